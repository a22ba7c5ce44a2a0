"""Multi-head latent attention (DeepSeek-V3) in the paged form (`LLM(..., page_size=)`,
`ad.cached_mla_attention` with query_starts): one pool of latent pages per layer, [num_pages, page_size, kv_lora_rank
+ qk_rope_head_dim], not the heads' expanded K and V. test_mla's tiny DeepSeek-V3 (the query's
LoRA, MoE on the second layer, a wide init so that greedy tokens vary) run through test_paged's
flattened steps (prefill chunks beside decodes, pages out of order in the pool, crossing page
boundaries), every logit asked for against HF's full-prefix forward, on the kernels' torch
reference and with every kernel in the Triton interpreter; `generate` on the paged scheduler in
a pool that holds every request (no preemption) against HF `generate`."""

from __future__ import annotations

import pytest
import test_paged
import torch
from kernel_guard import graph_kernels, kernels_ran
from test_generate import PROMPTS, _hf_tokens
from test_mla import LAYERS, RANK, ROPE, _model
from test_paged import (
    NUM_PAGES,
    PAGE_SIZE,
    _assert_tokens_are_hf,
    _run_schedule,
    assert_forgotten_pages_are_seen,
)

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.runtime.kernels import reference_kernels

ATOL = 2e-5
"""Per unit of the largest logit: test_mla's tolerance for the slot form's steps (fp32
reordering of the absorbed sums through these wide weights), which the paged steps meet
(measured: at most 6.5e-6 on the reference, 5.8e-6 with the kernels in the interpreter); a step that forgets the pages is off by order 1
(`test_steps_that_forget_the_pages_are_seen`)."""


@pytest.fixture(scope="module")
def paged_mla() -> tuple[torch.nn.Module, ad_mlir.LLM]:
    model = _model("q_lora")
    return model, ad_mlir.LLM(model, max_batch=3, max_seq_len=24, page_size=PAGE_SIZE, num_pages=NUM_PAGES)


def test_the_caches_are_latent_pools(paged_mla) -> None:  # noqa: ANN001
    """One pool per layer [num_pages, page_size, rank + rope] in fp32, no K/V pages: (rank +
    rope) x 4 bytes per token and layer."""
    _, llm = paged_mla
    assert {name: tuple(c.shape) for name, c in llm.caches.items()} == {
        "latent_pages_0": (NUM_PAGES, PAGE_SIZE, RANK + ROPE), "latent_pages_1": (NUM_PAGES, PAGE_SIZE, RANK + ROPE)}
    assert all(c.dtype == torch.float32 for c in llm.caches.values())
    assert llm.token_bytes == dict.fromkeys(LAYERS, (RANK + ROPE) * 4)
    ops = [type(op) for op in llm.program.function.body.walk()]
    mlas = [op for op in llm.program.function.body.walk() if isinstance(op, ad.CachedMlaAttentionOp)]
    assert len(mlas) == 2 and all(op.query_starts is not None for op in mlas) and ad.CachedAttentionOp not in ops


def test_flattened_steps_match_hf(paged_mla) -> None:  # noqa: ANN001
    model, llm = paged_mla
    _assert_tokens_are_hf(model, _run_schedule(model, llm, ATOL))


def test_steps_that_forget_the_pages_are_seen(paged_mla, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The check can fail: with the pools zeroed before each step, a step's logits differ from HF's."""
    model, llm = paged_mla
    assert_forgotten_pages_are_seen(model, llm, ATOL, monkeypatch)


def test_in_the_interpreter(paged_mla, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The first four steps (prefill chunks beside decodes, then a decode-only step: both of the
    kernel's grids) with every kernel in the Triton interpreter, the MLA kernel (its paged configuration) among
    them; the tokens generated so far are HF's."""
    model, llm = paged_mla
    assert any(name.startswith("cached_mla_attention") for name in graph_kernels(llm.graph)), llm.graph.code
    monkeypatch.setattr(test_paged, "SCHEDULE", test_paged.SCHEDULE[:4])
    generated = _run_schedule(model, llm, ATOL, lambda: kernels_ran(monkeypatch))
    assert [len(tokens) for tokens in generated] == [3, 4, 2]
    for prompt, tokens in zip(PROMPTS, generated, strict=True):
        assert tokens == _hf_tokens(model, prompt, 8)[:len(tokens)]


def test_generate_gives_hf_tokens(paged_mla) -> None:  # noqa: ANN001
    """`LLM.generate` on the paged scheduler: three prompts, 10 new tokens each, in a pool that
    holds all three at once (14 of 24 pages), HF's greedy tokens."""
    model, llm = paged_mla
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=10)
    assert [out.token_ids for out in outputs] == [_hf_tokens(model, prompt, 10) for prompt in PROMPTS]
