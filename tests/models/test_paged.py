"""The paged form (`LLM(..., page_size=)`, `forward_flat`) against HF's full-prefix forward.

Three prompts run through flattened steps that mix a prefill chunk of one sequence with the
decode tokens of others and the first chunk of a third, each sequence's pages given by hand out
of order in the pool (so a kernel or reference reading pages in pool order, or a page's rows in
the wrong place, would be seen), crossing page boundaries (page size 4). The logits asked for
(`logits_indices`: the last token of every sequence, and every token of one prefill chunk, as
prompt logits) are compared with HF's forward over each sequence's whole prefix, within
test_generate's fp32 tolerance (`_assert_logits_close`, with `ATOL`: the same ops on the same
values, only the keys and values read back from the pages); greedy tokens are fed back, and must be HF's
(which vary: `_hf_tokens` checks it). A SmolLM2-shaped Llama (grouped-query heads, 3 per K/V
head, tied embeddings) and Mistral (a sliding window of 6, which the 7- and 11-token prompts and
the decodes cross), on the kernels' torch reference and, for the Llama, with every kernel in
the Triton interpreter. The paged scheduler (`PagedEngine`) on the compiled model: `generate`,
preemption in a pool too small, a prefix hit reading shared pages, each giving HF's tokens."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_steps import checked_step
from kernel_guard import graph_kernels, kernels_ran
from test_generate import PROMPTS, _assert_logits_close, _family_model, _hf_tokens
from test_llm_runtime import decode_problems
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from transformers import AutoModelForCausalLM, LlamaConfig

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.llm.cuda_graphs import pad_flat_decode
from ad_mlir.llm.engine import PagedEngine, SamplingParams, make_engine
from ad_mlir.runtime.kernels import reference_kernels

PAGE_SIZE = 4
NUM_PAGES = 24
BLOCK_TABLES = torch.tensor([[9, 2, 17, 5, 0, 0], [11, 3, 20, 1, 0, 0], [4, 16, 8, 13, 6, 22]])
"""Each sequence's pages, in no order of the pool (0 past a sequence's pages: never read)."""
SCHEDULE = [
    [(0, 5), (1, 2)],  # a prefill chunk of prompt 0 (5 of 7) and the whole prompt 1
    [(0, 2), (1, 1), (2, 6)],  # the rest of prompt 0, a decode of 1, a first chunk of prompt 2
    [(1, 1), (2, 5), (0, 1)],  # a decode, the rest of prompt 2 (across pages), a decode
    *[[(0, 1), (1, 1), (2, 1)]] * 5,  # decodes of all three
]
"""Steps as (sequence, new tokens): prompts are fed in chunks, then each sequence's greedy tokens."""
PROMPT_LOGITS = (0, 0)
"""(step, sequence) whose every new token's logits are asked for (prompt logits)."""


