"""The `LLM` runtime around the compiled graph, on the CPU with a one-layer tiny Llama: caches
sized from a byte budget, and a decode step fit for CUDA-graph capture (checked on the graph
traced with fake tensors, so it holds whichever cached-attention kernel the graph calls; the CPU
reference of that op reads slots on the host, but it is the CPU path, not the graph)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import ad_mlir
from ad_mlir import generate
from ad_mlir.llm.cuda_graphs import buckets_up_to, pad_to_bucket
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.tiny import TinyConfig, build_model

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [3, 4], [11, 12, 13, 14, 15]]

HOST_SYNC_OR_DATA_DEPENDENT = {
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default, torch.ops.aten.unique_consecutive.default,
    torch.ops.aten._unique2.default, torch.ops.aten.repeat_interleave.Tensor,
}
"""Ops that read tensor data on the host or size their result from it."""


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(TinyConfig(family="llama", layers=1))


@pytest.fixture(scope="module")
def llm(model: torch.nn.Module) -> ad_mlir.LLM:
    return ad_mlir.LLM(model, max_batch=4, max_seq_len=32)


def _bytes_per_token(model: torch.nn.Module) -> int:
    """K and V of one token in every layer, fp32."""
    cfg = model.config
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4


def _hf_tokens(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


# -- kv_cache_budget ---------------------------------------------------------------------


def test_a_byte_budget_decides_the_tokens_per_slot(model: torch.nn.Module, caplog: pytest.LogCaptureFixture) -> None:
    per_token = _bytes_per_token(model)
    budget = per_token * 2 * 40 + per_token - 1  # 80 tokens and a bit: 2 slots of 40
    with caplog.at_level(logging.INFO, logger="ad_mlir.llm.llm"):
        llm = ad_mlir.LLM(model, max_batch=2, kv_cache_budget=budget)
    assert (llm.max_batch, llm.max_seq_len, llm.cache_tokens) == (2, 40, 80)
    assert llm.cache_bytes == 80 * per_token <= budget
    assert all(c.shape[:2] == (2, 40) for c in llm.caches.values())
    assert (f"kv_cache_budget of {budget} bytes holds 80 tokens of {per_token} bytes beside 0 bytes of per-slot "
            "states: 2 slots x 40 tokens") in caplog.text
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=8)
    assert [o.token_ids for o in outputs] == [_hf_tokens(model, p, 8) for p in PROMPTS]
    with pytest.raises(ValueError, match="needs 48 > max_seq_len=40"):
        llm.generate([[1] * 40], max_new_tokens=8)


def test_max_seq_len_caps_what_a_budget_buys(model: torch.nn.Module) -> None:
    llm = ad_mlir.LLM(model, max_batch=1, max_seq_len=24, kv_cache_budget=10**9)
    assert (llm.max_seq_len, llm.cache_tokens, llm.cache_bytes) == (24, 24, 24 * _bytes_per_token(model))


@pytest.mark.parametrize(("budget", "message"), [
    (0, "kv_cache_budget=0: bytes must be positive"),
    (True, r"kv_cache_budget=True: give bytes \(an int\)"),
    (1.5, r"kv_cache_budget=1.5: give bytes \(an int\) or, on CUDA, a fraction"),
    ("1GB", "kv_cache_budget='1GB': give bytes"),
    (0.5, r"kv_cache_budget=0.5 is a fraction of free CUDA memory, but the model is on cpu: give bytes \(an int\)"),
])
def test_bad_budgets_are_refused(model: torch.nn.Module, budget: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ad_mlir.LLM(model, kv_cache_budget=budget)


def test_a_budget_below_one_token_per_slot_is_refused(model: torch.nn.Module) -> None:
    per_token = _bytes_per_token(model)
    with pytest.raises(ValueError, match=rf"holds 3 tokens \({per_token} bytes each .*fewer than one per slot for "
                       "max_batch=4; raise the budget or lower max_batch"):
        ad_mlir.LLM(model, max_batch=4, kv_cache_budget=3 * per_token)


def test_the_command_line_takes_a_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """`--model llama` is the two-layer tiny Llama: 512 bytes a token. The slot form's budget buys
    slots of the longest sequence that fits; the paged form's (the default) whole pages of 16."""
    command = ["--model", "llama", "--prompt-ids", "5", "9", "13", "--max-new-tokens", "4", "--max-batch", "2",
               "--kv-cache-budget", str(512 * 2 * 30)]
    generate.main([*command, "--page-size", "0"])
    captured = capsys.readouterr()
    assert "the caches hold 60 tokens (2 slots x 30" in captured.err
    assert "4 tokens in" in captured.err
    generate.main(command)
    captured = capsys.readouterr()
    assert "the caches hold 48 tokens (3 pages x 16 tokens" in captured.err  # 60 tokens' bytes buy 3 pages
    assert "4 tokens in" in captured.err
    with pytest.raises(SystemExit):
        generate.main(["--model", "llama", "--kv-cache-budget", "1k"])
    assert "'1k' is neither bytes (an integer) nor a fraction" in capsys.readouterr().err


