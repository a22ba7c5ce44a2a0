"""The MLA kernel template (`ad.cached_mla_attention`: attention over pages of latents, the
up-projection absorbed) and the op's torch reference, against attention over the whole sequence
with the heads' K and V expanded as HF's `DeepseekV3Attention.expand_kv` does (SDPA, causal), in
both of the op's configurations: the slot form (batch rows, each slot one page of max_seq tokens:
prefills, a chunked prefill and decode steps) and the paged form (flattened steps that mix
prefill chunks across page boundaries with decode tokens, and decode-only steps, through block
tables): in the Triton interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent)
or on the GPU; and its PTX for sm_90 at DeepSeek-V3's real sizes in both, compiled without a GPU:
no spills.

The slot form: two sequences in slots 2 and 0 of 3 whose rows start as random values (a stale
sequence's latents). The paged form: two sequences whose pages lie out of order in a pool of
random values, one page no sequence holds. A read or write through the wrong slot or page, or
past what a sequence wrote, would be seen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.mla_attention_kernel import emit_mla_attention_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)], [(1, SEQ)]]
"""(row, end) of each call: prefills of 9 and 7 tokens, one token of one row, a chunk of 5 of the
other, two decode steps of both rows together, then chunks to the end."""
SLOTS = [2, 0]
PAGE = 4
BLOCK_TABLES = torch.tensor([[5, 0, 7, 2, 9, 3], [8, 1, 6, 4, 10, 11]])
"""Each sequence's pages (SEQ = 21 tokens: 6 pages of 4), in no order of the pool; page 12 is
no sequence's."""
STEPS = [[(0, 9)], [(1, 7), (0, 1)], [(0, 1), (1, 1)], [(1, 5), (0, 3)], [(0, 1), (1, 1)], [(1, 7), (0, 6)]]
"""Flattened steps as (sequence, new tokens): a prefill of 9 (three pages), a prefill beside a
decode, decode-only steps (one token each: the kernel's shorter grid), chunks of both, chunks to
the end."""
# fp32: the absorbed form sums the same products in another order (q_nope W_uk c against q_nope
# (W_uk c)), measured < 2e-6 on outputs of order 1. bf16: the expected side rounds the expanded
# K and V to bf16 (as HF does), the kernel rounds q W_uk and the probabilities instead: errors of
# a few bf16 ulps (2^-8) of the largest output, measured < 0.02 at max |out| ~ 2.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("mla_kernels"), "mla",
                            lambda spec, name, header: emit_mla_attention_module(*spec, name, header))


