"""`ad_mlir.LLM(model, kv_cache_dtype="fp8")`: attention's K/V caches in float8_e4m3fn (vLLM's
fp8 KV cache, per-tensor scales of 1.0), in the slot form and the paged one, on a tiny Llama
(2 layers, 2 query heads over 1 K/V head: grouped-query).

Each step's logits, teacher-forced on the reference's greedy tokens (prefill, then decode steps
of all sequences together), are compared with

- HF's model, eager, with an attention that rounds its keys and values as the cache holds them
  (x / 1.0 clamped to +-448, rounded to e4m3, read back): the same arithmetic as the cached op,
  over every position of a full-prefix forward. The compiled graph then differs by the order of
  its fp32 sums alone: relative error (L2 over the vocabulary) <= 1e-5, as for the FP8 weight
  formats (a key entry that a last-bit difference moved across an e4m3 rounding boundary would
  show as ~1e-3). The wide init (initializer_range 0.5) makes greedy tokens vary, and the tokens
  generated must be this reference's.
- HF's model in fp32, unquantized: each K/V entry errs by at most 2^-4 relative (e4m3 keeps 3
  mantissa bits, rounding to nearest), rms 2^-4 / sqrt(3) for errors spread evenly. A value row's
  error reaches the attention output as a convex combination of the rows' errors (no larger in
  rms), a key's moves scores that a default init keeps small (the softmax near uniform, so it
  changes the output far less); each layer's attention branch then errs by at most ~2^-4 /
  sqrt(3) relative, and two layers add that twice: 2 * 2^-4 / sqrt(3) = 0.072, the bound the
  FP8 activation formats use (test_generate_ct_fp8.py). A default-init model (it does not
  amplify a perturbation); a wide init amplifies it and is held to the first comparison only.
"""

from __future__ import annotations

import copy

import pytest
import torch
from eager_reference import assert_logits_follow, eager_greedy, eager_logits
from kernel_guard import kernels_ran
from test_generate_fp8 import _trajectory
from transformers import AttentionInterface, DeepseekV3Config
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import ad_mlir
from ad_mlir import generate
from ad_mlir.codegen.interpreter import nearest_e4m3_rounding
from ad_mlir.llm import llm as llm_module
from ad_mlir.runtime.kernels import reference_kernels
from ad_mlir.serve import cli as serve_cli
from ad_mlir.tools.report import fp8_logits_error
from ad_mlir.zoo.small import model_from_config
from ad_mlir.zoo.tiny import TinyConfig, build_model

PROMPTS = [[5, 9, 13, 3, 7, 40, 41], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [2, 60, 90, 17]]
FORCED = 2
"""The teacher-forced runs take the first prompts, one slot each; `generate` takes them all, more
prompts than slots."""
STEPS = 6
SAME_QUANTIZATION_ERROR = 1e-5
KV_ROUNDING_ERROR = 2 * 2.0**-4 / 3**0.5
FP8_ATTENTION = "fp8_kv_sdpa"


def _fp8_kv_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """HF's SDPA attention over keys and values rounded as an e4m3 cache with scale 1.0 holds
    them (rotated keys: HF applies RoPE before the attention function)."""
    key, value = ((x.float().clamp(-448, 448).to(torch.float8_e4m3fn).float()).to(x.dtype) for x in (key, value))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(FP8_ATTENTION, _fp8_kv_sdpa)


def _fp8_reference(model: torch.nn.Module) -> torch.nn.Module:
    """`model` itself, eager, with its K/V rounded as the fp8 cache rounds them (`_fp8_kv_sdpa`)."""
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(FP8_ATTENTION)
    return reference


def _model(initializer_range: float) -> torch.nn.Module:
    return build_model(TinyConfig(family="llama", layers=2, hf_overrides=(("initializer_range", initializer_range),)))


