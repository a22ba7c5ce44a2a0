"""The cached-attention kernel template (prefill / chunked prefill, split-K decode, the cache
written in place) against eager torch, in the Triton interpreter on CPU (conftest sets
TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its PTX for sm_90 at Llama-3-8B
sizes, compiled without a GPU: no spills, shared memory within an H100's.

The expectation is written here from torch ops, independently of the kernel and of the op's
reference (`torch_ops.cached_attention`, also checked against it): each row's new query and key
rotated as HF's `apply_rotary_pos_emb` does, the key/value sequence = what the slot held before
+ the new tokens, and SDPA (or, soft-capped, the scores computed explicitly as Gemma2 does) with
the causal-with-offset (and sliding window) mask. q/k/v are views of a projection's [B, S, H * D]
output, as HF makes them; caches are filled with random values (stale tokens of an earlier
sequence), so a kernel reading past `start` would be seen."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from template_modules import template_builder

from ad_mlir.codegen.ptx import Specialization, compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.cached_attention_kernel import (
    DECODE,
    PREFILL,
    REDUCE,
    CachedAttentionSpec,
    decode_splits,
    emit_cached_attention_module,
)
from ad_mlir.dialects.ad import QkNorm
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# |kernel - eager| <= k eps (1 + |eager|) (eps: bf16 2^-7, fp32 2^-23), as in
# test_attention_kernel.py and for the same reasons: fp32 differs by summation order, exp2 and
# FMA contraction (measured k <= 4 here); bf16 eager rounds RoPE after each op and SDPA's math
# backend scales q and k in bf16, while the kernel rounds Q, K and P once for the dots (measured
# k = 2: 0.0156 at |out| < 1). The soft cap's tanh from exp2 adds a few fp32 ulps.
TOLERANCE = {torch.float32: 16 * 2.0**-23, torch.bfloat16: 3 * 2.0**-7}
CACHE_TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 2.0**-7}
"""The rotated key the kernel writes: fp32 RoPE computes it as eager does (exact); in bf16 the
kernel rounds once from fp32 where eager rounds after each op (1 ulp of values below 2)."""
QK_NORM_TOLERANCE = {torch.float32: TOLERANCE[torch.float32], torch.bfloat16: 6 * 2.0**-7}
QK_NORM_CACHE_TOLERANCE = {torch.float32: 8 * 2.0**-23, torch.bfloat16: 3 * 2.0**-7}
"""With QK-norm first: Triton's rsqrt and row sum differ from torch's in the last fp32 bits, a
few ulps of the normalized key (fp32: measured 6e-7 at |k| < 4). In bf16 the interpreter
truncates each f32 -> bf16 cast (1.0 + 1.1 * 2^-8 becomes 1.0, measured), and the norm rounds q
and k once or twice more: a bias of up to an ulp on each, measured k <= 3.8 on the output and
2.2 on the cache over 16 random cases (test_attention_kernel.py's QK-norm bound is the same)."""

H100_SHARED_MEMORY = 227 * 1024


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[CachedAttentionSpec], ModuleType]:
    """`build(spec) -> module`, each spec emitted and imported once per worker."""
    return template_builder(tmp_path_factory.mktemp("cached_attention_kernels"), "cached_attn", emit_cached_attention_module)


def _spec(head_dim: int = 64, dtype: torch.dtype = torch.float32, rope: bool = True, window: int | None = None,
          softcap: float | None = None, rotary_dim: int | None = None, interleaved: bool = False,
          qk_norm: QkNorm | None = None, sinks: bool = False, alibi: bool = False,
          v_head_dim: int | None = None, distance_extent: int | None = None) -> CachedAttentionSpec:
    return CachedAttentionSpec(head_dim, dtype, head_dim**-0.5, rope, dtype if rope else None, window, softcap,
                               rotary_dim, interleaved, qk_norm, sinks, alibi, v_head_dim, distance_extent)