# -- a decode step fit for CUDA graphs -------------------------------------------------------


def _trace_decode(llm: ad_mlir.LLM, batch: int) -> torch.fx.GraphModule:
    """The compiled graph as one decode step of `batch` rows runs it, traced op by op with fake
    tensors of static shapes (an op that reads data on the host fails the trace)."""
    ints = {"input_ids": (batch, 1), "position_ids": (batch, 1), "cache_slots": (batch,), "cache_starts": (batch,),
            "logits_indices": (1,)}
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the weights stay real constants
    given: dict[str, Any] = {"use_cache": False, **{n: mode.from_tensor(c) for n, c in llm.caches.items()},
                             **{n: mode.from_tensor(torch.zeros(s, dtype=torch.int64)) for n, s in ints.items()}}
    with mode:
        return make_fx(llm.graph)(*(given[name] for name in llm.inputs))


def decode_problems(gm: torch.fx.GraphModule, inputs: list[str], caches: set[str]) -> list[str]:
    """Why a traced step could not be captured in a CUDA graph and replayed: host syncs and
    data-dependent ops, sizes that are not plain ints, caches not written in place by an op
    that declares the write (or copied)."""
    placeholders = {n: name for n, name in zip((n for n in gm.graph.nodes if n.op == "placeholder"), inputs,
                                               strict=True)}
    problems = [f"{n.name}: {n.target}" for n in gm.graph.nodes if n.target in HOST_SYNC_OR_DATA_DEPENDENT]
    for n in gm.graph.nodes:
        vals = n.meta.get("val")
        for v in vals if isinstance(vals, list | tuple) else [vals]:
            if isinstance(v, torch.Tensor) and not all(type(d) is int for d in v.shape):
                problems.append(f"{n.name}: shape {tuple(v.shape)} is not static")
    written: set[str] = set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        for arg, value in zip(schema.arguments if schema else [], n.args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write:
                written |= {placeholders[v] for v in (value if isinstance(value, list) else [value])
                            if v in placeholders}
    if written != caches:
        problems.append(f"written in place: {sorted(written)}, caches: {sorted(caches)}")
    for p, name in placeholders.items():
        if name in caches:
            problems += [f"{name} is copied by {u.name}" for u in p.users
                         if "copy" in str(u.target) or "clone" in str(u.target)]
    return problems


def test_the_decode_step_is_cuda_graph_ready(llm: ad_mlir.LLM) -> None:
    for batch in buckets_up_to(llm.max_batch):
        gm = _trace_decode(llm, batch)
        assert decode_problems(gm, llm.inputs, set(llm.caches)) == []
        (output,) = (n for n in gm.graph.nodes if n.op == "output")
        logits = output.args[0][0].meta["val"]
        assert tuple(logits.shape) == (batch, 1, llm.model.config.vocab_size)


def test_the_decode_check_finds_a_host_sync_and_a_cache_not_written() -> None:
    """The checker itself, on a step traced with real tensors (a fake trace refuses the sync)."""
    def step(ids: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        return ids[ids.nonzero()] + cache.clone().sum()

    gm = make_fx(step)(torch.ones(2, 1, dtype=torch.int64), torch.zeros(2, 4))
    problems = decode_problems(gm, ["input_ids", "k_cache_0"], {"k_cache_0"})
    assert any("aten.nonzero.default" in p for p in problems), problems
    assert "written in place: [], caches: ['k_cache_0']" in problems
    assert any(p.startswith("k_cache_0 is copied by clone") for p in problems), problems


def test_buckets_cover_every_size_up_to_the_limit() -> None:
    assert buckets_up_to(1) == (1,)
    assert buckets_up_to(4) == (1, 2, 4)
    assert buckets_up_to(6) == (1, 2, 4, 6)


def test_a_prefill_for_its_last_logits_runs_the_lm_head_on_the_last_token_alone(llm: ad_mlir.LLM) -> None:
    """`last_only` (what the engine's prefill asks): the logits of the last token, the full
    prefill's last row (both write the same K/V). fp32's default tolerance, not bitwise: the LM
    head's GEMM over one row may sum in another order than over seven (measured 6e-8 apart)."""
    prompt = torch.tensor([PROMPTS[0]])
    positions = torch.arange(prompt.shape[1])[None]
    with torch.no_grad(), reference_kernels():
        every = llm.step(prompt, positions, [0], [0])
        last = llm.step(prompt, positions, [0], [0], last_only=True)
    assert every.shape[1] == prompt.shape[1] and last.shape[1] == 1
    torch.testing.assert_close(last[:, 0], every[:, -1])


def test_padded_decode_rows_leave_the_real_rows_unchanged(llm: ad_mlir.LLM) -> None:
    """Two sequences in slots 0 and 2, decoded as a batch of 2 and padded to 4 (the dummy rows in
    free slots 1 and 3, the way the CUDA-graph runner pads a batch to its bucket): same logits."""
    prompts = [PROMPTS[0], PROMPTS[2]]
    with torch.no_grad(), reference_kernels():
        for slot, prompt in zip((0, 2), prompts, strict=True):
            llm.step(torch.tensor([prompt]), torch.arange(len(prompt))[None], [slot], [0])
        tokens, slots, starts = [1, 2], [0, 2], [len(p) for p in prompts]
        plain = llm.decode(tokens, slots, starts, free=[1, 3])
        padded = pad_to_bucket(tokens, slots, starts, [1, 3], (1, 4))
        assert padded == ([1, 2, 0, 0], [0, 2, 1, 3], [*starts, 0, 0])
        ids, pad_slots, pad_starts = padded
        logits = llm.step(torch.tensor(ids)[:, None], torch.tensor(pad_starts)[:, None], pad_slots, pad_starts)
    torch.testing.assert_close(logits[:2, -1], plain)
    with pytest.raises(ValueError, match="3 decode rows padded to 4 need 1 free slots, have 0"):
        pad_to_bucket([1, 2, 3], [0, 1, 2], [5, 5, 5], [], (4,))


def test_every_form_decodes_from_cuda_graphs_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode graphs a model on CUDA gets, decided here without a GPU (the graphs' classes
    stubbed): the slot form's take per-slot states (Mamba's), the paged form's per-sequence states
    too (a hybrid's: the state kernels read `query_starts` on the device), its padding rows in the
    scratch page and, with states, the state pools' scratch slot (the one past `max_batch`); so
    `cuda_graphs=True` refuses none of them."""
    from ad_mlir.llm import llm as llm_module

    monkeypatch.setattr(llm_module, "CudaGraphDecode", lambda llm, buckets: ("slot graphs", buckets))
    monkeypatch.setattr(llm_module, "CudaGraphFlatDecode",
                        lambda llm, buckets, scratch, scratch_state: ("paged graphs", buckets, scratch, scratch_state))

    def on_cuda(page_size: int | None, states: frozenset[str]) -> ad_mlir.LLM:
        llm = object.__new__(ad_mlir.LLM)
        llm.device, llm.page_size, llm.slot_states, llm.max_batch, llm.scratch_page = (
            torch.device("cuda"), page_size, states, 4, None if page_size is None else 9)
        return llm

    states = frozenset({"conv_state_0"})
    for asked in (None, True):
        assert on_cuda(None, states)._capture_decode(asked) == ("slot graphs", (1, 2, 4))
        assert on_cuda(4, frozenset())._capture_decode(asked) == ("paged graphs", (1, 2, 4), 9, None)
        assert on_cuda(4, states)._capture_decode(asked) == ("paged graphs", (1, 2, 4), 9, 4)
    assert on_cuda(4, states)._capture_decode(False) is None


def test_cuda_graphs_need_a_cuda_model(model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA device"):
        ad_mlir.LLM(model, cuda_graphs=True)
    assert ad_mlir.LLM(model, max_batch=1, max_seq_len=16).decode_graphs is None