@pytest.fixture(scope="module")
def wide() -> tuple[torch.nn.Module, torch.nn.Module, list[list[int]]]:
    """The wide-init model, its fp8-K/V reference and that reference's greedy tokens."""
    model = _model(0.5)
    reference = _fp8_reference(model)
    tokens = [eager_greedy(reference, prompt, STEPS) for prompt in PROMPTS]
    assert all(len(set(t)) > 3 for t in tokens), f"greedy tokens barely vary: {tokens}"
    return model, reference, tokens


def _paged_trajectory(llm: ad_mlir.LLM, prompts: list[list[int]], forced: list[list[int]]) -> list[torch.Tensor]:
    """`_trajectory` in the paged form: every prompt prefilled in one flattened step (sequence i
    in its own pages), then one decode step of all together per token of `forced`."""
    per_sequence = llm.num_pages // len(prompts)
    tables = torch.arange(len(prompts) * per_sequence).view(len(prompts), per_sequence)
    lengths = torch.tensor([len(p) for p in prompts])
    query_starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]
    first = llm.forward_flat(torch.tensor([sum(prompts, [])]), positions, query_starts, torch.zeros_like(lengths),
                             tables, query_starts[1:] - 1)
    logits = [[row] for row in first]
    for step in range(len(forced[0])):
        starts = lengths + step
        out = llm.forward_flat(torch.tensor([[f[step] for f in forced]]), starts[None], torch.arange(len(prompts) + 1),
                               starts, tables, torch.arange(len(prompts)))
        for i, row in enumerate(out):
            logits[i].append(row)
    return [torch.stack(steps) for steps in logits]


def _assert_same_quantization(reference: torch.nn.Module, forced: list[list[int]], logits: list[torch.Tensor]) -> None:
    assert_logits_follow(reference, PROMPTS[:len(forced)], forced, logits, SAME_QUANTIZATION_ERROR,
                         "the eager fp8-K/V model")


