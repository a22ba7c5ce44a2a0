"""The lightning indexer's kernel template (`ad.cached_index_topk`: DeepSeek sparse attention's
top-k positions over an index-key cache written in place) and the op's torch reference, fed as
prefills, a chunked prefill and decode steps, against HF's indexer over the whole sequence
(`DeepseekV32Indexer.forward`'s scores, masked causally, topk of min(k, keys)): in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its
PTX for sm_90 at DeepSeek-V3.2's real sizes, compiled without a GPU: no spills. With 3 heads,
relu often zeroes every head of a key, so equal scores (0) are common: a selection is right when
its positions are distinct and causal and their scores (HF's) are the k best, whichever of equal
ones it kept.

Two sequences in slots 2 and 0 of 3 whose cache rows start as random values (a stale sequence's
keys), so a row that read past what its sequence wrote would be seen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.index_topk_kernel import emit_index_topk_module
from ad_mlir.semantics import torch_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ = 21
PIECES = [[(0, 9)], [(1, 1)], [(1, 7)], [(0, 10)], [(1, 12)], [(0, 11), (1, 13)], [(0, 12), (1, 14)], [(0, SEQ)],
          [(1, SEQ)]]
"""(row, end) of each call: a prefill of 9 tokens, one of 1 (fewer positions than k), a chunk of 6,
one token of one row, a chunk of 5 of the other, two decode steps of both rows together, then
chunks to the end."""
SLOTS = [2, 0]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("index_kernels"), "index_topk",
                            lambda spec, name, header: emit_index_topk_module(*spec, name, header))


def _hf_scores(query: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """HF's index scores over whole sequences ([B, S, H, D], [B, S, D], [B, S, H]), masked
    causally as `topk` takes them: [B, S, S]."""
    scores = torch.relu(torch.matmul(query.float(), key.transpose(-1, -2).float().unsqueeze(1)) * scale)
    index = torch.matmul(weights.float().unsqueeze(-2), scores).squeeze(-2)
    seq = query.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=query.device).tril()
    return index.masked_fill(~causal, float("-inf"))


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "dim", "topk"), [
    (torch.float32, 4, 32, 2),    # the sweep's index_topk
    (torch.bfloat16, 3, 24, 5),   # heads and dim no powers of two (masked tiles)
])
def test_index_topk_in_pieces_equals_hf_indexer(build, run_kernel: bool, dtype: torch.dtype, heads: int,  # noqa: ANN001
                                                dim: int, topk: int) -> None:
    scale = dim ** -0.5
    g = torch.Generator().manual_seed(heads * dim)
    query = torch.randn(2, SEQ, heads, dim, generator=g).to(dtype).to(DEVICE)
    key = torch.randn(2, SEQ, dim + 3, generator=g).to(dtype).to(DEVICE)[..., :dim]  # a slice: strided rows
    weights = torch.randn(2, SEQ, heads, generator=g).to(DEVICE)
    scores = _hf_scores(query, key, weights, scale)
    cache = torch.randn(3, 32, dim, generator=g).to(dtype).to(DEVICE)
    untouched = cache[1].clone()
    module = build((scale, topk)) if run_kernel else None
    done = [0, 0]
    for piece in PIECES:
        rows = [r for r, _ in piece]
        chunk = [torch.stack([x[r, done[r]:e] for r, e in piece]) for x in (query, key, weights)]
        slots = torch.tensor([SLOTS[r] for r in rows], device=DEVICE)
        starts = torch.tensor([done[r] for r in rows], device=DEVICE)
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [*chunk, cache, slots, starts], [])[0]
        else:
            out = torch_ops.cached_index_topk(*chunk, cache, slots, starts, scale, topk)
        assert out.dtype == torch.int64 and out.shape == (len(piece), chunk[0].shape[1], topk)
        for i, (r, e) in enumerate(piece):
            for t, position in enumerate(range(done[r], e)):
                kept, got = min(topk, position + 1), out[i, t]
                assert got[kept:].eq(-1).all() and got[:kept].ge(0).all(), (piece, r, position)  # fewer causal than k
                assert got[:kept].unique().numel() == kept and got[:kept].max() <= position, (piece, r, position)
                best = scores[r, position].topk(kept).values  # the k best scores (ties: any of them)
                torch.testing.assert_close(scores[r, position, got[:kept]].sort(descending=True).values, best)
            done[r] = e
    for r, slot in enumerate(SLOTS):
        assert torch.equal(cache[slot, :SEQ], key[r])
    assert torch.equal(cache[1], untouched)


def test_index_topk_ptx_for_sm90_at_deepseek_v32_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """DeepSeek-V3.2's indexer (64 heads x 128, top 2048, bf16 keys, fp32 weights) over a cache of
    4096 positions: a 1024-token prefill of 1 row and a decode step of 8, compiled for sm_90 as
    the runtime specializes them: no spills."""
    heads, dim = 64, 128
    module = build((dim ** -0.5, 2048))
    launches = []
    for batch, seq in ((1, 1024), (8, 1)):
        tensors = [torch.empty(batch, seq, heads, dim, dtype=torch.bfloat16, device="meta"),
                   torch.empty(batch, seq, dim, dtype=torch.bfloat16, device="meta"),
                   torch.empty(batch, seq, heads, device="meta"),
                   torch.empty(16, 4096, dim, dtype=torch.bfloat16, device="meta"),
                   *[torch.empty(batch, dtype=torch.int64, device="meta")] * 2]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1024, 4096 // 32), (8, 4096 // 32)]
    for report in compile_all(specs):
        assert report.spills == 0, report
