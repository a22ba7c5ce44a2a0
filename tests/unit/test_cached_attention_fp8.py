"""The FP8 K/V cache of `ad.cached_attention` (vLLM's `kv_cache_dtype="fp8"`: e4m3 pools, a
per-tensor scale for keys and one for values): its torch reference against attention written
here from torch ops over K/V quantized the same way, and the kernel template against the
reference in the Triton interpreter (within `nearest_e4m3_rounding`, so that the interpreter's
own e4m3 conversion, which sends ties the wrong way, is not what is measured), in the slot form
(one page of max_seq positions per row) and the paged, flattened form, with grouped-query heads,
for a prefill, a chunked prefill and decode steps; and its PTX for sm_90 at Llama-3.1-8B's sizes
without spills."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from template_modules import template_builder

from ad_mlir.codegen.interpreter import nearest_bf16_rounding, nearest_e4m3_rounding
from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.cached_attention_kernel import (
    CachedAttentionSpec,
    emit_cached_attention_module,
)
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
SCALES = (0.5, 2.0)
"""Key and value scales, not 1: a scale applied the wrong way round (or not at all) shows."""

# fp32: the kernel and the reference quantize the same fp32 rotated keys (RoPE in fp32 is exact
# in both, CACHE_TOLERANCE of test_cached_attention_kernel.py) with the same rounding, so the
# pools are equal bit for bit and the dequantized keys the same: what is left is the attention's
# own fp32 error (summation order, exp2, FMA, SDPA's flash or math path: 16 ulps as in
# test_cached_attention_kernel.py's TOLERANCE), of sums of values up to ~16 here (randn x 3).
FP32_TOLERANCE = 16 * 2.0**-23 * 16


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[CachedAttentionSpec], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("cached_attention_fp8"), "cached_attn_fp8",
                            emit_cached_attention_module)


def _spec(dtype: torch.dtype = torch.float32, head_dim: int = HEAD_DIM, flattened: bool = False) -> CachedAttentionSpec:
    return CachedAttentionSpec(head_dim, dtype, head_dim**-0.5, rope=True, cos_dtype=dtype, flattened=flattened,
                               kv_scales=SCALES)


def _tables(positions: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    emb = (positions[..., None].float() * inv_freq).repeat(*([1] * positions.dim()), 2)
    return [emb.cos().to(dtype), emb.sin().to(dtype)]


def _pools(pages: int, page: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pools of random e4m3 rows (stale tokens of earlier sequences, within the values' range)."""
    return tuple(torch_ops.quantize_kv(torch.randn(pages, page, KV_HEADS, HEAD_DIM, generator=g) * 2, scale)
                 for scale in SCALES)