def _smollm2_shaped() -> torch.nn.Module:
    """SmolLM2-135M's layout at a tiny size: 9 query heads on 3 K/V heads (groups of 3, not a
    power of two), tied embeddings, rope_theta 1e5, RMSNorm eps 1e-5; 2 layers, heads of 16."""
    config = LlamaConfig(vocab_size=256, hidden_size=144, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=16, tie_word_embeddings=True,
                         rope_theta=1e5, rms_norm_eps=1e-5, max_position_embeddings=256, initializer_range=0.5,
                         pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


ATOL = {"smollm2": 3e-5, "mistral": 1e-5}
"""`_assert_logits_close`'s atol per unit of the largest logit: its default for Mistral; the
SmolLM2-shaped model's own fp32 noise is larger (measured: the slot form's decode steps off HF by
up to 1.6e-4 on logits of ~20, the paged steps up to 2.9e-4 on 21: 1.4e-5 per unit), still far
below what a wrong page does (order 1: `test_steps_that_forget_the_pages_are_seen`)."""


@pytest.fixture(scope="module")
def paged() -> dict[str, tuple[torch.nn.Module, ad_mlir.LLM]]:
    made = {}
    for family, model in (("smollm2", _smollm2_shaped()), ("mistral", _family_model("mistral"))):
        made[family] = model, ad_mlir.LLM(model, max_batch=3, max_seq_len=24, page_size=PAGE_SIZE,
                                          num_pages=NUM_PAGES)
    return made


def _run_schedule(model: torch.nn.Module, llm: ad_mlir.LLM, atol: float,
                  kernels_as: Callable[[], contextlib.AbstractContextManager] = reference_kernels) -> list[list[int]]:
    """`SCHEDULE` through `forward_flat`, every logit asked for checked against HF (within
    `atol` per unit of the largest logit); returns each sequence's generated tokens. A model
    with per-sequence states keeps sequence s in state slot 2 - s (not its index in a step)."""
    sequences, held = [list(p) for p in PROMPTS], [0] * len(PROMPTS)
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for i, step in enumerate(SCHEDULE):
        ids, asked, query_starts = [], [], [0]
        for s, n in step:
            new = sequences[s][held[s]:held[s] + n]
            assert len(new) == n, f"step {i}: sequence {s} has {len(new)} tokens to feed, the schedule says {n}"
            rows = range(n) if (i, s) == PROMPT_LOGITS else [n - 1]
            asked += [(s, held[s] + r, len(ids) + r) for r in rows]
            ids += new
            query_starts.append(len(ids))
        positions = [p for s, n in step for p in range(held[s], held[s] + n)]
        seqs = [s for s, _ in step]
        states = {"state_slots": torch.tensor([2 - s for s in seqs])} if llm.num_state_slots else {}
        with torch.no_grad(), kernels_as():
            logits = llm.forward_flat(torch.tensor([ids]), torch.tensor([positions]), torch.tensor(query_starts),
                                      torch.tensor([held[s] for s in seqs]), BLOCK_TABLES[seqs],
                                      torch.tensor([flat for _, _, flat in asked]), **states)
        assert logits.shape == (len(asked), model.config.vocab_size)
        for s, n in step:
            held[s] += n
        for j, (s, position, _) in enumerate(asked):
            with torch.no_grad():
                expected = model(torch.tensor([sequences[s][:position + 1]])).logits[0, -1]
            _assert_logits_close(logits[j], expected, atol)
            if position == len(sequences[s]) - 1:  # the sequence's last token: its next is greedy
                generated[s].append(int(logits[j].argmax()))
                sequences[s].append(generated[s][-1])
    return generated


def _assert_tokens_are_hf(model: torch.nn.Module, generated: list[list[int]]) -> None:
    for prompt, tokens in zip(PROMPTS, generated, strict=True):
        assert len(tokens) >= 6
        assert tokens == _hf_tokens(model, prompt, len(tokens))


@pytest.mark.parametrize("family", ["smollm2", "mistral"])
def test_flattened_steps_match_hf(paged, family: str) -> None:
    model, llm = paged[family]
    _assert_tokens_are_hf(model, _run_schedule(model, llm, ATOL[family]))


def test_a_byte_budget_buys_whole_pages(paged) -> None:
    """kv_cache_budget sizes the pools in pages: bytes per page from the config (K and V of every
    layer: layers x 2 x page_size x kv_heads x head_dim x 4 bytes in fp32), 10 pages and a bit."""
    model, _ = paged["smollm2"]
    config = model.config
    per_page = config.num_hidden_layers * 2 * PAGE_SIZE * config.num_key_value_heads * config.head_dim * 4
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=24, page_size=PAGE_SIZE, kv_cache_budget=10 * per_page + 100)
    assert llm.num_pages == 10 and llm.cache_bytes == 10 * per_page
    assert llm.max_seq_len == 24, "the length asked for, not the default"
    with pytest.raises(ValueError, match="holds no page of 4 tokens"):
        ad_mlir.LLM(model, max_batch=2, max_seq_len=24, page_size=PAGE_SIZE, kv_cache_budget=per_page - 1)


