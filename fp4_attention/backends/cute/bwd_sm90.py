"""CuTe DSL backward kernel of the ``fp8`` and ``nvfp4qk_fp8pv`` recipes for Hopper (sm_90a): dK, dV
and dQ in one pass.

What is ours and what is FA4's
------------------------------
The kernel class derives from flash-attn-4's Hopper BF16 backward (``FlashAttentionBackwardSm90``)
and keeps its machinery: one CTA per (KV block, query head, batch) looping over the query blocks
that see its keys, the dQ accumulation (a dedicated warp bulk-adds each query block's FP32 dQ tile
into a global accumulator, which FA4's postprocess kernel turns into BF16), the dK/dV epilogue
(TMA store for MHA, FP32 bulk-add for GQA) and the tile scheduler. Its configuration is FA4's for
head dim 128: 64 query rows x 128 keys per step, two consumer warpgroups that split the keys, S and
dP computed transposed (``SdP_swapAB``) so that P^T and dS^T stay in registers as the A operands of
the dV and dK products.

Ours is the mainloop (``mma_one_m_block``), the operands and their layouts, following
``numerics/reference.py``'s backward of the ``fp8`` recipe:

* S^T = K Q^T is the forward's product: E4M3 x E4M3 wgmma, K-major both, the head dim's four k32
  products chained inside the MMA (no FP32 promotion of the QK product: the ``fp8`` recipe's
  definition, as ``FP8ForwardSm90`` and the Triton kernels), so the scores match the forward's.
  ``qk_bf16`` (``nvfp4qk_fp8pv``): a BF16 wgmma on the exact BF16 decodes ``s_b * q`` of the NVFP4
  Q/K instead (the forward's ``qk_bf16`` product), with the per-head global scales as the token
  scales; the rest of the loop is the same.
  P^T = exp2(fma(t * col_j, r_i, stat_i)) with ``col`` the K token scale, ``r`` = Q token scale *
  softmax_scale * log2 e and ``stat = LIFT - LSE log2 e`` (-inf for rows without keys), lifted by
  2^LIFT into E4M3's range; ``qk_bf16``: ``exp2(fma(t, fold_k_scale(r_i, g_k), stat_i))`` with the
  head's K global scale ``g_k`` in the row factor, as the forward scores.
* dV += P^T dO as an E4M3 x E5M2 wgmma with P^T from registers, converted in place
  (``fwd_sm90.p_to_e4m3_operand``: the accumulator's column order) and dO^T stored with its query
  order permuted to match (``pv_layout.V_PERM16``, as the forward does for V's keys).
* dP^T = V dO^T as an E4M3 x E5M2 wgmma (chained inside the MMA over the head dim, as the Triton
  backward's), dO in E5M2 with V's per-channel scale folded in and one FP32 scale per head (``s_do``).
* dS^T = P^T (dP^T s_do - D) 2^-LIFT with D = rowsum(dO^ * O / v_scale) of the same dequantized dO
  (the reference's rule: consistent with dP under a dominant key). dK += dS^T Q and dQ = dS K are
  BF16 wgmmas, with the token scales placed as ``reference_backward`` defines them:
  ``fp8`` (E4M3 Q/K): in the BF16 operands, ``Qb = BF16(q8 * row)`` and ``Kb = BF16(k8 * col2)``
  (``row``, ``col2``: the token scales times 2^-LIFT), and one BF16(2^LIFT dS) feeds both dK (from
  registers) and dQ (through shared memory), as in FA4's BF16 kernel (two FMUL and half an F2FP per
  score element fewer than two scaled dS; 2-3% faster on the H200, results/cute_scaled_operands_h200/);
  ``qk_bf16``: on dS, ``BF16(dS^T * row)`` and ``BF16(dS * col2)`` against the exact NVFP4 decodes
  (its S^T reads those BF16 tiles, which must stay unscaled).
  dK is scaled by softmax_scale and dV by s_do 2^-LIFT / v_scale in the epilogue, dQ by
  softmax_scale in FA4's postprocess.
* The dQ tile's handoff to the dQ warp is split: each warpgroup stores its FP32 tile at the end of a
  query block, and fences (``fence.proxy.async``) and signals it after the next block's S^T/dP^T
  issue (the last block's after the loop), when the stores have drained. Fencing right after the
  stores waited for them (5.5% of the stall samples at B4 causal); the split made the backward 2.3%
  faster (results/cute_bwd_schedule_h200/).

The launch order of a causal mask: the first KV blocks of a causal backward carry the most work (KV
block n is seen by the query blocks from its own on), and FA4's grid order (KV block fastest, one
head after another) starts the heaviest CTAs of the last heads last: a greedy model of 132 SMs puts
that order 14% above the balanced time at B1 H32/8 S4096 and 3.5% at B4
(``bench/bwd_schedule_model.py``). So a causal backward takes its CTAs through flash-attn-4's
``SingleTileLPTBwdScheduler``: sections of heads sized to the L2 (8 heads at S4096 D128 with the
``element_size`` below), KV block major within a section, i.e. heaviest first with a section's
operands together in L2. On the H100 (three runs with the grid order beside it, H32/8 S4096:
results/session_2026-12-06c_h100) fwd+bwd took 1.5-2.5% less time at B1 (graphed) for fp8 and 4.4-4.7%
for nvfp4qk_fp8pv, 1.6-2.2% less at B4 for nvfp4qk_fp8pv, and 0.5-1.1% more at B4 for fp8 (its backward
alone 0.2-1.1% more); the grid order was deleted as the loser. The model's 14% at B1 did not appear.
Heaviest first over all heads (the deleted ``lpt`` option) put 132 heads' operands in flight at once
and took 50% more time (results/session_2026-12-05b_h200).

Operands are prepared on the host (``cute/backend.py``: ``backward_operands``). Requires
``nvidia-cutlass-dsl`` and ``flash-attn-4`` (``pip install 'fp4-attention-pretrain[cute]'``).
"""

import math
from functools import partial

import cutlass
import cutlass.utils.hopper_helpers as sm90_utils_basic
from cutlass import Float32, Int32, const_expr, cute
from cutlass.cute import FastDivmodDivisorV2
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum
from flash_attn.cute import pipeline
from flash_attn.cute import utils as fa_utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.named_barrier import NamedBarrierBwd
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.tile_scheduler import (
    SingleTileLPTBwdScheduler,
    SingleTileScheduler,
    TileSchedulerArguments,
)
from quack import copy_utils, layout_utils, sm90_utils

from .fwd_sm90 import LIFT, fold_k_scale, p_to_e4m3_operand

