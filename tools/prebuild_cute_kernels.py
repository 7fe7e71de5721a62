"""Compile the cute backend's kernels on a machine without a GPU, into a kernel cache that GPU
processes load instead of compiling (``fp4_attention/backends/cute/prebuild.py``): run it once on a
login node before a 64-GPU job, not 64 times per restart.

    python tools/prebuild_cute_kernels.py --cache-dir DIR [--preset bench|tests]
        [--head-dims 128] [--groups 1 4] [--causal both|yes|no] [--recipes fp8 nvfp4qk_fp8pv]
        [--tiles 128,192,2 ...] [--k-group] [--arch sm_90a] [--jobs 2]
        [--dsl-bundle .gpu-bundle [--dsl-site DIR]] [--archive FILE.tar.xz]

``--preset`` picks the keys of a device session (``prebuild.SESSION_PRESETS``; the other key options
are then refused); otherwise the options give them (default: head dim 128, GQA groups 1 and 4,
causal and not, both recipes, the backend's default tiles). Kernels already in the cache are
loaded, not compiled again.

Compile with the CUTLASS DSL build the GPU machine runs: nvidia-cutlass-dsl 4.8.1 has a CUDA 12 and
a CUDA 13 build of its compiler, whose SASS differs for the same kernel (this environment's may be
the other one). ``--dsl-bundle .gpu-bundle`` installs the GPU bundle's DSL into ``--dsl-site`` (its
own ``install.sh``, as on the GPU machine) and compiles with it. The cache's fingerprint covers the
compiler build (``compile_cache.compiler_dso``), the kernels' sources, the DSL, flash-attn-4 and
Python versions and the target, so a GPU process whose build or sources differ computes another
fingerprint and compiles: it never loads a stale kernel.

It writes ``DIR/cute`` (this package's kernels, ``FP4_ATTENTION_CUTE_CACHE_DIR``) and prints the
variable a GPU job sets. Readers take a shared lock file per kernel: keep the lock files with
the cache (``--archive`` packs them) or give it a writable directory.

Exit status: 0; 2 for a bad option (the message names it); 1 with the traceback where a kernel
fails to compile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tiles(text: str) -> tuple[int, int, int]:
    try:
        m, n, s = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"tiles are tile_m,tile_n,stages (e.g. 128,192,2), got {text!r}"
        ) from None
    return m, n, s


def _env(cache_dir: Path, arch: str) -> dict:
    return {
        "CUTE_DSL_ARCH": arch,
        "FP4_ATTENTION_CUTE_CACHE_DIR": str(cache_dir / "cute"),
    }


def _worker(keys):
    """One process's share of the keys."""
    from fp4_attention.backends.cute.prebuild import prebuild

    return prebuild(keys)


_REEXEC = "FP4_PREBUILD_DSL_SITE"  # set in the process re-run on the bundle's CUTLASS DSL


