"""The backend registry: declarations, ``auto``, and every "unsupported" error naming the backends
that do run the request (``fp4_attention.backends``)."""

import inspect

import pytest
import torch

import fp4_attention as fa
from fp4_attention import backends
from fp4_attention.backends import BackendSpec, UnsupportedError

from ..conftest import atomic_fp8_backend

FIXED = {"self", "q", "k", "v", "recipe", "causal", "softmax_scale", "state", "dout"}


def test_every_builtin_is_declared_and_imports():
    assert fa.available_backends() == sorted(backends.BUILTIN)
    for name in backends.BUILTIN:
        spec = fa.backend_spec(name)
        assert spec.name == name
        assert set(spec.recipes) <= set(fa.RECIPES)
        impl = fa.get_backend(name)  # the cute extra is installed in CI: an import failure fails here
        assert impl.spec is spec


@pytest.mark.parametrize("name", sorted(backends.BUILTIN))
def test_declared_options_are_the_forward_keywords(name):
    impl = fa.get_backend(name)
    forward = set(inspect.signature(type(impl).forward).parameters) - FIXED
    # a backend that declares fused_rope takes the RoPE tables too (interface.attention passes them)
    assert forward == set(impl.spec.options) | ({"rope"} if impl.spec.fused_rope else set())


def test_auto_on_cpu_is_the_reference_for_every_recipe():
    for recipe in fa.RECIPES:
        name, why = fa.resolve_backend("auto", recipe, "cpu", training=fa.get_recipe(recipe).trainable)
        assert name == "reference" and "CPU" in why


def test_auto_prefers_the_highest_priority_backend_that_runs_the_recipe():
    # without a GPU the ranking is read from the declarations alone (device None)
    assert backends.alternatives("bf16") == ["fa4", "triton", "reference"]
    assert backends.alternatives("fp8") == ["cute", "triton", "reference"]
    assert backends.alternatives("nvfp4qk_fp8pv") == ["cute", "triton", "reference"]
    # deterministic mode passes over cute's backwards (FP32 atomics) of both recipes
    for recipe in ("fp8", "nvfp4qk_fp8pv"):
        assert backends.alternatives(recipe, training=True, deterministic=True) == ["triton", "reference"]
        # inference keeps the priority order
        want = backends.alternatives(recipe)
        assert backends.alternatives(recipe, training=False, deterministic=True) == want


def test_named_backend_errors_name_the_alternatives():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(
        UnsupportedError, match=r"^triton backend needs a CUDA device, not cpu; use backend='reference'$"
    ):
        backends.check_supported("triton", "fp8", q)
    with pytest.raises(
        UnsupportedError,
        match="cute backend runs recipes fp8, nvfp4qk_fp8pv, not 'bf16'; use backend='reference'",
    ):
        backends.check_supported("cute", "bf16", q)
    with pytest.raises(
        UnsupportedError, match="runs head dims multiples of 16 up to 256, not 300; no registered"
    ):
        backends.check_supported("reference", "fp8", torch.zeros(1, 1, 4, 300))
    with pytest.raises(
        ValueError, match="unknown attention backend 'nope'; known: auto, cute, fa4, reference"
    ):
        fa.backend_spec("nope")


def test_a_backend_without_backward_is_refused_for_training_and_passed_over_by_auto():
    class ForwardOnly:
        spec = BackendSpec(
            name="fwd_only_test",
            impl="unused:Unused",
            recipes=("fp8",),
            backward=False,
            devices=("cpu",),
            priority=99,
        )

        def forward(self, q, k, v, recipe, *, causal, softmax_scale):
            return fa.get_backend("reference").forward(
                q, k, v, recipe, causal=causal, softmax_scale=softmax_scale
            )

        def backward(self, state, dout, recipe, *, causal, softmax_scale):
            raise AssertionError("never called")

    fa.register_backend(ForwardOnly())
    try:
        assert fa.resolve_backend("auto", "fp8", "cpu", training=False)[0] == "fwd_only_test"
        assert fa.resolve_backend("auto", "fp8", "cpu", training=True)[0] == "reference"
        q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
        out = fa.attention(q, q, q, recipe="fp8", backend="fwd_only_test", layout="bhsd")
        assert torch.equal(out, fa.attention(q, q, q, recipe="fp8", backend="reference", layout="bhsd"))
        with pytest.raises(UnsupportedError, match="has no backward .* use backend='reference'"):
            fa.attention(q.requires_grad_(), q, q, recipe="fp8", backend="fwd_only_test", layout="bhsd")
        with pytest.raises(ValueError, match="already registered"):
            fa.register_backend(ForwardOnly())
    finally:
        backends._SPECS.pop("fwd_only_test")
        backends._INSTANCES.pop("fwd_only_test")


