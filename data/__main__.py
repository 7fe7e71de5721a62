"""``python -m data`` is ``python -m data.prepare``."""

from data.prepare import main

raise SystemExit(main())