class Case:
    """Inputs of one call: new tokens of `len(starts)` rows, row b in slot `slots[b]` whose cache
    holds `starts[b]` tokens already."""

    def __init__(self, starts: list[int], seq: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 max_seq: int, rope: bool = True, seed: int = 0, rotary_dim: int | None = None,
                 interleaved: bool = False, qk_norm: QkNorm | None = None, sinks: bool = False,
                 alibi: bool = False, v_head_dim: int | None = None, distance_extent: int | None = None):
        g = torch.Generator().manual_seed(seed)
        batch = len(starts)

        def heads_view(h: int, d: int = head_dim) -> torch.Tensor:
            flat = torch.randn(batch, seq, h * d, generator=g).to(dtype)
            return flat.view(batch, seq, h, d).transpose(1, 2).to(DEVICE)

        v_dim = v_head_dim or head_dim
        self.q, self.k, self.v = heads_view(heads), heads_view(kv_heads), heads_view(kv_heads, v_dim)
        self.starts = torch.tensor(starts, device=DEVICE)
        self.slots = torch.arange(batch, device=DEVICE).flip(0) + 1  # not the row order; slot 0 unused
        positions = self.starts[:, None] + torch.arange(seq, device=DEVICE)[None]
        rotary = rotary_dim or head_dim
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary, 2, device=DEVICE) / rotary))
        angles = positions[..., None].float() * inv_freq
        # HF's tables: each angle twice, as the rotated pairs take them (GPT-J's repeat_interleave).
        emb = angles.repeat_interleave(2, -1) if interleaved else torch.cat([angles, angles], -1)
        self.tables = [emb.cos().to(dtype), emb.sin().to(dtype)] if rope else []
        self.interleaved = interleaved
        shape = (batch + 1, max_seq, kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=g).to(dtype).to(DEVICE)
        self.v_cache = torch.randn((*shape[:3], v_dim), generator=g).to(dtype).to(DEVICE)
        # QK-norm weights around 1 (offset included, as trained ones are) but not 1, for new q and k
        # of RMS ~3 (as projections give them)
        self.norm_weights = [(torch.randn(head_dim, generator=g) * 0.3 + 1 - qk_norm.offset).to(dtype).to(DEVICE)
                             for _ in range(2)] if qk_norm else []
        if qk_norm:
            self.q, self.k = self.q * 3, self.k * 3
        # gpt-oss's sink logits, one per query head, spread as wide as the scores (std ~1 here)
        # and more, so that some heads' sinks take most of the probability and others little
        self.sinks = [(torch.randn(heads, generator=g) * 2).to(dtype).to(DEVICE)] if sinks else []
        # BLOOM's and MPT's slopes for 6 heads (2^-(8/8 * (i + 1)) over the next power of two, 8,
        # interleaved: 0.5, 0.125, ... then 0.707 ...), always fp32 as HF builds them
        self.alibi = [_alibi_slopes(heads).to(DEVICE)] if alibi else []
        # Inkling's relative logits: a bias per query token and head over `distance_extent`
        # backward distances, std 2 (as wide as the scores and more)
        self.distance = [(torch.randn(batch, heads, seq, distance_extent, generator=g) * 2).to(dtype).to(DEVICE)
                         ] if distance_extent else []

    def tensors(self) -> list[torch.Tensor]:
        # the slot form: each row's block table is its slot, one page of max_seq positions
        return [self.q, self.k, self.v, *self.tables, *self.norm_weights, self.k_cache, self.v_cache,
                self.slots[:, None], self.starts, *self.sinks, *self.alibi, *self.distance]


def _alibi_slopes(heads: int) -> torch.Tensor:
    """transformers' `build_alibi_tensor` slopes (BLOOM), for any head count."""
    closest = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    extra = [2 ** (-4 * (2 * i + 1) / closest) for i in range(heads - closest)]
    return torch.tensor(slopes + extra, dtype=torch.float32)


def _rotate(x: torch.Tensor, tables: list[torch.Tensor], interleaved: bool = False) -> torch.Tensor:
    """HF's apply_rotary_pos_emb: the first cos.shape[-1] dims (GPT-NeoX's partial rotary),
    rotate_half or (interleaved) GPT-J's rotate_every_two."""
    if not tables:
        return x
    cos, sin = (t.unsqueeze(1) for t in tables)
    rot, rest = x[..., :cos.shape[-1]], x[..., cos.shape[-1]:]
    if interleaved:
        turned = torch.stack([-rot[..., 1::2], rot[..., ::2]], -1).flatten(-2)
    else:
        half = rot.shape[-1] // 2
        turned = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    return torch.cat([rot * cos + turned * sin, rest], -1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, norm: QkNorm) -> torch.Tensor:
    """transformers' Qwen3RMSNorm (fp32 normalization rounded to x's dtype, times the weight) or,
    weight_in_fp32, Gemma3RMSNorm (times offset + the weight in fp32, then rounded)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
    if norm.weight_in_fp32:
        return (normed * (norm.offset + weight.float())).to(x.dtype)
    return (weight + norm.offset) * normed.to(x.dtype)


def _expected(case: Case, scale: float, window: int | None = None, softcap: float | None = None,
              qk_norm: QkNorm | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, k_cache, v_cache) as eager torch computes them, on copies of the caches."""
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    q, k = case.q, case.k
    if qk_norm is not None:
        q, k = _rms_norm(q, case.norm_weights[0], qk_norm), _rms_norm(k, case.norm_weights[1], qk_norm)
    q, k = _rotate(q, case.tables, case.interleaved), _rotate(k, case.tables, case.interleaved)
    seq, group = q.shape[2], q.shape[1] // k.shape[1]
    out = q.new_empty((*q.shape[:3], case.v.shape[3]))
    for b, (slot, start) in enumerate(zip(case.slots.tolist(), case.starts.tolist(), strict=True)):
        keys = torch.cat([k_cache[slot, :start].transpose(0, 1), k[b]], 1).repeat_interleave(group, 0)
        values = torch.cat([v_cache[slot, :start].transpose(0, 1), case.v[b]], 1).repeat_interleave(group, 0)
        k_cache[slot, start:start + seq] = k[b].transpose(0, 1)
        v_cache[slot, start:start + seq] = case.v[b].transpose(0, 1)
        query_pos = torch.arange(start, start + seq, device=DEVICE)[:, None]
        key_pos = torch.arange(start + seq, device=DEVICE)[None, :]
        allowed = key_pos <= query_pos
        if window is not None:
            allowed &= key_pos > query_pos - window
        if softcap is None and not case.sinks and not case.alibi and not case.distance:
            out[b] = F.scaled_dot_product_attention(q[b], keys, values, attn_mask=allowed, scale=scale)
            continue
        # With ALiBi in fp64: HF's bias grows with the key position (100 at position 200 for a
        # slope of 0.5), and fp32 would round it by more than the kernel's error on its distances
        work = torch.float64 if case.alibi else torch.float32
        scores = q[b].to(work) @ keys.to(work).transpose(1, 2) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if case.alibi:  # BLOOM's form: slope * key position (constant per query: the softmax cancels it)
            scores = scores + case.alibi[0][:, None, None] * key_pos
        if case.distance:
            scores = scores + _inkling_position_bias(case.distance[0][b].to(work), query_pos, key_pos)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if case.sinks:  # gpt-oss: the sink column joins the softmax, then goes (Inkling2: one per token)
            sinks = case.sinks[0].to(work)
            sink = sinks[b][..., None] if sinks.dim() == 3 else sinks[:, None, None].expand(-1, seq, 1)
            probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[b] = (probs.to(q.dtype) @ values).to(q.dtype)
    return out, k_cache, v_cache


