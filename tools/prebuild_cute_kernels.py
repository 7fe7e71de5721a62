"""Compile the cute backend's kernels on a machine without a GPU, into a kernel cache that GPU
processes load instead of compiling (``fp4_attention/backends/cute/prebuild.py``): run it once on a
login node before a 64-GPU job, not 64 times per restart.

    python tools/prebuild_cute_kernels.py --cache-dir DIR [--preset bench|tests]
        [--head-dims 128] [--groups 1 4] [--causal both|yes|no] [--recipes fp8 nvfp4qk_fp8pv]
        [--tiles 128,192,2 ...] [--k-group] [--arch sm_90a] [--jobs 2] [--archive FILE.tar.xz]

``--preset`` picks the keys of a device session (``prebuild.SESSION_PRESETS``); otherwise the
options give them (default: head dim 128, GQA groups 1 and 4, causal and not, both recipes, the
backend's default tiles). Kernels already in the cache are loaded, not compiled again.

It writes ``DIR/cute`` (this package's kernels, ``FP4_ATTENTION_CUTE_CACHE_DIR``) and ``DIR/fa4``
(flash-attn-4's backward postprocess, ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``) and prints the
variables a GPU job sets to use them. The cache's fingerprint covers the kernels' sources, the
CUTLASS DSL, flash-attn-4 and Python versions and the target: a GPU process with other sources or
versions computes another fingerprint and compiles, it never loads a stale kernel.

Exit status: 0, or 2 for a bad option (the message names it).
"""

from __future__ import annotations

import argparse
import os
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
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(cache_dir / "fa4"),
    }


def _worker(keys):
    """One process's share of the keys."""
    from fp4_attention.backends.cute.prebuild import prebuild

    return prebuild(keys)


def main(argv=None) -> int:
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
        "--archive",
        type=Path,
        help="also pack the cache into this .tar.xz (bench/cute_session.sh unpacks "
        ".gpu-bundle/cute-prebuilt.tar.xz on the GPU machine)",
    )
    args = ap.parse_args(argv)
    if args.jobs < 1 or any(g < 1 for g in args.groups):
        ap.error("--jobs and --groups must be >= 1")
    # before the DSL and flash-attn-4 are imported: both read these on import (the worker
    # processes are forked from this one)
    env = _env(args.cache_dir.resolve(), args.arch)
    os.environ.update(env)
    from fp4_attention.backends.cute.backend import SUPPORTED_TILES
    from fp4_attention.backends.cute.prebuild import keys_for, preset_keys

    if args.tiles and any(t not in SUPPORTED_TILES for t in args.tiles):
        ap.error(f"--tiles: the backend takes {SUPPORTED_TILES}")
    if args.preset:
        keys = preset_keys(args.preset)
    else:
        causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
        keys = keys_for(args.head_dims, args.groups, causal, args.tiles, args.recipes, args.k_group)
    for d in ("cute", "fa4"):
        (args.cache_dir / d).mkdir(parents=True, exist_ok=True)
    jobs = [keys[i :: args.jobs] for i in range(args.jobs)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_worker, jobs))
    n = {k: sum(r[k] for r in results) for k in ("compiled", "loaded", "postprocess")}
    size = sum(f.stat().st_size for f in args.cache_dir.rglob("*") if f.is_file())
    print(
        f"{n['compiled'] + n['loaded']} kernels ({n['compiled']} compiled, {n['loaded']} already there) "
        f"and flash-attn-4's postprocess for {n['postprocess']} head dim(s) in "
        f"{max(r['seconds'] for r in results):.0f} s; {args.cache_dir}: {size / 2**20:.1f} MiB"
    )
    if args.archive:
        with tarfile.open(args.archive, "w:xz") as tar:
            for d in ("cute", "fa4"):  # the kernels, not their lock files
                for f in sorted((args.cache_dir / d).rglob("*.o")):
                    tar.add(f, arcname=str(f.relative_to(args.cache_dir)))
        print(f"{args.archive}: {args.archive.stat().st_size / 2**20:.1f} MiB")
    print("on the GPU machine:")
    for k, v in env.items():
        if k != "CUTE_DSL_ARCH":  # the GPU's own target has the same name (compile_cache._target)
            print(f"  export {k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
