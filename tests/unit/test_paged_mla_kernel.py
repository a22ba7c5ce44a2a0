"""The paged MLA kernel template (`ad.paged_mla_attention`: attention over a pool of latent
pages, the up-projection absorbed) and the op's torch reference, fed flattened steps that mix
prefill chunks (across page boundaries) with decode tokens, and decode-only steps, the pages
written in place, against attention over the whole sequence with the heads' K and V expanded as
HF's `DeepseekV3Attention.expand_kv` does (`test_mla_kernel._expanded_attention`): in the Triton
interpreter on CPU (conftest sets TRITON_INTERPRET=1 where CUDA is absent) or on the GPU; and its
PTX for sm_90 at DeepSeek-V3's real sizes, compiled without a GPU: no spills.

Two sequences whose pages lie out of order in a pool of random values (a stale sequence's
latents), one page no sequence holds: a read or write through the wrong page, or past what a
sequence wrote, would be seen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from template_modules import template_builder
from test_mla_kernel import DEVICE, SEQ, TOLERANCE, _expanded_attention, _inputs

from ad_mlir.codegen.ptx import compile_all, record_launches, specialize_launch
from ad_mlir.codegen.templates.paged_mla_attention_kernel import emit_paged_mla_attention_module
from ad_mlir.semantics import torch_ops

PAGE = 4
BLOCK_TABLES = torch.tensor([[5, 0, 7, 2, 9, 3], [8, 1, 6, 4, 10, 11]])
"""Each sequence's pages (SEQ = 21 tokens: 6 pages of 4), in no order of the pool; page 12 is
no sequence's."""
STEPS = [[(0, 9)], [(1, 7), (0, 1)], [(0, 1), (1, 1)], [(1, 5), (0, 3)], [(0, 1), (1, 1)], [(1, 7), (0, 6)]]
"""Flattened steps as (sequence, new tokens): a prefill of 9 (three pages), a prefill beside a
decode, decode-only steps (one token each: the kernel's shorter grid), chunks of both, chunks to
the end."""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple], ModuleType]:
    return template_builder(tmp_path_factory.mktemp("paged_mla_kernels"), "paged_mla",
                            lambda spec, name, header: emit_paged_mla_attention_module(*spec, name, header))


@pytest.mark.parametrize("run_kernel", [True, False], ids=["kernel", "reference"])
@pytest.mark.parametrize(("dtype", "heads", "nope", "rope", "rank", "v_dim"), [
    (torch.float32, 4, 16, 8, 32, 16),   # DeepSeek-V3's ratios, scaled down
    (torch.float32, 3, 12, 6, 40, 20),   # widths that are no powers of two (masked tiles), 3 heads
    (torch.bfloat16, 4, 16, 8, 32, 24),
])
def test_flattened_steps_equal_expanded_attention(build, run_kernel: bool, dtype: torch.dtype, heads: int,  # noqa: ANN001
                                                  nope: int, rope: int, rank: int, v_dim: int) -> None:
    """Each step's output within the MLA kernel's tolerance of the expanded attention (the same
    sums: the pages hold the latents exactly, `TOLERANCE` says why it is not 0); afterwards the
    pages hold each token's latent ++ rope key at its position, the stray page untouched."""
    scale = (nope + rope) ** -0.5
    (q_nope, q_rope, latent, k_rope), weight = _inputs(dtype, heads, nope, rope, rank, v_dim)
    expected = _expanded_attention(q_nope, q_rope, latent, k_rope, weight, scale).float()
    g = torch.Generator().manual_seed(1)
    pages = torch.randn(13, PAGE, rank + rope, generator=g).to(dtype).to(DEVICE)
    untouched = pages[12].clone()
    tables = BLOCK_TABLES.to(DEVICE)
    module = build((dtype, scale, PAGE)) if run_kernel else None
    tol = TOLERANCE[dtype]
    done = [0, 0]
    for step in STEPS:
        seqs = [s for s, _ in step]
        flat = [torch.cat([x[s:s + 1, :, done[s]:done[s] + n] for s, n in step], dim=2)
                for x in (q_nope, q_rope, latent, k_rope)]
        bounds = torch.tensor([0, *torch.tensor([n for _, n in step]).cumsum(0).tolist()], device=DEVICE)
        meta = [bounds, torch.tensor([done[s] for s in seqs], device=DEVICE), tables[seqs]]
        if module is not None:
            out = module.launch(getattr(module, module.kernel_name), [*flat, weight, pages, *meta], [])[0]
        else:
            out = torch_ops.paged_mla_attention(*flat, weight, pages, *meta, scale)
        assert out.dtype == dtype and out.shape == (1, heads, int(bounds[-1]), v_dim)
        for i, (s, n) in enumerate(step):
            want = expected[s, :, done[s]:done[s] + n]
            got = out[0, :, int(bounds[i]):int(bounds[i + 1])].float()
            assert (got - want).abs().max() <= tol * (1 + want.abs().max()), (step, s)
            done[s] += n
    assert done == [SEQ, SEQ]
    for s in range(2):
        held = pages[tables[s]].flatten(0, 1)[:SEQ]
        assert torch.equal(held, torch.cat([latent[s, 0], k_rope[s, 0]], dim=-1))
    assert torch.equal(pages[12], untouched)


def test_paged_mla_ptx_for_sm90_at_deepseek_v3_sizes_has_no_spills(build) -> None:  # noqa: ANN001
    """DeepSeek-V3's attention (128 heads, nope 128 + rope 64, value 128, latent 512) in bf16,
    pages of 64 tokens: a 1024-token prefill of 1 sequence and a decode step of 8 (one token
    each: the grid's second axis the heads' blocks only), compiled for sm_90 as the runtime
    specializes them: no spills."""
    heads, nope, rope, rank, v_dim, page = 128, 128, 64, 512, 128, 64
    module = build((torch.bfloat16, (nope + rope) ** -0.5, page))
    launches = []
    for seqs, tokens in ((1, 1024), (8, 8)):
        def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="meta")
        q_nope, q_rope = meta(1, tokens, heads, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        latent, k_rope = meta(1, tokens, rank + rope).split([rank, rope], dim=-1)
        tensors = [q_nope, q_rope, latent.unsqueeze(1), k_rope.unsqueeze(1), meta(heads * (nope + v_dim), rank),
                   meta(512, page, rank + rope), meta(seqs + 1, dtype=torch.int64), meta(seqs, dtype=torch.int64),
                   meta(seqs, 64, dtype=torch.int64)]
        launches += record_launches(module, tensors, [])
    fn = getattr(module, module.kernel_name)
    specs = [specialize_launch(module.kernel_name, Path(module.__file__), fn, launch) for launch in launches]
    assert [s.grid for s in specs] == [(1, 1024 * heads // 32), (8, heads // 32)]
    for report in compile_all(specs):
        assert report.spills == 0, report
