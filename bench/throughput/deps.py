"""What the planned runs need installed, checked before the first run: nothing falls back silently.

An arm with Transformer Engine projections (``model.transformer_impl=transformer_engine`` or
``projection.precision=te_fp8``) needs ``import transformer_engine.pytorch`` to work; an arm on the
``fa4`` or ``cute`` attention backend needs that backend's implementation to import
(flash-attn-4; the CUTLASS DSL and flash-attn-4). Each is tried in a child process (this process
never imports a kernel or holds a CUDA context). :func:`missing_dependencies` lists what is
missing and the arms that need it; :func:`refusal` words it as one sentence: what to install (the
``te`` or ``cute`` extra) and what runs without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from .plan import LOCAL_ARMS, RunSpec
from .process import child_env

# the backends checked here: the others (triton, reference) come with the base install
CHECKED_BACKENDS = ("fa4", "cute")
LOCAL_HINT = " ".join(LOCAL_ARMS)


def _child_import(code: str, timeout_s: float = 300) -> tuple[bool, str]:
    """(exit 0, the last stdout line or the last stderr line) of ``python -c code``."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=child_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"the import timed out after {timeout_s:.0f} s"
    if res.returncode != 0:
        return False, (res.stderr.strip().splitlines() or ["?"])[-1][:200]
    return True, (res.stdout.strip().splitlines() or [""])[-1]


def transformer_engine_status() -> tuple[bool, str]:
    """(usable, a sentence for the output): whether ``import transformer_engine.pytorch`` works (in a
    child process)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, (
            "Transformer Engine is not installed on this machine (`import transformer_engine` fails: "
            "No module named 'transformer_engine')"
        )
    ok, out = _child_import(
        "import transformer_engine as t, transformer_engine.pytorch; print(t.__version__)"
    )
    if not ok:
        return False, f"Transformer Engine does not import on this machine ({out})"
    return True, f"Transformer Engine {out} imports"


def attention_backend_status(name: str) -> tuple[bool, str]:
    """(usable, a sentence): whether attention backend ``name``'s implementation imports (in a child
    process, through ``fp4_attention.backends.get_backend``, whose error says what to install)."""
    ok, out = _child_import(f"from fp4_attention.backends import get_backend; get_backend({name!r})")
    if ok:
        return True, f"attention backend {name} imports"
    return False, f"attention backend {name} does not import on this machine ({out})"


def needs_transformer_engine(spec: RunSpec) -> bool:
    """Whether a validated run (``spec.plan`` filled) builds Transformer Engine projections."""
    return spec.plan["transformer_impl"] == "transformer_engine" or spec.plan["projection"] == "te_fp8"


def missing_dependencies(specs: list[RunSpec]) -> tuple[list[dict], list[str]]:
    """What the validated runs need that does not import here.

    Returns:
        (missing, notes): ``missing`` one dict per missing package (``what``, ``note``, ``extra`` (the
        pip extra), ``arms`` (the arms that need it)); ``notes`` a sentence per checked package (for
        the output and the report's metadata).
    """
    missing, notes = [], []
    te_arms = list(dict.fromkeys(s.arm for s in specs if needs_transformer_engine(s)))
    if te_arms:
        ok, note = transformer_engine_status()
        notes.append(note)
        if not ok:
            missing.append({"what": "Transformer Engine", "note": note, "extra": "te", "arms": te_arms})
    for name in CHECKED_BACKENDS:
        arms = list(dict.fromkeys(s.arm for s in specs if s.plan["backend"] == name))
        if not arms:
            continue
        ok, note = attention_backend_status(name)
        notes.append(note)
        if not ok:
            recipes = sorted({s.plan["recipe"] for s in specs if s.plan["backend"] == name})
            missing.append(
                {
                    "what": f"attention backend {name}",
                    "note": note,
                    "extra": "cute",
                    "arms": arms,
                    "recipes": recipes,
                }
            )
    return missing, notes


def refusal(missing: list[dict]) -> str:
    """One sentence: the arms that cannot run, what to install, and what runs without it."""
    parts = []
    for m in missing:
        if m["extra"] == "te":
            instead = f"or run only the local-projection arms (--arms {LOCAL_HINT})"
        else:
            instead = (
                "or choose another backend (--backend-override "
                + " ".join(f"{r}=triton" for r in m["recipes"])
                + ")"
            )
        parts.append(
            f"arm(s) {', '.join(m['arms'])} need {m['what']}: {m['note']}; install the '{m['extra']}' "
            f"extra (pip install -e '.[{m['extra']}]') {instead}"
        )
    return "; ".join(parts)
