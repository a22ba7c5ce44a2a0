"""Numeric verification of passes (`ad-opt --verify-each`, `compile(..., verify=True)`);
the compiled graph's kernels are checked against the final IR in `runtime/verify.py`.

Before each pass the function runs on fixed random inputs through the reference semantics
(`semantics/reference.py`), keeping every value; after the pass it runs again. Passes rewrite the
module in place, so an op the pass kept is the same object before and after: the first kept op
(in program order) whose result moved beyond the dtype's tolerance is where the rewrite broke
the program, and the ops the pass made that feed it are named too.

Tolerances (relative, and as much again times the largest magnitude of the value, since sums
that cancel keep their terms' rounding): fp32 1e-5 (passes reorder sums, e.g. fuse-gemms' one
GEMM over concatenated weights); bf16 2^-6 and fp16 2^-9, two units in the last place (a fused
op rounds once where the unfused ops rounded twice); integers and booleans exactly. Where wide
activations amplify the first roundings past these (a wide-init model: GELU's cube, a second
layer's attention), a value off by more is still accepted when nudging the weights and inputs by
one rounding moves it at least a quarter as far (`_Nudged`): the pass only rounded differently.
A wrong rewrite moves values by their own size, far more.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, AnyFloat, DictionaryAttr, ModuleOp, TensorType, i1
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from ad_mlir.dialects import ad
from ad_mlir.dialects.weights import weight_of
from ad_mlir.frontends.fx_import import INPUT_ATTR
from ad_mlir.passes.cache.interface import POSITION_INPUT
from ad_mlir.passes.patterns.matching import describe_op
from ad_mlir.semantics import op_table as T
from ad_mlir.semantics.reference import run_block_values

log = logging.getLogger(__name__)

RTOL = {torch.float32: 1e-5, torch.float64: 1e-9, torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9}
SEQ = 7
"""The size given to dynamic dims (the sequence) of random inputs."""
COLLECTIVES = (ad.AllReduceOp, ad.WaitTensorOp)


class NumericMismatch(DiagnosticException):
    """A pass changed what the program computes (the message names the pass and the op)."""


def function_of(module: ModuleOp) -> func.FuncOp:
    return next(op for op in module.ops if isinstance(op, func.FuncOp) and op.body.blocks)


def _random(t: Attribute, generator: torch.Generator, high: int) -> Any:
    if not isinstance(t, TensorType):  # a scalar input, e.g. HF's `use_cache` flag
        return False if t == i1 else 1.0 if isinstance(t, AnyFloat) else SEQ
    shape = [SEQ if d == DYNAMIC_INDEX else d for d in t.get_shape()]
    dtype = T.torch_dtype(t.element_type)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not dtype.is_floating_point:
        return torch.randint(0, high, shape, generator=generator, dtype=dtype)
    return torch.randn(shape, generator=generator).to(dtype)


def _index_bound(arg: SSAValue) -> int:
    """Integer inputs index embeddings: keep them below the rows of every table they index."""
    rows = [use.operation.weight.type.get_shape()[0] for use in arg.uses
            if isinstance(use.operation, ad.EmbeddingOp) and use.operation.indices == arg]
    return min(rows, default=4)


def _cache_input(arg: SSAValue, attrs: DictionaryAttr, slots: int, pages: int) -> torch.Tensor | None:
    """Inputs of a cached function (`insert-cached-attention`) that make it compute what the
    function computed before the pass: empty caches, starts 0 (a prefill), row b in slot
    b % slots (rows sharing a slot are harmless at start 0: nothing is read back), and the
    position ids 0..seq-1 that a prefill has (the pass dropped a mask computed from them). The
    paged form (`pages` > 0: the pools' page size) gets one sequence of all the tokens in pages
    0, 1, .. (and state slot 0) and the logits of every token."""
    names = attrs.data
    if ad.CACHE_ATTR in names:
        return torch.zeros(arg.type.get_shape(), dtype=T.torch_dtype(arg.type.element_type))
    if ad.CACHE_SLOTS_ATTR in names:
        return torch.arange(SEQ) % slots
    if ad.CACHE_STARTS_ATTR in names:
        return torch.zeros(1 if pages else SEQ, dtype=torch.int64)
    if ad.QUERY_STARTS_ATTR in names:
        return torch.tensor([0, SEQ])
    if ad.STATE_SLOTS_ATTR in names:
        return torch.zeros(1, dtype=torch.int64)
    if ad.BLOCK_TABLES_ATTR in names:
        return torch.arange(-(-SEQ // pages))[None]
    if ad.LOGITS_INDICES_ATTR in names:
        return torch.arange(SEQ)
    if INPUT_ATTR in names and names[INPUT_ATTR].data == POSITION_INPUT:
        shape = [SEQ if d == DYNAMIC_INDEX else d for d in arg.type.get_shape()]
        return torch.arange(shape[-1]).expand(shape).contiguous()
    return None


def example_arguments(fn: func.FuncOp, weights: Mapping[str, torch.Tensor] | None, seed: int = 0) -> list[Any]:
    """One value per argument of `fn`: the weight by its FQN when `weights` has it, the inputs of
    a cached function as `_cache_input` says, else (and for other user inputs) a seeded random
    value of the argument's type, dynamic dims of size SEQ. Arguments a pass appends get values
    of their own; the values of the others do not change."""
    generator = torch.Generator().manual_seed(seed)
    block_args, arg_attrs = fn.body.block.args, list(fn.arg_attrs or [])
    slots = min((a.type.get_shape()[0] for a, attrs in zip(block_args, arg_attrs, strict=True)
                 if ad.CACHE_ATTR in attrs.data), default=1)
    paged = any(ad.BLOCK_TABLES_ATTR in attrs.data for attrs in arg_attrs)
    page_size = next((a.type.get_shape()[1] for a, attrs in zip(block_args, arg_attrs, strict=True)
                      if ad.CACHE_ATTR in attrs.data
                      and attrs.data[ad.CACHE_ATTR].data.rsplit(" ", 1)[1] in ad.PER_TOKEN_ROLES), 0) if paged else 0
    args = []
    for arg, attrs in zip(block_args, arg_attrs, strict=True):
        weight = weight_of(attrs)
        if weight is not None and weights is not None and weight[1] in weights:
            args.append(weights[weight[1]])
        elif (value := _cache_input(arg, attrs, slots, page_size)) is not None:
            args.append(value)
        else:
            args.append(_random(arg.type, generator, _index_bound(arg)))
    return args


def run_values(fn: func.FuncOp, args: list[Any]) -> tuple[tuple[Any, ...], dict[SSAValue, Any]]:
    """Run `fn` on `args` with the reference semantics: its outputs, and every value."""
    with torch.no_grad():
        return run_block_values(fn.body.block, args)


def mismatch(got: Any, expected: Any) -> str | None:
    """Why `got` is not `expected` within the tolerance of its dtype, or None."""
    if not isinstance(expected, torch.Tensor):
        return None if got == expected else f"{got!r} instead of {expected!r}"
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        return f"{kind_of(got)} instead of {kind_of(expected)}"
    if expected.dtype not in RTOL:
        return None if torch.equal(got, expected) else "values differ (exact dtype)"
    g, e = got.double(), expected.double()
    finite = torch.isfinite(e)
    if not torch.equal(torch.isfinite(g), finite) or not torch.equal(g[~finite], e[~finite]):
        return "NaN/inf where the original has none, or the other way round"
    if not finite.any():
        return None
    err = (g - e)[finite].abs().max().item()
    rtol = RTOL[expected.dtype]
    bound = rtol * (1 + e[finite].abs().max().item())
    return None if err <= bound or math.isclose(err, bound) else f"max |error| {err:.3g} > tolerance {bound:.3g}"


NUDGE = 2.0**-23
"""The relative size of the nudge given to the weights and inputs (`_Nudged`): one fp32 rounding."""
ROUNDING_SPREAD = 4.0
"""How much further apart than the nudged run the programs before and after a pass may be (their
roundings are not the nudge; measured on wide-init BLOOM and MPT, match-layernorm: at most 0.81
times as far)."""


class _Nudged:
    """The function after the pass run again with its float weights and inputs nudged by one
    rounding (`nudged`), run only when some value is off by more than the tolerance: how far a
    rounding at the start moves each value. Where the activations are wide (a wide-init model,
    GELU's cube), fp32 rounding at the start moves later values past the fixed tolerance, and
    a pass that only reorders sums moves them as much; a wrong rewrite moves them far more."""

    def __init__(self, fn: func.FuncOp, args: list[Any], values: Mapping[SSAValue, Any]) -> None:
        self.fn, self.args, self.values = fn, args, values
        self._moved: dict[SSAValue, Any] | None = None

    def beyond(self, value: SSAValue, expected: Any, why: str | None) -> str | None:
        """`why` (`value` is not `expected`, its value before the pass) unless a rounding's
        nudge moves `value` about as far (`beyond_rounding`)."""
        if why is None:
            return None
        if self._moved is None:
            self._moved = run_values(self.fn, nudged(self.args))[1]
        return beyond_rounding(self.values[value], expected, self._moved.get(value), why)


def nudged(args: list[Any], seed: int = 1) -> list[Any]:
    """`args` with each float tensor scaled by 1 + NUDGE * (seeded normal noise) elementwise."""
    generator = torch.Generator().manual_seed(seed)
    return [a * (1 + NUDGE * torch.randn(a.shape, generator=generator)).to(a.dtype)
            if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def beyond_rounding(got: Any, expected: Any, moved: Any, why: str) -> str | None:
    """`why` (`got` is not `expected` within the tolerance) unless `moved`, what computed `got`
    gives on inputs nudged by one rounding, is at least 1 / ROUNDING_SPREAD as far from `got`:
    then the gap is fp32 rounding amplified by wide activations, not another result."""
    if not isinstance(got, torch.Tensor) or not got.is_floating_point() or not isinstance(moved, torch.Tensor):
        return why
    gap, spread = _largest_gap(got, expected), _largest_gap(got, moved)
    return None if gap <= ROUNDING_SPREAD * spread else f"{why} (a rounding of the inputs moves it {spread:.3g})"


def _largest_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| where both are finite (0 where nowhere)."""
    finite = torch.isfinite(a) & torch.isfinite(b)
    return (a.double() - b.double())[finite].abs().max().item() if finite.any() else 0.0


def kind_of(v: Any) -> str:
    return f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__


@dataclass
class NumericVerifier:
    """Runs the module before and after each pass on the same inputs (`check_pass`)."""

    weights: Mapping[str, torch.Tensor] | None = None
    """Real weights by FQN (else random ones of each argument's type)."""
    seed: int = 0
    skipped: list[str] = field(default_factory=list)
    """Passes not checked (the module held collectives)."""
    _args: list[Any] | None = None
    _before: tuple[tuple[Any, ...], dict[SSAValue, Any]] | None = None

    def before_pass(self, module: ModuleOp) -> None:
        fn = function_of(module)
        if any(isinstance(op, COLLECTIVES) for op in fn.body.block.ops):
            self._before = None  # a collective needs a process group: one process cannot run it
            return
        if self._args is None:
            self._args = example_arguments(fn, self.weights, self.seed)
        self._before = run_values(fn, list(self._args))

    def check_pass(self, name: str, module: ModuleOp) -> None:
        """Raise NumericMismatch if the pass `name`, just applied to `module`, changed its results."""
        fn = function_of(module)
        if self._before is None or any(isinstance(op, COLLECTIVES) for op in fn.body.block.ops):
            self.skipped.append(name)
            log.warning("verify: %s not checked numerically: the module holds collectives, which one process "
                        "cannot run", name)
            return
        if len(self._args) < len(fn.body.block.args):  # e.g. insert-cached-attention's caches
            self._args = example_arguments(fn, self.weights, self.seed)
        outputs, values = run_values(fn, list(self._args))
        old_outputs, old_values = self._before
        nudged = _Nudged(fn, self._args, values)
        for op in fn.body.block.ops:
            for result in op.results:
                if result in old_values and (why := nudged.beyond(result, old_values[result],
                                                                  mismatch(values[result], old_values[result]))):
                    raise NumericMismatch(self._message(name, op, why, old_values))
        returned = fn.body.block.last_op.operands
        for i, (got, expected) in enumerate(zip(outputs, old_outputs, strict=True)):
            if why := nudged.beyond(returned[i], expected, mismatch(got, expected)):
                raise NumericMismatch(f"pass '{name}' changed the function's result {i}: {why}")

    @staticmethod
    def _message(name: str, op: Operation, why: str, old_values: Mapping[SSAValue, Any]) -> str:
        made = [describe_op(v.owner) for v in op.operands if isinstance(v.owner, Operation) and v not in old_values]
        feeds = f"; it reads what the pass made: {', '.join(made)}" if made else ""
        return f"pass '{name}' changed the results: first differing op {describe_op(op)}: {why}{feeds}"
