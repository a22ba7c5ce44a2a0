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

import logging

import pytest
import torch
from engine_steps import checked_step
from kernel_guard import graph_kernels, kernels_ran
from test_generate import PROMPTS, _hf_tokens
from test_paged import BLOCK_TABLES, NUM_PAGES, PAGE_SIZE, _assert_tokens_are_hf, _run_schedule
from test_recurrent_mixers import CONFIGS
from transformers import AutoModelForCausalLM, Lfm2Config, MambaConfig, NemotronHConfig
from xdsl.utils.exceptions import PassFailedException

import ad_mlir
from ad_mlir.dialects import ad
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
    for op in (*STATE_OPS["nemotron_h"], ad.PagedAttentionOp):
        assert any(name.startswith(op.name.removeprefix("ad.")) for name in kernels), (op.name, kernels)
    _assert_tokens_are_hf(model, _run_schedule(model, llm, 1e-5, lambda: kernels_ran(monkeypatch)))


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


def test_a_model_of_states_alone_gets_the_slot_form(caplog: pytest.LogCaptureFixture) -> None:
    """Mamba (scans, no attention) has nothing to page: the paged form refuses it by name
    (`PerSequenceState`), and `paged_where_possible` (the command lines' builder) gives it the
    slot form with a warning; LFM2 with its convolutions gets pages and state slots."""
    mamba = _model(MambaConfig(vocab_size=1000, hidden_size=32, state_size=8, num_hidden_layers=1, conv_kernel=4,
                               expand=2, pad_token_id=0))
    with pytest.raises(PassFailedException, match=r"backbone\.layers\.0\.mixer: the model keeps states per sequence "
                                                  r"but has no attention.*compile this model in the slot form"):
        ad_mlir.LLM(mamba, page_size=4, num_pages=8, max_seq_len=16)
    with caplog.at_level(logging.WARNING, logger="ad_mlir.llm.llm"):
        slots = paged_where_possible(mamba, 4, max_batch=2, max_seq_len=16)
    assert slots.page_size is None and "the slot form, not the paged one: backbone.layers.0.mixer" in caplog.text
    paged = paged_where_possible(_model(LFM2), 4, max_batch=2, max_seq_len=16)
    assert (paged.page_size, paged.num_pages, paged.num_state_slots) == (4, 2 * 16 // 4, 2)
    assert isinstance(make_engine(paged), PagedEngine)