def _inkling_position_bias(rel_logits: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """transformers' `InklingRelativeLogits` of one row's rel_logits [heads, seq, extent] at
    query positions [seq, 1] over key positions [1, keys]: gathered by distance, 0 outside
    0 <= distance < extent."""
    extent = rel_logits.shape[-1]
    distance = query_pos - key_pos
    index = distance.clamp(0, extent - 1).expand(rel_logits.shape[0], -1, -1)
    return rel_logits.gather(-1, index).masked_fill((distance < 0) | (distance >= extent), 0.0)


def _assert_close(got: torch.Tensor, expected: torch.Tensor, eps: float) -> None:
    """Within eps (1 + |expected|); NaN where expected is NaN (stale cache rows left as they were)."""
    torch.testing.assert_close(got, expected, atol=eps, rtol=eps, equal_nan=True)


def _check(module: ModuleType, case: Case, spec: CachedAttentionSpec) -> torch.Tensor:
    """Run the kernel on `case` (its caches written in place) and compare all three results."""
    expected, k_cache, v_cache = _expected(case, spec.scale, spec.window, spec.softcap, spec.qk_norm)
    cache_ptr = case.k_cache.data_ptr()
    out, = module.launch(getattr(module, module.kernel_name), case.tensors(), [])
    assert case.k_cache.data_ptr() == cache_ptr  # written in place, never reallocated
    _assert_close(out, expected, (QK_NORM_TOLERANCE if spec.qk_norm else TOLERANCE)[spec.dtype])
    _assert_close(case.k_cache, k_cache, (QK_NORM_CACHE_TOLERANCE if spec.qk_norm else CACHE_TOLERANCE)[spec.dtype])
    _assert_close(case.v_cache, v_cache, 0.0)
    return out


# ------------------------------------------------------------------------ prefill


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (8, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_and_chunked_prefill(build, head_dim: int, heads: int, kv_heads: int) -> None:  # noqa: ANN001
    """Rows of one call at start 0 (a prompt) and start > 0 (a chunk after a cached prefix, and
    one past a 16-key tile edge), 19 new tokens each (two query blocks of 16 at fp32 sizes)."""
    spec = _spec(head_dim)
    _check(build(spec), Case([0, 5, 37], 19, heads, kv_heads, head_dim, spec.dtype, max_seq=64), spec)


def test_prefill_in_bf16(build) -> None:  # noqa: ANN001
    spec = _spec(64, torch.bfloat16)
    _check(build(spec), Case([0, 21], 33, 6, 2, 64, torch.bfloat16, max_seq=64), spec)


def test_without_rope(build) -> None:  # noqa: ANN001
    """Plain SDPA attention cached: q and k taken as they are."""
    spec = _spec(64, rope=False)
    _check(build(spec), Case([0, 9], 7, 4, 2, 64, spec.dtype, max_seq=32, rope=False), spec)
    decode = Case([0, 30], 1, 4, 2, 64, spec.dtype, max_seq=32, rope=False)
    _check(build(spec), decode, spec)


@pytest.mark.parametrize("seq", [1, 12])
def test_sliding_window(build, seq: int) -> None:  # noqa: ANN001
    """Window 5: keys more than 4 positions back are not seen, in the cache and among the new
    tokens; rows whose start is below, at and past the window."""
    spec = _spec(64, window=5)
    _check(build(spec), Case([0, 3, 5, 70], seq, 4, 2, 64, spec.dtype, max_seq=96), spec)


@pytest.mark.parametrize("seq", [1, 9])
def test_soft_capped_scores(build, seq: int) -> None:  # noqa: ANN001
    """Gemma2's `softcap * tanh(s / softcap)`; a cap of 2 bends the scores of random inputs hard."""
    spec = _spec(64, softcap=2.0)
    _check(build(spec), Case([0, 40], seq, 4, 2, 64, spec.dtype, max_seq=64), spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [None, 5])
def test_attention_sinks_prefill_and_decode(build, dtype: torch.dtype, window: int | None) -> None:  # noqa: ANN001
    """gpt-oss's per-head sink logit in the softmax, with and without its sliding window: a
    prefill (a prompt, a chunk after a cached prefix) and a decode step over several splits
    (a cache of 256: 4 splits of 64, the sink merged once), GQA 6:2; also what the op's
    reference computes. Sinks of std 2 move the outputs far beyond the tolerance (checked)."""
    spec = _spec(64, dtype, window=window, sinks=True)
    for seq, starts, max_seq in ((9, [0, 21], 64), (1, [3, 70, 200], 256)):
        case = Case(starts, seq, 6, 2, 64, dtype, max_seq=max_seq, seed=seq, sinks=True)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        reference = torch_ops.cached_attention(case.q, case.k, case.v, *case.tables, k_cache, v_cache, case.slots[:, None],
                                               case.starts, spec.scale, window, sinks=case.sinks[0])
        out = _check(build(spec), case, spec)
        _assert_close(out, reference, TOLERANCE[dtype])
        sinkless = torch_ops.cached_attention(case.q, case.k, case.v, *case.tables, k_cache.clone(), v_cache.clone(),
                                              case.slots[:, None], case.starts, spec.scale, window)
        assert (out.float() - sinkless.float()).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("head_dim", "v_head_dim"), [(96, 64), (48, 80)])
def test_a_value_head_dim_of_its_own(build, dtype: torch.dtype, head_dim: int, v_head_dim: int) -> None:  # noqa: ANN001
    """DeepSeek's heads at a small scale (query/key 96 = 64 nope + 32 rope, value 64: the value
    narrower) and the other way round (value 80, wider, no power of two): prefill (a prompt, a
    chunk after a cached prefix) and decode over several splits, GQA 4:2; the value cache has
    its own width and the output the value's head dim. Also what the op's reference computes."""
    spec = _spec(head_dim, dtype, rope=False, v_head_dim=v_head_dim)
    for seq, starts, max_seq in ((9, [0, 21], 64), (1, [3, 70, 200], 256)):
        case = Case(starts, seq, 4, 2, head_dim, dtype, max_seq=max_seq, rope=False, seed=seq, v_head_dim=v_head_dim)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        reference = torch_ops.cached_attention(case.q, case.k, case.v, None, None, k_cache, v_cache, case.slots[:, None],
                                               case.starts, spec.scale)
        out = _check(build(spec), case, spec)
        assert out.shape == (len(starts), 4, seq, v_head_dim)
        _assert_close(out, reference, TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_alibi_prefill_and_decode(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """BLOOM's ALiBi (6 heads: the non-power-of-two slopes) without RoPE: a prefill (a prompt, a
    chunk after a cached prefix) and decode steps over several splits (a cache of 256), GQA 6:2
    (MPT-style grouped heads); the expectation adds HF's `slope * key position`, the kernel the
    relative distance: equal after the softmax. Also what the op's reference computes; without
    the bias the outputs move far beyond the tolerance (checked)."""
    spec = _spec(64, dtype, rope=False, alibi=True)
    for seq, starts, max_seq in ((9, [0, 21], 64), (1, [3, 70, 200], 256)):
        case = Case(starts, seq, 6, 2, 64, dtype, max_seq=max_seq, rope=False, seed=seq, alibi=True)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        reference = torch_ops.cached_attention(case.q, case.k, case.v, None, None, k_cache, v_cache, case.slots[:, None],
                                               case.starts, spec.scale, alibi_slopes=case.alibi[0])
        out = _check(build(spec), case, spec)
        _assert_close(out, reference, TOLERANCE[dtype])
        plain = torch_ops.cached_attention(case.q, case.k, case.v, None, None, k_cache.clone(), v_cache.clone(),
                                           case.slots[:, None], case.starts, spec.scale)
        assert (out.float() - plain.float()).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm", [QkNorm(1e-6), QkNorm(1e-6, 1.0, weight_in_fp32=True)], ids=["qwen3", "gemma3"])
def test_qk_norm_prefill_and_decode(build, norm: QkNorm, dtype: torch.dtype) -> None:  # noqa: ANN001
    """Qwen3's and Gemma3's QK-norm in every phase: a prefill (and a chunk after a cached prefix)
    and a decode step; the cache gets the normalized, rotated keys. q and k have an RMS of ~3:
    without the norm the output and the cache would be far off. Also what the op's reference
    computes."""
    spec = _spec(64, dtype, qk_norm=norm)
    for seq, starts in ((9, [0, 5]), (1, [3, 40])):
        case = Case(starts, seq, 4, 2, 64, spec.dtype, max_seq=64, seed=seq, qk_norm=norm)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        reference = torch_ops.cached_attention(
            case.q, case.k, case.v, *case.tables, k_cache, v_cache, case.slots[:, None], case.starts, spec.scale,
            q_norm_weight=case.norm_weights[0], k_norm_weight=case.norm_weights[1], qk_norm_eps=norm.eps,
            qk_norm_offset=norm.offset, qk_norm_weight_in_fp32=norm.weight_in_fp32)
        out = _check(build(spec), case, spec)
        _assert_close(out, reference, QK_NORM_TOLERANCE[spec.dtype])
        _assert_close(case.k_cache, k_cache, QK_NORM_CACHE_TOLERANCE[spec.dtype])


ROPE_FORMS = [
    # (head_dim, rotary_dim, interleaved): head dims that are not powers of two (Phi-2's 80,
    # Phi-3's 96), partial rotary (Phi-2's 32 of 80; Pythia's 16 of 64; StableLM-3B's 20 of 80),
    # interleaved pairs (GPT-J, Ernie 4.5: all of 64; GLM: 32 of 64).
    (80, None, False), (96, None, False), (80, 32, False), (64, 16, False), (80, 20, False),
    (64, None, True), (64, 32, True),
]


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved"), ROPE_FORMS,
                         ids=[f"d{d}-r{r or d}" + ("-pairs" if i else "") for d, r, i in ROPE_FORMS])
def test_any_head_dim_partial_rotary_and_interleaved_pairs(build, head_dim: int, rotary_dim: int | None,  # noqa: ANN001
                                                           interleaved: bool) -> None:
    """Prefill (a prompt, a chunk after a cached prefix), then decode at cached lengths around a
    split edge, GQA 6:2: the cache holds the rotated keys in the head's own dim order (only the
    first rotary_dim dims rotated) and the padded lanes are never stored."""
    spec = _spec(head_dim, rotary_dim=rotary_dim, interleaved=interleaved)
    forms = {"rotary_dim": rotary_dim, "interleaved": interleaved}
    _check(build(spec), Case([0, 5, 37], 19, 6, 2, head_dim, spec.dtype, max_seq=64, **forms), spec)
    _check(build(spec), Case([1, 63, 64, 65], 1, 6, 2, head_dim, spec.dtype, max_seq=128, **forms), spec)


@pytest.mark.parametrize("seq", [1, 12])
def test_partial_interleaved_rotary_in_bf16(build, seq: int) -> None:  # noqa: ANN001
    """GLM's form (half of an 80-dim head, interleaved pairs) in bf16, prefill and decode."""
    spec = _spec(80, torch.bfloat16, rotary_dim=40, interleaved=True)
    case = Case([0, 21], seq, 4, 2, 80, torch.bfloat16, max_seq=64, rotary_dim=40, interleaved=True)
    _check(build(spec), case, spec)


def test_qk_norm_with_partial_rotary_pairs(build) -> None:  # noqa: ANN001
    """QK-norm over the whole 80-dim head (rotated pairs, passed dims and their tail) before
    RoPE on 32 dims in pairs, prefill and decode: the cache holds the normalized, rotated keys."""
    norm = QkNorm(1e-6)
    spec = _spec(80, rotary_dim=32, interleaved=True, qk_norm=norm)
    for seq, starts in ((9, [0, 5]), (1, [3, 40])):
        _check(build(spec), Case(starts, seq, 4, 2, 80, spec.dtype, max_seq=64, seed=seq, rotary_dim=32,
                                 interleaved=True, qk_norm=norm), spec)


# ------------------------------------------------------------------------- decode


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(2, 2, 64), (6, 2, 128), (8, 2, 64)])
def test_decode_across_split_boundaries(build, head_dim: int, heads: int, kv_heads: int) -> None:  # noqa: ANN001
    """One new token per row at cached lengths 1, 63, 64, 65 and 1000: splits of 64 positions
    (a cache of 1024), so the new token falls at the end of a split, at the start of the next
    one, and deep in the 16th; every GQA group in one tile. Each head count and head dim once
    (the split arithmetic does not depend on them; the tile shapes do, and
    test_prefill_and_chunked_prefill crosses them all)."""
    assert decode_splits(1024) == (16, 64)
    spec = _spec(head_dim)
    _check(build(spec), Case([1, 63, 64, 65, 1000], 1, heads, kv_heads, head_dim, spec.dtype, max_seq=1024), spec)


