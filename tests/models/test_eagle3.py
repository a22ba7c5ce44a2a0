"""EAGLE-3 speculative decoding (`ad_mlir.llm.eagle3`, `capture-hidden-states`, `ad_mlir.zoo.eagle3`).

One generation run (kernels as their torch reference) of a wide-init tiny Llama (two layers, compiled in the paged form with the
capture of the streams after 0, 1 and 2 layers: the embeddings, the first layer's output, the
last layer's before the final norm), three prompts with pages for two at a time, greedy, drafting
3 tokens a decode with a random EAGLE-3 head written in vLLM's checkpoint layout. Every
`forward_flat` and every draft is recorded, and checked against HF:

- each step's captured hidden states (prefill chunks, decodes and drafted rows) equal HF's
  forward of the tokens the sequence held there, at those layers (`output_hidden_states`; the last
  layer's output read by a hook, since HF's last entry has the final norm applied);
- each draft equals a reference written here from the checkpoint's tensors (no cache: every
  position run again for each drafted token) on HF's hidden states of the sequence;
- the tokens are HF's greedy ones. The head's draft vocabulary is the four tokens HF generates
  most often (EAGLE-3 keeps the target's most frequent tokens: here ones that occur), so some
  random drafts are right and the acceptance counters move; the head itself is random.

Then the same model and proposer with 16 new tokens a request, which the pool cannot hold for
two at once: a preempted request's head state is dropped and rebuilt from its recomputed states.

fp32 throughout: the compiled graph computes HF's ops in another order (fused norms, the cached
attention), so states agree to fp32 rounding scaled by their size (`_assert_logits_close`'s
rule: wide weights make hidden states of order 10-300)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from engine_steps import checked_step
from safetensors.torch import load_file
from test_generate import _assert_logits_close, _family_model, _hf_tokens
from test_paged_engine import PagedTokens

import ad_mlir
from ad_mlir.llm import llm as llm_module
from ad_mlir.llm.eagle3 import Eagle3Proposer
from ad_mlir.llm.engine import PagedEngine, SamplingParams, make_engine
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.zoo.eagle3 import load_eagle3, write_eagle3

PROMPTS = ((3, 17, 9, 41, 5), (60, 2, 33), (11, 12, 13, 14, 15, 16, 17))
NEW = 8
LAYERS = (0, 1, 2)
DRAFT = 3


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _family_model("llama")


@pytest.fixture(scope="module")
def hf(model: torch.nn.Module) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): _hf_tokens(model, list(p), NEW) for p in PROMPTS}


@pytest.fixture(scope="module")
def head_dir(model: torch.nn.Module, hf: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    frequent = [t for t, _ in Counter(t for tokens in hf.values() for t in tokens).most_common(4)]
    return write_eagle3(tmp_path_factory.mktemp("eagle3"), model, draft_tokens=frequent, layers=LAYERS)


@pytest.fixture(scope="module")
def run(model: torch.nn.Module, head_dir: Path) -> dict:
    """`LLM.generate` with the EAGLE-3 proposer, each `forward_flat` (inputs, hidden states) and
    each draft (the sequence, the drafted tokens) recorded."""
    proposer = Eagle3Proposer(head_dir, num_tokens=DRAFT)
    llm = ad_mlir.LLM(model, max_batch=2, max_seq_len=32, page_size=4, num_pages=10, speculative=proposer)
    steps, drafts = [], []
    forward_flat, propose_for = llm.forward_flat, proposer.propose_for

    def recorded_forward(*inputs: torch.Tensor) -> torch.Tensor:
        logits = forward_flat(*inputs)
        steps.append((inputs, llm.hidden_states.clone()))
        return logits

    def recorded_propose(ids: list[str], sequences: list[list[int]], limits: list[int]) -> list[list[int]]:
        got = propose_for(ids, sequences, limits)
        drafts.extend((list(s), d) for s, d in zip(sequences, got, strict=True))
        return got

    llm.forward_flat, proposer.propose_for = recorded_forward, recorded_propose
    engines = []
    make = llm_module.make_engine

    def kept_engine(*args: object, **kwargs: object) -> PagedEngine:
        engine = make(*args, **kwargs)
        schedule = engine._schedule

        def scheduled() -> list:
            chunks = schedule()
            prompts.append([tuple(c.request.output.prompt_token_ids) for c in chunks])
            return chunks

        engine._schedule = scheduled
        engines.append(engine)
        return engine

    prompts: list[list[tuple[int, ...]]] = []
    llm_module.make_engine = kept_engine
    try:
        with reference_kernels():  # the kernels' own tests run them in the interpreter; here the graph is checked
            outputs = llm.generate([list(p) for p in PROMPTS], max_new_tokens=NEW)
    finally:
        llm_module.make_engine = make
        del llm.forward_flat, proposer.propose_for  # the methods again, unrecorded
    steps = [(chunk_prompts, *step) for chunk_prompts, step in zip([p for p in prompts if p], steps, strict=True)]
    return {"llm": llm, "outputs": outputs, "steps": steps, "drafts": drafts, "engine": engines[0],
            "proposer": proposer}


def test_preempted_requests_draft_again_from_their_recomputed_states(model: torch.nn.Module, run: dict) -> None:
    """16 new tokens each: two sequences need more than the 10 pages, so the youngest is
    preempted (its head state dropped) and recomputed (its states handed again); HF's tokens."""
    llm, proposer = run["llm"], run["proposer"]
    engine = make_engine(llm, speculative=proposer)
    requests = [engine.add(list(p), SamplingParams(max_tokens=16)) for p in PROMPTS]
    with reference_kernels():
        while engine.has_work:
            checked_step(engine)
    assert [r.output.token_ids for r in requests] == [_hf_tokens(model, list(p), 16) for p in PROMPTS]
    assert engine.preemptions > 0 and engine.drafted_tokens > 0 and not proposer.tracks


