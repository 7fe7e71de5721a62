"""cuDNN's FP8 attention (the FP8 peer) through ``nvidia-cudnn-frontend``: forward and backward graphs
with their per-tensor scales as graph inputs, so one built graph runs at any scales.

Formats (cuDNN's FP8 SDPA on Hopper): Q/K/V/O and P ("S") in E4M3, dO, dP and dQ/dK/dV in E5M2, one
FP32 scale per tensor; ``descale_x`` multiplies a stored x back to its value, ``scale_x`` divides a
value into its stored range. :func:`calibrated_attention` runs it as a user of the peer would at
its best: every scale from the amax of a first pass on the same inputs (delayed scaling with a
perfect history). ``bench/attention_bench.py`` times the same graphs.

Requires a CUDA device and ``nvidia-cudnn-frontend``; raises ImportError naming the package otherwise.
"""

from __future__ import annotations

import torch

try:
    import cudnn
except ImportError as err:  # the caller reports it with the alternative
    raise ImportError(
        f"the cuDNN FP8 peer needs nvidia-cudnn-frontend ({err}); pip install nvidia-cudnn-frontend"
    ) from err

__all__ = ["E4M3_MAX", "E5M2_MAX", "CudnnFP8Attention", "calibrated_attention"]

E4M3_MAX, E5M2_MAX = 448.0, 57344.0
FWD_SCALES = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
BWD_SCALES = (
    "descale_q",
    "descale_k",
    "descale_v",
    "descale_o",
    "descale_do",
    "descale_s",
    "descale_dp",
    "scale_s",
    "scale_dq",
    "scale_dk",
    "scale_dv",
    "scale_dp",
)


def _graph():
    return cudnn.pygraph(
        io_data_type=cudnn.data_type.FP8_E4M3,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )


def _finish(g, amaxes) -> torch.Tensor:
    for a in amaxes:
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")


def _set_out(t, buf, dtype):
    t.set_output(True).set_dim(list(buf.shape)).set_stride(list(buf.stride())).set_data_type(dtype)


class CudnnFP8Attention:
    """Built cuDNN FP8 SDPA graphs for one problem.

    Args:
        b, hq, hkv, s, d: batch, query heads, KV heads, sequence length (queries = keys), head dim.
        causal: top-left causal mask (the same as bottom-right for Sq = Sk).
        training: also build the backward graph (the forward then writes the softmax stats).
    """

    def __init__(self, b: int, hq: int, hkv: int, s: int, d: int, causal: bool, training: bool = True):
        e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
        dev = "cuda"
        self.q8 = torch.empty(b, hq, s, d, dtype=e4, device=dev)
        self.k8 = torch.empty(b, hkv, s, d, dtype=e4, device=dev)
        self.v8 = torch.empty(b, hkv, s, d, dtype=e4, device=dev)
        self.o8 = torch.empty(b, hq, s, d, dtype=e4, device=dev)
        self.scales = {
            n: torch.ones(1, 1, 1, 1, dtype=torch.float32, device=dev) for n in {*FWD_SCALES, *BWD_SCALES}
        }
        self.amax = {n: torch.empty(1, 1, 1, 1, device=dev) for n in ("s", "o", "dq", "dk", "dv", "dp")}
        g = _graph()
        tq, tk, tv = (g.tensor_like(t) for t in (self.q8, self.k8, self.v8))
        ts = {n: g.tensor_like(self.scales[n]) for n in FWD_SCALES}
        o, stats, amax_s, amax_o = g.sdpa_fp8(
            tq,
            tk,
            tv,
            *(ts[n] for n in FWD_SCALES),
            is_inference=not training,
            attn_scale=d**-0.5,
            use_causal_mask=causal,
        )
        _set_out(o, self.o8, cudnn.data_type.FP8_E4M3)
        self.pack = {
            tq: self.q8,
            tk: self.k8,
            tv: self.v8,
            o: self.o8,
            amax_s: self.amax["s"],
            amax_o: self.amax["o"],
        }
        self.pack.update({ts[n]: self.scales[n] for n in FWD_SCALES})
        if training:
            self.stats = torch.empty(b, hq, s, 1, dtype=torch.float32, device=dev)
            _set_out(stats, self.stats, cudnn.data_type.FLOAT)
            self.pack[stats] = self.stats
        self.g, self.ws = g, _finish(g, (amax_s, amax_o))
        if not training:
            return
        self.do8 = torch.empty(b, hq, s, d, dtype=e5, device=dev)
        self.grads = {
            "dq": torch.empty(b, hq, s, d, dtype=e5, device=dev),
            "dk": torch.empty(b, hkv, s, d, dtype=e5, device=dev),
            "dv": torch.empty(b, hkv, s, d, dtype=e5, device=dev),
        }
        gb = _graph()
        bq, bk, bv, bo, bdo, bst = (
            gb.tensor_like(t) for t in (self.q8, self.k8, self.v8, self.o8, self.do8, self.stats)
        )
        bs = {n: gb.tensor_like(self.scales[n]) for n in BWD_SCALES}
        dq, dk, dv, a_dq, a_dk, a_dv, a_dp = gb.sdpa_fp8_backward(
            bq, bk, bv, bo, bdo, bst, *(bs[n] for n in BWD_SCALES), attn_scale=d**-0.5, use_causal_mask=causal
        )
        for t, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
            _set_out(t, self.grads[name], cudnn.data_type.FP8_E5M2)
        self.packb = {bq: self.q8, bk: self.k8, bv: self.v8, bo: self.o8, bdo: self.do8, bst: self.stats}
        self.packb.update({bs[n]: self.scales[n] for n in BWD_SCALES})
        self.packb.update({dq: self.grads["dq"], dk: self.grads["dk"], dv: self.grads["dv"]})
        self.packb.update(
            {a_dq: self.amax["dq"], a_dk: self.amax["dk"], a_dv: self.amax["dv"], a_dp: self.amax["dp"]}
        )
        self.gb, self.wsb = gb, _finish(gb, (a_dq, a_dk, a_dv, a_dp))

    def set_scales(self, **values: float) -> None:
        """Set named scales (``descale_q=...``); a name shared by the two graphs sets both."""
        for n, x in values.items():
            self.scales[n].fill_(float(x))

    def forward(self) -> None:
        self.g.execute(self.pack, self.ws)

    def backward(self) -> None:
        self.gb.execute(self.packb, self.wsb)