def test_decode_in_bf16_with_a_long_cache(build) -> None:  # noqa: ANN001
    """A cache over 2048 positions takes splits of 128 (32 at most): 3000 positions, 24 splits."""
    assert decode_splits(3000) == (24, 128)
    spec = _spec(64, torch.bfloat16)
    _check(build(spec), Case([0, 127, 128, 2999], 1, 4, 1, 64, torch.bfloat16, max_seq=3000), spec)


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleaved"), [(64, None, False), (80, 32, True)])
def test_matches_the_ops_reference(build, head_dim: int, rotary_dim: int | None, interleaved: bool) -> None:  # noqa: ANN001
    """The kernel computes what `ad.cached_attention` means (its torch reference op), also with
    partial rotary and interleaved pairs."""
    spec = _spec(head_dim, window=8, rotary_dim=rotary_dim, interleaved=interleaved)
    for seq, starts in ((6, [0, 4]), (1, [10, 3])):
        case = Case(starts, seq, 4, 2, head_dim, spec.dtype, max_seq=32, seed=seq, rotary_dim=rotary_dim,
                    interleaved=interleaved)
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        expected = torch_ops.cached_attention(case.q, case.k, case.v, *case.tables, k_cache, v_cache, case.slots[:, None],
                                              case.starts, spec.scale, spec.window, interleaved=interleaved)
        out = _check(build(spec), case, spec)
        _assert_close(out, expected, TOLERANCE[spec.dtype])
        torch.testing.assert_close(case.k_cache, k_cache, atol=0, rtol=0)


