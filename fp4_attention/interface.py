"""Public entry points: ``attention()`` and the ``FP4Attention`` module.

Input validation lives here, once, for every backend: errors name the problem and the fix.
"""

from __future__ import annotations

import math

import torch

from .backends import (
    AUTO,
    available_backends,
    backend_spec,
    check_supported,
    deterministic_mode,
    flatten_state,
    get_backend,
    resolve_backend,
    restore_state,
)
from .backends.rope import RoPEFunction, rope_pair_op
from .numerics.recipes import Recipe, get_recipe, with_qk_rotation
from .numerics.rope import RoPETables
from .numerics.rotation import check_rotation_head_dim

__all__ = ["LAYOUTS", "FP4Attention", "attention"]

# layout name -> permutation from the layout to [B, H, S, D]
LAYOUTS = {"bshd": (0, 2, 1, 3), "bhsd": (0, 1, 2, 3), "sbhd": (1, 2, 0, 3)}


# layout name -> permutation from [B, H, S, D] back to the layout
_INVERSE = {name: tuple(perm.index(i) for i in range(4)) for name, perm in LAYOUTS.items()}


def _to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "bhsd" else x.permute(*LAYOUTS[layout])  # no identity view per call


def _from_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "bhsd" else x.permute(*_INVERSE[layout])


def _validate(q, k, v, layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check the inputs; return them as ``[B, H, S, D]`` views."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D in layout {layout!r}, got shape {tuple(t.shape)}")
        if t.dtype != torch.bfloat16:
            raise TypeError(
                f"{name} must be torch.bfloat16 (the recipes quantize from BF16), got {t.dtype}; "
                f"cast with .bfloat16()"
            )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    qb, kb, vb = (_to_bhsd(t, layout) for t in (q, k, v))
    if kb.shape != vb.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if qb.shape[0] != kb.shape[0]:
        raise ValueError(f"batch mismatch: q has {qb.shape[0]}, k/v have {kb.shape[0]}")
    if qb.shape[-1] != kb.shape[-1]:
        raise ValueError(f"head dim mismatch: q has {qb.shape[-1]}, k/v have {kb.shape[-1]}")
    if kb.shape[1] == 0:  # found in review, 2026-12-06: a bare ZeroDivisionError from the modulo below
        raise ValueError(f"k and v have no heads (shape {tuple(k.shape)} in layout {layout!r})")
    if qb.shape[1] % kb.shape[1]:
        raise ValueError(
            f"GQA needs the query heads ({qb.shape[1]}) to be a multiple of the key/value heads "
            f"({kb.shape[1]})"
        )
    if qb.shape[2] == 0 or kb.shape[2] == 0:
        raise ValueError(f"empty sequence: q_len={qb.shape[2]}, kv_len={kb.shape[2]}")
    return qb, kb, vb


def _check_options(backend: str, options: dict) -> None:
    """TypeError naming the keyword options that ``backend`` (a registered name) does not take."""
    accepts = backend_spec(backend).options
    unknown = set(options) - set(accepts)
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for backend {backend!r}; it accepts {sorted(accepts)}"
        )


_AUTO_CACHE: dict[tuple, str] = {}


def _resolve(backend: str, recipe: Recipe, device: torch.device, deterministic: bool) -> str:
    """``backend``, or for ``auto`` the registry's choice for (recipe, device, deterministic mode),
    resolved once."""
    if backend != AUTO:
        return backend
    key = (
        recipe.name,
        recipe.qk_rotation and recipe.qk_rotation.kind,
        recipe.k_scale_keys,
        str(device),
        deterministic,
    )
    if key not in _AUTO_CACHE:
        _AUTO_CACHE[key] = resolve_backend(
            AUTO, recipe, device, training=recipe.trainable, deterministic=deterministic
        )[0]
    return _AUTO_CACHE[key]


def _with_rotation(rec: Recipe, qk_rotation: str | None, seed: int) -> Recipe:
    """``rec`` with the rotation asked for (None: ``rec``'s own, and then ``seed`` must be 0)."""
    if qk_rotation is not None:
        return with_qk_rotation(rec, qk_rotation, seed)
    if seed != 0:
        raise ValueError(f"qk_rotation_seed={seed!r} needs qk_rotation='hadamard'")
    return rec


