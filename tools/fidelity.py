"""Fidelity of every recipe against float64 attention (contract §4 case 3).

For each input family and recipe: cosine and relative L2 of the output (and of dQ/dK/dV for the
training recipes) against float64 naive attention on the same BF16 inputs, computed by the chosen
backend. Writes a markdown table (and JSON) with the command that produced it.

    python tools/fidelity.py --out results/fidelity            # reference backend, CPU
    python tools/fidelity.py --backend triton --device cuda    # a GPU backend, same table
    python tools/fidelity.py --backend cute --device cuda --recipes fp8 --peers cudnn_fp8  # with the peer
    python tools/fidelity.py --recipes nvfp4qk_fp8pv nvfp4qk_fp8pv+hadamard   # with the Q/K rotation

A recipe written ``NAME+hadamard`` runs ``NAME`` with ``qk_rotation="hadamard"`` (the random-sign
Hadamard rotation of Q/K's head dim, ``fp4_attention/numerics/rotation.py``; seed
``--qk-rotation-seed``); ``fp8+k64`` runs ``fp8`` with one K scale per 64 keys
(``Recipe.k_scale_keys``, the forward issue's K-scale option). The two combine in either order.

Arguments that cannot run (unknown recipe, backend or input family, no CUDA device, a head dim the
backend does not run, ...) exit with status 2 and one line on stderr.

Input families (B=1, Hq=8, Hkv=2, S=1024, D=128, causal unless noted; seed fixed):
  normal        q, k, v ~ N(0, 1)
  outliers      N(0, 1) with 0.1% of entries replaced by N(0, 100^2)
  sink          N(0, 1) with key 0 aligned to every query so that it takes most of the mass
  std=X         q, k scaled so that the scores have standard deviation X (X = 0.5, 1, 2, 4)
  gap=X         one dominant key: key 0's logit stands X above the mean of the others (whose
                logits are N(0, 1)) for every query, so that it takes all but ~S e^-X of each
                row's mass (an attention sink of a trained LLM; X = 30 exposed an inconsistent D)
  channels=X    N(0, 1) with 4 fixed channels (the same for every token and head) of q and k
                multiplied by X: structured outlier channels, as LLM queries and keys have them
  kbias=X       N(0, 1) with 4 fixed channels of k shifted by +-X, the same shift for every token
                and head: outlier channels that are a bias over tokens, as trained LLMs' keys have
                them (it shifts each query's scores by a constant, which the softmax ignores, but
                it sets K's quantization scales)
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # tools/cudnn_fp8.py, the FP8 peer

import fp4_attention as fa
from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.recipes import with_k_scale_keys, with_qk_rotation


def _metrics(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, b = x.double().flatten(), ref.double().flatten()
    cos = float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))
    rel = float((a - b).norm() / b.norm().clamp_min(1e-300))
    return cos, rel


def make_inputs(family: str, b: int, hq: int, hkv: int, s: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=g)
    k = torch.randn(b, hkv, s, d, generator=g)
    v = torch.randn(b, hkv, s, d, generator=g)
    if family == "outliers":
        for t in (q, k, v):
            mask = torch.rand(t.shape, generator=g) < 1e-3
            t[mask] = torch.randn(int(mask.sum()), generator=g) * 100.0
    elif family == "sink":
        # key 0 points along the mean query direction: its score is ~ +6 std above the others
        direction = q.mean(dim=(1, 2), keepdim=True)
        direction = direction / direction.norm(dim=-1, keepdim=True)
        k[:, :, 0:1, :] = direction * 8.0 * math.sqrt(d)
        q = q + direction * 2.0
    elif family.startswith("gap="):
        gap = float(family.split("=")[1])
        # q and k orthogonal to a unit direction u, then key 0 = c u and every query gets a u with
        # a c / sqrt(d) = gap: key 0's logit is exactly `gap` (up to BF16 rounding), the others N(0, 1)
        u = torch.randn(d, generator=g)
        u = u / u.norm()
        q = q - (q @ u).unsqueeze(-1) * u
        k = k - (k @ u).unsqueeze(-1) * u
        c = 4.0 * math.sqrt(d)
        q = q + (gap * math.sqrt(d) / c) * u
        k[:, :, 0] = c * u
    elif family.startswith("channels="):
        scale = float(family.split("=")[1])
        channels = torch.randperm(d, generator=g)[:4]
        q[..., channels] *= scale
        k[..., channels] *= scale
    elif family.startswith("kbias="):
        shift = float(family.split("=")[1])
        channels = torch.randperm(d, generator=g)[:4]
        signs = torch.randint(0, 2, (4,), generator=g).float() * 2 - 1
        k[..., channels] += shift * signs
    elif family.startswith("std="):
        target = float(family.split("=")[1])
        # scores q.k / sqrt(d) of unit normals have std 1; scale q and k by sqrt(target)
        q = q * math.sqrt(target)
        k = k * math.sqrt(target)
    elif family != "normal":
        raise ValueError(f"unknown input family {family!r}")
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def float64_case(family: str, b: int, hq: int, hkv: int, s: int, d: int, seed: int, causal: bool = True):
    """One input family's BF16 ``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` (:func:`make_inputs`)
    and dO (N(0, 1) of seed + 1), with float64 naive attention's output and gradients on them
    (softmax scale ``d ** -0.5``): ``(q, k, v, dout, out64, (dq64, dk64, dv64))``.

    Raises:
        ValueError: an unknown input family (:func:`make_inputs`).
    """
    q, k, v = make_inputs(family, b, hq, hkv, s, d, seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = naive_attention(qd, kd, vd, causal=causal, softmax_scale=d**-0.5)
    out.backward(dout.double())
    return q, k, v, dout, out.detach(), (qd.grad, kd.grad, vd.grad)


ROTATION_SUFFIX = "+hadamard"
K64_SUFFIX = "+k64"


def parse_recipe(name: str | fa.Recipe, seed: int) -> fa.Recipe:
    """``NAME``, with the suffixes ``+k64`` (K scales per 64 keys: ``Recipe.k_scale_keys``) and
    ``+hadamard`` (the Q/K rotation of ``seed``) in either order, as a :class:`Recipe` (a
    :class:`Recipe` is returned as it is). ``bench/attention_bench.py`` reads its ``--recipes`` so.

    Raises:
        ValueError: unknown recipe, or an option the recipe does not take.
    """
    if isinstance(name, fa.Recipe):
        return name
    base, options = name, []
    while base.endswith((ROTATION_SUFFIX, K64_SUFFIX)):
        suffix = ROTATION_SUFFIX if base.endswith(ROTATION_SUFFIX) else K64_SUFFIX
        if suffix in options:
            raise ValueError(f"recipe {name!r}: {suffix} given twice")
        options.append(suffix)
        base = base[: -len(suffix)]
    rec = fa.get_recipe(base)
    if K64_SUFFIX in options:
        rec = with_k_scale_keys(rec, 64)
    if ROTATION_SUFFIX in options:
        rec = with_qk_rotation(rec, "hadamard", seed)
    return rec


def run(args) -> list[dict]:
    device = torch.device(args.device)
    options = backend_options(args.backend_option)
    records = []
    for family in args.families:
        q, k, v, dout, ref_out, (dq64, dk64, dv64) = float64_case(
            family, args.batch, args.hq, args.hkv, args.seqlen, args.headdim, args.seed, args.causal
        )
        for name in args.recipes:
            rec = parse_recipe(name, args.qk_rotation_seed)
            qq, kk, vv = (t.detach().clone().to(device).requires_grad_(rec.trainable) for t in (q, k, v))
            ctx = torch.enable_grad() if rec.trainable else torch.no_grad()
            with ctx:
                out = fa.attention(
                    qq,
                    kk,
                    vv,
                    recipe=rec,
                    causal=args.causal,
                    layout="bhsd",
                    backend=args.backend,
                    **options,
                )
            rec_row = {"family": family, "recipe": name, "out": _metrics(out.cpu(), ref_out)}
            if rec.trainable:
                out.backward(dout.to(device))
                for gname, mine, ref in (("dq", qq.grad, dq64), ("dk", kk.grad, dk64), ("dv", vv.grad, dv64)):
                    rec_row[gname] = _metrics(mine.cpu(), ref)
            records.append(rec_row)
            print(json.dumps(rec_row), flush=True)
        for peer in args.peers:  # the FP8 peer, its scales calibrated on these inputs (tools/cudnn_fp8.py)
            from cudnn_fp8 import calibrated_attention

            got = calibrated_attention(*(t.cuda() for t in (q, k, v, dout)), causal=args.causal)
            rec_row = {"family": family, "recipe": f"{peer} (peer)"}
            for gname, mine, ref in zip(("out", "dq", "dk", "dv"), got, (ref_out, dq64, dk64, dv64)):
                rec_row[gname] = _metrics(mine.cpu(), ref)
            records.append(rec_row)
            print(json.dumps(rec_row), flush=True)
    return records


def to_markdown(records: list[dict], args, command: str) -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        commit += "+dirty" if dirty else ""
    except Exception:  # noqa: BLE001 - running outside a checkout
        commit = "unknown"
    # the GPU machine's copy of the tree carries stale git metadata: the session names the commit
    commit = os.environ.get("BENCH_COMMIT") or commit
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    lines = [
        "# Attention fidelity vs float64",
        "",
        f"- command: `{command}`",
        (
            f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; commit {commit}; "
            f"device {dev}; torch {torch.__version__}; backend `{args.backend}`"
            + (f" with options {backend_options(args.backend_option)}" if args.backend_option else "")
        ),
        (
            f"- shape: B={args.batch}, Hq={args.hq}, Hkv={args.hkv}, S={args.seqlen}, D={args.headdim}, "
            f"causal={args.causal}; inputs BF16; reference = float64 naive attention on the same BF16 inputs"
        ),
        "- cells: cosine / relative L2. Gradients only for the training recipes. "
        f"`NAME+hadamard`: NAME with qk_rotation=hadamard, qk_rotation_seed={args.qk_rotation_seed}; "
        "`NAME+k64`: K scales per 64 keys (k_scale_keys=64).",
        "",
        "| inputs | recipe | out | dQ | dK | dV |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        cells = [f"{r[k][0]:.5f} / {r[k][1]:.4f}" if k in r else "-" for k in ("out", "dq", "dk", "dv")]
        lines.append(f"| {r['family']} | {r['recipe']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def backend_options(pairs: list[str]) -> dict:
    """``NAME=VALUE`` strings (``--backend-option``) as keyword options of ``fa.attention``; a VALUE is
    a Python literal (``ast.literal_eval``: ``True``, ``1``, ``(128, 128, 2)``), else kept a string.

    Raises:
        ValueError: a pair without ``=`` or with an empty name, or a name given twice.
    """
    out: dict = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise ValueError(f"--backend-option {pair!r}: expected NAME=VALUE, e.g. 'tiles=(128, 128, 2)'")
        if name in out:
            raise ValueError(f"--backend-option {name} given twice")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def check_backend_options(backend: str, options: dict) -> None:
    """Refuse ``--backend-option`` names that ``backend`` does not take (its spec's options).

    Raises:
        ValueError: an unknown backend, or option names the backend does not accept (named with the
            ones it does)."""
    accepted = fa.get_backend(backend).spec.options
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"--backend-option {unknown}: backend {backend!r} accepts {sorted(accepted)}")


FAMILIES = ("normal", "outliers", "sink")
SCALED_FAMILIES = ("std", "gap", "channels", "kbias")  # std=X, gap=X, channels=X, kbias=X


def check_args(args) -> str | None:
    """Why the arguments cannot run (one sentence), or None; imports the backend to check it."""
    for name in ("batch", "hq", "hkv", "seqlen", "headdim"):
        if getattr(args, name) < 1:
            return f"--{name} must be >= 1, got {getattr(args, name)}"
    for family in args.families:
        kind, eq, value = family.partition("=")
        if eq and kind in SCALED_FAMILIES:
            try:
                ok = float(value) > 0
            except ValueError:
                ok = False
            if not ok:
                return f"--families {family}: {kind}=X needs a number X > 0, e.g. {kind}=2"
        elif family not in FAMILIES:
            return (
                f"--families {family}: unknown input family; choose from {', '.join(FAMILIES)}, "
                + ", ".join(f"{k}=X" for k in SCALED_FAMILIES)
            )
    if args.hq % args.hkv:
        return f"--hq {args.hq} must be a multiple of --hkv {args.hkv} (grouped-query attention)"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        return f"--device {args.device!r} is not a torch device; use cpu or cuda (cuda:N)"
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"--device {args.device}: no CUDA device here; use --device cpu (with --backend reference)"
    if args.peers and not torch.cuda.is_available():
        return "--peers cudnn_fp8 needs a CUDA device (cuDNN's FP8 attention); drop --peers on this machine"
    if args.peers:
        try:
            import cudnn_fp8  # noqa: F401
        except ImportError as err:
            return str(err)
    try:
        opts = backend_options(args.backend_option)
        if opts and args.backend != "auto":
            check_backend_options(args.backend, opts)
    except ValueError as err:
        return str(err)
    if not 0 <= args.qk_rotation_seed < 2**63:
        return f"--qk-rotation-seed must be an integer in [0, 2^63), got {args.qk_rotation_seed}"
    try:
        for name in args.recipes:
            rec = parse_recipe(name, args.qk_rotation_seed)
            if rec.qk_rotation is not None and args.headdim & (args.headdim - 1):
                return f"--headdim {args.headdim}: {name} needs a head dim that is a power of two"
        if args.backend != "auto":
            fa.get_backend(args.backend)  # unknown name or not importable: says what to install
    except ValueError as err:
        return str(err)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="reference")
    p.add_argument("--device", default="cpu")
    p.add_argument("--recipes", nargs="+", default=list(fa.RECIPES))
    p.add_argument(
        "--families",
        nargs="+",
        default=["normal", "outliers", "sink", "gap=20", "std=0.5", "std=1", "std=2", "std=4"],
    )
    p.add_argument(
        "--peers",
        nargs="*",
        default=[],
        choices=["cudnn_fp8"],
        help="also the FP8 peer: cudnn_fp8 = cuDNN's FP8 attention with calibrated per-tensor scales (CUDA)",
    )
    p.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keyword option of the backend (its spec's options), e.g. 'tiles=(128, 128, 2)' for cute; "
        "repeatable",
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hq", type=int, default=8)
    p.add_argument("--hkv", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--qk-rotation-seed", type=int, default=0, help="sign seed of the NAME+hadamard recipes")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args(argv)
    problem = check_args(args)
    if problem is None and args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problem = f"--out {args.out}: cannot create {Path(args.out).parent} ({err.strerror})"
    if problem is not None:
        print(f"fidelity: {problem}", file=sys.stderr)
        return 2
    try:
        records = run(args)
    except fa.UnsupportedError as err:  # the backend does not run this recipe / head dim / device
        print(f"fidelity: {err}", file=sys.stderr)
        return 2
    command = "python tools/fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    md = to_markdown(records, args, command.strip())
    print(md)
    if args.out:
        Path(args.out + ".md").write_text(md)
        Path(args.out + ".json").write_text(json.dumps({"command": command, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