def test_a_reused_slot_reads_nothing_past_its_start(build) -> None:  # noqa: ANN001
    """Stale positions of an earlier sequence (NaN here) are never read, in either phase."""
    spec = _spec(64)
    for seq, starts in ((5, [0, 3]), (1, [0, 7])):
        case = Case(starts, seq, 4, 2, 64, spec.dtype, max_seq=32)
        for slot, start in zip(case.slots.tolist(), starts, strict=True):
            case.k_cache[slot, start:] = float("nan")
            case.v_cache[slot, start:] = float("nan")
        out = _check(build(spec), case, spec)
        assert not out.isnan().any()


def test_other_slots_and_positions_are_untouched(build) -> None:  # noqa: ANN001
    """Only rows start .. start + seq - 1 of the used slots change."""
    spec = _spec(64)
    case = Case([4, 0], 3, 4, 2, 64, spec.dtype, max_seq=16)
    before = case.k_cache.clone()
    module = build(spec)
    module.launch(getattr(module, module.kernel_name), case.tensors(), [])
    changed = (case.k_cache != before).any(dim=(2, 3))
    expected = torch.zeros_like(changed)
    expected[2, 4:7] = True  # row 0: slot 2, start 4
    expected[1, 0:3] = True  # row 1: slot 1, start 0
    assert torch.equal(changed, expected)


