"""`insert-cached-attention`: every causal attention becomes `ad.cached_attention` over K/V
caches that are new arguments of the function (AutoDeploy's cache-initialization stage).

For each `ad.rope_attention` (and plain `ad.attention`), in program order:

- two arguments `k_cache_<i>` / `v_cache_<i>` of type [max-batch, max-seq-len, kv_heads,
  head_dim] in the key's dtype, marked `ad.kv_cache = "<layer> key|value"` (the layer is the
  attention's HF module path);
- once per function, `cache_slots` and `cache_starts` (tensor<?xi64>: each batch row's cache
  slot and the tokens that slot already holds), marked `ad.cache_slots` / `ad.cache_starts`.

The causal mask HF builds is dropped, with every op of its computation that nothing else
uses: the op masks causally with the cached offset. The pass evaluates the mask's computation
(it may read only the user inputs' shapes and position ids) at max-seq-len new tokens: a causal
mask is dropped, a sliding-window one becomes the op's `window`, anything else is an error
naming the layer. RoPE positions must come from a
`position_ids` input (export the model with it, as `ad_mlir.generate` does): with a cache the
new tokens' positions are start + 0..seq-1, which an `arange(seq)` inside the graph does not know.
Attentions that cannot be cached (no attention op: Gemma2's soft-capped matmul/softmax form)
are not found, and the log says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DictionaryAttr,
    Float64Type,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    ModuleOp,
    NameLoc,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad

log = logging.getLogger(__name__)

POSITION_INPUT = "position_ids"


@dataclass(frozen=True)
class InsertCachedAttentionPass(ModulePass):
    """Attention -> `ad.cached_attention` over per-layer K/V cache arguments (module docstring)."""

    name = "insert-cached-attention"

    max_batch: int = 8
    """Cache slots: sequences that can be in flight at once."""
    max_seq_len: int = 2048
    """Tokens a slot holds (prompt + generated)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.max_batch < 1 or self.max_seq_len < 1:
            raise PassFailedException(f"insert-cached-attention: max-batch {self.max_batch} and max-seq-len "
                                      f"{self.max_seq_len} must be positive")
        for fn in op.ops:
            if isinstance(fn, func.FuncOp) and fn.body.blocks:
                self._apply_to(fn)

    def _apply_to(self, fn: func.FuncOp) -> None:
        attentions = [o for o in fn.body.block.ops if isinstance(o, ad.RopeAttentionOp | ad.AttentionOp)]
        if not attentions:
            log.info("insert-cached-attention: no attention op in @%s (an attention written as matmul/softmax, "
                     "e.g. Gemma2's soft-capped one, is not cached)", fn.sym_name.data)
            return
        slots = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]), {ad.INPUT_ATTR: "cache_slots", ad.CACHE_SLOTS_ATTR: ""})
        starts = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                  {ad.INPUT_ATTR: "cache_starts", ad.CACHE_STARTS_ATTR: ""})
        for i, attention in enumerate(attentions):
            self._replace(fn, attention, i, slots, starts)
        region_dce(fn.body)
        log.info("insert-cached-attention: %d attentions cached (%d slots x %d tokens)", len(attentions),
                 self.max_batch, self.max_seq_len)

    def _replace(self, fn: func.FuncOp, op: ad.RopeAttentionOp | ad.AttentionOp, i: int, slots: SSAValue,
                 starts: SSAValue) -> None:
        layer = _layer(op)
        rope = isinstance(op, ad.RopeAttentionOp)
        if rope and not _reads_input(fn, op.cos, POSITION_INPUT):
            raise PassFailedException(
                f"{layer}: the RoPE positions do not come from a '{POSITION_INPUT}' input; export the model with "
                f"{POSITION_INPUT} as an input so the cache can offset them")
        window = self._window(fn, op, layer)
        key_shape = op.key.type.get_shape()
        cache_type = TensorType(op.key.type.element_type, [self.max_batch, self.max_seq_len, key_shape[1],
                                                           key_shape[3]])
        caches = [_append_argument(fn, cache_type, {ad.INPUT_ATTR: f"{role[0]}_cache_{i}",
                                                    ad.KV_CACHE_ATTR: f"{layer} {role}"})
                  for role in ("key", "value")]
        scale = op.scale.value.data if op.scale is not None else key_shape[3] ** -0.5
        properties = {"scale": FloatAttr(scale, Float64Type())}
        if window is not None:
            properties["window"] = IntegerAttr(window, i64)
        cached = ad.CachedAttentionOp.build(
            operands=[op.query, op.key, op.value, [op.cos] if rope else [], [op.sin] if rope else [], *caches,
                      slots, starts],
            properties=properties,
            result_types=[op.result.type],
        )
        cached.location = op.location
        mask_ops = _backward_slice(op.attn_mask)[0] if op.attn_mask is not None else []
        Rewriter.replace_op(op, cached)
        for dead in reversed(mask_ops):  # opaque torch ops (diff, cumsum, index) too: the pass ran them
            if all(not r.uses for r in dead.results):
                Rewriter.erase_op(dead)

    def _window(self, fn: func.FuncOp, op: ad.RopeAttentionOp | ad.AttentionOp, layer: str) -> int | None:
        """None for causal attention, the window of a sliding-window mask; raises otherwise."""
        if op.attn_mask is None:
            if op.is_causal is None:
                raise PassFailedException(f"{layer}: attention without a mask and not causal cannot be cached")
            return None
        mask = _evaluate(fn, op.attn_mask, self.max_seq_len, layer)
        n = self.max_seq_len
        rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
        causal = cols <= rows
        mask = mask.broadcast_to((*mask.shape[:-2], n, n)).reshape(-1, n, n)
        if mask.dtype != torch.bool or not all(torch.equal(m, mask[0]) for m in mask):
            raise PassFailedException(f"{layer}: its attention mask is not one boolean mask for every row and head")
        window = int(mask[0][-1].sum())
        if op.is_causal is None and torch.equal(mask[0], causal & (cols > rows - window)):
            return None if window == n else window
        raise PassFailedException(f"{layer}: its attention mask is neither causal nor a causal sliding window; "
                                  "only those can be cached")


