"""What the backward's speed bar asks of the kernel and of the work around it, from two backward
profiles of one run (``bench/attention_step_profile.py --part backward``: ours and FA4 BF16's).

    python3 bench/bwd_bar_bound.py OURS.json FA4.json [--ratio 1.3] [--fp8-products 3] [--out PREFIX]

The backward's five products (S^T, dP^T, dV, dK, dQ) each take ``2 B Hq S^2 D`` FLOPs (halved when
causal), so FA4's main kernel time over five is the time of one BF16 product at FA4's efficiency.
The ``fp8`` recipe runs ``--fp8-products`` of them on FP8 tensor cores (twice the BF16 peak) and the
rest in BF16 (dS in BF16 for dK and dQ, issue 18's definition), so at FA4's efficiency per FLOP its
kernel would take ``fp8 / 2 + (5 - fp8)`` BF16 products. "Around" is every other kernel of the
backward except the ``.grad`` accumulation (torch's add, the same for both: the profile's repeated
backward); FA4's is its preprocess, its accumulator fills and its postprocess.

Prints, and writes to ``PREFIX.{json,md}``: the bar (FA4's backward time over ``--ratio``); our
kernel and around-work today; the kernel time at FA4's efficiency per FLOP and our efficiency
relative to it; the most the work around the kernel may cost with that ideal kernel, and the most
the kernel may cost with FA4's work around it and with ours. Times are GPU time (sums of kernel
times under the profiler), not wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MAIN_KERNELS = ("FP8BackwardSm90", "FlashAttentionBackwardSm90")  # ours, FA4's main backward kernel
GRAD_ACCUMULATION = "CUDAFunctor_add"  # torch adding the gradients into .grad


def split(profile: dict) -> tuple[float, float]:
    """``(main kernel ms, around ms)`` per step of one backward profile."""
    main = around = 0.0
    for k in profile["kernels"]:
        if any(m in k["kernel"] for m in MAIN_KERNELS) and "Postprocess" not in k["kernel"]:
            main += k["ms_per_step"]
        elif GRAD_ACCUMULATION not in k["kernel"]:
            around += k["ms_per_step"]
    if main == 0.0:
        raise ValueError(
            "bwd_bar_bound: no main backward kernel in the profile (names: " + ", ".join(MAIN_KERNELS) + ")"
        )
    return main, around


def bound(ours: dict, fa4: dict, ratio: float = 1.3, fp8_products: int = 3) -> dict:
    """The numbers of the module docstring (ms, and fractions), from two profiles' JSON."""
    if not 0 <= fp8_products <= 5 or ratio <= 0:
        raise ValueError(
            f"bwd_bar_bound: need 0 <= fp8_products <= 5 and ratio > 0, got {fp8_products}, {ratio}"
        )
    if ours["shape"] != fa4["shape"]:
        raise ValueError(f"bwd_bar_bound: the profiles' shapes differ: {ours['shape']} / {fa4['shape']}")
    k_ours, a_ours = split(ours)
    k_fa4, a_fa4 = split(fa4)
    bar = (k_fa4 + a_fa4) / ratio
    product = k_fa4 / 5  # one BF16 product at FA4's efficiency
    ideal = product * (fp8_products / 2 + (5 - fp8_products))
    return {
        "shape": ours["shape"],
        "ratio": ratio,
        "fp8_products": fp8_products,
        "fa4_kernel_ms": k_fa4,
        "fa4_around_ms": a_fa4,
        "fa4_total_ms": k_fa4 + a_fa4,
        "ours_kernel_ms": k_ours,
        "ours_around_ms": a_ours,
        "ours_total_ms": k_ours + a_ours,
        "today_ratio": (k_fa4 + a_fa4) / (k_ours + a_ours),
        "bar_total_ms": bar,
        "ideal_kernel_ms": ideal,
        "kernel_efficiency_vs_fa4": ideal / k_ours,
        "around_allowed_with_ideal_kernel_ms": bar - ideal,
        "kernel_allowed_with_fa4_around_ms": bar - a_fa4,
        "kernel_allowed_with_ours_around_ms": bar - a_ours,
        "efficiency_needed_with_fa4_around": ideal / (bar - a_fa4) if bar > a_fa4 else float("inf"),
        "efficiency_needed_with_ours_around": ideal / (bar - a_ours) if bar > a_ours else float("inf"),
    }


def to_markdown(b: dict, sources: tuple[str, str]) -> str:
    s = b["shape"]
    return "\n".join(
        [
            f"# The backward bar ({b['ratio']}x FA4 BF16) in GPU time: B{s['B']} H{s['Hq']}/{s['Hkv']} "
            f"S{s['S']} D{s['D']}{' causal' if s.get('causal') else ''}",
            "",
            f"- from `{sources[0]}` and `{sources[1]}` (`bench/bwd_bar_bound.py`); "
            f"{b['fp8_products']} of the five products at FP8 rate",
            "",
            "| | ms |",
            "|---|---|",
            f"| FA4: kernel + around | {b['fa4_kernel_ms']:.3f} + {b['fa4_around_ms']:.3f} = "
            f"{b['fa4_total_ms']:.3f} |",
            f"| ours today: kernel + around | {b['ours_kernel_ms']:.3f} + {b['ours_around_ms']:.3f} = "
            f"{b['ours_total_ms']:.3f} ({b['today_ratio']:.2f}x FA4) |",
            f"| the bar: at most | {b['bar_total_ms']:.3f} |",
            f"| our kernel at FA4's efficiency per FLOP | {b['ideal_kernel_ms']:.3f} "
            f"(ours today is at {b['kernel_efficiency_vs_fa4']:.0%} of it) |",
            f"| around allowed with that kernel | {b['around_allowed_with_ideal_kernel_ms']:.3f} |",
            f"| kernel allowed with FA4's around | {b['kernel_allowed_with_fa4_around_ms']:.3f} "
            f"(needs {b['efficiency_needed_with_fa4_around']:.0%} of FA4's efficiency per FLOP) |",
            f"| kernel allowed with our around | {b['kernel_allowed_with_ours_around_ms']:.3f} "
            f"(needs {b['efficiency_needed_with_ours_around']:.0%}) |",
            "",
        ]
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ours", help="our backward's profile JSON")
    p.add_argument("fa4", help="FA4 BF16's backward profile JSON, same run and shape")
    p.add_argument("--ratio", type=float, default=1.3, help="the bar: FA4's time over ours (issue 18: 1.3)")
    p.add_argument("--fp8-products", type=int, default=3, help="products at FP8 rate (fp8 recipe: 3 of 5)")
    p.add_argument("--out", default=None, help="output prefix (PREFIX.json, PREFIX.md)")
    a = p.parse_args(argv)
    try:
        profiles = [json.loads(Path(f).read_text()) for f in (a.ours, a.fa4)]
        b = bound(*profiles, ratio=a.ratio, fp8_products=a.fp8_products)
    except (OSError, ValueError, KeyError) as err:
        print(f"bwd_bar_bound: {err}", file=sys.stderr)
        return 2
    md = to_markdown(b, (a.ours, a.fa4))
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.json").write_text(json.dumps({"sources": [a.ours, a.fa4], **b}, indent=1) + "\n")
        Path(f"{a.out}.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
