"""`insert-cached-attention`: every causal attention becomes `ad.cached_attention` over K/V
caches that are new arguments of the function (AutoDeploy's cache-initialization stage).

For each `ad.rope_attention` (and plain `ad.attention`), in program order:

- two arguments `k_cache_<i>` / `v_cache_<i>` of type [max-batch, max-seq-len, kv_heads,
  head_dim] in the key's dtype, marked `ad.kv_cache = "<layer> key|value"` (the layer is the
  attention's HF module path);
- once per function, `cache_slots` and `cache_starts` (tensor<?xi64>: each batch row's cache
  slot and the tokens that slot already holds), marked `ad.cache_slots` / `ad.cache_starts`.

The RoPE of an `ad.rope_attention` (or `ad.rope`) carries over whole: its tables (whose width is
the rotary dim: partial rotary) and `interleaved`; the cache holds the keys rotated.

Gemma2's attention is no attention op but HF's eager form, which is matched whole:
    p   = softmax(tanh((matmul(q, transpose(repeat_kv(k), 2, 3)) * scale) / cap) * cap + mask)
    out = matmul(p, repeat_kv(v))
(the softmax possibly in f32 and cast back, q and k possibly the two results of one `ad.rope`,
which the cached op then applies itself) becomes `ad.cached_attention` with `softcap` = cap
(a bare tanh is cap 1, whose division and product canonicalize drops; without the tanh, plain
eager attention, it has no `softcap`). The softmax must still be an `ad.softmax`: the pass runs
before `decompose` (as `ad_mlir.LLM`'s pipeline places it). The scores and probabilities must
have no other user (with a cache they would cover the new tokens only); a softmax that feeds a
matmul but does not match exactly is left alone and the log says why.

The causal mask HF builds is dropped, with every op of its computation that nothing else
uses: the op masks causally with the cached offset. The pass evaluates the mask's computation
(it may read only the user inputs' shapes and position ids) at max-seq-len new tokens: a causal
mask is dropped, a sliding-window one becomes the op's `window`, anything else is an error
naming the layer. An additive (float) mask, as the eager form adds, must hold 0 where it attends
and a very negative number (at most half the dtype's lowest, or -inf) where it masks. RoPE
positions must come from a `position_ids` input (export the model with it, as
`ad_mlir.generate` does): with a cache the new tokens' positions are start + 0..seq-1, which an
`arange(seq)` inside the graph does not know.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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
    UnitAttr,
    i64,
)
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from ad_mlir.dialects import ad
from ad_mlir.passes.fuse_rope_attention import match_repeat_kv
from ad_mlir.passes.matching import constant, erase_dead, other_operand, plain_binary, producer, sole_user

log = logging.getLogger(__name__)

POSITION_INPUT = "position_ids"


@dataclass
class Attention:
    """One attention to cache, whichever form it had in the graph."""

    output: Operation
    """The op whose result is the attention's output (replaced by the cached op)."""
    query: SSAValue
    key: SSAValue
    value: SSAValue
    rope: tuple[SSAValue, SSAValue] | None
    """(cos, sin) when the cached op applies RoPE to the query and the key (on their first
    `cos.shape[-1]` dims: partial rotary carries over as the tables' width)."""
    mask: SSAValue | None
    causal: bool
    scale: float
    softcap: float | None = None
    chain: list[Operation] = field(default_factory=list)
    """Ops besides `output` that only computed the attention, users first (erased once dead)."""
    interleaved: bool = False
    """RoPE rotates pairs (2i, 2i + 1) (`ad.RopeAttentionOp`)."""


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
        attentions = _find_attentions(fn)
        if not attentions:
            log.info("insert-cached-attention: no attention in @%s (neither an attention op nor HF's eager "
                     "matmul/softmax form)", fn.sym_name.data)
            return
        slots = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]), {ad.INPUT_ATTR: "cache_slots", ad.CACHE_SLOTS_ATTR: ""})
        starts = _append_argument(fn, TensorType(i64, [DYNAMIC_INDEX]),
                                  {ad.INPUT_ATTR: "cache_starts", ad.CACHE_STARTS_ATTR: ""})
        for i, attention in enumerate(attentions):
            self._replace(fn, attention, i, slots, starts)
        region_dce(fn.body)
        log.info("insert-cached-attention: %d attentions cached (%d slots x %d tokens)", len(attentions),
                 self.max_batch, self.max_seq_len)

    def _replace(self, fn: func.FuncOp, attention: Attention, i: int, slots: SSAValue, starts: SSAValue) -> None:
        layer = _layer(attention.output)
        if attention.rope is not None and not _reads_input(fn, attention.rope[0], POSITION_INPUT):
            raise PassFailedException(
                f"{layer}: the RoPE positions do not come from a '{POSITION_INPUT}' input; export the model with "
                f"{POSITION_INPUT} as an input so the cache can offset them")
        window = self._window(fn, attention, layer)
        key_shape = attention.key.type.get_shape()
        cache_type = TensorType(attention.key.type.element_type, [self.max_batch, self.max_seq_len, key_shape[1],
                                                                  key_shape[3]])
        caches = [_append_argument(fn, cache_type, {ad.INPUT_ATTR: f"{role[0]}_cache_{i}",
                                                    ad.KV_CACHE_ATTR: f"{layer} {role}"})
                  for role in ("key", "value")]
        properties: dict[str, FloatAttr | IntegerAttr | UnitAttr] = {
            "scale": FloatAttr(attention.scale, Float64Type())}
        if attention.interleaved:
            properties["interleaved"] = UnitAttr()
        if window is not None:
            properties["window"] = IntegerAttr(window, i64)
        if attention.softcap is not None:
            properties["softcap"] = FloatAttr(attention.softcap, Float64Type())
        rope = list(attention.rope) if attention.rope is not None else [[], []]
        cached = ad.CachedAttentionOp.build(
            operands=[attention.query, attention.key, attention.value, *rope, *caches, slots, starts],
            properties=properties,
            result_types=[attention.output.results[0].type],
        )
        cached.location = attention.output.location
        mask_ops = _backward_slice(attention.mask)[0] if attention.mask is not None else []
        Rewriter.replace_op(attention.output, cached)
        erase_dead(Rewriter.erase_op, attention.chain)
        for dead in reversed(mask_ops):  # opaque torch ops (diff, cumsum, index) too: the pass ran them
            if all(not r.uses for r in dead.results):
                Rewriter.erase_op(dead)

    def _window(self, fn: func.FuncOp, attention: Attention, layer: str) -> int | None:
        """None for causal attention, the window of a sliding-window mask; raises otherwise."""
        if attention.mask is None:
            if not attention.causal:
                raise PassFailedException(f"{layer}: attention without a mask and not causal cannot be cached")
            return None
        mask = _attended(_evaluate(fn, attention.mask, self.max_seq_len, layer), layer)
        n = self.max_seq_len
        rows, cols = torch.arange(n)[:, None], torch.arange(n)[None, :]
        causal = cols <= rows
        mask = mask.broadcast_to((*mask.shape[:-2], n, n)).reshape(-1, n, n)
        if not all(torch.equal(m, mask[0]) for m in mask):
            raise PassFailedException(f"{layer}: its attention mask is not one mask for every row and head")
        window = int(mask[0][-1].sum())
        if not attention.causal and torch.equal(mask[0], causal & (cols > rows - window)):
            return None if window == n else window
        raise PassFailedException(f"{layer}: its attention mask is neither causal nor a causal sliding window; "
                                  "only those can be cached")


