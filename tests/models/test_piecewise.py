"""The paged form's steps replayed piecewise (`CudaGraphPiecewise`), on the CPU: the step's graph
split at its cached mixers, each piece between them "captured" by a stand-in that runs it
eagerly at capture and at each replay, reading the static buffers it was captured with and
writing its outputs in place (what a CUDA graph does with its memory), the mixers eager between.

A tiny wide-init Llama (two attention layers) and LFM2 (short convolutions beside attention, its
states in state slots) against `forward_flat`'s eager steps on the same caches: a prefill step of
two sequences and a mixed step (the rest of a prompt, a decode, the first chunk of a third
prompt), pages out of order and state slots not in the sequences' order, each padded to its
bucket of tokens by dummy sequences in the scratch page (and scratch state slot). The same
logits, every page and state slot of the sequences as the eager step leaves them, the scratch
page written by the padding; the split keeps exactly the mixers (and the logits' gather and LM
head) out of the pieces; each piece is captured once per bucket; the paged engine with its
steps replayed (`generate`, prompt chunks beside decodes, verified n-gram drafts) gives the eager
steps' tokens. `tests/gpu/test_cuda.py` runs the
real CUDA graphs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_steps import checked_step
from kernel_guard import kernel_calls
from test_generate import PROMPTS, _assert_logits_close
from test_llm_runtime import decode_problems
from test_paged import BLOCK_TABLES, NUM_PAGES, PAGE_SIZE
from test_paged_states import LFM2, STATE_OPS
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from transformers import AutoModelForCausalLM

import ad_mlir
from ad_mlir.dialects import ad
from ad_mlir.llm.engine import SamplingParams, make_engine
from ad_mlir.llm.piecewise import LOGITS_INPUT, SEQUENCE_INPUTS, CudaGraphPiecewise, pad_flat_step
from ad_mlir.llm.speculative import NgramProposer
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.tiny import TinyConfig, build_model

SCRATCH_PAGE = NUM_PAGES - 1
"""A page no block table of test_paged's holds: the padding's."""
SCRATCH_SLOT = 3
"""The state slot no sequence holds (of `max_batch` 4): the padding's."""
STATE_SLOTS = torch.tensor([2, 0, 1])
"""Each sequence's state slot, not in their order."""
BUCKETS = (4, 8, 16)
"""Enough for the steps here: 3 tokens (decodes), 7, 9 (and 20, past them all: eager)."""
MIXERS = {"llama": (ad.CachedAttentionOp,), "lfm2": (*STATE_OPS["lfm2"], ad.CachedAttentionOp)}
STEPS = {
    "prefill": [(0, 0, 5), (1, 0, 2)],  # a chunk of prompt 0 (5 of 7) and the whole prompt 1: 7 tokens, bucket 8
    "mixed": [(0, 5, 2), (1, 2, 1), (2, 0, 6)],  # the rest of prompt 0, a decode of 1, a chunk of 2: 9 tokens, bucket 16
}
"""Steps as (sequence, cache start, new tokens), each after the one before; a decode feeds token 1."""


class _Replay:
    """A captured piece's stand-in: a replay reruns it on the static buffers it was captured
    with and writes its outputs into the ones the capture returned."""

    def __init__(self, run: Callable[[], Any], outputs: Any) -> None:
        self.run, self.outputs, self.replays = run, outputs, 0

    def replay(self) -> None:
        new = self.run()
        pairs = zip(*((o if isinstance(o, tuple) else (o,)) for o in (self.outputs, new)), strict=True)
        for out, value in pairs:
            if isinstance(out, torch.Tensor):
                out.copy_(value)
            else:
                assert out == value
        self.replays += 1


class _EagerCapture:
    """`CudaGraphCapture`'s stand-in on the CPU: each capture noted, its graph a `_Replay`."""

    def __init__(self) -> None:
        self.captured: list[_Replay] = []
        self.warm_ups = 0

    def warm_up(self, run: Callable[[], Any]) -> None:
        self.warm_ups += 1
        run()

    def capture(self, run: Callable[[], Any]) -> tuple[_Replay, Any]:
        graph = _Replay(run, run())
        self.captured.append(graph)
        return graph, graph.outputs

    @property
    def replays(self) -> int:
        return sum(g.replays for g in self.captured)