def _layer(op: Operation) -> str:
    return op.location.desc.data if isinstance(op.location, NameLoc) else op.name


def _append_argument(fn: func.FuncOp, arg_type: TensorType, attrs: dict[str, str]) -> BlockArgument:
    block = fn.body.block
    arg = block.insert_arg(arg_type, len(block.args))
    arg.name_hint = attrs[ad.INPUT_ATTR]
    arg_attrs = list(fn.arg_attrs.data) if fn.arg_attrs else [DictionaryAttr({}) for _ in block.args[:-1]]
    arg_attrs.append(DictionaryAttr({k: StringAttr(v) for k, v in attrs.items()}))
    fn.arg_attrs = ArrayAttr(arg_attrs)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], fn.function_type.outputs.data)
    return arg


def _backward_slice(value: SSAValue) -> tuple[list[Operation], set[BlockArgument]]:
    """The ops `value` is computed by (program order) and the function arguments they read."""
    ops: set[Operation] = set()
    args: set[BlockArgument] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, BlockArgument):
            args.add(v)
        elif v.owner not in ops:
            ops.add(v.owner)
            stack += list(v.owner.operands)
    block = value.owner.parent_block() if isinstance(value.owner, Operation) else value.owner
    assert isinstance(block, Block)
    return [o for o in block.ops if o in ops], args


def _input_name(fn: func.FuncOp, arg: BlockArgument) -> str | None:
    attrs = fn.arg_attrs.data[arg.index].data if fn.arg_attrs else {}
    return attrs[ad.INPUT_ATTR].data if ad.INPUT_ATTR in attrs else None


def _reads_input(fn: func.FuncOp, value: SSAValue, name: str) -> bool:
    return any(_input_name(fn, a) == name for a in _backward_slice(value)[1])


def _evaluate(fn: func.FuncOp, mask: SSAValue, seq: int, layer: str) -> torch.Tensor:
    """The mask for one sequence of `seq` new tokens at positions 0..seq-1."""
    from ad_mlir.runtime.reference import run_op

    ops, args = _backward_slice(mask)
    env: dict[SSAValue, object] = {}
    for arg in args:
        name = _input_name(fn, arg)
        if name not in ("input_ids", POSITION_INPUT):
            raise PassFailedException(f"{layer}: its attention mask reads %{arg.name_hint}, not only the token "
                                      "positions: it cannot be replaced by causal masking")
        env[arg] = torch.arange(seq)[None, :] if name == POSITION_INPUT else torch.zeros(1, seq, dtype=torch.int64)
    with torch.no_grad():
        for op in ops:
            env.update(zip(op.results, run_op(op, [env[v] for v in op.operands]), strict=True))
    return env[mask]
