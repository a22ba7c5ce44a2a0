"""What an attention mask HF builds is, found by running its computation.

HF computes the mask inside the graph from the token positions (`create_causal_mask`,
`create_sliding_window_causal_mask`: comparisons of key and query positions, packed-sequence
checks, `where` into an additive float mask). The passes that replace it by masking inside a
kernel (`fuse-rope-attention`, `insert-cached-attention`) run that computation with the
reference semantics at a known length and compare the result with the masks the kernels
build: causal, or causal within a sliding window of the last W keys. Anything else is a
`MaskError` saying what the mask is, and the mask stays (or the pass refuses).

A mask may read a value only for its shape (GIT's token types are `zeros_like` of its
embeddings): such a value's computation runs on the meta device, from the inputs' shapes and the
weights' types (`SHAPE_ONLY`).

A mask may also read the model's buffers and lifted constants (GPT-Neo slices a triangular
`bias` buffer and fills with a lifted scalar): their values are read from the weights the
compiler put in scope (`constants_known`), never a parameter's, which a mask has no reason to read.

ALiBi's bias (BLOOM, MPT) is found the same way: run, it must be `slope[h] * key position` plus
a constant per query row (which the softmax cancels: MPT counts positions from the last key), and
its computation must hold the slopes as a [heads] tensor, which the cached attention then reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, SSAValue


class MaskError(Exception):
    """The mask is not one the kernels can build (the message says what it is instead)."""


class NotCausalWindow(MaskError):
    """The mask is boolean or additive, one for every row and head, but neither causal nor a
    causal sliding window."""


_CONSTANTS: ContextVar[Mapping[str, torch.Tensor] | None] = ContextVar("ad_mlir_known_constants", default=None)


@contextmanager
def constants_known(weights: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Within it, a mask's computation may read the buffers and lifted constants among
    `weights` (FQN -> value): the compiler's program's weights while its pipeline runs."""
    token = _CONSTANTS.set(weights)
    try:
        yield
    finally:
        _CONSTANTS.reset(token)


def _known_constant(fn: func.FuncOp, arg: BlockArgument) -> torch.Tensor | None:
    """The value of a buffer or lifted-constant argument when `constants_known` holds it."""
    from ad_mlir.dialects import ad

    attrs = fn.arg_attrs.data[arg.index].data if fn.arg_attrs else {}
    fqn = next((attrs[k].data for k in (ad.BUFFER_ATTR, ad.CONSTANT_TENSOR_ATTR) if k in attrs), None)
    known = _CONSTANTS.get()
    return known.get(fqn) if fqn is not None and known is not None else None


SHAPE_ONLY = frozenset({"aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
                        "aten.empty_like.default"})
"""Torch ops whose result reads only their input's shape (and dtype), not its values."""


def shape_only(op: Operation) -> bool:
    from ad_mlir.dialects import ad

    return isinstance(op, ad.TorchOp) and op.target.data in SHAPE_ONLY


def backward_slice(value: SSAValue, values_only: bool = False) -> tuple[list[Operation], set[BlockArgument]]:
    """The ops `value` is computed by (program order) and the function arguments they read; with
    `values_only`, not through the inputs of `shape_only` ops (whose values it does not read)."""
    ops: set[Operation] = set()
    args: set[BlockArgument] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, BlockArgument):
            args.add(v)
        elif v.owner not in ops:
            ops.add(v.owner)
            if not (values_only and shape_only(v.owner)):
                stack += list(v.owner.operands)
    block = value.owner.parent_block() if isinstance(value.owner, Operation) else value.owner
    assert isinstance(block, Block)
    return [o for o in block.ops if o in ops], args


def input_name(fn: func.FuncOp, arg: BlockArgument) -> str | None:
    """The user input an argument of `fn` stands for (`ad.input`), None for a weight."""
    from ad_mlir.dialects import ad

    attrs = fn.arg_attrs.data[arg.index].data if fn.arg_attrs else {}
    return attrs[ad.INPUT_ATTR].data if ad.INPUT_ATTR in attrs else None