def _rope_kwargs(rope: RoPETables | None) -> dict:
    return {} if rope is None else {"rope": rope}


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        recipe: Recipe,
        causal: bool,
        softmax_scale: float,
        backend_name: str,
        options: dict,
        rope: RoPETables | None,
    ):
        backend = get_backend(backend_name)
        out, lse, state = backend.forward(
            q, k, v, recipe, causal=causal, softmax_scale=softmax_scale, **_rope_kwargs(rope), **options
        )
        # the backend applied RoPE (fused_rope): its gradients are of the RoPE'd Q/K, rotated back below
        skeleton, tensors = flatten_state(state)
        rope_skeleton, rope_tensors = flatten_state(rope)  # a RoPETables is a dataclass of tensors
        ctx.save_for_backward(*tensors, *rope_tensors)
        ctx.skeleton, ctx.rope_skeleton, ctx.n_state = skeleton, rope_skeleton, len(tensors)
        ctx.meta = (recipe, causal, softmax_scale, backend_name, options)
        ctx.out_like = (out.shape, out.device)
        # a gradient that autograd has none for stays None (no zero tensor, a GPU fill per step): the
        # LSE's where it is not in the loss, the output's where only the LSE is
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        recipe, causal, softmax_scale, backend_name, options = ctx.meta
        saved = ctx.saved_tensors
        state = restore_state(ctx.skeleton, saved[: ctx.n_state])
        rope = restore_state(ctx.rope_skeleton, saved[ctx.n_state :])
        lse_grad = {}
        if dlse is not None:  # found in review, 2026-12-06: the LSE's gradient was dropped silently
            if not backend_spec(backend_name).lse_grad:
                with_it = [n for n in available_backends() if backend_spec(n).lse_grad]
                raise NotImplementedError(
                    f"the LSE returned by attention(..., return_lse=True) is in the loss, and backend "
                    f"{backend_name!r} has no gradient for it (backends with one: {', '.join(with_it)}); "
                    "use one of those, or lse.detach() where its gradient is not wanted"
                )
            lse_grad = {"dlse": dlse.float().contiguous()}
        if dout is None:  # only the LSE is in the loss
            shape, device = ctx.out_like
            dout = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        # dout in the strides autograd hands over (a [B, H, S, D] view of the caller's layout), with
        # a unit last stride; each backend reads it in place or makes the copy it needs
        dout = dout.bfloat16() if dout.stride(-1) == 1 else dout.contiguous().bfloat16()
        dq, dk, dv = get_backend(backend_name).backward(
            state, dout, recipe, causal=causal, softmax_scale=softmax_scale, **options, **lse_grad
        )
        if rope is not None:  # back from the RoPE'd Q/K, for the inputs that need a gradient (one launch)
            need_q, need_k = ctx.needs_input_grad[:2]
            dq, dk = rope_pair_op(dq if need_q else None, dk if need_k else None, rope, grad=True)
        return dq, dk, dv, None, None, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str | Recipe = "bf16",
    causal: bool = False,
    softmax_scale: float | None = None,
    layout: str = "bshd",
    backend: str = "reference",
    return_lse: bool = False,
    qk_rotation: str | None = None,
    qk_rotation_seed: int = 0,
    rope: RoPETables | None = None,
    **options,
):
    """Scaled dot-product attention in one of the low-precision recipes.

    Args:
        q: BF16 query, ``[B, Sq, Hq, D]`` for layout "bshd" (FlashAttention's), ``[B, Hq, Sq, D]`` for
            "bhsd", ``[Sq, B, Hq, D]`` for "sbhd" (megatron-core's).
        k, v: BF16, same layout with Hkv heads (Hq % Hkv == 0: GQA, K/V are never expanded).
        recipe: a name from ``fp4_attention.RECIPES`` (``bf16``, ``fp8``, ``nvfp4qk_fp8pv``,
            ``nvfp4qk_mxfp4pv_fast``, ``nvfp4qk_mxfp4pv_accurate``) or a :class:`Recipe`.
        causal: causal mask, bottom-right aligned when Sq != Sk (query i sees key j iff
            ``j <= i + Sk - Sq``; a query that sees no key outputs 0 with LSE = -inf).
        softmax_scale: defaults to ``D ** -0.5``.
        backend: a registered backend (``fa.available_backends()``; each one's ``SPEC`` says what it
            runs), or ``auto``: the highest-priority backend that runs the recipe on q's device
            (``fp4_attention.backends.resolve_backend``). Under
            ``torch.use_deterministic_algorithms(True)`` (not ``warn_only``) only backends whose
            backward is bitwise reproducible: ``auto`` passes the others over, a named one raises
            UnsupportedError.
        return_lse: also return the natural-log LSE, FP32 ``[B, Hq, Sq]``. It has a gradient
            where the backend computes one (``BackendSpec.lse_grad``: reference, triton, cute); with
            another backend, a loss that reaches it raises NotImplementedError in the backward
            (``lse.detach()`` where its gradient is not wanted).
        qk_rotation: ``"hadamard"``: rotate the head dim of Q and K by a random-sign Hadamard
            transform before quantizing them (``numerics/rotation.py``; recipes ``fp8`` and
            ``nvfp4qk_fp8pv``, head dim a power of two); ``"none"``: no rotation; None (default):
            as ``recipe`` says (a name: none; a :class:`Recipe`: its ``qk_rotation``).
        qk_rotation_seed: the seed of the rotation's sign vector (an integer in [0, 2^63)).
        rope: rotary position embedding of Q and K, applied here (``numerics/rope.py``: megatron-core's
            non-interleaved RoPE in FP32, rounded to BF16): a :class:`~fp4_attention.RoPETables`
            (``RoPETables.from_angles(theta)``, ``theta`` FP32 ``[S, D/2]``; build it once per step).
            The result equals attention of ``apply_rope(q)``, ``apply_rope(k)``, gradients to the
            un-rotated q and k. Backends that declare ``fused_rope`` (triton, cute) apply it inside
            their Q/K quantizers (``fp8``: one kernel that reads Q and K once; ``nvfp4qk_fp8pv``:
            both passes of the NVFP4 quantizer); for the others it runs first, as its own pass.
        options: the backend's options (its ``spec.options``; reference: ``block_n``,
            ``rescale_threshold``; triton: forward tiles; cute: ``tiles``).
    Returns:
        BF16 output in q's layout (and the LSE if asked).
    Raises:
        TypeError / ValueError: malformed inputs, RoPE tables of the wrong shape, dtype or device
            (message names the problem);
        UnsupportedError: the backend cannot run this recipe/shape/device (the message names the
            backends that can);
        RuntimeError: a forward-only recipe called with gradients enabled.
    """
    qb, kb, vb = _validate(q, k, v, layout)
    rec = _with_rotation(get_recipe(recipe), qk_rotation, qk_rotation_seed)
    if rec.qk_rotation is not None:
        check_rotation_head_dim(qb.shape[-1])
    # torch's deterministic mode (the trainer's runtime.deterministic) admits only backends whose
    # backward is bitwise reproducible; auto passes the others over, a named one is refused
    deterministic = deterministic_mode()
    backend = _resolve(backend, rec, qb.device, deterministic)
    spec = backend_spec(backend)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(qb.shape[-1])
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    _check_options(backend, options)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if needs_grad and not rec.trainable:
        raise RuntimeError(
            f"recipe {rec.name} is forward-only (MXFP4 P/V diverged in every training run of the paper); "
            "call it under torch.no_grad() / torch.inference_mode(), or train with bf16, fp8 or nvfp4qk_fp8pv"
        )
    check_supported(backend, rec, qb, training=needs_grad, deterministic=deterministic)
    be = get_backend(backend)
    if rope is not None:
        if not isinstance(rope, RoPETables):
            raise TypeError(
                "rope must be an fp4_attention.RoPETables (RoPETables.from_angles), got "
                f"{type(rope).__name__}"
            )
        rope.check(qb.shape[2], kb.shape[2], qb.shape[-1], qb.device)
        if not spec.fused_rope:  # RoPE as its own pass (one launch for Q and K) before this backend
            qb, kb = RoPEFunction.apply(qb, kb, rope) if needs_grad else rope_pair_op(qb, kb, rope)
            rope = None
    if needs_grad:
        out, lse = _AttentionFunction.apply(
            qb, kb, vb, rec, bool(causal), float(softmax_scale), backend, options, rope
        )
    else:
        with torch.no_grad():
            out, lse, _ = be.forward(
                qb,
                kb,
                vb,
                rec,
                causal=bool(causal),
                softmax_scale=float(softmax_scale),
                **_rope_kwargs(rope),
                **options,
            )
    out = _from_bhsd(out, layout)
    return (out, lse) if return_lse else out