def _use_bundle(bundle: Path, site: Path, argv: list[str]) -> None:
    """Install the GPU bundle's CUTLASS DSL into ``site`` as the GPU machine does (its own
    ``install.sh``: the wheels, then the cute-a and cute-b parts; a second run reuses them) and run
    this tool again on it (the DSL must be imported fresh). Returns only in that second run."""
    if os.environ.get(_REEXEC) == str(site):
        return
    for part in ("install.sh", "cute-a.tar.xz", "cute-b.tar.xz"):
        if not (bundle / part).is_file():
            print(
                f"prebuild_cute_kernels: --dsl-bundle {bundle} has no {part} (make the bundle with "
                "../shared/offline-gpu/bundle.sh, or leave --dsl-bundle out to use this environment's DSL)",
                file=sys.stderr,
            )
            raise SystemExit(2)
    res = subprocess.run(
        ["bash", str(bundle / "install.sh"), str(bundle), str(site)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise SystemExit(
            f"prebuild_cute_kernels: installing {bundle}'s DSL into {site} failed:\n{res.stdout}{res.stderr}"
        )
    paths = [str(site), str(site / "nvidia_cutlass_dsl" / "dsl_packages")]
    env = {
        **os.environ,
        _REEXEC: str(site),
        "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]),
    }
    os.execve(sys.executable, [sys.executable, __file__, *argv], env)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, required=True)
    ap.add_argument("--preset", choices=("bench", "tests"))
    ap.add_argument("--head-dims", type=int, nargs="+", choices=(64, 128), default=[128])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument(
        "--recipes", nargs="+", choices=("fp8", "nvfp4qk_fp8pv"), default=["fp8", "nvfp4qk_fp8pv"]
    )
    ap.add_argument("--tiles", type=_tiles, nargs="+")
    ap.add_argument("--k-group", action="store_true", help="also the fp8 forward with K per 64 keys")
    ap.add_argument("--arch", default="sm_90a", help="the CUTLASS DSL target (CUTE_DSL_ARCH)")
    ap.add_argument("--jobs", type=int, default=1, help="compile processes")
    ap.add_argument(
        "--dsl-bundle",
        type=Path,
        help="compile with the CUTLASS DSL of this GPU bundle (.gpu-bundle: the GPU machine's CUDA build "
        "of the DSL's compiler, whose SASS differs from another build's), installed into --dsl-site",
    )
    ap.add_argument("--dsl-site", type=Path, default=Path("/tmp/prebuild-dsl-site"))
    ap.add_argument(
        "--archive",
        type=Path,
        help="also pack the cache into this .tar.xz (bench/cute_session.sh unpacks "
        ".gpu-bundle/cute-prebuilt.tar.xz on the GPU machine)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1 or any(g < 1 for g in args.groups):
        ap.error("--jobs and --groups must be >= 1")
    explicit = [
        o
        for o in ("head_dims", "groups", "causal", "recipes", "tiles", "k_group")
        if getattr(args, o) != ap.get_default(o)
    ]
    if args.preset and explicit:
        flags = ", ".join("--" + o.replace("_", "-") for o in explicit)
        ap.error(f"--preset names every kernel itself: leave out {flags}")
    if args.dsl_bundle:
        _use_bundle(args.dsl_bundle.resolve(), args.dsl_site.resolve(), argv)
    # before the DSL is imported: it reads CUTE_DSL_ARCH on import (the worker processes are forked
    # from this one)
    cache_dir = args.cache_dir.resolve()
    env = _env(cache_dir, args.arch)
    os.environ.update(env)
    from fp4_attention.backends.cute.compile_cache import compiler_dso, source_fingerprint

    flavour = compiler_dso()[0]
    from fp4_attention.backends.cute.backend import SUPPORTED_TILES
    from fp4_attention.backends.cute.prebuild import keys_for, preset_keys

    if args.tiles and any(t not in SUPPORTED_TILES for t in args.tiles):
        ap.error(f"--tiles: the backend takes {SUPPORTED_TILES}")
    if args.preset:
        keys = preset_keys(args.preset)
    else:
        causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
        keys = keys_for(args.head_dims, args.groups, causal, args.tiles, args.recipes, args.k_group)
    ours = cache_dir / "cute" / source_fingerprint()
    (cache_dir / "cute").mkdir(parents=True, exist_ok=True)
    jobs = [keys[i :: args.jobs] for i in range(args.jobs)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_worker, jobs))
    n = {k: sum(r[k] for r in results) for k in ("compiled", "loaded")}
    size = sum(f.stat().st_size for f in ours.rglob("*") if f.is_file())
    print(
        f"{n['compiled'] + n['loaded']} kernels ({n['compiled']} compiled, {n['loaded']} already there) in "
        f"{max(r['seconds'] for r in results):.0f} s with the DSL's {flavour} compiler; "
        f"{ours}: {size / 2**20:.1f} MiB"
    )
    if args.archive:
        # this build's kernels with their lock files (a reader takes a shared lock on each: with the
        # files there, a read-only copy of the cache loads), not other fingerprints' folders
        with tarfile.open(args.archive, "w:xz") as tar:
            for f in sorted(p for p in ours.rglob("*") if p.is_file()):
                tar.add(f, arcname=str(f.relative_to(cache_dir)))
        print(f"{args.archive}: {args.archive.stat().st_size / 2**20:.1f} MiB")
    print("to load them, a GPU job sets (a path of this machine: where the folder is there):")
    for k, v in env.items():
        if k != "CUTE_DSL_ARCH":  # the GPU's own target has the same name (compile_cache._target)
            print(f"  export {k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
