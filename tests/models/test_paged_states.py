"""Per-sequence states in the paged form: hybrid models served over pages and state slots.

LFM2 (short convolutions beside attention) and Nemotron-H (Mamba2's scan and its convolution,
attention), tiny, wide-init (0.5) so that greedy tokens vary (`_hf_tokens` checks it) and a state that is
wrong or missing shows. Their convolutions and scans keep a state per sequence in pools of
`max_batch` slots beside the K/V pages (`state_slots`), each sequence of the flattened step
from its own slot. `test_paged._run_schedule`'s flattened steps (a prefill chunk beside decodes and
a first chunk, a prompt split over two steps, pages out of order, state slots not the sequences'
order) against HF's full-prefix forward; the paged scheduler (`PagedEngine`) on the compiled
model against HF `generate` with arrivals while others decode, a prompt longer than the step's
budget and a pool small enough to preempt. On the kernels' torch reference, and Nemotron-H's
steps (its convolution, scan and paged attention) with every kernel in the Triton interpreter:
the state ops' kernels run all sequences of a step in one launch, reading `query_starts` on the
device (`codegen/templates/state_rows.py`; the gated delta rule's, Qwen3-Next's mixer, is checked
over flattened sequences of unequal lengths against HF's whole sequences, kernel and reference,
in tests/unit/test_recurrent_state_kernels.py, and its paged rewrite in FileCheck: a Qwen3-Next
model here cost ~30 s of CI for what those cover)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_steps import checked_step
from kernel_guard import graph_kernels, kernels_ran
from test_generate import PROMPTS, _assert_logits_close, _hf_tokens
from test_llm_runtime import decode_problems
from test_paged import BLOCK_TABLES, NUM_PAGES, PAGE_SIZE, _assert_tokens_are_hf, _run_schedule
from test_recurrent_mixers import CONFIGS
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from transformers import AutoModelForCausalLM, Lfm2Config, MambaConfig, NemotronHConfig

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.llm.cuda_graphs import CudaGraphFlatDecode, pad_flat_decode
from ad_mlir.llm.engine import PagedEngine, SamplingParams, make_engine
from ad_mlir.llm.llm import paged_where_possible
from ad_mlir.runtime.kernels import reference_kernels

LFM2 = Lfm2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"], pad_token_id=0,
                  max_position_embeddings=256, initializer_range=0.5)
NEMOTRON_H = CONFIGS["nemotron_h"].to_dict() | {"layers_block_type": ["linear_attention", "full_attention"]}
"""test_recurrent_mixers' Nemotron-H with its Mamba2 and attention layers only (its MoE and MLP
layers keep no state and would only slow the interpreter run)."""
FAMILIES = {"lfm2": LFM2, "nemotron_h": NemotronHConfig(**NEMOTRON_H)}
STATE_OPS = {"lfm2": (ad.CachedCausalConv1dOp,), "nemotron_h": (ad.CachedCausalConv1dOp, ad.CachedSsmScanOp)}
SLOTS = 3
"""State slots (`max_batch`): `_run_schedule`'s three sequences at once."""