def _inputs(dtype: torch.dtype, heads: int, nope: int, rope: int, rank: int, v_dim: int
            ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(q_nope, q_rope, latent, k_rope) of 2 rows x SEQ tokens, each pair a split of one
    projection (HF's layout: any strides), and kv_b_weight."""
    g = torch.Generator().manual_seed(heads * rank + nope)
    q = torch.randn(2, SEQ, heads, nope + rope, generator=g).to(dtype).to(DEVICE).transpose(1, 2)
    q_nope, q_rope = q.split([nope, rope], dim=-1)
    kv = torch.randn(2, SEQ, rank + rope, generator=g).to(dtype).to(DEVICE)
    latent, k_rope = kv.split([rank, rope], dim=-1)
    weight = (torch.randn(heads * (nope + v_dim), rank, generator=g) * rank**-0.5).to(dtype).to(DEVICE)
    return [q_nope, q_rope, latent.unsqueeze(1), k_rope.unsqueeze(1)], weight


def _expanded_attention(q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, k_rope: torch.Tensor,
                        weight: torch.Tensor, scale: float) -> torch.Tensor:
    """HF's MLA over the whole sequence: kv_b_proj expands the latent into each head's k_nope and
    value, the rope key is shared by the heads, then causal SDPA."""
    batch, heads, seq, nope = q_nope.shape
    kv = torch.nn.functional.linear(latent, weight).view(batch, seq, heads, -1).transpose(1, 2)
    k_nope, value = kv.split([nope, kv.shape[-1] - nope], dim=-1)
    key = torch.cat([k_nope, k_rope.expand(-1, heads, -1, -1)], dim=-1)
    query = torch.cat([q_nope, q_rope], dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "nope", "rope", "rank", "v_dim"), [
    (torch.float32, 4, 16, 8, 32, 16),   # DeepSeek-V3's ratios, scaled down
    (torch.float32, 3, 12, 6, 40, 20),   # widths that are no powers of two (masked tiles), 3 heads
    (torch.bfloat16, 4, 16, 8, 32, 24),
])
def test_mla_in_pieces_equals_expanded_attention(build, run_kernel: bool, dtype: torch.dtype, heads: int,  # noqa: ANN001
                                                 nope: int, rope: int, rank: int, v_dim: int) -> None:
    scale = (nope + rope) ** -0.5
    (q_nope, q_rope, latent, k_rope), weight = _inputs(dtype, heads, nope, rope, rank, v_dim)
    expected = _expanded_attention(q_nope, q_rope, latent, k_rope, weight, scale).float()
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(3, 32, rank + rope, generator=g).to(dtype).to(DEVICE)
    untouched = cache[1].clone()
    module = build((dtype, scale)) if run_kernel else None
    tol = TOLERANCE[dtype]
    done = [0, 0]
    for piece in PIECES:
        rows = [r for r, _ in piece]
        chunk = [torch.stack([x[r, :, done[r]:e] for r, e in piece]) for x in (q_nope, q_rope, latent, k_rope)]
        tables = torch.tensor([[SLOTS[r]] for r in rows], device=DEVICE)  # a slot: one page of the pool
        starts = torch.tensor([done[r] for r in rows], device=DEVICE)
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [*chunk, weight, cache, tables, starts], [])[0]
        else:
            out = torch_ops.cached_mla_attention(*chunk, weight, cache, tables, starts, scale)
        assert out.dtype == dtype
        for i, (r, e) in enumerate(piece):
            want = expected[r, :, done[r]:e]
            assert (out[i].float() - want).abs().max() <= tol * (1 + want.abs().max()), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):  # the cache holds each token's latent ++ rope key, as given
        assert torch.equal(cache[slot, :SEQ], torch.cat([latent[r, 0], k_rope[r, 0]], dim=-1))
    assert torch.equal(cache[1], untouched)


def test_mla_ptx_for_sm90_at_deepseek_v3_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """DeepSeek-V3's attention (128 heads, nope 128 + rope 64, value 128, latent 512) in bf16, the
    slot form (slots of 4096 tokens): a 1024-token prefill of 1 row and a decode step of 8,
    compiled for sm_90 as the runtime
    specializes them (the token count is not specialized: a decode step compiled with seq 1 as
    a constant spilled 1.7 KB a thread)."""
    heads, nope, rope, rank, v_dim = 128, 128, 64, 512, 128
    module = build((torch.bfloat16, (nope + rope) ** -0.5))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        def meta(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=torch.bfloat16, device="meta")
        q_nope, q_rope = meta(batch, seq, heads, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        latent, k_rope = meta(batch, seq, rank + rope).split([rank, rope], dim=-1)
        tensors = [q_nope, q_rope, latent.unsqueeze(1), k_rope.unsqueeze(1), meta(heads * (nope + v_dim), rank),
                   meta(16, 4096, rank + rope), torch.empty(batch, 1, dtype=torch.int64, device="meta"),
                   torch.empty(batch, dtype=torch.int64, device="meta")]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 1024 * heads // 32), (8, heads // 32)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "nope", "rope", "rank", "v_dim"), [
    (torch.float32, 3, 12, 6, 40, 20),   # widths that are no powers of two (masked tiles), 3 heads
    (torch.bfloat16, 4, 16, 8, 32, 24),
])
def test_flattened_paged_steps_equal_expanded_attention(build, run_kernel: bool, dtype: torch.dtype,  # noqa: ANN001
                                                        heads: int, nope: int, rope: int, rank: int,
                                                        v_dim: int) -> None:
    """The paged form (`query_starts`, pages of 4): each step's output within `TOLERANCE` of the
    expanded attention (the same sums: the pages hold the latents exactly); afterwards the pages
    hold each token's latent ++ rope key at its position, the stray page untouched."""
    scale = (nope + rope) ** -0.5
    (q_nope, q_rope, latent, k_rope), weight = _inputs(dtype, heads, nope, rope, rank, v_dim)
    expected = _expanded_attention(q_nope, q_rope, latent, k_rope, weight, scale).float()
    pages = torch.randn(13, PAGE, rank + rope, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    untouched = pages[12].clone()
    tables = BLOCK_TABLES.to(DEVICE)
    module = build((dtype, scale)) if run_kernel else None
    done = [0, 0]
    for step in STEPS:
        seqs = [s for s, _ in step]
        flat = [torch.cat([x[s:s + 1, :, done[s]:done[s] + n] for s, n in step], dim=2)
                for x in (q_nope, q_rope, latent, k_rope)]
        bounds = torch.tensor([0, *torch.tensor([n for _, n in step]).cumsum(0).tolist()], device=DEVICE)
        meta = [tables[seqs], torch.tensor([done[s] for s in seqs], device=DEVICE)]
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [*flat, weight, pages, *meta, bounds], [])[0]
        else:
            out = torch_ops.cached_mla_attention(*flat, weight, pages, *meta, scale, query_starts=bounds)
        assert out.dtype == dtype and out.shape == (1, heads, int(bounds[-1]), v_dim)
        for i, (s, n) in enumerate(step):
            want = expected[s, :, done[s]:done[s] + n]
            got = out[0, :, int(bounds[i]):int(bounds[i + 1])].float()
            assert (got - want).abs().max() <= TOLERANCE[dtype] * (1 + want.abs().max()), (step, s)
            done[s] += n
    assert done == [SEQ, SEQ]
    for s in range(2):
        held = pages[tables[s]].flatten(0, 1)[:SEQ]
        assert torch.equal(held, torch.cat([latent[s, 0], k_rope[s, 0]], dim=-1))
    assert torch.equal(pages[12], untouched)


