"""``backends/triton/launch.py`` (the compiled-kernel launch cache, on by default) on a CPU, with a
stand-in for Triton's ``JITFunction`` and ``CompiledKernel``: which calls take the cache, which go
through ``JITFunction``, and the argument order of the cached launch; and, with Triton's own binder
on a real kernel, that equal cache keys mean equal Triton specializations. The launch itself needs
a GPU (``bench/launch_overhead.py`` times it there)."""

from types import SimpleNamespace

import pytest
import torch
from triton import knobs

from fp4_attention.backends.triton import launch

NAMES = ("X", "Y", "N", "scale", "D", "BLOCK")  # two tensors, an int, a float, two constexprs


class FakeCompiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


class FakeJIT:
    debug = None
    pre_run_hooks = ()

    def __init__(self, names=NAMES, defaults=None):
        defaults = defaults or {}
        self.params = [
            SimpleNamespace(name=n, has_default=n in defaults, default=defaults.get(n)) for n in names
        ]
        self.calls = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.compiled

        return call


@pytest.fixture
def cuda_stub(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(launch.ENV, raising=False)  # the default: on


def _args(x, n=64, scale=0.5):
    return (x, torch.empty(64, dtype=torch.uint8), n, scale)


def _launched_once():
    """A fake kernel, its launcher and a tensor, after one launch (the key now cached)."""
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    x = torch.empty(64)
    cl[(1,)](*_args(x), D=128, BLOCK=16)
    return fn, cl, x


def test_switched_off_every_call_through_jit(monkeypatch, cuda_stub):
    monkeypatch.setenv(launch.ENV, "0")
    fn = FakeJIT()
    x = torch.empty(64)
    for _ in range(3):
        launch.CachedLaunch(fn)[(4, 2)](*_args(x), BLOCK=16, D=128, num_warps=4)
    assert len(fn.calls) == 3 and not fn.compiled.runs


def test_a_tensor_subclass_argument_is_never_cached(cuda_stub):
    """A key holding a tensor subclass (hashed by identity) would never be hit again: not stored."""
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    for _ in range(3):
        cl[(1,)](*_args(torch.nn.Parameter(torch.empty(64))), D=128, BLOCK=16)
    assert len(fn.calls) == 3 and not fn.compiled.runs and not cl.cache


def test_second_call_launches_the_compiled_kernel_with_every_parameter_in_order(cuda_stub):
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    x = torch.empty(64)
    # keywords in another order than the parameters: the cached launch follows the parameters
    assert cl[(4, 2)](*_args(x), BLOCK=16, D=128, num_warps=4) is fn.compiled
    y = torch.empty(64)
    cl[(4, 2)](*_args(y), BLOCK=16, D=128, num_warps=4)  # the same key with other tensors
    assert len(fn.calls) == 1 and len(fn.compiled.runs) == 1
    run = fn.compiled.runs[0]
    assert run[:9] == (4, 2, 1, 77, "function", "metadata", None, None, None)
    assert run[9] is y and run[11:] == (64, 0.5, 128, 16)  # num_warps is an option, not a parameter


@pytest.mark.parametrize(
    "change",
    [
        "misaligned tensor",
        "dtype",
        "int value",
        "bool for int",
        "float value",
        "negative zero",
        "grid",
        "constexpr",
        "option",
        "debug",
    ],
)
def test_a_changed_key_goes_through_jit(cuda_stub, change):
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    base = torch.empty(80)
    x, grid, kw = base[:64], (4, 2), dict(D=128, BLOCK=16, num_warps=4)
    cl[grid](*_args(x), **kw)
    args = _args(x)
    if change == "misaligned tensor":
        args = (base.view(torch.uint8)[1:257].view(torch.uint8), *args[1:])  # address not a multiple of 16
        assert args[0].data_ptr() % 16
    elif change == "dtype":
        args = (x.to(torch.bfloat16), *args[1:])
    elif change == "int value":
        args = _args(x, n=65)
    elif change == "bool for int":  # True == 1, but Triton specializes them differently
        cl[grid](*_args(x, n=1), **kw)
        args = _args(x, n=True)
        fn.calls.pop()
    elif change == "float value":  # a float may be a constexpr, compiled into the kernel
        args = _args(x, scale=0.25)
    elif change == "negative zero":  # -0.0 == 0.0, but a constexpr -0.0 compiles apart
        cl[grid](*_args(x, scale=0.0), **kw)
        args = _args(x, scale=-0.0)
        fn.calls.pop()
    elif change == "debug":  # a debug launch option, as JITFunction.run reads it
        kw["debug"] = True
    elif change == "grid":
        grid = (4, 3)
    elif change == "constexpr":
        kw["BLOCK"] = 32
    else:
        kw["num_warps"] = 8
    cl[grid](*args, **kw)
    assert len(fn.calls) == 2 and not fn.compiled.runs


def test_a_nan_float_hits_the_cache():
    """A NaN float is keyed by its bits: equal keys, one entry (a NaN is not equal to itself)."""
    assert launch._key([float("nan")]) == launch._key([float("nan")])


def test_the_cache_starts_over_past_max_keys(monkeypatch, cuda_stub):
    monkeypatch.setattr(launch, "MAX_KEYS", 3)
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    x = torch.empty(64)
    for n in range(5):  # five lengths: five keys
        cl[(1,)](*_args(x, n=n + 100), D=128, BLOCK=16)
    assert len(cl.cache) == 2  # cleared at the fourth, then two more
    cl[(1,)](*_args(x, n=104), D=128, BLOCK=16)  # the last key is still there
    assert len(fn.calls) == 5 and len(fn.compiled.runs) == 1


def test_a_parameter_left_to_its_default_is_filled_in(cuda_stub):
    fn = FakeJIT(defaults={"BLOCK": 64})
    cl = launch.CachedLaunch(fn)
    x = torch.empty(64)
    for _ in range(2):
        cl[(1,)](*_args(x), D=128, num_warps=4)  # BLOCK left to its default
    assert len(fn.calls) == 1 and fn.compiled.runs[0][-2:] == (128, 64)


def test_a_parameter_without_value_or_default_is_never_cached(cuda_stub):
    fn = FakeJIT()
    cl = launch.CachedLaunch(fn)
    x = torch.empty(64)
    for _ in range(2):
        cl[(1,)](*_args(x), D=128)  # BLOCK missing (a real JITFunction raises)
    assert len(fn.calls) == 2 and not fn.compiled.runs


def test_triton_debug_setting_is_part_of_the_key(monkeypatch, cuda_stub):
    fn, cl, x = _launched_once()
    monkeypatch.setattr(knobs.runtime, "debug", True)
    cl[(1,)](*_args(x), D=128, BLOCK=16)
    assert len(fn.calls) == 2 and not fn.compiled.runs


def test_a_launch_hook_or_the_interpreter_takes_the_jit_path(monkeypatch, cuda_stub):
    fn, cl, x = _launched_once()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)  # a profiler's hook: every launch through JIT
    try:
        cl[(1,)](*_args(x), D=128, BLOCK=16)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cl[(1,)](*_args(x), D=128, BLOCK=16)
    assert len(fn.calls) == 3 and not fn.compiled.runs
    monkeypatch.delenv("TRITON_INTERPRET")
    cl[(1,)](*_args(x), D=128, BLOCK=16)  # and back to the cache
    assert len(fn.calls) == 3 and len(fn.compiled.runs) == 1