def _slot_inputs(starts: list[int], seq: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """The slot form: batch row b in slot b + 1 of pools [rows + 1, 64] (a table one page wide)."""
    g = torch.Generator().manual_seed(seed)
    batch = len(starts)
    q, k, v = (torch.randn(batch, h, seq, HEAD_DIM, generator=g).mul(3).to(dtype)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    positions = torch.tensor(starts)[:, None] + torch.arange(seq)
    k_pool, v_pool = _pools(batch + 1, 64, g)
    slots = torch.arange(1, batch + 1)[:, None]
    return [q, k, v, *_tables(positions, dtype), k_pool, v_pool, slots, torch.tensor(starts)]


def _paged_inputs(starts: list[int], counts: list[int], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """The paged, flattened form: sequence s brings counts[s] tokens after starts[s], its pages
    of 8 tokens scattered over a pool of 24 (pages in any order, none shared)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(counts)
    q, k, v = (torch.randn(1, h, total, HEAD_DIM, generator=g).mul(3).to(dtype)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, counts, strict=True)])[None]
    k_pool, v_pool = _pools(24, 8, g)
    tables = torch.randperm(24, generator=g)[:4 * len(starts)].view(len(starts), 4)
    query_starts = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    return [q, k, v, *_tables(positions, dtype), k_pool, v_pool, tables, torch.tensor(starts), query_starts]


def _reference(inputs: list[torch.Tensor], scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, k_pool, v_pool) of the op's torch reference, on copies of the pools."""
    q, k, v, cos, sin, k_pool, v_pool, tables, starts, *query_starts = inputs
    k_pool, v_pool = k_pool.clone(), v_pool.clone()
    out = torch_ops.cached_attention(q, k, v, cos, sin, k_pool, v_pool, tables, starts, scale,
                                     query_starts=query_starts[0] if query_starts else None,
                                     k_scale=SCALES[0], v_scale=SCALES[1])
    return out, k_pool, v_pool


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _eager(inputs: list[torch.Tensor], scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slot form from torch ops: the new keys rotated (HF's apply_rotary_pos_emb), quantized
    as vLLM does (x / scale, clamp to +-448, e4m3) into the slots, then SDPA over the slot's
    dequantized rows (e4m3 * scale), causal with the offset."""
    q, k, v, cos, sin, k_pool, v_pool, slots, starts = inputs
    k_pool, v_pool = k_pool.clone(), v_pool.clone()
    q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
    seq, out = q.shape[2], torch.empty_like(q)
    for b, (slot, start) in enumerate(zip(slots[:, 0].tolist(), starts.tolist(), strict=True)):
        for pool, new, kv_scale in ((k_pool, k, SCALES[0]), (v_pool, v, SCALES[1])):
            pool[slot, start:start + seq] = (new[b].float() / kv_scale).clamp(-448, 448).to(torch.float8_e4m3fn) \
                .transpose(0, 1)
        keys, values = ((pool[slot, :start + seq].float() * kv_scale).to(q.dtype).transpose(0, 1)
                        .repeat_interleave(HEADS // KV_HEADS, 0) for pool, kv_scale in zip((k_pool, v_pool), SCALES,
                                                                                           strict=True))
        allowed = torch.arange(start + seq)[None] <= torch.arange(start, start + seq)[:, None]
        out[b] = F.scaled_dot_product_attention(q[b], keys, values, attn_mask=allowed, scale=scale)
    return out, k_pool, v_pool


def _bits(pool: torch.Tensor) -> torch.Tensor:
    return pool.view(torch.uint8)


@pytest.mark.parametrize(("starts", "seq"), [([0, 0], 7), ([5, 20], 3), ([9, 30, 2], 1)],
                         ids=["prefill", "chunk", "decode"])
def test_reference_quantizes_as_vllm_does(starts: list[int], seq: int) -> None:
    """The op's reference against attention over K/V quantized here: the pools bit for bit, the
    output within fp32 attention's error (both read the same dequantized keys and values)."""
    inputs = _slot_inputs(starts, seq, torch.float32, seed=seq)
    out, k_pool, v_pool = _reference(inputs, HEAD_DIM**-0.5)
    expected, k_expected, v_expected = _eager(inputs, HEAD_DIM**-0.5)
    assert torch.equal(_bits(k_pool), _bits(k_expected)) and torch.equal(_bits(v_pool), _bits(v_expected))
    torch.testing.assert_close(out, expected, atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE)


def test_values_past_448_times_the_scale_saturate() -> None:
    """e4m3's largest value is 448: a row beyond 448 * scale is stored as +-448 (never NaN)."""
    stored = torch_ops.quantize_kv(torch.tensor([1000.0, -1000.0, 3.0]), 2.0)
    assert stored.float().tolist() == [448.0, -448.0, 1.5]


def _run(build: Callable, spec: CachedAttentionSpec, inputs: list[torch.Tensor]) -> torch.Tensor:
    module = build(spec)
    with nearest_e4m3_rounding():
        out, = module.launch(getattr(module, module.kernel_name), [t.to(DEVICE) for t in inputs], [])
    return out.cpu()


@pytest.mark.parametrize(("starts", "seq"), [([0, 0], 7), ([5, 20], 3), ([9, 30, 2], 1)],
                         ids=["prefill", "chunk", "decode"])
def test_kernel_slot_form_matches_the_reference(build, starts: list[int], seq: int) -> None:  # noqa: ANN001
    """The slot form's kernel (pools of one 64-token page per row): the pools it writes equal the
    reference's bit for bit, its output within fp32 attention's error."""
    spec = _spec()
    inputs = _slot_inputs(starts, seq, torch.float32, seed=seq)
    expected, k_expected, v_expected = _reference(inputs, spec.scale)
    out = _run(build, spec, inputs)
    assert torch.equal(_bits(inputs[5]), _bits(k_expected)) and torch.equal(_bits(inputs[6]), _bits(v_expected))
    torch.testing.assert_close(out, expected, atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE)


def test_kernel_paged_form_matches_the_reference(build) -> None:  # noqa: ANN001
    """The paged, flattened form (pages of 8 through block tables): a step of a prompt, a chunk
    after a cached prefix crossing pages, and a decode, then a decode-only step."""
    spec = _spec(flattened=True)
    for starts, counts in (([0, 12, 7], [10, 5, 1]), ([10, 17, 8], [1, 1, 1])):
        inputs = _paged_inputs(starts, counts, torch.float32, seed=len(counts) + starts[0])
        expected, k_expected, v_expected = _reference(inputs, spec.scale)
        out = _run(build, spec, inputs)
        assert torch.equal(_bits(inputs[5]), _bits(k_expected)) and torch.equal(_bits(inputs[6]), _bits(v_expected))
        torch.testing.assert_close(out, expected, atol=FP32_TOLERANCE, rtol=FP32_TOLERANCE)


def test_kernel_in_bf16(build) -> None:  # noqa: ANN001
    """bf16 heads, without RoPE: both quantize the same bf16 keys, so the pools are equal bit for
    bit. (With RoPE in bf16 the kernel rounds the rotated key once from fp32 where eager rounds
    after each op, one bf16 ulp apart, test_cached_attention_kernel.py; an e4m3 step apart where
    that ulp crosses a rounding midpoint: measured ~20 of 896 entries, and the output then moves
    by what one step of a key moves a peaked softmax. That is the bf16 RoPE's difference, not
    the cache's, so it is left out here.) The output: bf16 attention's own error, 3 bf16 ulps of
    1 + |out| in test_cached_attention_kernel.py (its TOLERANCE), 4 here: q and k are 3 times
    wider, so the softmax is more peaked and P's rounding to bf16 before its dot weighs more
    (measured 3.3). Run within nearest_bf16_rounding so that the interpreter's truncating bf16
    stores are not what is measured."""
    spec = CachedAttentionSpec(HEAD_DIM, torch.bfloat16, HEAD_DIM**-0.5, rope=False, kv_scales=SCALES)
    for starts, seq in (([5, 20], 7), ([9, 30, 2], 1)):
        q, k, v, _, _, *rest = _slot_inputs(starts, seq, torch.bfloat16, seed=seq)
        inputs = [q, k, v, *rest]
        k_pool, v_pool = rest[0].clone(), rest[1].clone()
        expected = torch_ops.cached_attention(q, k, v, None, None, k_pool, v_pool, *rest[2:], spec.scale,
                                              k_scale=SCALES[0], v_scale=SCALES[1])
        with nearest_bf16_rounding():
            out = _run(build, spec, inputs)
        assert torch.equal(_bits(rest[0]), _bits(k_pool)) and torch.equal(_bits(rest[1]), _bits(v_pool))
        torch.testing.assert_close(out, expected, atol=4 * 2.0**-7, rtol=4 * 2.0**-7)


def test_pools_of_another_dtype_are_refused(build) -> None:  # noqa: ANN001
    spec = _spec()
    inputs = _slot_inputs([0], 2, torch.float32, seed=0)
    inputs[5] = inputs[5].float()
    module = build(spec)
    with pytest.raises(ValueError, match=r"k_cache is torch.float32 .* expected torch.float8_e4m3fn"):
        module.launch(getattr(module, module.kernel_name), inputs, [])


def test_ptx_for_sm90_at_llama31_8b_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """Llama-3.1-8B's heads (32 query, 8 K/V, head dim 128) in bf16 over e4m3 pools: a
    1024-token prefill over the paged form's pools (pages of 16 through block tables) and a
    decode step of 8 sequences (split kernel + reduce), compiled for sm_90 as the runtime
    specializes them: no spills."""
    module = build(CachedAttentionSpec(128, torch.bfloat16, 128**-0.5, rope=True, cos_dtype=torch.bfloat16,
                                       flattened=True, kv_scales=(1.0, 1.0)))

    def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    launches = []
    for tokens, seqs in ((1024, 1), (8, 8)):
        tensors = [meta(1, 32, tokens, 128), meta(1, 8, tokens, 128), meta(1, 8, tokens, 128),
                   meta(1, tokens, 128), meta(1, tokens, 128),
                   meta(4096, 16, 8, 128, dtype=torch.float8_e4m3fn), meta(4096, 16, 8, 128, dtype=torch.float8_e4m3fn),
                   meta(seqs, 512, dtype=torch.int64), meta(seqs, dtype=torch.int64),
                   meta(seqs + 1, dtype=torch.int64)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert len(specs) == 3  # prefill; decode and its reduce
    for spec, report in zip(specs, compile_all(specs), strict=True):
        assert report.spills == 0, (spec.constexprs["PHASE"], report)
