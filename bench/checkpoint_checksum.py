"""Rates of the checksums a checkpoint manifest could record, and what they cost on the 8B checkpoint.

    python bench/checkpoint_checksum.py [--mib 256] [--dir /path/on/the/checkpoint/filesystem]

Prints, per algorithm, the rate (GB/s, best of 3) over a buffer of random bytes in memory; then the
rate of :func:`training.checkpoint.file_checksum` (the one the manifests record) over a file of the
same size just written under ``--dir`` (so mostly read from the page cache, as at a save); then the
cost of that rate on the Llama-3.1-8B checkpoint (105 GiB: BF16 weights + FP32 main weights + Adam m
and v, 14 bytes x 8.03e9 parameters) for one process and shared over 8 and 64 ranks. xxhash (a PyPI
package) is measured when installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.checkpoint import CHECKSUM, file_checksum  # noqa: E402

CKPT_8B_BYTES = 105 * 2**30
CHUNK = 16 * 2**20


def _best_rate(nbytes: int, fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _chunked(view: memoryview, update) -> None:
    for i in range(0, len(view), CHUNK):
        update(view[i : i + CHUNK])


def _zlib(view: memoryview, fn, start: int) -> None:
    value = start
    for i in range(0, len(view), CHUNK):
        value = fn(view[i : i + CHUNK], value)


def algorithms(view: memoryview) -> dict:
    algos = {
        "crc32 (zlib)": lambda: _zlib(view, zlib.crc32, 0),
        "adler32 (zlib)": lambda: _zlib(view, zlib.adler32, 1),
        "sha256 (hashlib)": lambda: _chunked(view, hashlib.sha256().update),
        "blake2b (hashlib)": lambda: _chunked(view, hashlib.blake2b().update),
    }
    try:
        import xxhash
    except ImportError:
        print("xxhash: not installed (pip install xxhash to compare)")
    else:
        algos["xxh3_64 (xxhash)"] = lambda: _chunked(view, xxhash.xxh3_64().update)
        algos["xxh3_128 (xxhash)"] = lambda: _chunked(view, xxhash.xxh3_128().update)
    return algos


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="buffer and file size in MiB (default 256)")
    p.add_argument("--dir", default=None, help="where to write the test file (default: the temp dir)")
    args = p.parse_args(argv)
    data = os.urandom(args.mib * 2**20)
    view = memoryview(data)
    print(f"in memory, {args.mib} MiB, best of 3:")
    for name, fn in algorithms(view).items():
        print(f"  {name:20s} {_best_rate(len(data), fn):6.2f} GB/s")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "blob"
        path.write_bytes(data)
        rate = _best_rate(len(data), lambda: file_checksum(path))
    print(f"file_checksum ({CHECKSUM}) of a {args.mib} MiB file just written: {rate:.2f} GB/s")
    one = CKPT_8B_BYTES / 1e9 / rate
    print(
        f"8B checkpoint ({CKPT_8B_BYTES / 2**30:.0f} GiB = {CKPT_8B_BYTES / 1e9:.0f} GB) at that rate: "
        f"{one:.1f} s in one process, {one / 8:.2f} s per rank over 8 ranks, {one / 64:.2f} s over 64"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
