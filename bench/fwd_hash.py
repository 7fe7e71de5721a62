"""Fingerprints of the CuTe forward's output and LSE on fixed inputs, to show that a schedule change
left the numbers bit for bit unchanged: run it in two trees (``bench/variants.sh``) or with two
kernel options, and compare the JSON files; equal hashes mean equal bytes.

    python3 bench/fwd_hash.py --out fwd_hash.json [--options '{"k_group": 64}'] [--tiles 128,128,2]

Cases: recipe ``fp8`` on five shapes (GQA 4 causal with ragged tiles, D64 GQA 6 non-causal with
Sq != Sk, rows without keys (causal Sq > Sk), B2 H32/8 S4096 causal, and non-causal D128 at its
128x192 default tiles; the runs of 2026-12-03 had the first four), ``nvfp4qk_fp8pv`` on the
first; each clean and with one NaN or Inf in K (contract §4: the poisoned key's unit). Inputs come
from a seeded CUDA generator. Output: ``{case: sha256 of out's bytes + LSE's bytes, 16 hex}``.
Needs a CUDA GPU (sm_90) and the ``cute`` extra.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [  # (B, Hq, Hkv, Sq, Sk, causal, D)
    (1, 8, 2, 1000, 1000, True, 128),
    (2, 6, 1, 700, 900, False, 64),
    (1, 4, 4, 600, 200, True, 128),
    (2, 32, 8, 4096, 4096, True, 128),
    (1, 8, 8, 1000, 1000, False, 128),  # non-causal D128: the 128x192 default tiles
]


def fingerprints(options: dict, tiles: tuple[int, int, int] | None) -> dict[str, str]:
    """``{case: hash}`` of ``forward_fp8`` with kernel ``options`` at ``tiles`` (None: the backend's
    default tiles for the case)."""
    from fp4_attention.backends.cute.backend import (
        default_tiles,
        forward_fp8,
        kernel_operands,
        quantize_inputs,
        quantize_nvfp4_inputs,
    )

    res = {}
    for recipe in ("fp8", "nvfp4qk_fp8pv"):
        for i, (b, hq, hkv, sq, sk, causal, d) in enumerate(CASES):
            if recipe != "fp8" and i != 0:
                continue
            for poison in (None, "nan", "inf"):
                g = torch.Generator(device="cuda").manual_seed(i)
                q = torch.randn(b, hq, sq, d, device="cuda", generator=g).bfloat16()
                k = torch.randn(b, hkv, sk, d, device="cuda", generator=g).bfloat16()
                v = torch.randn(b, hkv, sk, d, device="cuda", generator=g).bfloat16()
                if poison:
                    k[0, 0, sk // 3, 5] = float(poison)
                if recipe == "fp8":
                    ops = kernel_operands(*quantize_inputs(q, k, v), d**-0.5)
                else:
                    q_s, k_s, v_s, decoded = quantize_nvfp4_inputs(q, k, v)
                    ops = kernel_operands(q_s, k_s, v_s, d**-0.5, decoded)
                t = tiles or default_tiles(d)
                out, lse = forward_fp8(*ops, causal=causal, tiles=t, qk_bf16=recipe != "fp8", **options)
                data = out.contiguous().view(torch.int16).cpu().numpy().tobytes()
                data += lse.cpu().numpy().tobytes()
                case = f"{recipe} {(b, hq, hkv, sq, sk, causal, d)} {poison}"
                res[case] = hashlib.sha256(data).hexdigest()[:16]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file of the fingerprints")
    p.add_argument("--options", default="{}", help="kernel options of FP8ForwardSm90, as JSON")
    p.add_argument("--tiles", default=None, help="tile_m,tile_n,stages (default: the backend's)")
    a = p.parse_args(argv)
    tiles = tuple(int(x) for x in a.tiles.split(",")) if a.tiles else None
    res = fingerprints(json.loads(a.options), tiles)
    Path(a.out).write_text(json.dumps(res, indent=0) + "\n")
    print(json.dumps(res, indent=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