def _llama() -> torch.nn.Module:
    return build_model(TinyConfig(layers=2, hf_overrides=(("initializer_range", 0.5),)))


def _lfm2() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LFM2).eval()


@pytest.fixture(scope="module")
def llms() -> dict[str, ad_mlir.LLM]:
    return {name: ad_mlir.LLM(make(), max_batch=4, max_seq_len=24, page_size=PAGE_SIZE, num_pages=NUM_PAGES)
            for name, make in (("llama", _llama), ("lfm2", _lfm2))}


@pytest.fixture(scope="module")
def runners(llms: dict[str, ad_mlir.LLM]) -> dict[str, tuple[CudaGraphPiecewise, _EagerCapture]]:
    """Each model's piecewise runner, its pieces captured by `_EagerCapture` (at construction)."""
    made = {}
    for family, llm in llms.items():
        capture = _EagerCapture()
        slot = SCRATCH_SLOT if llm.num_state_slots else None
        with torch.no_grad(), reference_kernels():
            made[family] = CudaGraphPiecewise(llm, BUCKETS, SCRATCH_PAGE, slot, graphs=capture), capture
    return made


def _flat(llm: ad_mlir.LLM, step: list[tuple[int, int, int]]) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """`forward_flat`'s inputs of `step`: each chunk's prompt tokens (a decode: token 1), the
    last token of each chunk's logits."""
    ids, positions, starts = [], [], [0]
    for seq, start, length in step:
        ids += (PROMPTS[seq] + [1] * 24)[start:start + length]
        positions += range(start, start + length)
        starts.append(len(ids))
    seqs = [s for s, _, _ in step]
    flat = (torch.tensor([ids]), torch.tensor([positions]), torch.tensor(starts),
            torch.tensor([start for _, start, _ in step]), BLOCK_TABLES[seqs], torch.tensor(starts[1:]) - 1)
    return flat, ({"state_slots": STATE_SLOTS[seqs]} if llm.num_state_slots else {})


def _engine_tokens(llm: ad_mlir.LLM, prompts: list[list[int]], max_tokens: int, **engine_options: Any) -> list[list[int]]:
    """Each prompt's greedy tokens (at most `max_tokens`) from a paged engine made with
    `engine_options`, every step checked (`checked_step`), the kernels on their reference path."""
    engine = make_engine(llm, **engine_options)
    requests = [engine.add(prompt, SamplingParams(max_tokens=max_tokens)) for prompt in prompts]
    with torch.no_grad(), reference_kernels():
        while engine.has_work:
            checked_step(engine)
    return [r.output.token_ids for r in requests]


def _scratch(llm: ad_mlir.LLM, name: str) -> int:
    """The padding's entry of a cache: the scratch state slot, or the scratch page."""
    return SCRATCH_SLOT if name in llm.slot_states else SCRATCH_PAGE


def _kept(llm: ad_mlir.LLM, name: str) -> torch.Tensor:
    """The cache entries the sequences hold: every page but the scratch one, every state slot but
    the scratch one."""
    return torch.arange(SCRATCH_SLOT) if name in llm.slot_states else torch.arange(SCRATCH_PAGE)


