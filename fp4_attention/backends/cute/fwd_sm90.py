"""CuTe DSL forward kernel of the ``fp8`` recipe for Hopper (sm_90a): FP8 QK and FP8 PV on QGMMA;
with ``qk_bf16`` the ``nvfp4qk_fp8pv`` recipe: the QK product on the exact BF16 decode of NVFP4
Q/K (HGMMA, Hopper has no FP4 MMA), PV as in ``fp8``.

What is ours and what is FA4's
------------------------------
The kernel class derives from flash-attn-4's Hopper BF16 forward (``FlashAttentionForwardSm90``)
and keeps its machinery: the TMA producer warp (``load``), the Q/K/V mbarrier pipelines, the tile
schedulers (longest-first for causal), the causal/seqlen masks, the warp-scheduler barriers that
ping-pong the two consumer warpgroups, and the TMA epilogue. Ours are the parts that make it the
``fp8`` recipe of ``precision-contract.md`` §1-2 (the consumer mainloop, ``mma``):

* QK is an E4M3 x E4M3 wgmma (K-major both). The score of key j for query i, in log2 units, is
  ``z = (t_ij * col_j) * r_i`` with ``t`` the MMA dot, ``col`` the K token scale and
  ``r = row * softmax_scale * log2 e`` (``row`` the Q token scale, times the kernel's scalar
  argument ``qk_scale_log2`` as each work tile starts); the row max is taken of
  ``t * col`` and scaled once (``r > 0``), and ``P = exp2(fma(t * col, r, LIFT - m))`` is one FFMA
  and one MUFU.EX2, lifted by 2^LIFT (LIFT = 8) into [0, 256] (contract §2). ``qk_bf16``
  (``nvfp4qk_fp8pv``): K's scale is one global scale per head, so it is folded into the row
  factor instead, ``z = t * fold_k_scale(r_i, g_k)``, and the scores take no per-element multiply
  (the backward scores the same way).
* P leaves the FP32 accumulator as E4M3 (``cvt.rn.satfinite.e4m3x2.f32``) straight into the
  register A operand of the PV wgmma, with no shuffle: the wgmma accumulator of a thread holds
  columns {2q, 2q+1, 8+2q, 9+2q} of each 16, where the 8-bit A fragment wants k = 4q..4q+3. The
  kernel feeds its registers in that order and V's keys are permuted to match by the V quantizer
  (``pv_layout.V_PERM16``: within every 16 keys, slot k holds key ``V_PERM16[k]``); PV sums over
  keys, so the product is unchanged.
* V is E4M3 stored transposed ``[B, Hkv, D, Sk16]`` (keys contiguous, permuted as above, padded to
  a multiple of 16): the K-major layout the FP8 B operand needs, TMA-loaded into a column-major
  (MN-major) shared tile.
* FP32 promotion: each KV tile's PV product goes into a zeroed FP32 accumulator and is added to the
  running output in FP32 registers (contract §2: at least once per KV tile). Without it (PV
  accumulated into O inside the MMA, FA3's way) the kernel was no faster: within 1% either way at
  every shape of four H200 runs (results/cute_fwd_col_smem_h200, cute_k_scale_keys_h200,
  cute_k_group64_h200, cute_fwd_price2_h200: B4 causal 0.850-0.860 against 0.857-0.859 ms), so that
  switch was deleted. The QK product is not promoted: the head dim's four k32 wgmmas chain
  inside the MMA, as in every other FP8 attention (FA3, cuDNN, SageAttention) and in the Triton
  kernels. That is the ``fp8`` recipe's definition: its scores carry the FP8 MMA's accumulation
  error, at most 2^-10.9 of ``sum_d |q8 k8|`` on the H200 (results/robustness_h200/
  qk_accumulation_h200.md; 2^-13.7 promoted after every k32), which the tests' bounds are derived
  from; the output moved by at most 1.5e-5 of cosine on every input family against the promoted
  kernel, and the kernel ran 13-15% faster (results/cute_prep_h200/).
* KV tiles are visited last to first (FA4's producer order); ``reference.py``'s ``reverse_tiles``
  does the same, which the rounding of P depends on.
* Epilogue: ``O = acc / l * v_scale`` (per-channel V scale) in BF16, ``LSE = (m + log2 l - LIFT) ln 2``
  (natural log, as ``reference.py``); rows without keys give O = 0 and LSE = -inf.

The launch wrapper, its compile cache and the host-side operand preparation are in
``backend.py``. Requires ``nvidia-cutlass-dsl`` and ``flash-attn-4`` (``pip install
'fp4-attention-pretrain[cute]'``).
"""

import math
import operator
from functools import partial

import cutlass
import cutlass.utils.hopper_helpers as sm90_utils_basic
from cutlass import Float32, Int32, const_expr, cute, pipeline
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait
from cutlass.utils import LayoutEnum
from flash_attn.cute import pipeline as pipeline_custom
from flash_attn.cute import utils as fa_utils
from flash_attn.cute.block_info import BlockInfo
from flash_attn.cute.cute_dsl_utils import assume_tensor_aligned
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
from flash_attn.cute.mask import AttentionMask
from flash_attn.cute.seqlen_info import SeqlenInfoQK
from flash_attn.cute.tile_scheduler import SingleTileLPTScheduler, SingleTileScheduler, TileSchedulerArguments
from quack import layout_utils, sm90_utils