# ------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("cache", "message"), [
    (lambda c: c.to(torch.bfloat16), r"k_cache is torch.bfloat16 .* expected torch.float32"),
    (lambda c: c[:, :, :1], r"k_cache is torch.float32 \(3, 16, 1, 64\), expected .*\[pages, page_size, 2, 64\]"),
])
def test_a_cache_of_the_wrong_dtype_or_shape_is_refused(build, cache: Callable, message: str) -> None:  # noqa: ANN001
    spec = _spec(64)
    case = Case([0, 0], 2, 4, 2, 64, spec.dtype, max_seq=16)
    case.k_cache = cache(case.k_cache)
    module = build(spec)
    with pytest.raises(ValueError, match=message):
        module.launch(getattr(module, module.kernel_name), case.tensors(), [])


@pytest.mark.parametrize(("fields", "message"), [
    ({"head_dim": 512}, "head_dim 512 .* needs tiles 512 wide, over the 256"),
    ({"rotary_dim": 65}, "rotary_dim 65 must be even"),
    ({"rope": False, "interleaved": True}, "interleaved pairs need RoPE"),
    ({"window": 0}, "window 0 must be positive"),
    ({"softcap": -1.0}, "softcap -1.0 out of range"),
    ({"rope": False, "cos_dtype": None, "qk_norm": QkNorm(1e-6)}, "qk_norm needs rope=True"),
])
def test_spec_rejects_what_the_kernel_cannot_do(fields: dict, message: str) -> None:
    args = {"head_dim": 64, "dtype": torch.float32, "scale": 0.125, "rope": True, "cos_dtype": torch.float32} | fields
    with pytest.raises(ValueError, match=message):
        CachedAttentionSpec(**args)


# ---------------------------------------------------------------------------- PTX


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


PTX_FORMS = [
    # (dtype, head_dim, rotary_dim, interleaved, qk_norm): Llama-3-8B in bf16 and fp32; at the
    # same head counts, Phi-2's head (80, 32 rotated), Phi-3's 96, GLM-4's (half of 128 in pairs),
    # GPT-J's (64 of 256 in pairs); Qwen3-8B's QK-norm in bf16 and fp32.
    (torch.bfloat16, 128, None, False, None), (torch.float32, 128, None, False, None),
    (torch.bfloat16, 80, 32, False, None), (torch.bfloat16, 96, None, False, None),
    (torch.bfloat16, 128, 64, True, None), (torch.bfloat16, 256, 64, True, None),
    (torch.bfloat16, 128, None, False, QkNorm(1e-6)), (torch.float32, 128, None, False, QkNorm(1e-6)),
]