def test_batch_times_heads_above_a_backends_grid_is_refused_naming_the_alternatives():
    """B * Hq beyond ``max_batch_heads`` (the Triton and CuTe backends: 65,535, CUDA's grid y axis,
    where a launch would fail with a bare "invalid argument") is refused before any kernel, and the
    backends without the limit are named; at the limit it runs."""
    from ..conftest import ReferenceBacked

    for name in ("triton", "cute"):
        spec = fa.backend_spec(name)
        assert spec.max_batch_heads == 65535
        reason = backends._runs(spec, fa.get_recipe("fp8"), None, 128, True, batch_heads=65536)
        assert reason is not None and "up to 65,535" in reason and "not 65,536" in reason
        assert backends._runs(spec, fa.get_recipe("fp8"), None, 128, True, batch_heads=65535) is None
    fa.register_backend(
        ReferenceBacked(
            BackendSpec(
                name="bh_test", impl="unused:Unused", recipes=("fp8",), devices=("cpu",), max_batch_heads=4
            )
        )
    )
    try:
        q = torch.randn(2, 3, 8, 16, dtype=torch.bfloat16)  # B * Hq = 6
        with pytest.raises(
            UnsupportedError,
            match=r"^bh_test backend runs B \* Hq \(batch times query heads\) up to 4, .* not 6 \(a smaller "
            r"micro-batch fits\); use backend='reference'$",
        ):
            fa.attention(q, q, q, recipe="fp8", backend="bh_test", layout="bhsd")
        assert "bh_test" not in backends.alternatives("fp8", "cpu", batch_heads=6)
        assert "bh_test" in backends.alternatives("fp8", "cpu", batch_heads=4)
        out = fa.attention(q[:, :2], q[:, :2], q[:, :2], recipe="fp8", backend="bh_test", layout="bhsd")
        assert out.shape == (2, 2, 8, 16)
    finally:
        backends._SPECS.pop("bh_test")
        backends._INSTANCES.pop("bh_test")


def test_register_needs_a_spec():
    with pytest.raises(TypeError, match="`spec` attribute of type BackendSpec"):
        fa.register_backend(object())


def test_attention_config_validates_from_the_declarations():
    cfg = fa.AttentionConfig(recipe="fp8", backend="cute", options={"tiles": (128, 128, 2)})
    assert cfg.call_kwargs() == {"recipe": "fp8", "backend": "cute", "tiles": (128, 128, 2)}
    with pytest.raises(
        ValueError,
        match="runs recipe.s. fp8, nvfp4qk_fp8pv, not 'bf16'; use attention.backend=auto or one of "
        "fa4, triton, reference",
    ):
        fa.AttentionConfig(recipe="bf16", backend="cute")
    with pytest.raises(
        ValueError, match=r"attention.options \['tiles'\] are not options of backend 'triton'"
    ):
        fa.AttentionConfig(recipe="fp8", backend="triton", options={"tiles": (128, 128, 2)})
    with pytest.raises(ValueError, match="need a named attention.backend"):
        fa.AttentionConfig(recipe="fp8", options={"block_n": 64})
    resolved, why = fa.AttentionConfig(recipe="fp8").resolve("cpu")
    assert resolved == fa.AttentionConfig(recipe="fp8", backend="reference") and why.startswith("auto:")