__all__ = ["K_SCALE_FLOOR", "LIFT", "FP8ForwardSm90", "fold_k_scale", "p_to_e4m3_operand"]

LIFT = 8
LN2 = math.log(2.0)


@dsl_user_op
def _cvt_e4m3x4(a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> Int32:
    """Four FP32 -> four E4M3 bytes (a in the lowest byte), round-to-nearest-even, saturating."""
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
            "{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\nmov.b32 $0, {lo, hi};\n}",
            "=r,f,f,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def p_to_e4m3_operand(acc: cute.Tensor, frag: cute.Tensor):
    """FP32 wgmma accumulator (P, lifted) -> the E4M3 A operand of the next wgmma, registers in place
    (see ``pv_layout.V_PERM16``): per 32 accumulator columns the A fragment's 4 words are accumulator
    values (0,1,4,5) (2,3,6,7) (8,9,12,13) (10,11,14,15); the B operand's K order is permuted to match."""
    src = cute.make_tensor(acc.iterator, cute.make_layout(cute.size(acc)))
    dst = cute.recast_tensor(frag, Int32)
    for w in cutlass.range_constexpr(cute.size(dst)):
        base = (w // 4) * 16 + (w % 2) * 2 + ((w // 2) % 2) * 8
        dst[w] = _cvt_e4m3x4(src[base], src[base + 1], src[base + 4], src[base + 5])


K_SCALE_FLOOR = 2.0**-126  # the smallest normal FP32: a folded row scale never rounds to zero


@cute.jit
def fold_k_scale(r: Float32, g_k: Float32) -> Float32:
    """A K scale that is constant over the keys it covers (``nvfp4qk_fp8pv``'s per-head global scale, or
    one group's with ``k_group``) folded into a query's row factor: ``r * g_k`` (FP32, rounded
    once), with a NaN ``g_k`` taken as 1 and the product raised to :data:`K_SCALE_FLOOR` where it is
    smaller; a NaN ``r`` stays NaN. The forward and the backward both score ``t * fold_k_scale(r,
    g_k)`` (one FFMA with the exp2 offset): the same factor bits, given the same ``r`` (the
    forward's ``row * softmax_scale * log2 e`` in torch, the dO kernel's in Triton, both one FP32
    product). There is no ceiling: a product above FP32's range (global scales whose product is
    above about 3e39) would make a score with ``t = 0`` NaN. Why these rules leave the recipe
    unchanged: a head (group) whose K holds a NaN/Inf has a NaN ``g_k`` and NaN operands for every
    key it covers (NVFP4 block-scale code 0x7F; E4M3 code 0x7F), so its visible scores are NaN
    through ``t`` and its masked ones stay ``-inf * 1``; and a product below 2^-150 (global scales
    whose product is below about 1e-44) would round to zero, making a masked ``-inf * 0`` NaN, while
    any product at most 2^-126 gives every visible score below 2^-95 (``|t| <= 2688^2 * 128 <
    2^30``), so P is 2^LIFT either way."""
    g = Float32(1.0) if g_k != g_k else g_k
    x = r * g
    return Float32(K_SCALE_FLOOR) if x < Float32(K_SCALE_FLOOR) else x


class FP8ForwardSm90(FlashAttentionForwardSm90):
    """Forward of the ``fp8`` recipe on sm_90a; see the module docstring.

    Args:
        head_dim: 64 or 128.
        qhead_per_kvhead: GQA group size (query heads per KV head).
        is_causal: bottom-right causal mask (key j visible to query i iff j <= i + Sk - Sq).
        tile_m, tile_n: query rows per CTA (64 per consumer warpgroup) and keys per KV tile; the
            reference must use ``block_n = tile_n`` to round P identically.
        num_stages: K/V shared-memory pipeline depth.
        qk_bf16: Q/K operands are BF16 (recipe ``nvfp4qk_fp8pv``: the exact BF16 decode of the NVFP4
            payloads, QK on HGMMA; per-head global scales arrive as the row/col scale vectors).
        k_group: 0, or 64 (a measurement option of the ``fp8`` kernel, not a recipe yet: the
            forward issue's K-scale decision): the K scales in ``mCol`` are constant over each 64
            keys (K quantized per 64 keys); the kernel reads the first key's of each group per KV
            tile and scores ``t * fold_k_scale(r_i, s_g)``, with no per-score multiply. Needs
            ``tile_n`` a multiple of 64.

    Schedule: per warpgroup QK -> softmax -> PV, overlapped across the two consumer warpgroups
    (ping-pong), each part measured on the H200 before it
    became the only one (kernel-only TFLOP/s without -> with both, B1 / B4 H32/8 S4096 causal:
    443 -> 510 / 452 -> 526, ``results/cute_bwd_h200`` -> ``results/cute_prep_h200``):
    a tile's K token scales are loaded before its QK product is issued, so their latency hides
    behind it, and unclamped after the first tile (``_load_col``); they multiply the scores before
    the mask, so nothing waits for them before the QK issue (8-9% faster,
    ``results/cute_fwd_scale_first_h200``). The options that lost on the H200 were deleted: the
    PV-only warp-scheduler turn and Direct-P E4M3 exponentials on the FMA pipe (2026-12-01, whose
    table was not committed), the promoted QK product (every 32 or 64 elements of the head dim:
    12-13% / 3-5% slower, ``results/cute_prep_h200``), and FA3's intra-warpgroup overlap of QK(j)
    with PV(j-1), even with a promotion bit-identical to the ping-pong's (25% slower at B4 causal,
    ``results/cute_fwd_overlap_tiles_h200``); the K token scales through shared memory (one
    coalesced load per 128 keys, a per-warpgroup double buffer: bit-identical, 1.8-3.8% slower at
    each shape's best tile), and the overlap again on top of it (6-10% slower,
    ``results/cute_fwd_col_smem_h200``). Measured and not merged, all bit-identical schedules
    (``results/cute_fwd_schedule2_h200``): the previous tile's PV issued with the next QK in one
    turn, promoted while QK runs (14% slower); no warp-scheduler turn, or a turn over the QK issue
    only (8-19% slower); three consumer warpgroups at 192x64 / 192x96 (4-16% slower; 192x128
    spills); and the row sum as four round-robin partials (no gain). Lost and deleted on
    2026-12-05 (``results/cute_fwd_colv4_h200``, bit-identical, 1-6% slower): the K token scales
    permuted like V's keys so that a thread's four of each 16 keys are one 16-byte load, and on top
    of it each tile's promotion deferred past the next tile's row max.
    """

    def __init__(
        self,
        head_dim: int,
        qhead_per_kvhead: int,
        is_causal: bool,
        tile_m: int = 128,
        tile_n: int = 128,
        num_stages: int = 2,
        qk_bf16: bool = False,
        k_group: int = 0,
    ):
        super().__init__(
            cutlass.BFloat16,
            head_dim,
            head_dim,
            qhead_per_kvhead,
            is_causal=is_causal,
            is_local=False,
            pack_gqa=False,
            tile_m=tile_m,
            tile_n=tile_n,
            num_stages=num_stages,
            num_threads=128 * (tile_m // 64 + 1),
            Q_in_regs=False,
            intra_wg_overlap=False,
            mma_pv_is_rs=True,
        )
        # Q/K operands: E4M3 (fp8) or BF16 (nvfp4qk_fp8pv: the exact BF16 decode s_b * q of NVFP4,
        # contract §1); V and P are E4M3 in both recipes
        self.qk_dtype = cutlass.BFloat16 if qk_bf16 else cutlass.Float8E4M3FN
        self.v_dtype = cutlass.Float8E4M3FN
        self.qk_bf16 = qk_bf16
        # k_group: K's scale is constant over each k_group keys (0: per token); one scale per group
        # is read per tile and folded into the row factor (fold_k_scale), as qk_bf16's per-head one
        if k_group not in (0, 64) or (k_group and (tile_n % k_group or qk_bf16)):
            raise ValueError(
                f"FP8ForwardSm90: k_group must be 0, or 64 with E4M3 Q/K and tile_n % 64 == 0; got {k_group}"
            )
        self.k_group = k_group
        assert tile_n % 32 == 0 and tile_m % 64 == 0

    # ---- configuration -------------------------------------------------------------------------
    def _get_tiled_mma(self):
        k_major = warpgroup.OperandMajorMode.K
        qk = sm90_utils_basic.make_trivial_tiled_mma(
            self.qk_dtype,
            self.qk_dtype,
            k_major,
            k_major,
            Float32,
            atom_layout_mnk=(self.tile_m // 64, 1, 1),
            tiler_mn=(64, self.tile_n),
        )
        pv = sm90_utils_basic.make_trivial_tiled_mma(
            self.v_dtype,
            self.v_dtype,
            k_major,
            k_major,
            Float32,
            atom_layout_mnk=(self.tile_m // 64, 1, 1),
            tiler_mn=(64, self.tile_hdimv),
            a_source=warpgroup.OperandSource.RMEM,
        )
        return qk, pv

    def _get_shared_storage_cls(self):
        # sQ also holds the BF16 output tile in the epilogue: sized for the larger of the two
        q_elems = max(
            cute.cosize(self.sQ_layout), cute.cosize(self.sO_layout) * 2 // (self.qk_dtype.width // 8)
        )
        align = self.buffer_align_bytes
        sQ_struct = cute.struct.Align[cute.struct.MemRange[self.qk_dtype, q_elems], align]
        sK_struct = cute.struct.Align[cute.struct.MemRange[self.qk_dtype, cute.cosize(self.sK_layout)], align]
        sV_struct = cute.struct.Align[cute.struct.MemRange[self.v_dtype, cute.cosize(self.sV_layout)], align]
        mbar_q = cute.struct.MemRange[cutlass.Int64, 2]
        mbar_kv = cute.struct.MemRange[cutlass.Int64, self.num_stages * 2]

        @cute.struct
        class SharedStorage:
            mbar_ptr_Q: mbar_q
            mbar_ptr_K: mbar_kv
            mbar_ptr_V: mbar_kv
            sV: sV_struct
            sQ: sQ_struct
            sK: sK_struct

        return SharedStorage

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mVt: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mRow: cute.Tensor,
        mCol: cute.Tensor,
        mVScale: cute.Tensor,
        qk_scale_log2: Float32,
        stream,
    ):
        """mQ ``(B, Sq, Hq, D)`` E4M3, mK ``(B, Sk, Hkv, D)`` E4M3, mVt ``(B, Sk, Hkv, D)`` E4M3 with
        stride 1 along Sk (the permuted transposed V), mO ``(B, Sq, Hq, D)`` BF16, mLSE / mRow
        ``(B, Hq, Sq)`` FP32 (mRow = Q token scale), mCol ``(B, Hkv, Sk)`` FP32 (K token scale),
        mVScale ``(B, Hkv, D)`` FP32; ``qk_scale_log2`` = softmax_scale * log2 e: the row factor of
        query i is ``mRow[i] * qk_scale_log2`` (one FP32 product, as the host computed it before)."""
        mQ, mK, mO = [assume_tensor_aligned(t) for t in (mQ, mK, mO)]
        mQ, mO, mK, mVt = [layout_utils.select(t, [1, 3, 2, 0]) for t in (mQ, mO, mK, mVt)]
        mLSE, mRow, mCol, mVScale = [layout_utils.select(t, [2, 1, 0]) for t in (mLSE, mRow, mCol, mVScale)]
        tiled_mma_qk, tiled_mma_pv = self._get_tiled_mma()
        self.num_mma_threads = tiled_mma_qk.size
        self.num_threads_per_warp_group = 128
        self.num_wg_mma = self.num_mma_threads // 128
        self.num_threads = 128 * (self.num_wg_mma + 1)
        self.num_producer_threads = 32
        self.num_Q_load_threads = 128
        self.num_epilogue_threads = self.num_mma_threads
        self.num_mma_regs, self.num_producer_regs = {1: (256, 56), 2: (240, 24), 3: (160, 32)}[
            self.num_wg_mma
        ]
        self.use_block_sparsity = False
        self.use_scheduler_barrier = self.num_wg_mma >= 2 and self.tile_hdim <= 128
        self.use_tma_Q = True
        self.use_tma_O = True
        self.rescale_O_before_gemm = False
        self._setup_attributes()
        self.sQ_layout = sm90_utils.make_smem_layout(
            self.qk_dtype, LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_hdim), None
        )
        self.sK_layout = sm90_utils.make_smem_layout(
            self.qk_dtype, LayoutEnum.ROW_MAJOR, (self.tile_n, self.tile_hdim), self.num_stages
        )
        # keys contiguous in shared memory: the K-major B operand of the FP8 PV product
        self.sV_layout = sm90_utils.make_smem_layout(
            self.v_dtype, LayoutEnum.COL_MAJOR, (self.tile_n, self.tile_hdimv), self.num_stages
        )
        self.sO_layout = sm90_utils.make_smem_layout(
            self.dtype, LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_hdimv), None
        )
        self.sP_layout = None
        SharedStorage = self._get_shared_storage_cls()
        self.tma_copy_bytes = {
            name: cute.size_in_bytes(dtype, cute.select(layout, mode=[0, 1]))
            for name, dtype, layout in [
                ("Q", self.qk_dtype, self.sQ_layout),
                ("K", self.qk_dtype, self.sK_layout),
                ("V", self.v_dtype, self.sV_layout),
            ]
        }
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
            g2s, mQ, self.sQ_layout, (self.tile_m, self.tile_hdim)
        )
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.select(self.sK_layout, mode=[0, 1]), (self.tile_n, self.tile_hdim), 1
        )
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
            g2s, mVt, cute.select(self.sV_layout, mode=[0, 1]), (self.tile_n, self.tile_hdimv), 1
        )
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, self.sO_layout, (self.tile_m, self.tile_hdimv)
        )
        TileScheduler = SingleTileLPTScheduler if const_expr(self.is_causal) else SingleTileScheduler
        sched_args = TileSchedulerArguments(
            cute.ceil_div(cute.size(mQ.shape[0]), self.tile_m),
            cute.size(mQ.shape[2]),
            cute.size(mQ.shape[3]),
            1,
            cute.size(mK.shape[0]),
            mQ.shape[1],
            mVt.shape[1],
            total_q=cute.size(mQ.shape[0]) * cute.size(mQ.shape[3]),
            tile_shape_mn=(self.tile_m, self.tile_n),
            element_size=1,
            is_persistent=False,
            lpt=self.is_causal,
        )
        sched_params = TileScheduler.to_underlying_arguments(sched_args)
        self.kernel(
            tma_Q,
            tma_K,
            tma_V,
            tma_O,
            mLSE,
            mRow,
            mCol,
            mVScale,
            qk_scale_log2,
            tma_atom_Q,
            tma_atom_K,
            tma_atom_V,
            tma_atom_O,
            self.sQ_layout,
            self.sK_layout,
            self.sV_layout,
            self.sO_layout,
            tiled_mma_qk,
            tiled_mma_pv,
            sched_params,
            TileScheduler,
            SharedStorage,
        ).launch(
            grid=TileScheduler.get_grid_shape(sched_params),
            block=[self.num_threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mRow: cute.Tensor,
        mCol: cute.Tensor,
        mVScale: cute.Tensor,
        qk_scale_log2: Float32,
        tma_atom_Q: cute.CopyAtom,
        tma_atom_K: cute.CopyAtom,
        tma_atom_V: cute.CopyAtom,
        tma_atom_O: cute.CopyAtom,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        sched_params,
        TileScheduler: cutlass.Constexpr,
        SharedStorage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)
        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        tma_warp = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        mma_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        make_pipe = partial(
            pipeline_custom.PipelineTmaAsync.create,
            producer_group=tma_warp,
            consumer_group=mma_warps,
            defer_sync=True,
        )
        pipeline_q = make_pipe(
            barrier_storage=storage.mbar_ptr_Q.data_ptr(), num_stages=1, tx_count=self.tma_copy_bytes["Q"]
        )
        pipeline_k = make_pipe(
            barrier_storage=storage.mbar_ptr_K.data_ptr(),
            num_stages=self.num_stages,
            tx_count=self.tma_copy_bytes["K"],
        )
        pipeline_v = make_pipe(
            barrier_storage=storage.mbar_ptr_V.data_ptr(),
            num_stages=self.num_stages,
            tx_count=self.tma_copy_bytes["V"],
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner, dtype=self.dtype)
        block_info = BlockInfo(self.tile_m, self.tile_n, self.is_causal)
        SeqlenInfoCls = partial(SeqlenInfoQK.create, seqlen_q_static=mQ.shape[0], seqlen_k_static=mK.shape[0])
        TileSchedulerCls = partial(TileScheduler.create, sched_params)
        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)
        if warp_idx < 4:  # producer warpgroup: warp 0 issues the TMA loads (FA4's loader)
            cute.arch.setmaxregister_decrease(self.num_producer_regs)
            self.load(
                mQ,
                mK,
                mV,
                sQ,
                sK,
                sV,
                tma_atom_Q,
                tma_atom_K,
                tma_atom_V,
                pipeline_k,
                pipeline_v,
                pipeline_q,
                self.gmem_tiled_copy_Q,
                None,
                None,
                block_info,
                SeqlenInfoCls,
                TileSchedulerCls,
            )
        else:
            cute.arch.setmaxregister_increase(self.num_mma_regs)
            tidx, _, _ = cute.arch.thread_idx()
            self.mma_fp8(
                tiled_mma_qk,
                tiled_mma_pv,
                mO,
                mLSE,
                mRow,
                mCol,
                mVScale,
                qk_scale_log2,
                sQ,
                sK,
                layout_utils.transpose_view(sV),
                sO,
                pipeline_k,
                pipeline_v,
                pipeline_q,
                tma_atom_O,
                tidx - 128,
                block_info,
                SeqlenInfoCls,
                TileSchedulerCls,
            )

    # ---- consumer warpgroups -----------------------------------------------------------------
    @cute.jit
    def mma_fp8(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mRow: cute.Tensor,
        mCol: cute.Tensor,
        mVScale: cute.Tensor,
        qk_scale_log2: Float32,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sVt: cute.Tensor,
        sO: cute.Tensor,
        pipeline_k,
        pipeline_v,
        pipeline_q,
        tma_atom_O: cute.CopyAtom,
        tidx: Int32,
        block_info: BlockInfo,
        SeqlenInfoCls,
        TileSchedulerCls,
    ):
        wg_idx = cute.arch.make_warp_uniform(tidx // 128)
        wg_layout = cute.make_layout(self.num_wg_mma, stride=128)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        wg_mma_qk = tiled_mma_qk.get_slice(wg_layout(wg_idx))
        wg_mma_pv = tiled_mma_pv.get_slice(wg_layout(wg_idx))
        _, tSrQ, tSrK = sm90_utils.partition_fragment_ABC(
            wg_mma_qk, (self.tile_m, self.tile_n, self.tile_hdim), sQ, sK
        )
        acc_O, tOrP, tOrVt = sm90_utils.partition_fragment_ABC(
            wg_mma_pv, (self.tile_m, self.tile_hdimv, self.tile_n), None, sVt
        )
        acc_PV = cute.make_fragment_like(acc_O, Float32)  # each tile's PV, promoted into acc_O
        mma_qk = partial(self._qk_chained, tiled_mma_qk, tSrQ, tSrK)
        mma_pv = partial(sm90_utils.gemm_w_idx, tiled_mma_pv, acc_PV, tOrP, tOrVt, True)
        # coordinates of this thread's accumulator elements (rows, columns of the score tile)
        tScS_mn = layout_utils.reshape_acc_to_mn(
            thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        )
        tOcO_mn = layout_utils.reshape_acc_to_mn(
            thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_hdimv)))
        )
        n_rows = cute.size(tScS_mn, mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, Float32)
        row_sum = cute.make_rmem_tensor(n_rows, Float32)
        row_r = cute.make_rmem_tensor(n_rows, Float32)
        self.mma_init()
        q_phase = Int32(0)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        tile_scheduler = TileSchedulerCls()
        work_tile = tile_scheduler.initial_work_tile_info()
        while work_tile.is_valid_tile:
            m_block, head_idx, batch_idx, _ = work_tile.tile_idx
            seqlen = SeqlenInfoCls(batch_idx)
            kv_head = head_idx // self.qhead_per_kvhead
            mCol_cur = mCol[None, kv_head, batch_idx]
            mask = AttentionMask(self.tile_m, self.tile_n, seqlen)
            mask_fn = partial(
                mask.apply_mask,
                batch_idx=batch_idx,
                head_idx=head_idx,
                m_block=m_block,
                thr_mma=thr_mma_qk,
                mask_causal=self.is_causal,
            )
            if const_expr(self.qk_bf16):  # the head's K global scale (key 0's), folded into row_r
                g_k = mCol_cur[0]
            for r in cutlass.range(n_rows, unroll_full=True):
                q_idx = m_block * self.tile_m + tScS_mn[r, 0][0]
                row_r[r] = Float32(1.0)
                if q_idx < seqlen.seqlen_q:
                    row_r[r] = mRow[q_idx, head_idx, batch_idx] * qk_scale_log2
                if const_expr(self.qk_bf16):
                    row_r[r] = fold_k_scale(row_r[r], g_k)
            softmax = partial(self._softmax_tile, row_max=row_max, row_sum=row_sum, row_r=row_r)
            load_col = partial(self._load_col, mCol=mCol_cur, tScS_mn=tScS_mn, seqlen_k=seqlen.seqlen_k)
            scale_cols = partial(self._scale_cols, tScS_mn=tScS_mn)
            n_block_min, n_block_max = block_info.get_n_block_min_max(seqlen, m_block)
            pipeline_q.consumer_wait_w_index_phase(0, q_phase)
            acc_O.fill(0.0)
            step = partial(
                self._tile,
                mma_qk=mma_qk,
                mma_pv=mma_pv,
                pipeline_k=pipeline_k,
                pipeline_v=pipeline_v,
                acc_O=acc_O,
                acc_PV=acc_PV,
                tOrP=tOrP,
                softmax=softmax,
                load_col=load_col,
                scale_cols=scale_cols,
            )
            # the last KV tile first (ragged and, for causal, masked), then the causal band, then the rest
            self.warp_scheduler_barrier_sync()
            kv_state = step(
                kv_state,
                n_block=n_block_max - 1,
                mask_fn=partial(mask_fn, mask_seqlen=True),
                is_first=True,
            )
            kv_state = self._remaining_tiles(
                kv_state, step, n_block_min, n_block_max - 1, seqlen, m_block, block_info, mask_fn
            )
            self.warp_scheduler_barrier_arrive()
            pipeline_q.consumer_release_w_index(0)
            q_phase ^= 1
            self._finalize(acc_O, row_max, row_sum, mVScale[None, kv_head, batch_idx], tOcO_mn)
            self.epilogue(
                acc_O,
                row_sum,
                mO,
                mLSE,
                sO,
                seqlen,
                self.gmem_tiled_copy_O,
                tma_atom_O,
                tiled_mma_pv,
                tidx,
                m_block,
                head_idx,
                batch_idx,
            )
            tile_scheduler.advance_to_next_work()
            work_tile = tile_scheduler.get_current_work()

    @cute.jit
    def _remaining_tiles(
        self,
        kv_state,
        step,
        n_block_min: Int32,
        n_block_max: Int32,
        seqlen,
        m_block: Int32,
        block_info: BlockInfo,
        mask_fn,
    ):
        """``step`` over KV tiles ``[n_block_min, n_block_max)``, last to first: the causal band
        (causal mask) then the fully visible tiles (no mask): the tiles after the first."""
        if const_expr(self.is_causal):
            n_block_min_mask = block_info.get_n_block_min_causal_local_mask(seqlen, m_block, n_block_min)
            for n_tile in cutlass.range(n_block_max - n_block_min_mask, unroll=1):
                kv_state = step(
                    kv_state, n_block=n_block_max - 1 - n_tile, mask_fn=partial(mask_fn, mask_seqlen=False)
                )
            n_block_max = cutlass.min(n_block_max, n_block_min_mask)
        for n_tile in cutlass.range(n_block_max - n_block_min, unroll=1):
            kv_state = step(kv_state, n_block=n_block_max - 1 - n_tile, mask_fn=None)
        return kv_state

    @cute.jit
    def _tile(
        self,
        kv_state,
        n_block: Int32,
        mma_qk,
        mma_pv,
        pipeline_k,
        pipeline_v,
        acc_O: cute.Tensor,
        acc_PV: cute.Tensor,
        tOrP: cute.Tensor,
        softmax,
        load_col,
        scale_cols,
        mask_fn=None,
        is_first: cutlass.Constexpr = False,
    ):
        """One KV tile, QK -> softmax -> PV, while the other consumer warpgroup runs its own (FA3's
        ping-pong through the warp-scheduler barriers). By default it enters holding the barrier and
        leaves holding it again: the GEMM issue of one warpgroup does not interleave with the
        other's. The tile's K scales are loaded first, in flight during the QK product."""
        col = None if const_expr(self.qk_bf16) else load_col(n_block, clamp=is_first)
        pipeline_k.consumer_wait(kv_state, pipeline_k.consumer_try_wait(kv_state))
        acc_S = mma_qk(B_idx=kv_state.index, arrive=self.warp_scheduler_barrier_arrive)
        pipeline_k.consumer_release(kv_state)
        # t * col before the mask, so that no use of the K scales precedes the QK product (ptxas
        # placed the NaN check of each scale before the QGMMA issue, where it waited for the loads
        # while holding the warp-scheduler turn); the mask then overwrites a masked score whatever
        # its scale, NaN included
        scale_cols(acc_S, None if const_expr(self.k_group > 0) else col, n_block=n_block, is_first=is_first)
        if const_expr(mask_fn is not None):
            mask_fn(acc_S, n_block=n_block)
        alpha = softmax(acc_S, is_first=is_first, group_scales=col if const_expr(self.k_group > 0) else None)
        self._p_to_e4m3(acc_S, tOrP)
        pipeline_v.consumer_wait(kv_state, pipeline_v.consumer_try_wait(kv_state))
        self.warp_scheduler_barrier_sync()
        mma_pv(B_idx=kv_state.index, wg_wait=0)
        pipeline_v.consumer_release(kv_state)
        self._promote(acc_O, acc_PV, alpha)  # FP32 promotion once per KV tile
        kv_state.advance()
        return kv_state

    @cute.jit
    def _promote(self, acc_O: cute.Tensor, acc_PV: cute.Tensor, alpha: cute.Tensor):
        """FP32 promotion of one KV tile's PV product (contract §2): ``O = O * alpha + P V``."""
        acc_O_mn = layout_utils.reshape_acc_to_mn(acc_O)
        acc_PV_mn = layout_utils.reshape_acc_to_mn(acc_PV)
        for r in cutlass.range(cute.size(alpha), unroll_full=True):
            acc_O_mn[r, None].store(acc_O_mn[r, None].load() * alpha[r] + acc_PV_mn[r, None].load())

    @cute.jit
    def _qk_chained(
        self, tiled_mma_qk: cute.TiledMma, tSrQ: cute.Tensor, tSrK: cute.Tensor, B_idx: Int32, arrive=None
    ) -> cute.Tensor:
        """S = Q K^T, the head dim's k-blocks chained inside the MMA (the recipe's definition: no
        FP32 promotion, module docstring); ``arrive`` (the warp-scheduler barrier) is called once
        the product is issued."""
        acc = sm90_utils.gemm_zero_init(
            tiled_mma_qk, (self.tile_m, self.tile_n), tSrQ, tSrK, B_idx=B_idx, wg_wait=-1
        )
        if const_expr(arrive is not None):
            arrive()
        warpgroup.wait_group(0)
        return acc

    @cute.jit
    def _load_col(
        self,
        n_block: Int32,
        mCol: cute.Tensor,
        tScS_mn: cute.Tensor,
        seqlen_k: Int32,
        clamp: cutlass.Constexpr = False,
    ) -> cute.Tensor:
        """This thread's K token scales for KV tile ``n_block``, one per accumulator column, loaded
        before the tile's QK product is issued (the ping-pong's ``_tile``); with ``k_group``, one per
        group of ``k_group`` keys instead, read at the group's first key. ``clamp``: keys past the
        last one, or below key 0 (the n_block < 0 tile of rows without keys), read the last or the
        first scale (their scores are masked); no branch, so the loads issue back to back. Only the
        first tile visited needs it: every other tile lies inside [0, seqlen_k), and its loads take
        one base address plus constant offsets."""
        grouped = const_expr(self.k_group > 0)
        n = self.tile_n // self.k_group if grouped else cute.size(tScS_mn, mode=[1])
        col = cute.make_rmem_tensor(n, Float32)
        k_last = seqlen_k - 1
        for c in cutlass.range(n, unroll_full=True):
            k_idx = n_block * self.tile_n + (c * self.k_group if grouped else tScS_mn[0, c][1])
            col[c] = mCol[cutlass.max(cutlass.min(k_idx, k_last), 0)] if const_expr(clamp) else mCol[k_idx]
        return col

    @cute.jit
    def _scale_cols(
        self,
        acc_S: cute.Tensor,
        col: cute.Tensor,
        n_block: Int32,
        is_first: cutlass.Constexpr,
        tScS_mn: cute.Tensor,
    ):
        """Scores ``t * col_j`` in place, the tile's K token scales from :meth:`_load_col`; in the first
        tile visited, keys below 0 (the n_block < 0 tile of rows without keys, read as zeros by TMA)
        get -inf. Applied before the mask, so a masked score is -inf whatever its scale. The
        quantizers give a NaN scale only together with NaN operands: fp8, a key whose K held a
        NaN/Inf (its row's codes are 0x7F); nvfp4qk_fp8pv, every key of such a head (its decode is
        NaN through the block-scale code 0x7F). Its visible scores are NaN either way. Other scales
        are positive and finite (:func:`~fp4_attention.backends.cute.backend.forward_fp8`)."""
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        if const_expr(col is None):  # qk_bf16, k_group: the K scale is in the row factor; only keys < 0
            if const_expr(is_first):
                for c in cutlass.range(cute.size(acc_S_mn, mode=[1]), unroll_full=True):
                    k_idx = n_block * self.tile_n + tScS_mn[0, c][1]
                    for r in cutlass.range(cute.size(acc_S_mn, mode=[0]), unroll_full=True):
                        acc_S_mn[r, c] = -Float32.inf if k_idx < 0 else acc_S_mn[r, c]
        else:
            for c in cutlass.range(cute.size(col), unroll_full=True):
                for r in cutlass.range(cute.size(acc_S_mn, mode=[0]), unroll_full=True):
                    if const_expr(is_first):
                        k_idx = n_block * self.tile_n + tScS_mn[0, c][1]
                        acc_S_mn[r, c] = -Float32.inf if k_idx < 0 else acc_S_mn[r, c] * col[c]
                    else:
                        acc_S_mn[r, c] = acc_S_mn[r, c] * col[c]

    @cute.jit
    def _softmax_tile(
        self,
        acc_S: cute.Tensor,
        is_first: cutlass.Constexpr,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        row_r: cute.Tensor,
        group_scales: cute.Tensor | None = None,
    ) -> cute.Tensor:
        """Online softmax of one score tile in place, on the scores already masked (``t * col`` per
        token, or ``t`` with ``qk_bf16`` and ``k_group``: :meth:`_scale_cols`, then the mask); acc_S
        becomes the lifted P. Returns the per-row
        rescale factor alpha of the running output (contract §2, reference.py). ``group_scales``
        (``k_group``): the scores are the unscaled ``t``, key group g's factor is
        ``fold_k_scale(r_i, s_g)``, and the row max is the largest of the groups' ``max t * factor``
        (the same value as the max of the products: the factors are positive and rounding is
        monotone)."""
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        alpha = cute.make_fragment_like(row_max, Float32)
        n_cols = cute.size(acc_S_mn, mode=[1])
        for r in cutlass.range(cute.size(row_max), unroll_full=True):
            if const_expr(group_scales is None):
                t = acc_S_mn[r, None].load()
                t_max = fa_utils.fmax_reduce(t, init_val=None, arch=90)
                t_max = cute.arch.warp_reduction_max(t_max, threads_in_group=4)
                m_new = t_max * row_r[r]
            else:
                # a thread's accumulator columns in mn order: column 8 (c // 2) + 2 (lane % 4) + c % 2,
                # so each 64 keys are 16 consecutive entries
                n_groups = cute.size(group_scales)
                per_group = n_cols // n_groups
                factor = cute.make_rmem_tensor(n_groups, Float32)
                m_thr = -Float32.inf
                for g in cutlass.range_constexpr(n_groups):
                    factor[g] = fold_k_scale(row_r[r], group_scales[g])
                    g_max = acc_S_mn[r, g * per_group]
                    for c in cutlass.range_constexpr(g * per_group + 1, (g + 1) * per_group):
                        g_max = cute.arch.fmax(g_max, acc_S_mn[r, c])
                    m_thr = cute.arch.fmax(m_thr, g_max * factor[g])
                m_new = cute.arch.warp_reduction_max(m_thr, threads_in_group=4)
            if const_expr(not is_first):
                m_new = cute.arch.fmax(m_new, row_max[r])
            m_safe = Float32(0.0) if m_new == -Float32.inf else m_new
            if const_expr(group_scales is None):
                p = cute.math.exp2(t * row_r[r] + (Float32(LIFT) - m_safe), fastmath=True)
            else:
                offset = Float32(LIFT) - m_safe
                for c in cutlass.range_constexpr(n_cols):
                    acc_S_mn[r, c] = cute.math.exp2(
                        acc_S_mn[r, c] * factor[c // per_group] + offset, fastmath=True
                    )
                p = acc_S_mn[r, None].load()
            if const_expr(is_first):
                alpha[r] = Float32(1.0)
                row_sum[r] = fa_utils.fadd_reduce(p, init_val=None, arch=90)
            else:
                alpha[r] = (
                    Float32(1.0)
                    if m_new == row_max[r]
                    else cute.math.exp2(row_max[r] - m_safe, fastmath=True)
                )
                row_sum[r] = fa_utils.fadd_reduce(p, init_val=row_sum[r] * alpha[r], arch=90)
            row_max[r] = m_new
            acc_S_mn[r, None].store(p)
        return alpha

    @cute.jit
    def _p_to_e4m3(self, acc_S: cute.Tensor, tOrP: cute.Tensor):
        p_to_e4m3_operand(acc_S, tOrP)

    @cute.jit
    def _finalize(
        self,
        acc_O: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        mVs: cute.Tensor,
        tOcO_mn: cute.Tensor,
    ):
        """O = acc / l * v_scale; row_sum becomes the natural-log LSE (-inf for rows without keys)."""
        row_sum.store(fa_utils.warp_reduce(row_sum.load(), operator.add, width=4))
        acc_O_mn = layout_utils.reshape_acc_to_mn(acc_O)
        vs = cute.make_rmem_tensor(tOcO_mn[0, None].shape, Float32)
        for c in cutlass.range(cute.size(vs), unroll_full=True):
            vs[c] = mVs[tOcO_mn[0, c][1]]
        for r in cutlass.range(cute.size(row_sum), unroll_full=True):
            l = row_sum[r]
            empty = l == Float32(0.0)
            inv = Float32(0.0) if empty else Float32(1.0) / l
            acc_O_mn[r, None].store(acc_O_mn[r, None].load() * inv * vs.load())
            row_sum[r] = (
                -Float32.inf
                if empty
                else (row_max[r] + cute.math.log2(l, fastmath=False) - Float32(LIFT)) * Float32(LN2)
            )