def _find_attentions(fn: func.FuncOp) -> list[Attention]:
    """The attentions of `fn` in program order: attention ops and matched eager forms."""
    found = []
    for op in fn.body.block.ops:
        if isinstance(op, ad.RopeAttentionOp | ad.AttentionOp):
            found.append(_from_attention_op(op))
        elif isinstance(op, ad.SoftmaxOp):
            match = match_eager_attention(op)
            if isinstance(match, str):
                log.info("insert-cached-attention: the softmax at %s is not cached: %s", _layer(op), match)
            elif match is not None:
                found.append(match)
    return found


def _from_attention_op(op: ad.RopeAttentionOp | ad.AttentionOp) -> Attention:
    rope = (op.cos, op.sin) if isinstance(op, ad.RopeAttentionOp) else None
    scale = op.scale.value.data if op.scale is not None else op.key.type.get_shape()[3] ** -0.5
    return Attention(op, op.query, op.key, op.value, rope, op.attn_mask, op.is_causal is not None, scale,
                     interleaved=rope is not None and op.interleaved is not None)


def match_eager_attention(softmax: ad.SoftmaxOp) -> Attention | str | None:
    """HF's eager attention around `softmax` (module docstring). None when the softmax weighs no
    values with a matmul (it is no attention); why not, when it does but the rest differs."""
    probs = softmax.result
    if (cast := sole_user(probs, ad.CastOp)) is not None:
        probs = cast.result
    weighted = sole_user(probs, ad.MatmulOp)
    if weighted is None or weighted.input != probs:
        return None
    if len(probs.type.get_shape()) != 4 or ad.normalize_dim(softmax.dim.value.data, 4) != 3:
        return "its scores are not [batch, heads, seq, keys] normalized over the keys"
    add = softmax.input.owner
    if not plain_binary(add, ad.AddOp) or not softmax.input.has_one_use():
        return "its input is not the scores plus a mask (used only there)"
    scores = next(((x, m) for x in add.operands if (m := _scores(x)) is not None), None)
    if scores is None:
        return "its masked scores are not matmul(q, k^T) * scale, soft-capped or not, each used only there"
    mask = other_operand(add, scores[0])
    if not isinstance(mask.type, TensorType):
        return "its scores plus a number, not a mask"
    qk, scale, softcap, score_ops = scores[1]
    query = qk.input
    heads = query.type.get_shape()[1] if len(query.type.get_shape()) == 4 else DYNAMIC_INDEX
    transpose = producer(qk.other, ad.TransposeOp)
    if heads == DYNAMIC_INDEX or transpose is None or not _swaps_last_two(transpose):
        return "its scores are not matmul(q, transpose(k, 2, 3)) of a [batch, heads, seq, head_dim] q"
    key, key_repeat = match_repeat_kv(transpose.input, heads)
    value, value_repeat = match_repeat_kv(weighted.other, heads)
    if key.type != value.type or weighted.result.type != query.type or heads % key.type.get_shape()[1]:
        return "its query, key and value are not [batch, heads or kv_heads, seq, head_dim] of one type"
    chain = [*([cast] if cast else []), softmax, add, *score_ops, qk, transpose, *key_repeat, *value_repeat]
    rope = producer(query, ad.RopeOp)
    if rope is not None and (query, key) == (rope.query_out, rope.key_out):
        return Attention(weighted, rope.query, rope.key, value, (rope.cos, rope.sin), mask, False, scale, softcap,
                         [*chain, rope], rope.interleaved is not None)
    return Attention(weighted, query, key, value, None, mask, False, scale, softcap, chain)