def test_a_backend_that_fails_to_import_is_passed_over_by_auto_and_named():
    """Installed but broken (here: the class is missing; on the H200 a half-unpacked CUTLASS DSL
    raised RuntimeError) counts as not importable, never as a crash of ``auto``."""
    spec = BackendSpec(
        name="broken_test", impl="json:NoSuchBackend", recipes=("fp8",), devices=("cpu",), priority=99
    )
    backends._load_builtin_specs()
    backends._SPECS[spec.name] = spec
    try:
        name, why = fa.resolve_backend("auto", "fp8", "cpu")
        assert name == "reference" and "passed over: broken_test not importable" in why
        with pytest.raises(ValueError, match="attention backend 'broken_test' cannot be imported"):
            fa.get_backend("broken_test")
    finally:
        backends._SPECS.pop(spec.name)


def test_a_backend_that_refuses_its_configuration_on_import_says_why_without_the_install_hint(
    tmp_path, monkeypatch
):
    """A ValueError raised while the backend module imports (the cute backend's check of
    FP4_ATTENTION_CUTE_CACHE_DIR) is the fix to make; "pip install" would send the user astray."""
    (tmp_path / "refusing_backend_test.py").write_text(
        'raise ValueError("SOME_DIR=/x is not a directory; unset it or point it at a directory")\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = BackendSpec(
        name="refusing_test",
        impl="refusing_backend_test:Backend",
        recipes=("fp8",),
        devices=("cpu",),
        install_hint="pip install something",
    )
    backends._load_builtin_specs()
    backends._SPECS[spec.name] = spec
    try:
        with pytest.raises(ValueError) as info:
            fa.get_backend("refusing_test")
        expected = "SOME_DIR=/x is not a directory; unset it or point it at a directory"
        assert str(info.value) == f"attention backend 'refusing_test': {expected}"
    finally:
        backends._SPECS.pop(spec.name)


def test_deterministic_mode_refuses_a_nondeterministic_backward_and_auto_passes_it_over():
    fa.register_backend(atomic_fp8_backend("atomic_test"))
    was = torch.are_deterministic_algorithms_enabled()
    try:
        assert fa.resolve_backend("auto", "fp8", "cpu")[0] == "atomic_test"
        name, why = fa.resolve_backend("auto", "fp8", "cpu", deterministic=True)
        assert name == "reference" and "passed over: atomic_test (its fp8 backward is not bitwise" in why
        with pytest.raises(
            UnsupportedError, match="FP32 atomics .* deterministic mode .* use backend='reference'"
        ):
            fa.resolve_backend("atomic_test", "fp8", "cpu", deterministic=True)
        cfg = fa.AttentionConfig(recipe="fp8", backend="auto")
        assert cfg.resolve("cpu", deterministic=True)[0].backend == "reference"
        q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
        torch.use_deterministic_algorithms(True)
        with pytest.raises(UnsupportedError, match="not bitwise reproducible"):
            fa.attention(q.clone().requires_grad_(), q, q, recipe="fp8", backend="atomic_test", layout="bhsd")
        fa.attention(q, q, q, recipe="fp8", backend="atomic_test", layout="bhsd")  # no backward: runs
        out = fa.attention(q.clone().requires_grad_(), q, q, recipe="fp8", backend="auto", layout="bhsd")
        out.sum().backward()  # auto took the reference
    finally:
        torch.use_deterministic_algorithms(was)
        backends._SPECS.pop("atomic_test")
        backends._INSTANCES.pop("atomic_test")


def test_a_cuda_device_without_a_gpu_raises_unsupported_naming_cpu(monkeypatch):
    """``resolve("cuda")`` on a machine whose torch sees no GPU (the README's snippet run on a CPU
    machine) says so and names the CPU alternative, for ``auto`` and for a named backend alike,
    instead of failing inside torch.cuda."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for requested in ("auto", "triton"):
        with pytest.raises(UnsupportedError, match=r"torch sees no CUDA GPU here.*device 'cpu'"):
            fa.resolve_backend(requested, "fp8", "cuda")
    with pytest.raises(UnsupportedError, match="no CUDA GPU"):
        fa.AttentionConfig(recipe="fp8").resolve(torch.device("cuda", 0))
    assert fa.AttentionConfig(recipe="fp8").resolve("cpu")[0].backend == "reference"