def test_another_triton_version_is_off_by_default_and_refuses_1(monkeypatch, cuda_stub):
    monkeypatch.setattr(launch, "_VERIFIED", False)
    fn = FakeJIT()
    x = torch.empty(64)
    for _ in range(2):
        launch.CachedLaunch(fn)[(1,)](*_args(x), D=128, BLOCK=16)
    assert len(fn.calls) == 2 and not fn.compiled.runs  # unset: every launch through JITFunction
    monkeypatch.setenv(launch.ENV, "1")
    with pytest.raises(ValueError, match="verified with Triton 3.6.x only, this is Triton"):
        launch.enabled()


def test_the_switch_takes_0_or_1(monkeypatch):
    monkeypatch.setenv(launch.ENV, "yes")
    with pytest.raises(ValueError, match="must be 0 or 1, got 'yes'"):
        launch.enabled()


def test_one_launcher_per_kernel():
    fn = FakeJIT()
    assert launch.launcher(fn) is launch.launcher(fn) and launch.launcher(fn).fn is fn


def _triton_key(fn, args, kwargs) -> str:
    """Triton 3.6's own cache key of a launch (``JITFunction.run``: its binder's specialization and
    options, as ``compute_cache_key`` strings them), on the CPU: the binder only reads tensors'
    dtypes and addresses."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(fn.signature, fn.params, CUDABackend(GPUTarget("cuda", 90, 32)))
    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
    kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    _, specialization, options = binder(*args, **kw)
    return str(specialization) + str(options)


def _variants():
    """Launches of the real Q/K pair kernel differing in one argument at a time: tensors (aligned,
    misaligned by 2 bytes, other dtypes), ints around Triton's classes (1, multiples of 16, the
    32-bit edge), a bool for an int, constexpr floats (-0.0 and 0.0), bools and launch options."""
    storage = torch.empty(256, dtype=torch.bfloat16)
    tensors = [
        storage[:64],
        storage[8:72],
        storage[1:65],
        storage.float()[:64],
        storage.view(torch.uint8)[:64],
    ]
    ints = [0, 1, 2, 16, 17, 32, 2**31 - 1, 2**31, 2**32, True]
    base = [storage[:64], storage[:64], storage.float()[:64], 64, 1, 64, 64, 64, 128] * 2 + [4]
    kw = dict(D=128, FMAX=448.0, E5M2=False, ROWS=16, num_warps=4)
    yield base, kw
    for i, value in enumerate(base):
        for alt in tensors if isinstance(value, torch.Tensor) else ints:
            yield base[:i] + [alt] + base[i + 1 :], kw
    for name, alts in (
        ("FMAX", [57344.0, 0.0, -0.0]),
        ("E5M2", [True, 1]),
        ("ROWS", [8]),
        ("num_warps", [8]),
    ):
        for alt in alts:
            yield base, {**kw, name: alt}


def test_equal_keys_mean_equal_triton_specializations():
    """The cache's key is at least as strict as Triton's: any two launches of a real kernel with equal
    :func:`launch.launch_key` have equal Triton cache keys (checked against Triton's own binder)."""
    from fp4_attention.backends.triton import quant_fp8

    fn = quant_fp8._fp8_rows_pair_kernel
    cases = list(_variants())
    ours = [launch.launch_key(fn, (1,), 0, tuple(a), k) for a, k in cases]
    theirs = [_triton_key(fn, a, k) for a, k in cases]
    assert len(set(theirs)) > 10  # the variants do reach different specializations
    by_key: dict = {}
    for key, triton_key in zip(ours, theirs):
        by_key.setdefault(key, set()).add(triton_key)
    assert all(len(v) == 1 for v in by_key.values())