DTYPES = (torch.bfloat16, torch.float32)
"""Each model's kernels are compiled in both dtypes, in one compiler process per test."""


def test_ptx_for_sm90_at_llama3_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """32 query / 8 K/V heads, a cache of 16 slots x 8192 positions: a 1024-token prefill (one
    launch) and a decode step of 8 sequences (split kernel + reduce), compiled for sm_90 as the
    runtime specializes them, for each of PTX_FORMS."""
    cases = {}
    for dtype, head_dim, rotary_dim, interleaved, qk_norm in PTX_FORMS:
        module = build(_spec(head_dim, dtype, rotary_dim=rotary_dim, interleaved=interleaved, qk_norm=qk_norm))
        weights = [_meta(head_dim, dtype=dtype)] * 2 if qk_norm else []
        name = f"{str(dtype)[6:]}-d{head_dim}-r{rotary_dim or head_dim}" + ("-pairs" if interleaved else "") + \
            ("-qk_norm" if qk_norm else "")
        cases[name] = _launch_specs(module, dtype, 32, 8, head_dim, rotary_dim or head_dim, weights, [])
    _assert_compile_without_spills(cases)


def test_ptx_for_sm90_at_gpt_oss_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """gpt-oss-120b's attention: 64 query / 8 K/V heads of 64, sink logits, a sliding window of
    128 (its sliding layers; the full ones are the same kernel without it), RoPE applied before
    (its half-table RoPE is not matched: the cache pass caches q and k as they come)."""
    _assert_compile_without_spills({str(dtype): _launch_specs(
        build(_spec(64, dtype, rope=False, window=128, sinks=True)), dtype, 64, 8, 64, None, [],
        [_meta(64, dtype=dtype)]) for dtype in DTYPES})


def test_ptx_for_sm90_at_bloom_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """BLOOM-7B1's attention: 32 heads of 128 (no GQA), ALiBi slopes, no RoPE."""
    _assert_compile_without_spills({str(dtype): _launch_specs(
        build(_spec(128, dtype, rope=False, alibi=True)), dtype, 32, 32, 128, None, [],
        [_meta(32, dtype=torch.float32)]) for dtype in DTYPES})


def test_ptx_for_sm90_at_deepseek_v3_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """DeepSeek-V3's heads cached in full (not the latent): 128 heads, query/key 192 (128 nope +
    64 rope, rotated before), value 128."""
    _assert_compile_without_spills({str(dtype): _launch_specs(
        build(_spec(192, dtype, rope=False, v_head_dim=128)), dtype, 128, 128, 192, None, [], [], v_head_dim=128)
        for dtype in DTYPES})


def test_ptx_for_sm90_at_inkling_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """Inkling's sliding layers: 64 query / 16 K/V heads of 128, window 512, the relative bias
    over 512 distances per token and head (`distance_bias`), no RoPE."""
    _assert_compile_without_spills({str(dtype): _launch_specs(
        build(_spec(128, dtype, rope=False, window=512, distance_extent=512)), dtype, 64, 16, 128, None, [],
        {(b, s): [_meta(b, 64, s, 512, dtype=dtype)] for b, s in ((1, 1024), (8, 1))}) for dtype in DTYPES})


def test_ptx_for_sm90_at_doge_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """Doge-320M's attention: 8 query / 4 K/V heads of 128, its dynamic mask (a bias per key)
    cached as one more query/key head dim (129; the value's stays 128), RoPE applied before."""
    _assert_compile_without_spills({str(dtype): _launch_specs(
        build(_spec(129, dtype, rope=False, v_head_dim=128)), dtype, 8, 4, 129, None, [], [], v_head_dim=128)
        for dtype in DTYPES})