def evaluate(fn: func.FuncOp, mask: SSAValue, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The mask computed from `inputs` (user input name -> value); a mask that reads anything
    else (a padding mask, a weight) is a MaskError."""
    return evaluate_slice(fn, mask, inputs)[mask]


def evaluate_slice(fn: func.FuncOp, mask: SSAValue, inputs: Mapping[str, torch.Tensor]) -> dict[SSAValue, object]:
    """`evaluate`, with every value of the computation (program order)."""
    from ad_mlir.semantics.reference import run_op

    ops, args = backward_slice(mask, values_only=True)
    env: dict[SSAValue, object] = {}
    unknown = []
    for arg in args:
        name = input_name(fn, arg)
        if name in inputs:
            env[arg] = inputs[name]
        elif (constant := _known_constant(fn, arg)) is not None:
            env[arg] = constant
        else:
            unknown.append(arg)
    if unknown:
        raise MaskError(_unknown_read(fn, unknown, ops))
    with torch.no_grad():
        for op in ops:
            operands = [_shaped_like(fn, v, inputs) for v in op.operands] if shape_only(op) else \
                [env[v] for v in op.operands]
            env.update(zip(op.results, _off_accelerator(run_op(op, operands), "cpu"), strict=True))
    if env[mask].device.type == "meta":  # the ops were recorded on the meta device: no values to read
        raise MaskError("its attention mask is computed on the meta device (no values to read)")
    return env


def _unknown_read(fn: func.FuncOp, unknown: list[BlockArgument], ops: list[Operation]) -> str:
    """Why a mask that reads `unknown` (no user input, no known constant; `ops` compute it, in
    program order) is not causal masking. A parameter makes it a mask or bias computed from the
    activations: the one read last is named, with the ops from it to the mask."""
    from ad_mlir.dialects import ad

    def attrs(arg: BlockArgument) -> dict:
        return fn.arg_attrs.data[arg.index].data if fn.arg_attrs else {}

    def first_read(arg: BlockArgument) -> int:
        return next(i for i, op in enumerate(ops) if arg in op.operands)

    params = [a for a in unknown if ad.PARAM_ATTR in attrs(a)]
    if not params:
        arg = min(unknown, key=lambda a: a.index)
        return (f"its attention mask reads %{arg.name_hint}, not only the token positions: it cannot be replaced by "
                "causal masking")
    arg = max(params, key=first_read)
    reached: set[SSAValue] = {arg}
    names: list[str] = []
    for op in ops:
        if any(v in reached for v in op.operands):
            reached.update(op.results)
            names.append(op.target.data if isinstance(op, ad.TorchOp) else op.name)
    return (f"its attention mask is computed from the parameter %{arg.name_hint} (through "
            f"{', '.join(dict.fromkeys(names))}): a mask or score bias that depends on the activations, which the "
            "cached attention does not take")


def _off_accelerator(values: tuple[object, ...], device: str) -> tuple[object, ...]:
    """`values` with each tensor on an accelerator moved to `device`. A program exported on a GPU
    names it (`ad.arange` on cuda:0, `aten.to` cuda:0) while the inputs a mask is evaluated at
    are on the CPU; the mask's values do not depend on the device, so they are read there."""
    return tuple(v.to(device) if isinstance(v, torch.Tensor) and v.device.type not in ("cpu", "meta") else v
                 for v in values)


def _shaped_like(fn: func.FuncOp, value: SSAValue, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Zeros of `value`'s shape and dtype at `inputs`: its computation run on the meta device
    from the inputs' shapes and the weights' types (no weight is read)."""
    from ad_mlir.semantics.op_table import torch_dtype
    from ad_mlir.semantics.reference import run_op

    ops, args = backward_slice(value)
    env: dict[SSAValue, object] = {}
    for arg in args:
        name = input_name(fn, arg)
        if name in inputs:
            env[arg] = inputs[name].to("meta")
        elif isinstance(arg.type, TensorType) and DYNAMIC_INDEX not in arg.type.get_shape():
            env[arg] = torch.empty(arg.type.get_shape(), dtype=torch_dtype(arg.type.element_type), device="meta")
        else:
            raise MaskError(f"its attention mask reads the shape of %{arg.name_hint}, which is not a user input")
    with torch.no_grad():
        for op in ops:
            try:
                env.update(zip(op.results, _off_accelerator(run_op(op, [env[v] for v in op.operands]), "meta"),
                               strict=True))
            except (RuntimeError, NotImplementedError) as e:
                raise MaskError(f"its attention mask reads the shape of %{value.name_hint}, which {op.name} does not "
                                f"compute on the meta device: {e}") from None
    shaped = env[value]
    return torch.zeros(shaped.shape, dtype=shaped.dtype)


def attended(mask: torch.Tensor) -> torch.Tensor:
    """An evaluated mask as booleans (True: attended). An additive float mask attends where it
    adds 0 and masks where it adds a very negative number (HF adds the dtype's lowest)."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise MaskError(f"its attention mask is {mask.dtype}, neither boolean nor additive float")
    masked = mask <= torch.finfo(mask.dtype).min / 2
    if not torch.all(masked | (mask == 0)):
        raise MaskError("its additive attention mask holds values other than 0 and a very negative number (it is "
                        "not only a causal mask)")
    return ~masked


def causal_window(mask: torch.Tensor) -> int | None:
    """For an evaluated mask of n queries x n keys (any leading dims, broadcast): None when it
    is causal, W when it is causal within a sliding window of W < n keys (key j seen by query
    i when i - W < j <= i); a MaskError otherwise."""
    mask = attended(mask)
    n = mask.shape[-1]
    rows, cols = torch.arange(n, device=mask.device)[:, None], torch.arange(n, device=mask.device)[None, :]
    mask = mask.broadcast_to((*mask.shape[:-2], n, n)).reshape(-1, n, n)
    if not all(torch.equal(m, mask[0]) for m in mask):
        raise MaskError("its attention mask is not one mask for every row and head")
    window = int(mask[0][-1].sum())
    if not torch.equal(mask[0], (cols <= rows) & (cols > rows - window)):
        raise NotCausalWindow("its attention mask is neither causal nor a causal sliding window")
    return None if window == n else window


def alibi_slopes(fn: func.FuncOp, bias: SSAValue, heads: int, inputs: Mapping[str, torch.Tensor]) -> SSAValue:
    """The value of `bias`'s computation that holds ALiBi's slopes (a [heads] tensor, or one with
    other dims of size 1: MPT's [1, heads, 1, 1]), when `bias`, run on
    `inputs` (n tokens), is `slope[h] * key position` plus a constant per row for every row and
    head ([batch * heads or heads, queries or 1, n] or [batch, heads, queries or 1, n]); a
    MaskError otherwise."""
    env = evaluate_slice(fn, bias, inputs)
    values = env[bias]
    n = values.shape[-1]
    if n < 2 or values.dim() not in (3, 4) or values.numel() % (heads * n) or not values.is_floating_point():
        raise MaskError(f"its scores' bias {tuple(values.shape)} is not ALiBi's [heads, queries, keys]")
    rows = values.double().reshape(-1, heads, values.shape[-2], n)
    relative = rows - rows[..., :1]
    slopes = relative[..., -1].mean((0, 2)) / (n - 1)
    expected = slopes[:, None, None] * torch.arange(n, dtype=torch.float64)
    if not torch.allclose(relative, expected.expand_as(relative), rtol=1e-5, atol=1e-5 * float(rows.abs().max())):
        raise MaskError("its scores' bias is not ALiBi's (a slope per head times the key position)")
    found = [v for v, x in env.items() if isinstance(x, torch.Tensor) and x.numel() == heads in x.shape
             and x.is_floating_point() and torch.allclose(x.double().flatten(), slopes, rtol=1e-5)
             and not backward_slice(v)[1]]
    if not found:
        raise MaskError(f"its ALiBi bias has slopes {slopes.tolist()}, but its computation holds no [heads] tensor of "
                        "them")
    return ([v for v in found if v.type.get_shape() == (heads,)] or found)[-1]


def largest_integer(ops: Iterable[Operation]) -> int:
    """The largest magnitude of an integer the ops hold (constants, integer arguments): a
    window or offset a mask's computation compares positions with is one of them."""
    def integers(attr: Attribute) -> Iterable[int]:
        if isinstance(attr, IntegerAttr) and attr.type != IntegerType(1):
            yield abs(attr.value.data)
        elif isinstance(attr, ArrayAttr):
            for a in attr.data:
                yield from integers(a)
        elif isinstance(attr, DictionaryAttr):
            for a in attr.data.values():
                yield from integers(a)

    return max((i for op in ops for a in [*op.properties.values(), *op.attributes.values()] for i in integers(a)),
               default=0)


def erase_computation(mask: SSAValue, erase: Callable[[Operation], None]) -> None:
    """Erase the ops that computed `mask` once nothing uses them (`mask` itself must have lost
    its users): opaque torch ops (diff, cumsum, index) too, which DCE keeps."""
    for dead in reversed(backward_slice(mask)[0]):
        if all(not r.uses for r in dead.results):
            erase(dead)