def test_steps_that_forget_the_pages_are_seen(paged, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: with the pools zeroed before each step (a step sees its own new
    tokens only), the second step's logits already differ from HF's."""
    model, llm = paged["smollm2"]
    assert_forgotten_pages_are_seen(model, llm, ATOL["smollm2"], monkeypatch)


def assert_forgotten_pages_are_seen(model: torch.nn.Module, llm: ad_mlir.LLM, atol: float,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`_run_schedule` fails when the pools are zeroed before each step."""
    forward = llm.forward_flat

    def forgetful(*args: torch.Tensor) -> torch.Tensor:
        for pool in llm.caches.values():
            pool.zero_()
        return forward(*args)

    monkeypatch.setattr(llm, "forward_flat", forgetful)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _run_schedule(model, llm, atol)


def test_the_paged_llm(paged) -> None:
    """Pools of num_pages x page_size per layer and role, paged attention ops, the window kept."""
    _, llm = paged["mistral"]
    assert (llm.page_size, llm.num_pages, llm.cache_tokens) == (PAGE_SIZE, NUM_PAGES, PAGE_SIZE * NUM_PAGES)
    assert {tuple(c.shape) for c in llm.caches.values()} == {(NUM_PAGES, PAGE_SIZE, 1, 32)} and len(llm.caches) == 4
    ops = [op for op in llm.program.module.walk() if isinstance(op, ad.CachedAttentionOp)]
    assert len(ops) == 2 and all(op.query_starts is not None and op.window is not None and op.window.value.data == 6 for op in ops)
    assert llm.inputs[:2] == ["input_ids", "position_ids"]
    with pytest.raises(ValueError, match="compiled in the paged form: run it with forward_flat"):
        llm.step(torch.tensor([[1]]), torch.tensor([[0]]), [0], [0])


def test_llama_in_the_interpreter(paged, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same steps with every kernel in the Triton interpreter, the paged attention's included."""
    model, llm = paged["smollm2"]
    assert any(name.startswith("cached_attention") for name in graph_kernels(llm.graph)), llm.graph.code
    _assert_tokens_are_hf(model, _run_schedule(model, llm, ATOL["smollm2"], lambda: kernels_ran(monkeypatch)))


def test_generate_runs_the_paged_scheduler_on_the_compiled_model(paged) -> None:
    """`LLM.generate` on the paged form goes through the paged scheduler (`make_engine`), whose
    steps are `forward_flat` calls of the compiled graph: HF's greedy tokens."""
    model, llm = paged["smollm2"]
    assert isinstance(make_engine(llm), PagedEngine)
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=10)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert out.token_ids == _hf_tokens(model, prompt, 10)


def test_a_pool_too_small_for_all_preempts_and_still_gives_hf_tokens(paged) -> None:
    """7 pages of 4 tokens for three requests that need 5, 3 and 6 (prompt and 10 new tokens):
    the scheduler preempts and recomputes, the compiled graph's pages follow, the tokens are
    HF's, and every page is free at the end."""
    model, _ = paged["smollm2"]
    llm = ad_mlir.LLM(model, max_batch=3, max_seq_len=24, page_size=PAGE_SIZE, num_pages=7)
    engine = make_engine(llm, max_step_tokens=8)
    requests = [engine.add(prompt, SamplingParams(max_tokens=10)) for prompt in PROMPTS]
    with reference_kernels():
        while engine.has_work:
            checked_step(engine)
    assert engine.preemptions > 0
    assert engine.pages_in_use == 0
    for prompt, request in zip(PROMPTS, requests, strict=True):
        assert request.output.token_ids == _hf_tokens(model, prompt, 10)


def test_a_prefix_hit_reads_the_shared_pages_of_the_compiled_model(paged) -> None:
    """A second request that begins with the first one's 9-token prompt (two full pages of 4)
    shares those pages (prefix caching) and prefills from position 8 only: the paged kernel's
    reference reads the shared pages, and its tokens are HF's."""
    model, llm = paged["smollm2"]
    engine = make_engine(llm, max_step_tokens=16)
    first, second = [5, 9, 13, 3, 7, 40, 41, 2, 8], [5, 9, 13, 3, 7, 40, 41, 2, 8, 30, 31]
    with reference_kernels():
        done = engine.add(first, SamplingParams(max_tokens=6))
        while engine.has_work:
            checked_step(engine)
        hit = engine.add(second, SamplingParams(max_tokens=6))
        while engine.has_work:
            checked_step(engine)
    assert engine.prefix_hits >= 2 * PAGE_SIZE
    assert done.output.token_ids == _hf_tokens(model, first, 6)
    assert hit.output.token_ids == _hf_tokens(model, second, 6)


@pytest.mark.parametrize("seqs", [1, 3])
def test_a_decode_step_is_cuda_graph_ready(paged, seqs: int) -> None:
    """A paged decode step of `seqs` sequences (one token each, block tables 6 pages wide),
    traced op by op with fake tensors of static shapes: no host sync or data-dependent op, the
    pools written in place by an op that declares the write (test_llm_runtime's checks), the
    logits [1, seqs, vocab]."""
    _, llm = paged["smollm2"]
    ints = {"input_ids": (1, seqs), "position_ids": (1, seqs), "query_starts": (seqs + 1,), "cache_starts": (seqs,),
            "block_tables": (seqs, 6), "logits_indices": (seqs,)}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    given: dict[str, Any] = {"use_cache": False, **{n: mode.from_tensor(c) for n, c in llm.caches.items()},
                             **{n: mode.from_tensor(torch.zeros(s, dtype=torch.int64)) for n, s in ints.items()}}
    with mode:
        gm = make_fx(llm.graph)(*(given[name] for name in llm.inputs))
    assert decode_problems(gm, llm.inputs, set(llm.caches)) == []
    (output,) = (n for n in gm.graph.nodes if n.op == "output")
    assert tuple(output.args[0][0].meta["val"].shape) == (1, seqs, llm.model.config.vocab_size)


def test_a_decode_step_padded_to_its_cuda_graph_bucket_gives_the_same_logits(paged) -> None:
    """What `CudaGraphFlatDecode` replays, on the CPU: a decode step of two sequences padded to a
    bucket of 4 (`pad_flat_decode`: two dummy sequences in a scratch page no block table holds)
    gives the unpadded step's logits and leaves the sequences' pages as the unpadded step does.
    Within the fp32 noise `ATOL` allows per unit of the largest value, for the logits and the
    pages (measured 1.3e-4 on logits of ~20, 6.4e-5 on keys of 24: the GEMMs and the batched
    attention over 4 rows sum in another order than over 2); a dummy row reading or writing a
    sequence's page would be off by order 1."""
    _, llm = paged["smollm2"]
    scratch, rows = NUM_PAGES - 1, [0, 2]
    assert scratch not in BLOCK_TABLES
    prompts = [PROMPTS[s] for s in rows]
    with torch.no_grad(), reference_kernels():
        ids = [t for p in prompts for t in p]
        starts = torch.tensor([0, len(prompts[0]), len(ids)])
        first = llm.forward_flat(torch.tensor([ids]), torch.tensor([[i for p in prompts for i in range(len(p))]]),
                                 starts, torch.zeros(2, dtype=torch.int64), BLOCK_TABLES[rows], starts[1:] - 1)
        decode = (first.argmax(-1)[None], torch.tensor([[len(p) for p in prompts]]), torch.arange(3),
                  torch.tensor([len(p) for p in prompts]), BLOCK_TABLES[rows], torch.arange(2))
        before = {n: c.clone() for n, c in llm.caches.items()}
        eager = llm.forward_flat(*decode)
        written = {n: c.clone() for n, c in llm.caches.items()}
        for name, cache in llm.caches.items():
            cache.copy_(before[name])
        padded = llm.forward_flat(*pad_flat_decode(*decode, bucket=4, scratch_page=scratch))
    assert padded.shape[0] == 4
    for got, expected in zip(padded[:2], eager, strict=True):
        _assert_logits_close(got, expected, ATOL["smollm2"])
    for name, cache in llm.caches.items():
        scale = float(written[name].abs().max())  # the same noise per unit as the logits (measured 6.4e-5 on 24)
        torch.testing.assert_close(cache[:scratch], written[name][:scratch], rtol=0, atol=ATOL["smollm2"] * scale)