def _scores(value: SSAValue) -> tuple[ad.MatmulOp, float, float | None, list[Operation]] | None:
    """(matmul, scale, softcap, ops users first) when `value` is `matmul * scale`, soft-capped
    or not, and each value on the way has no other user (the probabilities stay internal)."""
    capped = _softcapped(value)
    scaled, softcap, cap_ops = capped if capped is not None else (value, None, [])
    unscaled, scale, scale_ops = _scaled(scaled)
    qk = producer(unscaled, ad.MatmulOp)
    ops = [*cap_ops, *scale_ops]
    if qk is None or not all(r.has_one_use() for op in [*ops, qk] for r in op.results):
        return None
    return qk, scale, softcap, ops


def _softcapped(value: SSAValue) -> tuple[SSAValue, float, list[Operation]] | None:
    """(x, cap, ops users first) when `value` is `tanh(x / cap) * cap` (`tanh(x)`: cap 1, whose
    division and product canonicalize drops)."""
    if (tanh := producer(value, ad.TanhOp)) is not None:
        return tanh.input, 1.0, [tanh]
    mul = value.owner
    if not plain_binary(mul, ad.MulOp):
        return None
    for capped in mul.operands:
        tanh = producer(capped, ad.TanhOp)
        div = producer(tanh.input, ad.DivOp) if tanh is not None else None
        cap = constant(other_operand(mul, capped))
        if div is not None and div.rounding_mode is None and cap is not None and cap > 0 and constant(div.other) == cap:
            return div.input, cap, [mul, tanh, div]
    return None


def _scaled(value: SSAValue) -> tuple[SSAValue, float, list[Operation]]:
    """(x, scale, [its op]) when `value` is `x * scale` or `x / (1 / scale)`; else (value, 1, [])."""
    op = value.owner
    if plain_binary(op, ad.MulOp):
        for x in op.operands:
            if (scale := constant(other_operand(op, x))) is not None:
                return x, scale, [op]
    if isinstance(op, ad.DivOp) and op.rounding_mode is None and (divisor := constant(op.other)):
        return op.input, 1 / divisor, [op]
    return value, 1.0, []


def _swaps_last_two(op: ad.TransposeOp) -> bool:
    rank = len(op.input.type.get_shape())
    return rank == 4 and {ad.normalize_dim(d.value.data, rank) for d in (op.dim0, op.dim1)} == {2, 3}


def _attended(mask: torch.Tensor, layer: str) -> torch.Tensor:
    """An evaluated mask as booleans (True: attended). An additive float mask attends where it
    adds 0 and masks where it adds a very negative number (HF adds the dtype's lowest)."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise PassFailedException(f"{layer}: its attention mask is {mask.dtype}, neither boolean nor additive float")
    masked = mask <= torch.finfo(mask.dtype).min / 2
    if not torch.all(masked | (mask == 0)):
        raise PassFailedException(f"{layer}: its additive attention mask holds values other than 0 and a very "
                                  "negative number (it is not only a causal mask)")
    return ~masked


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