def _launch_specs(module: ModuleType, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
                  rotary_dim: int | None, weights: list[torch.Tensor],
                  trailing: list[torch.Tensor] | dict[tuple[int, int], list[torch.Tensor]],
                  v_head_dim: int | None = None) -> list[Specialization]:
    """The launches of a 1024-token prefill (one launch) and a decode step of 8 sequences (split
    kernel + reduce) over a cache of 16 slots x 8192 positions (RoPE tables of `rotary_dim` when
    set), specialized as the runtime launches them. `trailing`: the tensors after `starts`, or
    those of each (batch, seq) launch."""
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        v_dim = v_head_dim or head_dim
        tensors = [_meta(batch, heads, seq, head_dim, dtype=dtype), _meta(batch, kv_heads, seq, head_dim, dtype=dtype),
                   _meta(batch, kv_heads, seq, v_dim, dtype=dtype),
                   *([_meta(batch, seq, rotary_dim, dtype=dtype)] * 2 if rotary_dim else []), *weights,
                   _meta(16, 8192, kv_heads, head_dim, dtype=dtype), _meta(16, 8192, kv_heads, v_dim, dtype=dtype),
                   _meta(batch, 1, dtype=torch.int64), _meta(batch, dtype=torch.int64),
                   *(trailing[batch, seq] if isinstance(trailing, dict) else trailing)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.constexprs["PHASE"] for s in specs] == [PREFILL, DECODE, REDUCE]
    assert [s.grid for s in specs] == [(heads, 1024 // specs[0].constexprs["BLOCK_M"]), (8 * kv_heads, 32),
                                       (8 * heads,)]
    return specs


def _assert_compile_without_spills(cases: dict[str, list[Specialization]]) -> None:
    """Every case's launches, compiled for sm_90 in one compiler process: no spills, shared
    memory within an H100's."""
    specs = [(name, spec) for name, case in cases.items() for spec in case]
    for (name, spec), report in zip(specs, compile_all([spec for _, spec in specs]), strict=True):
        assert report.spills == 0, (name, spec.constexprs["PHASE"], report)
        assert report.shared_memory <= H100_SHARED_MEMORY, (name, spec.constexprs["PHASE"], report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_distance_bias_reference(dtype: torch.dtype) -> None:
    """Inkling's per-token relative bias (`distance_bias`, extent 6 < the keys, GQA 6:2, window 9
    as its sliding layers) in the op's reference: a prefill (a prompt, a chunk after a cached
    prefix) and decode steps (a cache of 64). Without the bias the outputs move far beyond the
    tolerance (checked)."""
    for seq, starts in ((9, [0, 21]), (1, [3, 7, 40])):
        case = Case(starts, seq, 6, 2, 64, dtype, max_seq=64, rope=False, seed=seq, distance_extent=6)
        expected, k_cache, v_cache = _expected(case, 0.125, window=9)
        reference = torch_ops.cached_attention(case.q, case.k, case.v, None, None, case.k_cache, case.v_cache,
                                               case.slots[:, None], case.starts, 0.125, 9, distance_bias=case.distance[0])
        _assert_close(reference, expected, TOLERANCE[dtype])
        _assert_close(case.k_cache, k_cache, 0.0)
        plain = _expected(Case(starts, seq, 6, 2, 64, dtype, max_seq=64, rope=False, seed=seq), 0.125, window=9)[0]
        assert (reference.float() - plain.float()).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_distance_bias_kernel(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """The kernel with Inkling's distance bias (extent 6, window 9, GQA 6:2, the bias given
    transposed as HF's [batch, seq, heads, extent] matmul makes it): a prefill (a prompt, a chunk
    after a cached prefix: distances reaching into the cache) and a decode step over several
    splits (a cache of 256); the expectation is HF's gather form."""
    spec = _spec(64, dtype, rope=False, window=9, distance_extent=6)
    for seq, starts, max_seq in ((9, [0, 21], 64), (1, [3, 70, 200], 256)):
        case = Case(starts, seq, 6, 2, 64, dtype, max_seq=max_seq, rope=False, seed=seq, distance_extent=6)
        case.distance = [case.distance[0].transpose(1, 2).contiguous().transpose(1, 2)]
        _check(build(spec), case, spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sinks_per_token_prefill_and_decode(build, dtype: torch.dtype) -> None:  # noqa: ANN001
    """Inkling2's sink logit per token and head ([batch, heads, seq], given as the transposed
    [batch, seq, heads] projection HF makes it), window 5: a prefill (a prompt, a chunk after a
    cached prefix) and a decode step over several splits (a cache of 256), GQA 6:2; also what the
    op's reference computes. One sink per head instead moves the outputs past the tolerance."""
    spec = _spec(64, dtype, rope=False, window=5, sinks=True)
    for seq, starts, max_seq in ((9, [0, 21], 64), (1, [3, 70, 200], 256)):
        case = Case(starts, seq, 6, 2, 64, dtype, max_seq=max_seq, rope=False, seed=seq)
        g = torch.Generator().manual_seed(seq)
        case.sinks = [(torch.randn(len(starts), seq, 6, generator=g) * 2).to(dtype).to(DEVICE).transpose(1, 2)]
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        reference = torch_ops.cached_attention(case.q, case.k, case.v, None, None, k_cache, v_cache, case.slots[:, None],
                                               case.starts, spec.scale, 5, sinks=case.sinks[0])
        out = _check(build(spec), case, spec)
        _assert_close(out, reference, TOLERANCE[dtype])
        per_head = torch_ops.cached_attention(case.q, case.k, case.v, None, None, k_cache.clone(), v_cache.clone(),
                                              case.slots[:, None], case.starts, spec.scale, 5, sinks=case.sinks[0][0, :, 0])
        assert (out.float() - per_head.float()).abs().max() > 0.1