class FP4Attention(torch.nn.Module):
    """``nn.Module`` wrapper of :func:`attention` with a fixed recipe, mask, layout and backend.

    ``forward(q, k, v, rope=None)`` takes and returns tensors in ``layout`` (see :func:`attention`;
    ``rope``: the step's :class:`~fp4_attention.RoPETables`, or None); ``qk_rotation`` /
    ``qk_rotation_seed`` as there. Unlike :func:`attention`, whose ``causal`` defaults to False, the
    module defaults to ``causal=True`` (a decoder's self-attention, the layer this library trains);
    pass ``causal=False`` for an encoder or cross-attention.
    """

    def __init__(
        self,
        recipe: str = "bf16",
        *,
        causal: bool = True,
        softmax_scale: float | None = None,
        layout: str = "bshd",
        backend: str = "reference",
        qk_rotation: str | None = None,
        qk_rotation_seed: int = 0,
        **options,
    ):
        super().__init__()
        self.recipe = _with_rotation(get_recipe(recipe), qk_rotation, qk_rotation_seed)
        if backend != AUTO:
            get_backend(backend)
            _check_options(backend, options)  # as attention() would at the first call
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.causal, self.softmax_scale, self.layout, self.backend, self.options = (
            causal,
            softmax_scale,
            layout,
            backend,
            options,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RoPETables | None = None
    ) -> torch.Tensor:
        return attention(
            q,
            k,
            v,
            recipe=self.recipe,
            rope=rope,
            causal=self.causal,
            softmax_scale=self.softmax_scale,
            layout=self.layout,
            backend=self.backend,
            **self.options,
        )

    def extra_repr(self) -> str:
        return (
            f"recipe={self.recipe.label}, causal={self.causal}, layout={self.layout}, backend={self.backend}"
        )