def _per_tensor(x: torch.Tensor, fmax: float) -> float:
    a = float(x.float().abs().amax())
    return a / fmax if a > 0 else 1.0


def calibrated_attention(q, k, v, dout, *, causal: bool) -> tuple[torch.Tensor, ...]:
    """cuDNN FP8 attention of BF16 ``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` and ``dout`` (CUDA),
    every per-tensor scale calibrated: Q/K/V/dO from their amax, P, O, dP and dQ/dK/dV from the amax
    of a first pass on the same inputs. Returns FP32 ``(out, dq, dk, dv)`` (dequantized)."""
    b, hq, s, d = q.shape
    att = CudnnFP8Attention(b, hq, k.shape[1], s, d, causal)
    sx = {n: _per_tensor(t, E4M3_MAX) for n, t in (("q", q), ("k", k), ("v", v))}
    s_do = _per_tensor(dout, E5M2_MAX)
    for n, t in (("q", q), ("k", k), ("v", v)):
        getattr(att, f"{n}8").copy_((t.float() / sx[n]).to(torch.float8_e4m3fn))
    att.do8.copy_((dout.float() / s_do).to(torch.float8_e5m2))
    att.set_scales(descale_q=sx["q"], descale_k=sx["k"], descale_v=sx["v"], descale_do=s_do)
    # first pass: P lifted by 256 (FA3's convention), O, dP and the gradients unscaled
    att.set_scales(scale_s=256.0, descale_s=1 / 256.0)
    att.forward()
    att.backward()
    amax = {n: float(t) for n, t in att.amax.items()}
    scale_s = E4M3_MAX / max(amax["s"], 1e-30)
    scale_o = E4M3_MAX / max(amax["o"], 1e-30)
    scale_dp = E5M2_MAX / max(amax["dp"], 1e-30)
    grad_scale = {n: E5M2_MAX / max(amax[n], 1e-30) for n in ("dq", "dk", "dv")}
    att.set_scales(scale_s=scale_s, descale_s=1 / scale_s, scale_o=scale_o, descale_o=1 / scale_o)
    att.set_scales(
        scale_dp=scale_dp, descale_dp=1 / scale_dp, **{f"scale_{n}": x for n, x in grad_scale.items()}
    )
    att.forward()
    att.backward()
    out = att.o8.float() / scale_o
    return (out, *(att.grads[n].float() / grad_scale[n] for n in ("dq", "dk", "dv")))