def _model(config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def hybrids() -> dict[str, tuple[torch.nn.Module, ad_mlir.LLM]]:
    made = {}
    for family, config in FAMILIES.items():
        model = _model(config)
        made[family] = model, ad_mlir.LLM(model, max_batch=SLOTS, max_seq_len=24, page_size=PAGE_SIZE,
                                          num_pages=NUM_PAGES)
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_the_states_are_pools_of_state_slots_beside_the_pages(hybrids, family: str) -> None:  # noqa: ANN001
    _, llm = hybrids[family]
    assert llm.page_size == PAGE_SIZE and llm.num_state_slots == SLOTS
    assert llm.slot_states and all(llm.caches[name].shape[0] == SLOTS for name in llm.slot_states)
    assert {tuple(c.shape[:2]) for n, c in llm.caches.items() if n not in llm.slot_states} == {(NUM_PAGES, PAGE_SIZE)}
    ops = [op for op in llm.program.function.body.walk() if isinstance(op, STATE_OPS[family])]
    assert {type(op) for op in ops} == set(STATE_OPS[family])
    assert all(op.query_starts is not None for op in ops)
    assert "state_slots" in llm.inputs
    with pytest.raises(ValueError, match="takes state_slots"):
        llm.forward_flat(*(torch.zeros(1, 1, dtype=torch.int64),) * 2, torch.tensor([0, 1]), torch.tensor([0]),
                         BLOCK_TABLES[:1], torch.tensor([0]))


@pytest.mark.parametrize("family", FAMILIES)
def test_flattened_steps_match_hf(hybrids, family: str) -> None:  # noqa: ANN001
    """Every logit asked for against HF's full-prefix forward, within `_assert_logits_close`'s
    fp32 tolerance (1e-5 per unit of the largest logit, as the slot form's hybrids meet it,
    test_recurrent_mixers); greedy tokens fed back are HF's."""
    model, llm = hybrids[family]
    _assert_tokens_are_hf(model, _run_schedule(model, llm, 1e-5))


def test_nemotron_h_in_the_interpreter(hybrids, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The same steps with every kernel in the Triton interpreter: the convolution's and the
    scan's kernels each launched once over the step's sequences (`codegen/templates/state_rows.py`),
    the paged attention's, within the same fp32 tolerance."""
    model, llm = hybrids["nemotron_h"]
    kernels = graph_kernels(llm.graph)
    for op in (*STATE_OPS["nemotron_h"], ad.CachedAttentionOp):
        assert any(name.startswith(op.name.removeprefix("ad.")) for name in kernels), (op.name, kernels)
    _assert_tokens_are_hf(model, _run_schedule(model, llm, 1e-5, lambda: kernels_ran(monkeypatch)))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_decode_step_with_states_is_cuda_graph_ready(hybrids, family: str) -> None:  # noqa: ANN001
    """A paged decode step of 3 sequences with their state slots, traced op by op with fake tensors
    of static shapes: no host sync or data-dependent op, the pages and the state pools written in
    place by an op that declares the write (test_llm_runtime's checks), the logits [1, 3, vocab].
    The state ops are opaque here: that their kernels read nothing on the host is the unit tests'
    (their launches recorded on meta tensors)."""
    _, llm = hybrids[family]
    ints = {"input_ids": (1, 3), "position_ids": (1, 3), "query_starts": (4,), "cache_starts": (3,),
            "block_tables": (3, 6), "logits_indices": (3,), "state_slots": (3,)}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    given: dict[str, Any] = {"use_cache": False, **{n: mode.from_tensor(c) for n, c in llm.caches.items()},
                             **{n: mode.from_tensor(torch.zeros(s, dtype=torch.int64)) for n, s in ints.items()}}
    with mode:
        gm = make_fx(llm.graph)(*(given[name] for name in llm.inputs))
    assert decode_problems(gm, llm.inputs, set(llm.caches)) == []
    (output,) = (n for n in gm.graph.nodes if n.op == "output")
    assert tuple(output.args[0][0].meta["val"].shape) == (1, 3, llm.model.config.vocab_size)


class _EagerReplay:
    """A captured decode graph's stand-in on the CPU: a replay runs the eager step on the graph's
    static inputs (the buffers the capture reads and a step is copied into) into its output."""

    def __init__(self, llm: ad_mlir.LLM, static: list[torch.Tensor], out: torch.Tensor) -> None:
        self.llm, self.static, self.out = llm, static, out

    def replay(self) -> None:
        self.out.copy_(self.llm.run_flat(*self.static))


def test_a_decode_step_through_the_cuda_graph_runner_is_the_eager_step(hybrids,  # noqa: ANN001
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What `CudaGraphFlatDecode` replays, on the CPU with every kernel in the Triton interpreter
    (Nemotron-H: the convolution's and the scan's varlen kernels, the paged attention's): after a
    prefill of prompts 0 and 2 in state slots 2 and 0, their decode step goes through
    `forward_flat` to a runner of bucket 4 whose graph replays eagerly from its `static_inputs`,
    `state_slots` among them; the step padded with two dummy sequences in the scratch page (23)
    and one scratch state slot (1, which no sequence holds here) gives the unpadded step's logits
    and leaves every page and state slot of the two sequences as that step does. Within the fp32
    noise of `_assert_logits_close` (1e-5 per unit of the largest value, the flattened steps'
    bound; the GEMMs over 4 rows sum in another order than over 2: measured 2.6e-5 on logits of
    13.7, 3.7e-4 on scan states of 1140, 5e-6 on pages and convolution states of ~14), for the
    logits, the pages and the states; a dummy sequence that read or wrote a sequence's state or
    page is off by order 1 (padded into slot 0, a convolution state was off by 14.8)."""
    _, llm = hybrids["nemotron_h"]
    scratch_page, scratch_slot, rows, slots = NUM_PAGES - 1, 1, [0, 2], torch.tensor([2, 0])
    assert scratch_page not in BLOCK_TABLES and scratch_slot not in slots
    prompts = [PROMPTS[s] for s in rows]
    bounds = torch.tensor([0, len(prompts[0]), len(prompts[0]) + len(prompts[1])])
    runner = object.__new__(CudaGraphFlatDecode)
    runner.buckets, runner.scratch_page, runner.scratch_state_slot, runner.width = (4,), scratch_page, scratch_slot, 6
    static = runner.static_inputs(llm, 4)
    out = torch.empty(4, llm.model.config.vocab_size)
    runner.graphs = {4: (_EagerReplay(llm, static, out), static, out)}
    with torch.no_grad(), kernels_ran(monkeypatch):
        first = llm.forward_flat(torch.tensor([prompts[0] + prompts[1]]),
                                 torch.tensor([[i for p in prompts for i in range(len(p))]]), bounds,
                                 torch.zeros(2, dtype=torch.int64), BLOCK_TABLES[rows], bounds[1:] - 1,
                                 state_slots=slots)
        decode = (first.argmax(-1)[None], torch.tensor([[len(p) for p in prompts]]), torch.arange(3),
                  torch.tensor([len(p) for p in prompts]), BLOCK_TABLES[rows], torch.arange(2))
        before = {n: c.clone() for n, c in llm.caches.items()}
        eager = llm.forward_flat(*decode, state_slots=slots)
        written = {n: c.clone() for n, c in llm.caches.items()}
        for name, cache in llm.caches.items():
            cache.copy_(before[name])
        monkeypatch.setattr(llm, "decode_graphs", runner)
        replayed = llm.forward_flat(*decode, state_slots=slots)
    assert static[-1].tolist() == [2, 0, scratch_slot, scratch_slot], "the step's state slots, padded"
    with pytest.raises(ValueError, match="state_slots given without a scratch_state_slot"):
        pad_flat_decode(*decode, bucket=4, scratch_page=scratch_page, state_slots=slots)
    for got, expected in zip(replayed, eager, strict=True):
        _assert_logits_close(got, expected, 1e-5)
    kept = {n: (slots if n in llm.slot_states else torch.arange(scratch_page)) for n in llm.caches}
    for name, cache in llm.caches.items():
        scale = float(written[name][kept[name]].abs().max())
        torch.testing.assert_close(cache[kept[name]], written[name][kept[name]], rtol=0, atol=1e-5 * scale)


def test_steps_that_forget_the_states_are_seen(hybrids, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: with the state pools zeroed before each step (the K/V pages kept), a
    chunk or decode that continues a sequence starts from a zero state, and the logits differ."""
    model, llm = hybrids["nemotron_h"]
    forward = llm.forward_flat

    def forgetful(*args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        for name in llm.slot_states:
            llm.caches[name].zero_()
        return forward(*args, **kwargs)

    monkeypatch.setattr(llm, "forward_flat", forgetful)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _run_schedule(model, llm, 1e-5)


@pytest.mark.parametrize("family", ["lfm2", "nemotron_h"])
def test_the_paged_engine_gives_hf_tokens(hybrids, family: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The paged scheduler on the compiled model: the first prompt alone, the other two arriving
    while it decodes; a budget of 4 tokens a step (the 7- and 11-token prompts prefilled over
    steps, each chunk continuing its state); the engine given 7 of the pool's pages, fewer than
    the three requests need (4 + 3 + 5 pages for prompt and 8 new tokens), so it preempts and
    recomputes from position 0 (the state from zeros). Each request's greedy tokens are HF's;
    every state slot and page is free at the end; prefix caching is off (a shared page would
    skip tokens whose state the request needs)."""
    model, llm = hybrids[family]
    monkeypatch.setattr(llm, "num_pages", 7)  # pages 0..6 of the pool
    engine = PagedEngine(llm, max_step_tokens=4)
    assert engine.max_running == SLOTS and not engine.blocks.prefix_caching
    requests, held = {}, []
    arrivals = {0: [0], 2: [1, 2]}
    step = 0
    with reference_kernels():
        while engine.has_work or step <= max(arrivals):
            for i in arrivals.get(step, []):
                requests[i] = engine.add(PROMPTS[i], SamplingParams(max_tokens=8))
            checked_step(engine)
            slots = [r.slot for r in engine.running]
            assert None not in slots and len(set(slots)) == len(slots), "each running request its own state slot"
            assert engine.state_slots_in_use == len(slots)
            held.append(len(slots))
            step += 1
    assert engine.preemptions > 0 and max(held) >= 2
    for i, prompt in enumerate(PROMPTS):
        assert requests[i].output.token_ids == _hf_tokens(model, prompt, 8), f"prompt {i}"
    assert sorted(engine.free_state_slots) == list(range(SLOTS)) and engine.state_slots_in_use == 0
    assert engine.pages_in_use == 0 and engine.prefix_hits == 0
    assert all(r.slot is None for r in requests.values())


def test_a_byte_budget_pays_for_the_states_then_buys_pages(hybrids) -> None:  # noqa: ANN001
    """kv_cache_budget in the paged form: the states first (LFM2's two convolutions: 3 slots x 64
    channels x 2 inputs x 4 bytes each), then whole pages (its one attention layer's K and V: 4
    tokens x 2 kv heads x 16 x 4 bytes each), 10 pages and a bit."""
    model, _ = hybrids["lfm2"]
    states, per_page = 2 * SLOTS * 64 * 2 * 4, 2 * PAGE_SIZE * 2 * 16 * 4
    llm = ad_mlir.LLM(model, max_batch=SLOTS, max_seq_len=24, page_size=PAGE_SIZE,
                      kv_cache_budget=states + 10 * per_page + 100)
    assert llm.state_bytes == states and llm.num_pages == 10 and llm.cache_bytes == states + 10 * per_page


def test_a_model_of_states_alone_is_paged_without_a_pool() -> None:
    """Mamba (scans, no attention): the paged form keeps its states in state slots and has no
    page pool; the paged scheduler generates HF's greedy tokens (RWKV's paged form, with its
    token windows: tests/models/test_rwkv.py). `paged_where_possible` (the command lines'
    builder) gives it and LFM2 (with its convolutions, beside pages) the paged form."""
    mamba = _model(MambaConfig(vocab_size=1000, hidden_size=32, state_size=8, num_hidden_layers=1, conv_kernel=4,
                               expand=2, pad_token_id=0, initializer_range=0.5))  # wide: HF's tokens vary
    llm = paged_where_possible(mamba, 4, max_batch=2, max_seq_len=16)
    assert llm.page_size == 4 and set(llm.caches) == set(llm.slot_states)
    assert isinstance(make_engine(llm), PagedEngine)
    with reference_kernels():
        outputs = llm.generate(PROMPTS[:2], max_new_tokens=6)
    assert [out.token_ids for out in outputs] == [_hf_tokens(mamba, prompt, 6) for prompt in PROMPTS[:2]]
    paged = paged_where_possible(_model(LFM2), 4, max_batch=2, max_seq_len=16)
    assert (paged.page_size, paged.num_pages, paged.num_state_slots) == (4, 2 * 16 // 4, 2)
    assert isinstance(make_engine(paged), PagedEngine)

