"""The bound launch path (`runtime/bound_launch.py`, what a kernel call on CUDA takes) on the CPU,
against Triton's own JIT: with a driver that reports device 0, stream 0 and sm_90, and every
compilation a stub compiled kernel whose launcher records its arguments (`bench/launch.py`), the
JIT binds, specializes and launches here as it does on CUDA. The launches are those of every
kernel of a decode step and of a prefill step of a tiny paged Llama, recorded from the steps."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from engine_steps import two_sequence_flat_steps
from hypothesis import given
from hypothesis import strategies as st
from triton.runtime.jit import compute_cache_key

import ad_mlir
from ad_mlir.bench.launch import host_only_triton, recorded_calls, stubbed_jit
from ad_mlir.codegen.ptx import Launch, record_launches
from ad_mlir.runtime import bound_launch
from ad_mlir.runtime.bound_launch import BoundKernel
from ad_mlir.runtime.kernels import RegionKernel, reference_kernels, traced
from ad_mlir.zoo.tiny import TinyConfig, build_model

PAGE = 4


@pytest.fixture(scope="module")
def calls() -> list[tuple[RegionKernel, list[torch.Tensor], list[Any]]]:
    """Each kernel's call in a decode step of two sequences (5 and 9 cached tokens) and in a
    prefill step of two prompts (3 and 2 tokens): the kernel, its tensors and its scalars."""
    llm = ad_mlir.LLM(build_model(TinyConfig(family="llama", layers=1)), max_batch=2, max_seq_len=16, page_size=PAGE)
    found = []
    for flat in two_sequence_flat_steps():
        with reference_kernels():  # the calls' inputs are what is wanted, not the kernels' interpretation
            steps_calls = recorded_calls(llm, flat).values()
        for kernel, groups in steps_calls:
            found.append((kernel, *kernel._launch_inputs(kernel.join_inputs(*groups))))
    assert {k.name.rsplit("_", 1)[0] for k, _, _ in found} >= {"rms_norm", "add_rms_norm", "cached_attention",
                                                                "silu_and_mul"}
    return found


@pytest.fixture
def host() -> Iterator[None]:
    with host_only_triton():
        yield


class Runs:
    """A stub compiled kernel's launcher: each launch's arguments."""

    def __init__(self) -> None:
        self.args: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.args.append(args)


def _counted(jit: Any) -> list[int]:
    """Counts the calls of `jit.run` (the JIT's launch) from now on."""
    count, run = [0], jit.run

    def counting(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return run(*args, **kwargs)

    jit.run = counting
    return count


def _jit_key(jit: Any, launch: Launch) -> str:
    """The JIT's own cache key for a launch, from its binder (the options the JIT adds itself are
    the same for every call)."""
    _, key_cache, _, _, binder = jit.device_caches[0]
    _, specialization, options = binder(*launch.args, **launch.kwargs)
    return compute_cache_key(key_cache, specialization, options)


def _variants(launch: Launch, kernel: BoundKernel) -> Iterator[tuple[str, Launch, bool]]:
    """The launch with one argument changed: (what, the launch, whether Triton specializes on the
    change). A tensor: misaligned (a view 4 bytes in), another dtype, or another tensor alike
    (not specialized on); an int: 1, a multiple of 16, past 32 bits, or moved by 16 (not
    specialized on: same residue, never 1); a constexpr or an option: another value."""
    constexpr = {p.name for p in kernel.fn.params if p.is_constexpr}
    for i, value in enumerate(launch.args):
        if isinstance(value, torch.Tensor):
            flat = torch.zeros(value.numel() + 1, dtype=value.dtype)
            yield f"arg {i} misaligned", _with(launch, i, _like(value, flat[1:].view(value.shape))), True
            yield (f"arg {i} dtype", _with(launch, i, _like(value, value.to(torch.float16))),
                   value.dtype != torch.float16)
            yield f"arg {i} alike", _with(launch, i, _like(value, value.clone())), False
        elif type(value) is int and kernel.fn.params[i].name not in constexpr:
            for new in (1, 16 * (value // 16 + 1), 2**33 + value, value + 16):
                if new != value:
                    yield f"arg {i} = {new}", _with(launch, i, new), new != value + 16 or value in (1, -15)
    params = {p.name for p in kernel.fn.params}
    for name, value in launch.kwargs.items():
        if type(value) is int and value and (name in constexpr or name not in params):
            yield f"{name} = {value * 2}", Launch(launch.grid, launch.args, {**launch.kwargs, name: value * 2}), True


def _like(value: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """`new` as a tensor of `value`'s class (a weight stays a Parameter: the same plan)."""
    return torch.nn.Parameter(new, requires_grad=False) if isinstance(value, torch.nn.Parameter) else new


def _with(launch: Launch, i: int, value: Any) -> Launch:
    return Launch(launch.grid, launch.args[:i] + (value,) + launch.args[i + 1:], launch.kwargs)


@pytest.mark.usefixtures("host")
def test_bound_arguments_are_the_jit_binders_and_the_key_splits_what_triton_specializes_on(calls: list) -> None:
    """For every launch of every kernel: the arguments the bound path hands `CompiledKernel.run` are
    those the JIT's binder bound, each the same object; and for every argument changed in a way
    Triton specializes on (its own key changes), the bound key changes too, while a change it does
    not specialize on keeps the bound key (later calls find their kernel)."""
    checked = 0
    for kernel, tensors, scalars in calls:
        jit = stubbed_jit(kernel.cached.jit_function)
        bound = BoundKernel(jit)
        _, key_cache, _, _, binder = jit.device_caches[0]
        for launch in record_launches(kernel.cached.module, tensors, scalars):
            plan, key, args = bound.bind(launch.args, launch.kwargs)
            jit_args, _, _ = binder(*launch.args, **launch.kwargs)
            assert len(args) == len(jit_args) and all(a is b for a, b in zip(args, jit_args.values(), strict=True)), kernel.name
            jit_key = _jit_key(jit, launch)
            for what, variant, specialized in _variants(launch, bound):
                variant_plan, variant_key, _ = bound.bind(variant.args, variant.kwargs)
                assert (_jit_key(jit, variant) != jit_key) == specialized, (kernel.name, what)
                assert ((variant_plan, variant_key) != (plan, key)) == specialized, (kernel.name, what)
                checked += 1
    assert checked > 200


@pytest.mark.usefixtures("host")
def test_a_second_call_launches_the_compiled_kernel_with_the_jits_arguments_not_through_the_jit(calls: list) -> None:
    """The first call of a specialization goes through `JITFunction.run` (compiles, launches), the
    next ones call the compiled kernel's launcher only, with the grid, stream, function, metadata
    and arguments the JIT gives it (the launcher allocates new outputs each call: alike tensors);
    no launch hook is set, so none is handed over. A misaligned input is another specialization:
    the JIT again, once."""
    for kernel, tensors, scalars in calls:
        runs = Runs()
        jit = stubbed_jit(kernel.cached.jit_function, runs)
        bound, count = BoundKernel(jit), _counted(jit)
        launch = kernel.cached.module.launch
        launch(jit, tensors, scalars)
        by_jit, runs.args[:] = list(runs.args), []
        jit_calls = count[0]
        launch(bound, tensors, scalars)
        assert count[0] == 2 * jit_calls, kernel.name
        runs.args.clear()  # the JIT's launches, through its stub's run
        launch(bound, tensors, scalars)
        assert count[0] == 2 * jit_calls, f"{kernel.name}: a second call went through JITFunction.run"
        assert len(runs.args) == len(by_jit)
        for ours, theirs in zip(runs.args, by_jit, strict=True):
            assert ours[:6] == theirs[:6] and ours[6:9] == (None, None, None), kernel.name
            assert [_alike(a) for a in ours[9:]] == [_alike(a) for a in theirs[9:]], kernel.name
    kernel, tensors, scalars = next(c for c in calls if c[0].name.startswith("rms_norm"))
    jit = stubbed_jit(kernel.cached.jit_function)
    bound, count = BoundKernel(jit), _counted(jit)
    misaligned = [torch.zeros(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape) for t in tensors]
    for inputs in (tensors, tensors, misaligned, misaligned):
        kernel.cached.module.launch(bound, inputs, scalars)
    assert count[0] == 2


def _alike(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.dtype, value.shape, value.stride(), value.data_ptr() % 16
    return value


@pytest.mark.usefixtures("host")
def test_launch_hooks_are_handed_to_the_launcher_with_the_jits_metadata(calls: list) -> None:
    from triton import knobs

    kernel, tensors, scalars = calls[0]
    runs = Runs()
    bound = BoundKernel(stubbed_jit(kernel.cached.jit_function, runs))
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        for _ in range(2):
            kernel.cached.module.launch(bound, tensors, scalars)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    first, args = runs.args  # the JIT's launch, then the bound one
    assert first[7] is args[7]
    assert args[7] is knobs.runtime.launch_enter_hook and args[6].get()["function"] == 0


@pytest.mark.usefixtures("host")
def test_what_it_does_not_bind_goes_through_the_jit_on_every_call(
        calls: list, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A callable grid, an argument of a type Triton specializes apart (a tuple), and a kernel that
    is not a `JITFunction` (the interpreter's, said once in the log) launch through the kernel's own
    `run` each time."""
    kernel, tensors, scalars = next(c for c in calls if c[0].name.startswith("silu_and_mul"))
    (launch,) = record_launches(kernel.cached.module, tensors, scalars)
    jit = stubbed_jit(kernel.cached.jit_function)
    bound, count = BoundKernel(jit), _counted(jit)
    for _ in range(2):
        bound[lambda _: launch.grid](*launch.args, **launch.kwargs)
    i = next(i for i, a in enumerate(launch.args) if type(a) is int)
    for _ in range(2):
        bound[launch.grid](*launch.args[:i], (launch.args[i],), *launch.args[i + 1:], **launch.kwargs)
    assert count[0] == 4
    interpreted, interpreted_runs = kernel.cached.jit_function, []
    monkeypatch.setattr(interpreted, "run", lambda *args, **kwargs: interpreted_runs.append(args))
    unbound = BoundKernel(interpreted)
    bound_launch._say_once.cache_clear()
    with caplog.at_level(logging.INFO, logger=bound_launch.__name__):
        for _ in range(2):
            kernel.cached.module.launch(unbound, tensors, scalars)
    assert len(interpreted_runs) == 2 and "InterpretedFunction" in unbound.unbindable
    assert sum("through Triton's JIT on every call" in r.message for r in caplog.records) == 1


def test_traced_calls_are_told_from_eager_ones() -> None:
    """A call torch traces (fake or functional tensors, a dispatch mode) hands the kernel to
    `wrap_triton`; an eager call on plain tensors or parameters is launched bound."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    t = torch.zeros(2)
    assert not traced(t) and not traced(torch.nn.Parameter(t))
    with FakeTensorMode() as fake:
        assert traced(fake.from_tensor(t))
    with Passing():
        assert traced(t)


@pytest.mark.usefixtures("host")
def test_constexprs_are_told_apart_by_value_and_type(tmp_path: Any) -> None:
    """A constexpr's value and type pick the kernel: 1, True and 1.0 get one each (the JIT's own
    key cache holds them as one: equal tuples), 0.0 and -0.0 one (as the JIT: equal values), and
    never does one kernel serve calls the JIT compiles apart."""
    import importlib.util

    path = tmp_path / "scaled_kernel.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                    "def scaled(x, n, SCALE: tl.constexpr):\n    pass\n")
    spec = importlib.util.spec_from_file_location("scaled_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = stubbed_jit(module.scaled)
    bound, x = BoundKernel(jit), torch.zeros(4)
    launches = [Launch((1,), (x, 3), {"SCALE": scale}) for scale in (0.0, -0.0, 0.5, 0.25, 0.5, 1, True, 1.0)]
    ours = [(id(plan), key) for plan, key, _ in (bound.bind(launch.args, launch.kwargs) for launch in launches)]
    jit_keys = [_jit_key(jit, launch) for launch in launches]
    same = [[a == b for b in ours] for a in ours]
    same_for_jit = [[a == b for b in jit_keys] for a in jit_keys]
    assert all(j for row, jit_row in zip(same, same_for_jit, strict=True)
               for o, j in zip(row, jit_row, strict=True) if o)
    assert sum(map(sum, same)) == 8 + 2 + 2  # 0.0 with -0.0, 0.5 with 0.5, each other alone


@given(st.integers(0, 2**40), st.integers(1, 2**20))
def test_the_launchers_grid_arithmetic_is_tritons(x: int, div: int) -> None:
    """The generated launchers' `cdiv` and `next_power_of_2` (`codegen/launch.py`, plain Python:
    Triton's are ConstexprFunctions, about 100x dearer a call) give Triton's values, 0 included."""
    import triton

    from ad_mlir.codegen.launch import cdiv, next_power_of_2

    assert cdiv(x, div) == triton.cdiv(x, div)
    assert next_power_of_2(x) == triton.next_power_of_2(x)