@pytest.mark.parametrize("form", ["slots", "pages"])
def test_fp8_kv_cache_generates_the_fp8_reference(wide, form: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The slot form's steps with its kernels in the interpreter (the fp8 cache written and read
    by the cached-attention kernel), the paged form's on the op's reference; `generate` (three
    prompts over two slots, the engine's own steps) on the reference (in the interpreter it
    would cost 20 s more, and the steps' logits already hold the kernels to 1e-5); the caches
    are e4m3."""
    model, reference, tokens = wide
    paged = form == "pages"
    llm = ad_mlir.LLM(model, max_batch=FORCED, max_seq_len=32, kv_cache_dtype="fp8", page_size=8 if paged else None)
    attention = [c for name, c in llm.caches.items() if name.startswith(("k_", "v_"))]
    assert len(attention) == 4 and all(c.dtype == torch.float8_e4m3fn for c in attention)
    forced = tokens[:FORCED]
    with (reference_kernels() if paged else kernels_ran(monkeypatch)), nearest_e4m3_rounding():
        logits = (_paged_trajectory if paged else _trajectory)(llm, PROMPTS[:FORCED], forced)
    with reference_kernels():
        outputs = llm.generate(PROMPTS, max_new_tokens=STEPS, ignore_eos=True)
    _assert_same_quantization(reference, forced, logits)
    assert [out.token_ids for out in outputs] == tokens
    float_error = max(fp8_logits_error(eager_logits(model, p + t)[len(p) - 1:], got)
                      for p, t, got in zip(PROMPTS, forced, logits, strict=False))
    assert float_error > 10 * SAME_QUANTIZATION_ERROR, "the K/V are quantized: HF's float logits differ"


def test_fp8_kv_cache_is_within_kv_rounding_of_the_float_model() -> None:
    """A default-init model (module docstring): each step's logits within 2 * 2^-4 / sqrt(3) of
    HF's unquantized fp32 logits."""
    model = _model(0.02)
    llm = ad_mlir.LLM(model, max_batch=FORCED, max_seq_len=32, kv_cache_dtype="fp8")
    forced = [eager_greedy(model, prompt, STEPS) for prompt in PROMPTS[:FORCED]]
    with reference_kernels():
        logits = _trajectory(llm, PROMPTS[:FORCED], forced)
    _assert_same_quantization(_fp8_reference(model), forced, logits)
    for i, (prompt, tokens, got) in enumerate(zip(PROMPTS, forced, logits, strict=False)):
        error = fp8_logits_error(eager_logits(model, prompt + tokens)[len(prompt) - 1:], got)
        print(f"prompt {i}: {error:.3g} from HF's float logits")
        assert 0 < error <= KV_ROUNDING_ERROR, f"prompt {i}: {error:.3g} from HF's float logits"


def test_fp8_pages_take_half_the_bytes_and_a_budget_buys_twice_the_pages() -> None:
    """bf16 model, paged: the same kv_cache_budget buys twice the pages in fp8, each K/V pool
    float8_e4m3fn and half the bytes of the bf16 pool of as many pages."""
    model = build_model(TinyConfig(family="llama", layers=1, dtype="bfloat16"))
    budget = 64 * 1024
    bf16 = ad_mlir.LLM(model, max_batch=2, max_seq_len=64, page_size=8, kv_cache_budget=budget)
    fp8 = ad_mlir.LLM(model, max_batch=2, max_seq_len=64, page_size=8, kv_cache_budget=budget, kv_cache_dtype="fp8")
    assert fp8.num_pages == 2 * bf16.num_pages
    assert {c.dtype for c in bf16.caches.values()} == {torch.bfloat16}
    assert {c.dtype for c in fp8.caches.values()} == {torch.float8_e4m3fn}
    for name, pool in fp8.caches.items():
        per_page = pool.numel() * pool.element_size() // fp8.num_pages
        assert 2 * per_page == bf16.caches[name].numel() * bf16.caches[name].element_size() // bf16.num_pages
    assert fp8.cache_bytes == bf16.cache_bytes <= budget


def test_mla_is_refused_naming_the_option_and_the_mixer() -> None:
    """MLA caches its latent, which the fp8 K/V cache does not hold: a ValueError naming
    `kv_cache_dtype` and the mixer (the paged form here; both in
    insert-cached-attention-fp8.mlir)."""
    config = DeepseekV3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32, q_lora_rank=None,
                              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1,
                              max_position_embeddings=64, pad_token_id=0)
    model = model_from_config(config)
    with pytest.raises(ValueError, match="model.layers.0.self_attn: kv_cache_dtype='fp8' is not supported for MLA"):
        ad_mlir.LLM(model, max_batch=2, max_seq_len=32, page_size=8, kv_cache_dtype="fp8")


def test_the_command_lines_take_the_cache_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m ad_mlir.generate` and `ad-mlir serve` hand `--kv-cache-dtype` to the LLM they
    build (caught here before it compiles: the option's effect is the tests above); a dtype the
    cache does not know is an error naming it."""
    asked = []

    def caught(model: torch.nn.Module, page_size: int | None, **kwargs: object) -> None:
        asked.append(kwargs["kv_cache_dtype"])
        raise ValueError("caught before compiling")

    monkeypatch.setattr(llm_module, "paged_where_possible", caught)
    with pytest.raises(SystemExit, match="caught before compiling"):
        generate.main(["--model", "llama", "--prompt-ids", "5", "9", "--kv-cache-dtype", "fp8"])
    with pytest.raises(SystemExit, match="caught before compiling"):
        serve_cli._compile(serve_cli._parse(["serve", "--model", "llama", "--kv-cache-dtype", "fp8_e4m3"]), "default",
                           "cpu")
    assert asked == ["fp8", "fp8_e4m3"]
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="kv_cache_dtype='fp16' is none of auto, fp8, fp8_e4m3"):
        generate.main(["--model", "llama", "--prompt-ids", "5", "9", "--kv-cache-dtype", "fp16"])