def test_paged_mla_ptx_for_sm90_at_deepseek_v3_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """The paged form at DeepSeek-V3's sizes in bf16, pages of 64 tokens: a 1024-token prefill of
    1 sequence and a decode step of 8 (one token each: the grid's second axis the heads' blocks
    only), compiled for sm_90 as the runtime specializes them: no spills."""
    heads, nope, rope, rank, v_dim, page = 128, 128, 64, 512, 128, 64
    module = build((torch.bfloat16, (nope + rope) ** -0.5))
    launches = []
    for seqs, tokens in ((1, 1024), (8, 8)):
        def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="meta")
        q_nope, q_rope = meta(1, tokens, heads, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        latent, k_rope = meta(1, tokens, rank + rope).split([rank, rope], dim=-1)
        tensors = [q_nope, q_rope, latent.unsqueeze(1), k_rope.unsqueeze(1), meta(heads * (nope + v_dim), rank),
                   meta(512, page, rank + rope), meta(seqs, 64, dtype=torch.int64), meta(seqs, dtype=torch.int64),
                   meta(seqs + 1, dtype=torch.int64)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 1024 * heads // 32), (8, heads // 32)]
    for report in compile_all(specs):
        assert report.spills == 0, report


@pytest.fixture(scope="module")
def build_sparse(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("sparse_mla_kernels"), "sparse_mla",
                            lambda spec, name, header: emit_mla_attention_module(*spec, name, header, sparse=True))


def _selection(topk: int) -> torch.Tensor:
    """[2, SEQ, topk] positions as DeepSeek sparse attention's indexer gives them: distinct, one at
    or before the token's own position at least, some past it (masked causally) and some -1."""
    g = torch.Generator().manual_seed(topk)
    picks = torch.stack([torch.stack([torch.randperm(SEQ, generator=g)[:topk] for _ in range(SEQ)]) for _ in range(2)])
    own = torch.arange(SEQ)[None, :].expand(2, -1)
    picks[:, :, 0] = torch.where((picks[:, :, 1:] == own[..., None]).any(-1), picks[:, :, 0], own)
    picks[:, 1::3, -1] = -1
    return picks.to(DEVICE)


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "nope", "rope", "rank", "v_dim", "topk"), [
    (torch.float32, 4, 16, 8, 32, 16, 5),   # DeepSeek-V3's ratios, scaled down; topk no power of two
    (torch.bfloat16, 3, 12, 6, 40, 20, 20),  # 3 heads, widths no powers of two, more keys than a block
])
def test_sparse_mla_in_pieces_equals_masked_expanded_attention(build_sparse, run_kernel: bool,  # noqa: ANN001
                                                               dtype: torch.dtype, heads: int, nope: int, rope: int,
                                                               rank: int, v_dim: int, topk: int) -> None:
    """DeepSeek sparse attention's MLA (`selected`): each token attends to its selected positions
    at or before its own only; against HF's expanded attention with the mask `causal & ~index_mask`
    (SDPA), in pieces, the kernel and the reference, at `TOLERANCE`."""
    scale = (nope + rope) ** -0.5
    (q_nope, q_rope, latent, k_rope), weight = _inputs(dtype, heads, nope, rope, rank, v_dim)
    selected = _selection(topk)
    batch, _, seq, _ = q_nope.shape
    chosen = torch.zeros(batch, seq, seq + 1, dtype=torch.bool, device=DEVICE)
    chosen.scatter_(2, torch.where(selected < 0, seq, selected), True)
    allowed = chosen[..., :seq] & torch.ones(seq, seq, dtype=torch.bool, device=DEVICE).tril()
    kv = torch.nn.functional.linear(latent, weight).view(batch, seq, heads, -1).transpose(1, 2)
    k_nope, value = kv.split([nope, kv.shape[-1] - nope], dim=-1)
    key = torch.cat([k_nope, k_rope.expand(-1, heads, -1, -1)], dim=-1)
    expected = torch.nn.functional.scaled_dot_product_attention(
        torch.cat([q_nope, q_rope], dim=-1), key, value, attn_mask=allowed[:, None], scale=scale).float()
    cache = torch.randn(3, 32, rank + rope, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    untouched = cache[1].clone()
    module = build_sparse((dtype, scale)) if run_kernel else None
    done = [0, 0]
    for piece in PIECES:
        rows = [r for r, _ in piece]
        chunk = [torch.stack([x[r, :, done[r]:e] for r, e in piece]) for x in (q_nope, q_rope, latent, k_rope)]
        picks = torch.stack([selected[r, done[r]:e] for r, e in piece])
        tables = torch.tensor([[SLOTS[r]] for r in rows], device=DEVICE)
        starts = torch.tensor([done[r] for r in rows], device=DEVICE)
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [*chunk, weight, cache, tables, starts, picks], [])[0]
        else:
            out = torch_ops.cached_mla_attention(*chunk, weight, cache, tables, starts, scale, picks)
        for i, (r, e) in enumerate(piece):
            want = expected[r, :, done[r]:e]
            assert (out[i].float() - want).abs().max() <= TOLERANCE[dtype] * (1 + want.abs().max()), (piece, r)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        assert torch.equal(cache[slot, :SEQ], torch.cat([latent[r, 0], k_rope[r, 0]], dim=-1))
    assert torch.equal(cache[1], untouched)


def test_sparse_mla_ptx_for_sm90_at_deepseek_v32_sizes_has_no_spills(build_sparse) -> None:  # noqa: ANN001
    """DeepSeek-V3.2's sparse MLA (128 heads, nope 128 + rope 64, value 128, latent 512, top
    2048) in bf16: a 1024-token prefill of 1 row and a decode step of 8, compiled for sm_90 as
    the runtime specializes them: no spills."""
    heads, nope, rope, rank, v_dim, topk = 128, 128, 64, 512, 128, 2048
    module = build_sparse((torch.bfloat16, (nope + rope) ** -0.5))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="meta")
        q_nope, q_rope = meta(batch, seq, heads, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        latent, k_rope = meta(batch, seq, rank + rope).split([rank, rope], dim=-1)
        tensors = [q_nope, q_rope, latent.unsqueeze(1), k_rope.unsqueeze(1), meta(heads * (nope + v_dim), rank),
                   meta(16, 4096, rank + rope), meta(batch, 1, dtype=torch.int64), meta(batch, dtype=torch.int64),
                   meta(batch, seq, topk, dtype=torch.int64)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1024, heads // 32), (8, heads // 32)]
    for report in compile_all(specs):
        assert report.spills == 0, report