__all__ = ["FP8BackwardSm90"]

E4M3 = cutlass.Float8E4M3FN
E5M2 = cutlass.Float8E5M2


class FP8BackwardSm90(FlashAttentionBackwardSm90):
    """Backward of the ``fp8`` recipe (and, with ``qk_bf16``, ``nvfp4qk_fp8pv``) on sm_90a; see the
    module docstring.

    Args:
        head_dim: 64 or 128.
        qhead_per_kvhead: GQA group size.
        is_causal: bottom-right causal mask (key j visible to query i iff j <= i + Sk - Sq).
        tile_m, tile_n: query rows per step and keys per CTA (64, 128: FA4's head-dim-128 tiles).
        qk_bf16: recompute S^T as a BF16 wgmma on the BF16 Q/K images (``mQb``, ``mKb``: the exact
            decode ``s_b * q`` of ``nvfp4qk_fp8pv``'s NVFP4 Q/K, the forward's ``qk_bf16`` product)
            instead of the E4M3 one; ``mQ8`` / ``mK8`` are then not read (pass the BF16 tensors in
            their place), and the token scales are the per-head global scales broadcast per token.
            Without ``qk_bf16`` (E4M3 Q/K), ``mQb`` and ``mKb`` hold the BF16 images of the *scaled*
            payloads, ``BF16(q * row)`` and ``BF16(k * col2)``, and ``mRow`` and ``mCol2`` are not
            read (module docstring: where the token scales go).
    Raises:
        ValueError: head dim or tiles outside the supported ones.
    """

    def __init__(
        self,
        head_dim: int,
        qhead_per_kvhead: int,
        is_causal: bool,
        tile_m: int = 64,
        tile_n: int = 128,
        qk_bf16: bool = False,
    ):
        self.qk_bf16 = qk_bf16
        # causal: CTAs heaviest first within L2-sized sections of heads (module docstring); without a
        # causal mask every CTA has the same work, in FA4's grid order
        self.Scheduler = SingleTileLPTBwdScheduler if is_causal else SingleTileScheduler
        # fp8: the token scales in the BF16 dQ/dK operands, one dS; qk_bf16: on two scaled dS
        self.scales_in_operands = not qk_bf16
        if head_dim not in (64, 128):
            raise ValueError(f"FP8BackwardSm90: head dim must be 64 or 128, got {head_dim}")
        if (tile_m, tile_n) != (64, 128):
            raise ValueError(
                f"FP8BackwardSm90: tiles (tile_m, tile_n) must be (64, 128), got {(tile_m, tile_n)}"
            )
        super().__init__(
            cutlass.BFloat16,
            head_dim,
            head_dim,
            qhead_per_kvhead,
            is_causal=is_causal,
            tile_m=tile_m,
            tile_n=tile_n,
            Q_stage=2,
            dO_stage=2,
            PdS_stage=2,
            SdP_swapAB=True,
            dKV_swapAB=False,
            dQ_swapAB=False,
            AtomLayoutMSdP=1,
            AtomLayoutNdKV=2,
            AtomLayoutMdQ=1,
            num_threads=384,
        )
        assert self.mma_dkv_is_rs and self.num_wg_mma == 2
        # the per-query vectors loaded with each Q block: stat and r, and row where it scales dS
        self.n_q_vectors = 2 if self.scales_in_operands else 3

    OPERANDS = (
        "Q8",
        "Qb",
        "dO8",
        "dOt8",
        "K8",
        "Kb",
        "V8",
    )  # the TMA-loaded operands, in kernel argument order
    SMEM_TILES = (*OPERANDS, "dV", "PdS")  # their shared-memory layouts, the dV output tile's and dS's

    # ---- configuration -------------------------------------------------------------------------
    def _setup_attributes(self):
        bf16 = self.dtype
        stages = self.Q_stage
        self.sQ8_layout = sm90_utils.make_smem_layout(
            E4M3, LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_hdim), stages
        )
        # Q as the MN-major B operand of dK = dS^T Q (FA4's sQ layout)
        self.sQb_layout = sm90_utils.make_smem_layout(
            bf16, LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_hdim), stages, major_mode_size=self.tile_hdim
        )
        self.sdO8_layout = sm90_utils.make_smem_layout(
            E5M2, LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_hdim), stages
        )
        # dO^T, queries contiguous: the K-major B operand of dV = P^T dO (as the forward's V)
        self.sdOt8_layout = sm90_utils.make_smem_layout(
            E5M2, LayoutEnum.COL_MAJOR, (self.tile_m, self.tile_hdim), stages
        )
        self.sK8_layout = sm90_utils.make_smem_layout(
            E4M3, LayoutEnum.ROW_MAJOR, (self.tile_n, self.tile_hdim), None
        )
        # K as the MN-major B operand of dQ = dS K (FA4's sK layout); also the dK output tile
        self.sKb_layout = sm90_utils.make_smem_layout(
            bf16,
            LayoutEnum.ROW_MAJOR,
            (self.tile_n, self.tile_hdim),
            None,
            major_mode_size=self.tile_hdim // (self.num_wg_dQ // self.AtomLayoutMdQ),
        )
        self.sV8_layout = sm90_utils.make_smem_layout(
            E4M3, LayoutEnum.ROW_MAJOR, (self.tile_n, self.tile_hdim), None
        )
        # the dV output tile (MHA), in dS's bytes once the mainloop is done
        self.sdV_layout = sm90_utils.make_smem_layout(
            bf16, LayoutEnum.ROW_MAJOR, (self.tile_n, self.tile_hdim), None
        )
        self.sPdS_layout = sm90_utils.make_smem_layout(
            bf16,
            LayoutEnum.ROW_MAJOR,
            (self.tile_m, self.tile_n),
            stage=self.PdS_stage,
            major_mode_size=math.gcd(
                self.tile_n // (self.num_wg_mma // self.AtomLayoutMSdP), self.tile_n // self.AtomLayoutNdKV
            ),
        )
        assert cute.cosize(self.sdV_layout) <= cute.cosize(self.sPdS_layout)
        self.sdQaccum_layout = cute.make_layout(
            (self.tile_m * self.tile_hdim // self.num_wg_dQ, self.num_wg_dQ)
        )
        self.r2s_tiled_copy_dQaccum = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128),
            cute.make_layout((self.num_threads_per_warp_group, self.num_wg_dQ)),
            cute.make_layout(128 // Float32.width),
        )

    def _get_tiled_mma(self):
        k_major, mn_major = warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN
        # S^T = K Q^T and dP^T = V dO^T: keys on M (split over the two warpgroups), queries on N
        sdp = dict(atom_layout_mnk=(self.num_wg_mma, 1, 1), tiler_mn=(64, self.tile_m))
        s_dtype = self.dtype if self.qk_bf16 else E4M3
        tiled_mma_S = sm90_utils_basic.make_trivial_tiled_mma(
            s_dtype, s_dtype, k_major, k_major, Float32, **sdp
        )
        tiled_mma_dP = sm90_utils_basic.make_trivial_tiled_mma(E4M3, E5M2, k_major, k_major, Float32, **sdp)
        dkv = dict(atom_layout_mnk=(self.AtomLayoutNdKV, 1, 1), tiler_mn=(64, self.tile_hdim))
        tiled_mma_dV = sm90_utils_basic.make_trivial_tiled_mma(
            E4M3, E5M2, k_major, k_major, Float32, a_source=warpgroup.OperandSource.RMEM, **dkv
        )
        tiled_mma_dK = sm90_utils_basic.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, mn_major, Float32, a_source=warpgroup.OperandSource.RMEM, **dkv
        )
        tiled_mma_dQ = sm90_utils_basic.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            k_major,
            mn_major,
            Float32,
            atom_layout_mnk=(self.AtomLayoutMdQ, self.num_wg_dQ // self.AtomLayoutMdQ, 1),
            tiler_mn=(64, self.tile_hdim // (self.num_wg_dQ // self.AtomLayoutMdQ)),
        )
        return tiled_mma_S, tiled_mma_dP, tiled_mma_dK, tiled_mma_dV, tiled_mma_dQ

    def _get_shared_storage_cls(self):
        align = self.buffer_align_bytes

        def buf(dtype, layout):
            return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], align]

        vec = cute.round_up(self.tile_m, 64)
        stat_q = cute.struct.Align[cute.struct.MemRange[Float32, vec * self.Q_stage], 128]
        stat_do = cute.struct.Align[cute.struct.MemRange[Float32, vec * self.dO_stage], 128]
        # qk_bf16: no E4M3 Q/K tiles (S^T reads sQb and sKb)
        fp8_qk = not self.qk_bf16

        @cute.struct
        class SharedStorage:
            mbar_ptr_Q: cute.struct.MemRange[cutlass.Int64, self.Q_stage * 2]
            mbar_ptr_dO: cute.struct.MemRange[cutlass.Int64, self.dO_stage * 2]
            sStat: stat_q
            sR: stat_q
            sRow: stat_q
            sDelta: stat_do
            # sKb then sdS, contiguous: the FP32 dK/dV tile of the GQA epilogue spans both
            sKb: buf(self.dtype, self.sKb_layout)
            sdS: buf(self.dtype, self.sPdS_layout)
            sQb: buf(self.dtype, self.sQb_layout)
            if fp8_qk:
                sQ8: buf(E4M3, self.sQ8_layout)
                sK8: buf(E4M3, self.sK8_layout)
            sV8: buf(E4M3, self.sV8_layout)
            sdO8: buf(E5M2, self.sdO8_layout)
            sdOt8: buf(E5M2, self.sdOt8_layout)
            sdQaccum: cute.struct.Align[
                cute.struct.MemRange[Float32, cute.cosize(self.sdQaccum_layout)], align
            ]

        return SharedStorage

    @cute.jit
    def __call__(
        self,
        mQ8: cute.Tensor,
        mQb: cute.Tensor,
        mK8: cute.Tensor,
        mKb: cute.Tensor,
        mV8: cute.Tensor,
        mdO8: cute.Tensor,
        mdOt8: cute.Tensor,
        mStat: cute.Tensor,
        mR: cute.Tensor,
        mRow: cute.Tensor,
        mDelta: cute.Tensor,
        mCol: cute.Tensor,
        mCol2: cute.Tensor,
        mSdo: cute.Tensor,
        mVScale: cute.Tensor,
        mdQaccum: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: Float32,
        stream,
    ):
        """mQ8 / mQb ``(B, Sq, Hq, D)`` E4M3 / BF16 (the same values), mK8 / mKb / mV8 ``(B, Sk, Hkv, D)``
        E4M3 / BF16 / E4M3 (V in key order), mdO8 ``(B, Sq, Hq, D)`` E5M2, mdOt8 ``(B, Sq16, Hq, D)``
        E5M2 with stride 1 along Sq16 (dO^T, queries permuted within 16), mStat / mR / mRow / mDelta
        ``(B, Hq, Sq_pad)`` FP32 (``Sq_pad`` = Sq rounded up to tile_m; mRow = Q token scale * 2^-LIFT),
        mCol / mCol2 ``(B, Hkv, Sk)`` FP32 (K token scale, and times 2^-LIFT), mSdo ``(B, Hq)``,
        mVScale ``(B, Hkv, D)``, mdQaccum ``(B, Hq, Sq_pad * D)`` FP32 zeros, mdK / mdV ``(B, Sk, Hkv,
        D)`` BF16 (MHA) or ``(B, Hkv, Sk_pad * D)`` FP32 zeros (GQA)."""
        self.varlen_k = False
        self.is_varlen_q = False
        self.use_block_sparsity = False
        self.spt = False
        mQ8, mQb, mK8, mKb, mV8, mdO8, mStat, mR, mRow, mDelta, mdQaccum = [
            assume_tensor_aligned(t)
            for t in (mQ8, mQb, mK8, mKb, mV8, mdO8, mStat, mR, mRow, mDelta, mdQaccum)
        ]
        mQ8, mQb, mK8, mKb, mV8, mdO8, mdOt8 = [
            layout_utils.select(t, [1, 3, 2, 0]) for t in (mQ8, mQb, mK8, mKb, mV8, mdO8, mdOt8)
        ]
        if const_expr(self.qhead_per_kvhead == 1):
            mdK, mdV = [layout_utils.select(t, [1, 3, 2, 0]) for t in (mdK, mdV)]
        else:
            mdK, mdV = [layout_utils.select(t, [2, 1, 0]) for t in (mdK, mdV)]
        mStat, mR, mRow, mDelta, mdQaccum, mCol, mCol2, mVScale = [
            layout_utils.select(t, [2, 1, 0])
            for t in (mStat, mR, mRow, mDelta, mdQaccum, mCol, mCol2, mVScale)
        ]
        mSdo = layout_utils.select(mSdo, [1, 0])
        tiled_mmas = self._get_tiled_mma()
        self.num_mma_threads = tiled_mmas[0].size
        self.num_threads_per_warp_group = 128
        self.num_producer_threads = 32
        self.num_mma_regs, self.num_producer_regs = 240, 24
        self._setup_attributes()
        SharedStorage = self._get_shared_storage_cls()
        nbytes = cute.size_in_bytes
        tile2 = partial(cute.select, mode=[0, 1])
        q8_bytes = 0 if self.qk_bf16 else nbytes(E4M3, tile2(self.sQ8_layout))
        k8_bytes = 0 if self.qk_bf16 else nbytes(E4M3, self.sK8_layout)
        self.tma_copy_bytes = {
            "Q": q8_bytes + nbytes(self.dtype, tile2(self.sQb_layout)),
            "dO": 2 * nbytes(E5M2, tile2(self.sdO8_layout)),
            "K": k8_bytes + nbytes(self.dtype, self.sKb_layout),
            "V": nbytes(E4M3, self.sV8_layout),
            "vec": self.tile_m * 4,
            "dQ": self.tile_m * self.tile_hdim * 4 // self.num_wg_dQ,
            "dKacc": self.tile_n * self.tile_hdim * 4,
            "dVacc": self.tile_n * self.tile_hdimv * 4,
        }
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        atoms = {}
        tensors = {}
        for name, m, layout, tile in (
            ("Q8", mQ8, self.sQ8_layout, (self.tile_m, self.tile_hdim)),
            ("Qb", mQb, self.sQb_layout, (self.tile_m, self.tile_hdim)),
            ("dO8", mdO8, self.sdO8_layout, (self.tile_m, self.tile_hdim)),
            ("dOt8", mdOt8, self.sdOt8_layout, (self.tile_m, self.tile_hdim)),
            ("K8", mK8, self.sK8_layout, (self.tile_n, self.tile_hdim)),
            ("Kb", mKb, self.sKb_layout, (self.tile_n, self.tile_hdim)),
            ("V8", mV8, self.sV8_layout, (self.tile_n, self.tile_hdim)),
        ):
            if const_expr(self.qk_bf16 and name in ("Q8", "K8")):
                continue  # not read: the kernel's Q8/K8 arguments are the BF16 images' aliases
            atoms[name], tensors[name] = cpasync.make_tiled_tma_atom(g2s, m, tile2(layout), tile)
        if const_expr(self.qk_bf16):
            for name in ("Q", "K"):
                atoms[f"{name}8"], tensors[f"{name}8"] = atoms[f"{name}b"], tensors[f"{name}b"]
        tma_atom_dK = tma_atom_dV = None
        if const_expr(self.qhead_per_kvhead == 1):
            s2g = cpasync.CopyBulkTensorTileS2GOp()
            tma_atom_dK, mdK = cpasync.make_tiled_tma_atom(
                s2g, mdK, self.sKb_layout, (self.tile_n, self.tile_hdim)
            )
            tma_atom_dV, mdV = cpasync.make_tiled_tma_atom(
                s2g, mdV, self.sdV_layout, (self.tile_n, self.tile_hdim)
            )
        sched_args = TileSchedulerArguments(
            cute.ceil_div(cute.size(mK8.shape[0]), self.tile_n),
            cute.size(mQ8.shape[2]),
            cute.size(mK8.shape[3]),
            1,
            cute.size(mQ8.shape[0]),
            mQ8.shape[1],
            mV8.shape[1],
            total_q=cute.size(mK8.shape[0]) * cute.size(mK8.shape[3]),
            tile_shape_mn=(self.tile_n, self.tile_m),
            # the L2 section's size (causal): FA4's bytes per head, seqlen * (2 * D) * element_size +
            # seqlen * D * 4 (its dQ accumulator), with 2 for our Q8 + Qb + dO8 + dO^T's 5 bytes per
            # element: 4 MiB per head at S4096 D128, 8 heads per section
            element_size=2,
            is_persistent=False,
            lpt=False,  # causal: the KV blocks from the first (heaviest) on
        )
        sched_params = self.Scheduler.to_underlying_arguments(sched_args)
        group_divmod = None
        if const_expr(self.qhead_per_kvhead > 1):
            group_divmod = FastDivmodDivisorV2(self.qhead_per_kvhead)
        self.kernel(
            *[tensors[n] for n in self.OPERANDS],
            *[atoms[n] for n in self.OPERANDS],
            mStat,
            mR,
            mRow,
            mDelta,
            mCol,
            mCol2,
            mSdo,
            mVScale,
            mdQaccum,
            mdK,
            mdV,
            tma_atom_dK,
            tma_atom_dV,
            *[getattr(self, f"s{n}_layout") for n in self.SMEM_TILES],
            self.sdQaccum_layout,
            self.r2s_tiled_copy_dQaccum,
            tiled_mmas,
            softmax_scale,
            group_divmod,
            sched_params,
            SharedStorage,
        ).launch(
            grid=self.Scheduler.get_grid_shape(sched_params),
            block=[self.num_threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        mQ8: cute.Tensor,
        mQb: cute.Tensor,
        mdO8: cute.Tensor,
        mdOt8: cute.Tensor,
        mK8: cute.Tensor,
        mKb: cute.Tensor,
        mV8: cute.Tensor,
        tma_atom_Q8: cute.CopyAtom,
        tma_atom_Qb: cute.CopyAtom,
        tma_atom_dO8: cute.CopyAtom,
        tma_atom_dOt8: cute.CopyAtom,
        tma_atom_K8: cute.CopyAtom,
        tma_atom_Kb: cute.CopyAtom,
        tma_atom_V8: cute.CopyAtom,
        mStat: cute.Tensor,
        mR: cute.Tensor,
        mRow: cute.Tensor,
        mDelta: cute.Tensor,
        mCol: cute.Tensor,
        mCol2: cute.Tensor,
        mSdo: cute.Tensor,
        mVScale: cute.Tensor,
        mdQaccum: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        tma_atom_dK,
        tma_atom_dV,
        sQ8_layout: cute.ComposedLayout,
        sQb_layout: cute.ComposedLayout,
        sdO8_layout: cute.ComposedLayout,
        sdOt8_layout: cute.ComposedLayout,
        sK8_layout: cute.ComposedLayout,
        sKb_layout: cute.ComposedLayout,
        sV8_layout: cute.ComposedLayout,
        sdV_layout: cute.ComposedLayout,
        sPdS_layout: cute.ComposedLayout,
        sdQaccum_layout: cute.Layout,
        r2s_tiled_copy_dQaccum: cute.TiledCopy,
        tiled_mmas,
        softmax_scale: Float32,
        group_divmod,
        sched_params,
        SharedStorage: cutlass.Constexpr,
    ):
        names = self.OPERANDS
        tensors = dict(zip(names, (mQ8, mQb, mdO8, mdOt8, mK8, mKb, mV8)))
        atoms = dict(
            zip(
                names,
                (
                    tma_atom_Q8,
                    tma_atom_Qb,
                    tma_atom_dO8,
                    tma_atom_dOt8,
                    tma_atom_K8,
                    tma_atom_Kb,
                    tma_atom_V8,
                ),
            )
        )
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (*atoms.values(), tma_atom_dK, tma_atom_dV):
                if const_expr(atom is not None):
                    cpasync.prefetch_descriptor(atom)
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        producer = cutlass.pipeline.CooperativeGroup(cutlass.pipeline.Agent.Thread)
        consumers = cutlass.pipeline.CooperativeGroup(
            cutlass.pipeline.Agent.Thread, self.num_mma_threads // 32
        )
        pipeline_Q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_ptr_Q.data_ptr(),
            num_stages=self.Q_stage,
            producer_group=producer,
            consumer_group=consumers,
            tx_count=self.tma_copy_bytes["Q"] + self.n_q_vectors * self.tma_copy_bytes["vec"],
            defer_sync=True,
        )
        pipeline_dO = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_ptr_dO.data_ptr(),
            num_stages=self.dO_stage,
            producer_group=producer,
            consumer_group=consumers,
            tx_count=self.tma_copy_bytes["dO"] + self.tma_copy_bytes["vec"],
            defer_sync=False,
        )

        def get(field, layout):
            return field.get_tensor(layout.outer, swizzle=layout.inner)

        smem_t = dict(
            Qb=get(storage.sQb, sQb_layout),
            dO8=get(storage.sdO8, sdO8_layout),
            dOt8=get(storage.sdOt8, sdOt8_layout),
            Kb=get(storage.sKb, sKb_layout),
            V8=get(storage.sV8, sV8_layout),
        )
        if const_expr(self.qk_bf16):  # S^T = K Q^T on the BF16 tiles
            smem_t["Q8"], smem_t["K8"] = smem_t["Qb"], smem_t["Kb"]
        else:
            smem_t["Q8"], smem_t["K8"] = get(storage.sQ8, sQ8_layout), get(storage.sK8, sK8_layout)
        vec = cute.round_up(self.tile_m, 64)
        sStat, sR, sRow = [
            f.get_tensor(cute.make_layout((self.tile_m, self.Q_stage), stride=(1, vec)))
            for f in (storage.sStat, storage.sR, storage.sRow)
        ]
        sDelta = storage.sDelta.get_tensor(cute.make_layout((self.tile_m, self.dO_stage), stride=(1, vec)))
        sdS = get(storage.sdS, sPdS_layout)
        sdV = get(storage.sdS, sdV_layout)
        sdQaccum = storage.sdQaccum.get_tensor(sdQaccum_layout)
        block_info = BlockInfo(self.tile_m, self.tile_n, self.is_causal, False, False, None, None)
        SeqlenInfoCls = partial(
            SeqlenInfoQK.create,
            seqlen_q_static=tensors["Q8"].shape[0],
            seqlen_k_static=tensors["K8"].shape[0],
            tile_m=self.tile_m,
            tile_n=self.tile_n,
        )
        TileSchedulerCls = partial(self.Scheduler.create, sched_params)
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            if warp_idx == 0:
                self.load_fp8(
                    tensors,
                    atoms,
                    smem_t,
                    mStat,
                    mR,
                    mRow,
                    mDelta,
                    sStat,
                    sR,
                    sRow,
                    sDelta,
                    pipeline_Q,
                    pipeline_dO,
                    block_info,
                    SeqlenInfoCls,
                    TileSchedulerCls,
                )
            if warp_idx == 1:
                self.dQaccum_store(mdQaccum, sdQaccum, block_info, TileSchedulerCls, SeqlenInfoCls)
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            tidx, _, _ = cute.arch.thread_idx()
            self.mma_fp8(
                tiled_mmas,
                smem_t,
                sStat,
                sR,
                sRow,
                sDelta,
                sdS,
                sdV,
                sdQaccum,
                r2s_tiled_copy_dQaccum,
                mCol,
                mCol2,
                mSdo,
                mVScale,
                mdK,
                mdV,
                tma_atom_dK,
                tma_atom_dV,
                pipeline_Q,
                pipeline_dO,
                tidx - 128,
                softmax_scale,
                group_divmod,
                block_info,
                SeqlenInfoCls,
                TileSchedulerCls,
            )

    @cute.jit
    def _start(self, user_type, TileSchedulerCls):
        """The Q and dO pipeline states of a producer or consumer, the scheduler and its first tile."""
        state_Q = cutlass.pipeline.make_pipeline_state(user_type, self.Q_stage)
        state_dO = cutlass.pipeline.make_pipeline_state(user_type, self.dO_stage)
        tile_scheduler = TileSchedulerCls()
        return state_Q, state_dO, tile_scheduler, tile_scheduler.initial_work_tile_info()

    # ---- producer warp -------------------------------------------------------------------------
    @cute.jit
    def load_fp8(
        self,
        tensors: dict,
        atoms: dict,
        smem_t: dict,
        mStat: cute.Tensor,
        mR: cute.Tensor,
        mRow: cute.Tensor,
        mDelta: cute.Tensor,
        sStat: cute.Tensor,
        sR: cute.Tensor,
        sRow: cute.Tensor,
        sDelta: cute.Tensor,
        pipeline_Q,
        pipeline_dO,
        block_info: BlockInfo,
        SeqlenInfoCls,
        TileSchedulerCls,
    ):
        """TMA loads: the CTA's K (E4M3 and BF16; BF16 only with ``qk_bf16``) and V once; per query
        block Q (likewise) and the per-query stat, r (and row, with ``qk_bf16``) on pipeline_Q; dO
        and dO^T (E5M2) and D on pipeline_dO."""
        state_Q, state_dO, tile_scheduler, work_tile = self._start(
            cutlass.pipeline.PipelineUserType.Producer, TileSchedulerCls
        )
        while work_tile.is_valid_tile:
            n_block, head_idx, batch_idx, _ = work_tile.tile_idx
            seqlen = SeqlenInfoCls(batch_idx)
            head_kv = head_idx // self.qhead_per_kvhead
            kv_fns = []
            for name in ("K8", "Kb", "V8"):
                g = cute.local_tile(
                    tensors[name][None, None, head_kv, batch_idx], (self.tile_n, self.tile_hdim), (n_block, 0)
                )
                fn, _, _ = copy_utils.tma_get_copy_fn(
                    atoms[name], 0, cute.make_layout(1), g, smem_t[name], single_stage=True
                )
                kv_fns.append(fn)
            load_K8, load_Kb, load_V8 = kv_fns
            q_fns = []
            for name, pipe in (
                ("Q8", pipeline_Q),
                ("Qb", pipeline_Q),
                ("dO8", pipeline_dO),
                ("dOt8", pipeline_dO),
            ):
                g = cute.local_tile(
                    tensors[name][None, None, head_idx, batch_idx], (self.tile_m, self.tile_hdim), (None, 0)
                )
                fn, _, _ = copy_utils.tma_get_copy_fn(atoms[name], 0, cute.make_layout(1), g, smem_t[name])
                q_fns.append(copy_utils.tma_producer_copy_fn(fn, pipe))
            vec_fns = []
            for m, s, pipe in (
                (mStat, sStat, pipeline_Q),
                (mR, sR, pipeline_Q),
                (mRow, sRow, pipeline_Q),
                (mDelta, sDelta, pipeline_dO),
            ):
                g = cute.local_tile(m[None, head_idx, batch_idx], (self.tile_m,), (None,))
                vec_fns.append(
                    copy_utils.tma_producer_copy_fn(copy_utils.cpasync_bulk_get_copy_fn(g, s), pipe)
                )
            m_block_min, m_block_max = block_info.get_m_block_min_max(seqlen, n_block)
            for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
                first = m_block == m_block_min
                if first:
                    pipeline_Q.producer_acquire(state_Q, extra_tx_count=self.tma_copy_bytes["K"])
                    if const_expr(not self.qk_bf16):
                        load_K8(tma_bar_ptr=pipeline_Q.producer_get_barrier(state_Q))
                    load_Kb(tma_bar_ptr=pipeline_Q.producer_get_barrier(state_Q))
                else:
                    pipeline_Q.producer_acquire(state_Q)
                if const_expr(not self.qk_bf16):
                    q_fns[0](m_block, producer_state=state_Q)
                q_fns[1](m_block, producer_state=state_Q)
                for f in vec_fns[: self.n_q_vectors]:  # stat, r (and row on dS)
                    f(m_block, producer_state=state_Q)
                if first:
                    pipeline_dO.producer_acquire(state_dO, extra_tx_count=self.tma_copy_bytes["V"])
                    load_V8(tma_bar_ptr=pipeline_dO.producer_get_barrier(state_dO))
                else:
                    pipeline_dO.producer_acquire(state_dO)
                q_fns[2](m_block, producer_state=state_dO)
                q_fns[3](m_block, producer_state=state_dO)
                vec_fns[3](m_block, producer_state=state_dO)
                state_Q.advance()
                state_dO.advance()
            tile_scheduler.prefetch_next_work()
            tile_scheduler.advance_to_next_work()
            work_tile = tile_scheduler.get_current_work()

    # ---- consumer warpgroups -----------------------------------------------------------------
    @cute.jit
    def mma_fp8(
        self,
        tiled_mmas,
        smem_t: dict,
        sStat: cute.Tensor,
        sR: cute.Tensor,
        sRow: cute.Tensor,
        sDelta: cute.Tensor,
        sdS: cute.Tensor,
        sdV: cute.Tensor,
        sdQaccum: cute.Tensor,
        r2s_tiled_copy_dQaccum: cute.TiledCopy,
        mCol: cute.Tensor,
        mCol2: cute.Tensor,
        mSdo: cute.Tensor,
        mVScale: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        tma_atom_dK,
        tma_atom_dV,
        pipeline_Q,
        pipeline_dO,
        tidx: Int32,
        softmax_scale: Float32,
        group_divmod,
        block_info: BlockInfo,
        SeqlenInfoCls,
        TileSchedulerCls,
    ):
        tiled_mma_S, tiled_mma_dP, tiled_mma_dK, tiled_mma_dV, tiled_mma_dQ = tiled_mmas
        wg_idx = cute.arch.make_warp_uniform(tidx // self.num_threads_per_warp_group)
        wg_layout = cute.make_layout(self.num_wg_mma, stride=self.num_threads_per_warp_group)
        thr_mma_S = tiled_mma_S.get_slice(tidx)
        thr_mma_dV = tiled_mma_dV.get_slice(tidx)
        wg_S = tiled_mma_S.get_slice(wg_layout(wg_idx))
        wg_dP = tiled_mma_dP.get_slice(wg_layout(wg_idx))
        wg_dK = tiled_mma_dK.get_slice(wg_layout(wg_idx))
        wg_dV = tiled_mma_dV.get_slice(wg_layout(wg_idx))
        wg_dQ = tiled_mma_dQ.get_slice(wg_layout(wg_idx))
        # S^T = K Q^T (swapped: K is the A operand)
        _, tSrQ, tSrK = sm90_utils.partition_fragment_ABC(
            wg_S, (self.tile_m, self.tile_n, self.tile_hdim), smem_t["Q8"], smem_t["K8"], swap_AB=True
        )
        # dP^T = V dO^T
        _, tdPrdO, tdPrV = sm90_utils.partition_fragment_ABC(
            wg_dP, (self.tile_m, self.tile_n, self.tile_hdim), smem_t["dO8"], smem_t["V8"], swap_AB=True
        )
        mma_dp = partial(
            sm90_utils.gemm_zero_init, tiled_mma_dP, (self.tile_m, self.tile_n), tdPrdO, tdPrV, swap_AB=True
        )
        # dV += P^T dO: P^T from registers, dO^T (queries contiguous) as the K-major B operand
        acc_dV, tdVrPt, tdVrdOt = sm90_utils.partition_fragment_ABC(
            wg_dV,
            (self.tile_n, self.tile_hdim, self.tile_m),
            None,
            layout_utils.transpose_view(smem_t["dOt8"]),
        )
        # dK += dS^T Q (BF16): dS^T from registers, Q^T view (MN-major)
        acc_dK, _, tdKrQt = sm90_utils.partition_fragment_ABC(
            wg_dK, (self.tile_n, self.tile_hdim, self.tile_m), None, layout_utils.transpose_view(smem_t["Qb"])
        )
        # dQ = dS K (BF16): dS from shared memory, K^T view (MN-major)
        _, tdQrdS, tdQrKt = sm90_utils.partition_fragment_ABC(
            wg_dQ, (self.tile_m, self.tile_hdim, self.tile_n), sdS, layout_utils.transpose_view(smem_t["Kb"])
        )
        mma_dq = partial(
            sm90_utils.gemm_zero_init, tiled_mma_dQ, (self.tile_m, self.tile_hdim), tdQrdS, tdQrKt
        )
        copy_dS_r2s, _, _ = copy_utils.get_smem_store_C(
            tiled_mma_S,
            layout_utils.transpose_view(sdS),
            tidx,
            transpose=True,
            position_independent=True,
            major_mode_size=self.tile_n // self.num_wg_mma,
        )
        vec_part = partial(
            layout_utils.mma_partition_C_vec, thr_mma=thr_mma_S, expand_shape=self.tile_n, is_colvec=False
        )
        tStat, tR, tRow, tDelta = [vec_part(s) for s in (sStat, sR, sRow, sDelta)]
        smem_thr_copy_dQaccum = r2s_tiled_copy_dQaccum.get_slice(tidx)
        tdQsdQaccum = smem_thr_copy_dQaccum.partition_D(sdQaccum)
        PdS_barrier = cutlass.pipeline.NamedBarrier(
            barrier_id=int(NamedBarrierBwd.PdS), num_threads=self.num_mma_threads
        )
        # coordinates (key, query) of this thread's S^T elements, viewed [query, key]
        tScS_mn = layout_utils.reshape_acc_to_mn(
            thr_mma_S.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m))), transpose=True
        )
        tdVcdV_mn = layout_utils.reshape_acc_to_mn(
            thr_mma_dV.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_hdim)))
        )
        n_keys = cute.size(tScS_mn, mode=[1])

        state_Q, state_dO, tile_scheduler, work_tile = self._start(
            cutlass.pipeline.PipelineUserType.Consumer, TileSchedulerCls
        )
        while work_tile.is_valid_tile:
            n_block, head_idx, batch_idx, _ = work_tile.tile_idx
            seqlen = SeqlenInfoCls(batch_idx)
            head_kv = head_idx // self.qhead_per_kvhead
            # this thread's K token scales (clamped past the last key, whose scores are masked);
            # a NaN scale (a K row holding a NaN/Inf) is taken as 1 as in the forward. qk_bf16: the
            # head's one K global scale, folded into r per query block (fwd_sm90.fold_k_scale)
            col = cute.make_rmem_tensor(1 if const_expr(self.qk_bf16) else n_keys, Float32)
            col2 = cute.make_rmem_tensor(1 if const_expr(self.scales_in_operands) else n_keys, Float32)
            k_last = seqlen.seqlen_k - 1
            if const_expr(self.qk_bf16):
                col[0] = mCol[0, head_kv, batch_idx]
            for c in cutlass.range(n_keys, unroll_full=True):
                k_idx = cutlass.min(n_block * self.tile_n + tScS_mn[0, c][0], k_last)
                if const_expr(not self.qk_bf16):
                    col[c] = mCol[k_idx, head_kv, batch_idx]
                    col[c] = Float32(1.0) if col[c] != col[c] else col[c]
                if const_expr(not self.scales_in_operands):
                    col2[c] = mCol2[k_idx, head_kv, batch_idx]
            mask = AttentionMask(self.tile_m, self.tile_n, seqlen, swap_AB=True)
            mask_fn = partial(
                mask.apply_mask,
                batch_idx=batch_idx,
                head_idx=head_idx,
                n_block=n_block,
                thr_mma=thr_mma_S,
                mask_seqlen=True,
                mask_causal=self.is_causal,
            )
            s_do = mSdo[head_idx, batch_idx]
            m_block_min, m_block_max = block_info.get_m_block_min_max(seqlen, n_block)
            step = partial(
                self.mma_one_m_block_fp8,
                tiled_mma_S=tiled_mma_S,
                tSrQ=tSrQ,
                tSrK=tSrK,
                mma_dp=mma_dp,
                tiled_mma_dV=tiled_mma_dV,
                acc_dV=acc_dV,
                tdVrPt=tdVrPt,
                tdVrdOt=tdVrdOt,
                tiled_mma_dK=tiled_mma_dK,
                acc_dK=acc_dK,
                tdKrQt=tdKrQt,
                mma_dq=mma_dq,
                copy_dS_r2s=copy_dS_r2s,
                tStat=tStat,
                tR=tR,
                tRow=tRow,
                tDelta=tDelta,
                col=col,
                col2=col2,
                s_do=s_do,
                tdQsdQaccum=tdQsdQaccum,
                pipeline_Q=pipeline_Q,
                pipeline_dO=pipeline_dO,
                PdS_barrier=PdS_barrier,
                wg_idx=wg_idx,
                mask_fn=mask_fn,
            )
            state_Q, state_dO = step(m_block_min, state_Q, state_dO, dKV_accumulate=False)
            for m_block in cutlass.range(m_block_min + 1, m_block_max, unroll=1):
                state_Q, state_dO = step(m_block, state_Q, state_dO, dKV_accumulate=True)
            self._dq_tile_full(wg_idx)  # the last query block's dQ tile
            # epilogue scales: dK by softmax_scale; dV by s_do 2^-LIFT / v_scale (per channel, a power of two)
            acc_dK.store(acc_dK.load() * softmax_scale)
            acc_dV_mn = layout_utils.reshape_acc_to_mn(acc_dV)
            dv_scale = cute.make_rmem_tensor(cute.size(tdVcdV_mn, mode=[1]), Float32)
            for c in cutlass.range(cute.size(dv_scale), unroll_full=True):
                dv_scale[c] = s_do * Float32(2.0**-LIFT) / mVScale[tdVcdV_mn[0, c][1], head_kv, batch_idx]
            for r in cutlass.range_constexpr(cute.size(acc_dV_mn, mode=[0])):
                for c in cutlass.range(cute.size(dv_scale), unroll_full=True):
                    acc_dV_mn[r, c] = acc_dV_mn[r, c] * dv_scale[c]
            self.epilogue_dKV(
                acc_dV,
                mdV,
                sdV if const_expr(self.qhead_per_kvhead == 1) else smem_t["Kb"],
                acc_dK,
                mdK,
                smem_t["Kb"],
                seqlen,
                tma_atom_dK,
                tma_atom_dV,
                tiled_mma_dK,
                tiled_mma_dV,
                tidx,
                n_block,
                head_idx,
                batch_idx,
                group_divmod,
            )
            tile_scheduler.advance_to_next_work()
            work_tile = tile_scheduler.get_current_work()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 4:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _dq_tile_full(self, wg_idx):
        """Hand this warpgroup's dQ tile in shared memory to the dQ warp: the proxy fence that
        orders its stores before the bulk reduce's reads, then the dQFull arrival."""
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(
            barrier_id=int(NamedBarrierBwd.dQFullWG0) + wg_idx,
            number_of_threads=self.num_threads_per_warp_group + cute.arch.WARP_SIZE,
        )

    @cute.jit
    def mma_one_m_block_fp8(
        self,
        m_block: Int32,
        state_Q,
        state_dO,
        dKV_accumulate,
        tiled_mma_S,
        tSrQ,
        tSrK,
        mma_dp,
        tiled_mma_dV,
        acc_dV,
        tdVrPt,
        tdVrdOt,
        tiled_mma_dK,
        acc_dK,
        tdKrQt,
        mma_dq,
        copy_dS_r2s,
        tStat,
        tR,
        tRow,
        tDelta,
        col,
        col2,
        s_do,
        tdQsdQaccum,
        pipeline_Q,
        pipeline_dO,
        PdS_barrier,
        wg_idx,
        mask_fn,
    ):
        """One query block: S^T, P^T, dV, dP^T, dS^T, dQ, dK (module docstring)."""
        idx_Q = state_Q.index
        idx_dO = state_dO.index
        pipeline_Q.consumer_wait(state_Q, pipeline_Q.consumer_try_wait(state_Q))
        pipeline_dO.consumer_wait(state_dO, pipeline_dO.consumer_try_wait(state_dO))
        # S^T (the head dim's k32 products chained inside the MMA, as the forward's QK) and dP^T in
        # flight together; the softmax of S^T runs while dP^T finishes
        acc_S = sm90_utils.gemm_zero_init(
            tiled_mma_S, (self.tile_n, self.tile_m), tSrK, tSrQ, B_idx=idx_Q, wg_wait=-1
        )
        acc_dP = mma_dp(A_idx=idx_dO, wg_wait=-1)
        if const_expr(dKV_accumulate):
            # the last block's dQ tile, stored at the end of that block: its stores have drained by
            # now, so the proxy fence before the dQ warp's bulk reduce no longer waits for them
            self._dq_tile_full(wg_idx)
        warpgroup.wait_group(1)  # S^T done
        mask_fn(acc_S, m_block=m_block)
        stat = copy_utils.load_s2r(tStat[None, idx_Q])
        r_q = copy_utils.load_s2r(tR[None, idx_Q])
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S, transpose=True)
        if const_expr(self.qk_bf16):  # the head's K scale in r, as the forward's row factor
            for r in cutlass.range_constexpr(cute.size(r_q)):
                r_q[r] = fold_k_scale(r_q[r], col[0])
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                for c in cutlass.range(cute.size(acc_S_mn, mode=[1]), unroll_full=True):
                    acc_S_mn[r, c] = cute.math.exp2(acc_S_mn[r, c] * r_q[r] + stat[r], fastmath=True)
        else:
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                for c in cutlass.range(cute.size(acc_S_mn, mode=[1]), unroll_full=True):
                    acc_S_mn[r, c] = cute.math.exp2(
                        (acc_S_mn[r, c] * col[c]) * r_q[r] + stat[r], fastmath=True
                    )
        # P^T (lifted) -> E4M3 A operand of dV, in the accumulator's column order
        p_to_e4m3_operand(acc_S, tdVrPt)
        sm90_utils.gemm_w_idx(
            tiled_mma_dV, acc_dV, tdVrPt, tdVrdOt, not dKV_accumulate, B_idx=idx_dO, wg_wait=-1
        )
        warpgroup.wait_group(1)  # dP^T done (dV may still run)
        delta = copy_utils.load_s2r(tDelta[None, idx_dO])
        acc_dP_mn = layout_utils.reshape_acc_to_mn(acc_dP, transpose=True)
        if const_expr(self.scales_in_operands):
            # one BF16 dS (lifted by 2^LIFT) for both products: the token scales are in Qb and Kb
            for r in cutlass.range_constexpr(cute.size(acc_dP_mn, mode=[0])):
                for c in cutlass.range(cute.size(acc_dP_mn, mode=[1]), unroll_full=True):
                    acc_dP_mn[r, c] = acc_S_mn[r, c] * (acc_dP_mn[r, c] * s_do - delta[r])
            tdKrdS = fa_utils.cvt_f16(layout_utils.reshape_acc_to_frgA(acc_dP), self.dtype)
            copy_dS_r2s(tdKrdS, dst_idx=idx_Q)
        else:
            row = copy_utils.load_s2r(tRow[None, idx_Q])
            acc_dQs = cute.make_fragment_like(acc_dP, Float32)
            acc_dQs_mn = layout_utils.reshape_acc_to_mn(acc_dQs, transpose=True)
            for r in cutlass.range_constexpr(cute.size(acc_dP_mn, mode=[0])):
                for c in cutlass.range(cute.size(acc_dP_mn, mode=[1]), unroll_full=True):
                    x = acc_S_mn[r, c] * (acc_dP_mn[r, c] * s_do - delta[r])  # 2^LIFT dS
                    acc_dP_mn[r, c] = x * row[r]  # row = Q scale * 2^-LIFT
                    acc_dQs_mn[r, c] = x * col2[c]  # col2 = K scale * 2^-LIFT
            tdKrdS = fa_utils.cvt_f16(layout_utils.reshape_acc_to_frgA(acc_dP), self.dtype)
            tdQrdS_cvt = fa_utils.cvt_f16(layout_utils.reshape_acc_to_frgA(acc_dQs), self.dtype)
            copy_dS_r2s(tdQrdS_cvt, dst_idx=idx_Q)
        cute.arch.fence_view_async_shared()
        PdS_barrier.arrive_and_wait()
        acc_dQ = mma_dq(A_idx=idx_Q, wg_wait=1)  # dV done
        pipeline_dO.consumer_release(state_dO)
        sm90_utils.gemm_w_idx(
            tiled_mma_dK, acc_dK, tdKrdS, tdKrQt, not dKV_accumulate, B_idx=idx_Q, wg_wait=1
        )
        cute.arch.barrier(
            barrier_id=int(NamedBarrierBwd.dQEmptyWG0) + wg_idx,
            number_of_threads=self.num_threads_per_warp_group + cute.arch.WARP_SIZE,
        )
        cute.autovec_copy(cute.make_tensor(acc_dQ.iterator, cute.make_layout(tdQsdQaccum.shape)), tdQsdQaccum)
        warpgroup.wait_group(0)
        pipeline_Q.consumer_release(state_Q)
        state_Q.advance()
        state_dO.advance()
        return state_Q, state_dO