@pytest.mark.parametrize("family", MIXERS)
def test_the_split_leaves_exactly_the_mixers_and_the_logits_gather_eager(llms, runners,  # noqa: ANN001
                                                                          family: str) -> None:
    """Each eager partition but the last is one cached mixer's kernel (its results' getitems
    beside it), one per mixer op of the program; the last gathers the logits' rows and runs the
    LM head; no captured piece reads a sequence-sized input or `logits_indices`, nor calls a
    mixer's kernel; pieces and mixers alternate, so there is one piece more than mixers."""
    llm = llms[family]
    runner, _ = runners[family]
    mixer_names = tuple(op.name.removeprefix("ad.") for op in MIXERS[family])
    mixer_ops = [op for op in llm.program.function.body.walk() if isinstance(op, MIXERS[family])]
    children = [(name, module) for name, module in runner.split.named_children() if name.startswith("submod_")]
    eager = [module for name, module in children if name not in runner.pieces]
    *mixers, tail = eager
    assert len(mixers) == len(mixer_ops) and len(runner.pieces) == len(mixers) + 1
    for module in mixers:
        calls = [n for n in module.graph.nodes if n.op == "call_function"]
        (kernel,) = kernel_calls(module)
        assert kernel.startswith(mixer_names) and all(n.target.__name__ in ("getitem", f"run_{kernel}") for n in calls)
    assert {n.target.__name__ for n in tail.graph.nodes if n.op == "call_function"} == {"index_select.default",
                                                                                       "linear.default"}
    for name, piece in runner.pieces.items():
        inputs = {n.name for n in piece.module.graph.nodes if n.op == "placeholder"}
        assert not inputs & (SEQUENCE_INPUTS | {LOGITS_INPUT}), (name, inputs)
        assert not any(k.startswith(mixer_names) for k in kernel_calls(piece.module)), name
    kinds = [name in runner.pieces for name, _ in children]
    assert kinds == [True, False] * len(mixers) + [True, False]


@pytest.mark.parametrize("family", MIXERS)
def test_a_step_of_a_bucket_is_cuda_graph_ready(llms, family: str) -> None:  # noqa: ANN001
    """A step of 16 tokens (the largest bucket) in 5 sequences, traced op by op with fake tensors
    of static shapes: no host sync or data-dependent op, the caches written in place by the ops
    that declare the write (test_llm_runtime's checks of the decode step): what a capture of its
    pieces needs beyond running them. The mixers' kernels are opaque here (the decode step's
    tests say why that is enough)."""
    llm = llms[family]
    ints = {"input_ids": (1, 16), "position_ids": (1, 16), "query_starts": (6,), "cache_starts": (5,),
            "block_tables": (5, 6), "logits_indices": (3,), "state_slots": (5,)}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    given: dict[str, Any] = {"use_cache": False, **{n: mode.from_tensor(c) for n, c in llm.caches.items()},
                             **{n: mode.from_tensor(torch.zeros(s, dtype=torch.int64)) for n, s in ints.items()}}
    with mode:
        gm = make_fx(llm.graph)(*(given[name] for name in llm.inputs))
    assert decode_problems(gm, llm.inputs, set(llm.caches)) == []


