"""The report of a ``bench/multi_gpu.sh`` output directory (``tools/multi_gpu_report.py``), by role:

- :mod:`multigpu.bench_dir`: reading the directory (``runs.tsv``, ``bench.env``, ``device.json``, the
  run directories through ``tools/rundir.py``, the launch logs) and the scaling and per-step tables;
- :mod:`multigpu.tolerances`: the bound of each check and its reason;
- :mod:`multigpu.checks`: the parity, preemption/resume and reshard checks;
- :mod:`multigpu.render`: the markdown report and the JSON-safe document.
"""