def _hf_states(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """HF's streams after LAYERS layers for `tokens` [len, 3 * hidden]: `output_hidden_states`,
    the last layer's output taken before the final norm (a hook on it)."""
    last = {}
    hook = model.model.layers[-1].register_forward_hook(lambda m, i, out: last.setdefault("out", out))
    try:
        with torch.no_grad():
            states = list(model(torch.tensor([tokens]), output_hidden_states=True).hidden_states)
    finally:
        hook.remove()
    states[-1] = last["out"][0] if isinstance(last["out"], tuple) else last["out"]
    return torch.cat([states[i][0] for i in LAYERS], dim=-1)


def test_generation_with_eagle3_gives_hfs_tokens_and_accepts_some_drafts(run: dict, hf: dict) -> None:
    assert [o.token_ids for o in run["outputs"]] == [hf[tuple(p)] for p in PROMPTS]
    engine = run["engine"]
    assert engine.drafted_tokens > 0 and 0 < engine.accepted_tokens < engine.drafted_tokens, (
        engine.accepted_tokens, engine.drafted_tokens)
    assert engine.pages_in_use == 0 and not run["proposer"].tracks, "every request's head state is dropped"


def test_the_captured_hidden_states_are_hfs_at_those_layers(model: torch.nn.Module, run: dict, hf: dict) -> None:
    """Every row of every step: prefill chunks, decodes, drafted tokens (accepted or not); the
    compiled function returns them as its second result."""
    outputs = run["llm"].program.function.function_type.outputs.data
    assert run["llm"].captured_layers == LAYERS and outputs[1].get_shape()[-1] == 3 * model.config.hidden_size
    compared = 0
    for prompts, (ids, _, query_starts, cache_starts, _, _), hidden in run["steps"]:
        assert hidden.shape == (ids.shape[1], len(LAYERS) * model.config.hidden_size)
        for i, (prompt, start) in enumerate(zip(prompts, cache_starts.tolist(), strict=True)):
            fed = ids[0, query_starts[i]:query_starts[i + 1]].tolist()
            truth = list(prompt) + hf[prompt]
            expected = _hf_states(model, truth[:start] + fed)[start:]
            _assert_logits_close(hidden[query_starts[i]:query_starts[i + 1]], expected)
            compared += len(fed)
    assert compared > sum(len(p) + NEW for p in PROMPTS) - len(PROMPTS)


def test_each_draft_is_the_heads_on_hfs_hidden_states(model: torch.nn.Module, run: dict, head_dir: Path) -> None:
    weights = load_file(str(head_dir / "model.safetensors"))
    config = json.loads((head_dir / "config.json").read_text())
    embedding = model.get_input_embeddings().weight.detach()
    assert run["drafts"]
    for tokens, draft in run["drafts"]:
        if draft:
            states = _hf_states(model, tokens[:-1])
            assert draft == _reference_drafts(weights, config, embedding, states, tokens, len(draft)), tokens


def _reference_drafts(w: dict[str, torch.Tensor], config: dict, embedding: torch.Tensor, states: torch.Tensor,
                      tokens: list[int], k: int) -> list[int]:
    """EAGLE-3's chain written out from the checkpoint's tensors: positions 0 .. len - 2 with
    fc(the target's states) and the next token, then each drafted token at the next position
    with the head's output before its norm at the one before, every position run again."""
    hidden = states @ w["fc.weight"].T
    ids, drafts = list(tokens[1:]), []
    while len(drafts) < k:
        logits, prenorm = _reference_layer(w, config, embedding, hidden, ids)
        draft = int(logits[-1].argmax())
        drafts.append(draft + int(w["d2t"][draft]))
        hidden = torch.cat([hidden, prenorm[-1:]])
        ids.append(drafts[-1])
    return drafts


def _reference_layer(w: dict[str, torch.Tensor], config: dict, embedding: torch.Tensor, hidden: torch.Tensor,
                     ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    eps, heads, kv_heads, d = (config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"],
                               config["head_dim"])

    def rms(x: torch.Tensor, name: str) -> torch.Tensor:
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x: torch.Tensor) -> torch.Tensor:
        angles = torch.arange(n)[:, None] * config["rope_theta"] ** (-torch.arange(0, d, 2) / d)
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin

    n, layer = len(ids), "midlayer."
    x = torch.cat([rms(embedding[ids], layer + "input_layernorm.weight"), rms(hidden, layer + "hidden_norm.weight")], -1)
    q = rope((x @ w[layer + "self_attn.q_proj.weight"].T).view(n, heads, d).transpose(0, 1))
    k = rope((x @ w[layer + "self_attn.k_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1))
    v = (x @ w[layer + "self_attn.v_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = (q @ k.transpose(1, 2) / d ** 0.5).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
    residual = attended @ w[layer + "self_attn.o_proj.weight"].T + hidden
    h = rms(residual, layer + "post_attention_layernorm.weight")
    mlp = (torch.nn.functional.silu(h @ w[layer + "mlp.gate_proj.weight"].T) * (h @ w[layer + "mlp.up_proj.weight"].T))
    prenorm = mlp @ w[layer + "mlp.down_proj.weight"].T + residual
    return rms(prenorm, "norm.weight") @ w["lm_head.weight"].T, prenorm


def test_models_and_heads_it_cannot_draft_for_are_refused(model: torch.nn.Module, head_dir: Path) -> None:
    """A model with per-sequence states (its states cannot be rolled back past a rejected draft),
    a model compiled without the capture, a head of another width."""
    llm = PagedTokens(model, num_pages=8)
    llm.num_state_slots = 2
    with pytest.raises(ValueError, match="per-sequence states .*cannot be rolled back"):
        PagedEngine(llm, speculative=Eagle3Proposer(head_dir))
    with pytest.raises(ValueError, match=r"hidden states after layers \[0, 1, 2\], which this model does not return"):
        PagedEngine(PagedTokens(model, num_pages=8), speculative=Eagle3Proposer(head_dir))
    head = load_eagle3(head_dir)
    head.config.target_hidden_size = 32
    with pytest.raises(ValueError, match="target_hidden_size = 32, .* hidden_size = 64"):
        Eagle3Proposer(head).attach(model)


def test_the_serve_command_line_compiles_the_model_for_an_eagle3_head(run: dict, head_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`ad-mlir serve --speculative-eagle3 PATH --speculative-tokens 2`: the model is compiled with
    the head's proposer (so with the capture; the compile itself is the run's, not repeated here),
    and the engine drafts with that proposer; it excludes the other ways of drafting."""
    from ad_mlir.serve import cli

    args = cli._parse(["serve", "--model", "llama", "--speculative-eagle3", str(head_dir), "--speculative-tokens", "2"])
    given: dict = {}

    def compiled(model: torch.nn.Module, page_size: int | None, **kwargs: object) -> ad_mlir.LLM:
        given.update(kwargs, page_size=page_size)
        return run["llm"]

    monkeypatch.setattr(llm_module, "paged_where_possible", compiled)
    assert cli._compile(args, "default", "cpu") is run["llm"]
    proposer = given["speculative"]
    assert isinstance(proposer, Eagle3Proposer) and proposer.num_tokens == 2 and given["page_size"] == 16
    assert cli._proposer(args, run["llm"]) is run["llm"].speculative
    with pytest.raises(SystemExit):  # argparse: one way of drafting at a time
        cli._parse(["serve", "--speculative-eagle3", str(head_dir), "--speculative-ngram", "2"])