@pytest.mark.parametrize("family", MIXERS)
def test_steps_replayed_piecewise_are_the_eager_steps(llms, runners, family: str,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill step of two sequences (7 tokens, bucket 8) and then a mixed step (9 tokens,
    bucket 16) through `forward_flat` to the piecewise runner, against the same steps eager
    from the same caches: the same logits, and every page and state slot of the sequences as the
    eager step leaves them, while the padding wrote its scratch entries (filled with NaN before:
    the padding rows read them, and go NaN from the first layer on, reaching no sequence's row). fp32 within
    `_assert_logits_close`'s 1e-5 per unit of the largest value, logits and cache entries alike:
    the pieces run the same ops on the same rows, only over 8 or 16 rows, not 7 or 9 (the
    GEMMs may sum in another order; on the kernels' torch reference, and as well with every
    kernel in the Triton interpreter, measured: the Llama's equal, LFM2's 1.1e-5 on logits of
    15.5 and 5e-5 on convolution states of 73); a padding row that reached a sequence's page or
    state, or a mixer's output not copied into the next piece's buffer, is off by order 1. Each piece was captured once per bucket, at
    construction, after one eager warm-up of each bucket; the steps replayed them."""
    llm = llms[family]
    runner, capture = runners[family]
    assert len(capture.captured) == len(runner.pieces) * len(BUCKETS) and capture.warm_ups == len(BUCKETS)
    assert all(set(p.replays) == set(BUCKETS) for p in runner.pieces.values())
    for cache in llm.caches.values():
        cache.zero_()
    monkeypatch.setattr(llm, "step_graphs", runner)
    for kind, step in STEPS.items():
        flat, states = _flat(llm, step)
        with torch.no_grad(), reference_kernels():
            before = {n: c.clone() for n, c in llm.caches.items()}
            monkeypatch.setattr(llm, "step_graphs", None)
            eager = llm.forward_flat(*flat, **states)
            written = {n: c.clone() for n, c in llm.caches.items()}
            for name, cache in llm.caches.items():
                cache.copy_(before[name])
                cache[_scratch(llm, name)] = float("nan")
            monkeypatch.setattr(llm, "step_graphs", runner)
            replays = capture.replays
            replayed = llm.forward_flat(*flat, **states)
        assert capture.replays - replays == len(runner.pieces), kind
        _assert_logits_close(replayed, eager, 1e-5)
        for name, cache in llm.caches.items():
            kept = _kept(llm, name)
            scale = max(1.0, float(written[name][kept].abs().max()))
            torch.testing.assert_close(cache[kept], written[name][kept], rtol=0, atol=1e-5 * scale, msg=name)
        assert any(not c[_scratch(llm, name)].isnan().all() for name, c in llm.caches.items()), "no padding ran"
    assert len(capture.captured) == len(runner.pieces) * len(BUCKETS), "a bucket captured again"


def test_a_step_is_padded_by_one_token_sequences_in_the_scratch_page() -> None:
    """`pad_flat_step`: a step of 3 tokens in 2 sequences to a bucket of 6 gets three dummy
    sequences of one token each at cache start 0, their block tables the scratch page, their
    state slot the scratch slot; the logits' rows stay the step's."""
    flat = (torch.tensor([[7, 8, 9]]), torch.tensor([[4, 5, 2]]), torch.tensor([0, 2, 3]), torch.tensor([4, 2]),
            torch.tensor([[3, 5], [6, 0]]), torch.tensor([1, 2]))
    padded = pad_flat_step(*flat, 6, 9, torch.tensor([1, 0]), 2)
    assert [t.tolist() for t in padded] == [[[7, 8, 9, 0, 0, 0]], [[4, 5, 2, 0, 0, 0]], [0, 2, 3, 4, 5, 6],
                                            [4, 2, 0, 0, 0], [[3, 5], [6, 0], [9, 9], [9, 9], [9, 9]], [1, 2],
                                            [1, 0, 2, 2, 2]]
    with pytest.raises(ValueError, match="state_slots given without a scratch_state_slot"):
        pad_flat_step(*flat, 6, 9, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="a step of 3 tokens does not fit a bucket of 2"):
        pad_flat_step(*flat, 2, 9)


def test_generate_with_steps_replayed_gives_the_eager_tokens(llms, runners,  # noqa: ANN001
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`generate` on the paged engine, every step that a bucket holds replayed piecewise (the
    decodes too: no decode graphs here), the first step (the three prompts, 20 tokens) eager
    past the largest bucket of 16: the tokens of the eager steps."""
    llm = llms["llama"]
    runner, capture = runners["llama"]
    replays = capture.replays
    with torch.no_grad(), reference_kernels():
        eager = [out.token_ids for out in llm.generate(PROMPTS, max_new_tokens=6)]
        monkeypatch.setattr(llm, "step_graphs", runner)
        run = runner.run
        steps: list[int] = []
        monkeypatch.setattr(runner, "run", lambda flat, *states: steps.append(flat[0].shape[1]) or run(flat, *states))
        replayed = [out.token_ids for out in llm.generate(PROMPTS, max_new_tokens=6)]
    assert replayed == eager and len({t for out in eager for t in out}) > 3
    assert steps == [3] * 5 and capture.replays - replays == 5 * len(runner.pieces), steps


@pytest.mark.parametrize("family", MIXERS)
def test_chunks_beside_decodes_replayed_give_the_eager_tokens(llms, runners, family: str,  # noqa: ANN001
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The paged engine with a step budget of 8 tokens, so the prompts go in chunks beside the
    others' decodes (state slots for LFM2's convolutions): with every step replayed piecewise,
    the tokens of the eager steps, greedy; some steps mixed a chunk with decodes."""
    llm = llms[family]
    runner, _ = runners[family]

    eager = _engine_tokens(llm, PROMPTS, 5, max_step_tokens=8)
    monkeypatch.setattr(llm, "step_graphs", runner)
    run = runner.run
    mixed: list[bool] = []
    monkeypatch.setattr(runner, "run", lambda flat, *states: mixed.append(
        flat[2].diff().max() > 1 and flat[2].diff().min() == 1) or run(flat, *states))
    assert _engine_tokens(llm, PROMPTS, 5, max_step_tokens=8) == eager and len({t for out in eager for t in out}) > 3
    assert any(mixed), "no step fed a chunk beside a decode"


def test_verified_drafts_replayed_give_the_eager_tokens(llms, runners,  # noqa: ANN001
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculative decoding (n-gram drafts, on prompts that repeat themselves): with the steps
    replayed piecewise, some verifying drafts (more logits' rows than sequences), the tokens of
    the eager steps, greedy."""
    llm = llms["llama"]
    runner, _ = runners["llama"]
    prompts = [[5, 9, 13, 5, 9, 13, 5, 9], [3, 4, 3, 4, 3]]

    eager = _engine_tokens(llm, prompts, 8, max_step_tokens=16, speculative=NgramProposer(num_tokens=3))
    monkeypatch.setattr(llm, "step_graphs", runner)
    run = runner.run
    drafts: list[bool] = []
    monkeypatch.setattr(runner, "run", lambda flat, *states: drafts.append(
        flat[5].shape[0] > flat[3].shape[0]) or run(flat, *states))
    assert _engine_tokens(llm, prompts, 8, max_step_tokens=16, speculative=NgramProposer(num_tokens=3)) == eager
    assert any(drafts), "no step verified a draft"


def test_every_paged_form_replays_its_other_steps_piecewise_on_cuda(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Decided without a GPU (the graphs' classes stubbed): where the paged form's decode steps
    are captured, its other steps are too, hybrids' with the scratch state slot, over buckets of
    tokens up to 512 or the export's `max_batch` x `max_seq_len`; so `cuda_graphs=True` refuses
    no model the paged engine runs. A capture that fails is an error when asked for, else logged
    and the steps run eagerly."""
    from ad_mlir.llm import llm as llm_module

    class Decode:
        pass

    monkeypatch.setattr(llm_module, "CudaGraphFlatDecode", Decode)
    monkeypatch.setattr(llm_module, "CudaGraphPiecewise", lambda llm, buckets, page, slot: (buckets, page, slot))

    def on_cuda(states: frozenset[str], max_seq_len: int = 512) -> ad_mlir.LLM:
        llm = object.__new__(ad_mlir.LLM)
        llm.device, llm.page_size, llm.slot_states, llm.max_batch, llm.max_seq_len, llm.scratch_page = (
            torch.device("cuda"), 16, states, 4, max_seq_len, 9)
        llm.decode_graphs = Decode()
        return llm

    states = frozenset({"conv_state_0"})
    for asked in (None, True):
        assert on_cuda(frozenset())._capture_steps(asked) == ((1, 2, 4, 8, 16, 32, 64, 128, 256, 512), 9, None)
        assert on_cuda(states, max_seq_len=5)._capture_steps(asked) == ((1, 2, 4, 8, 16, 20), 9, 4)
    uncaptured = on_cuda(states)
    uncaptured.decode_graphs = None
    assert uncaptured._capture_steps(None) is None

    def fail(*_: object) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(llm_module, "CudaGraphPiecewise", fail)
    with pytest.raises(ValueError, match="piecewise CUDA graph capture of the paged steps failed"):
        on_cuda(states)._capture_steps(True)
    with caplog.at_level(logging.WARNING, logger="ad_mlir.llm.llm"):
        assert on_cuda(states)._capture_steps(None) is None
    assert "prefill and mixed steps run without CUDA graphs" in caplog.text
