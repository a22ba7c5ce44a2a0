"""The family matrix (`ad_mlir.bench.families.MATRIX`; the full sweep is `ad-bench --parts families`):
causal LMs of every common decoder shape built small from their HF config classes, exported with
a dynamic sequence length, compiled with the default pipeline and run against eager, with the
kernels as their torch reference and in the Triton interpreter (a region that ran its reference
there fails the test), in fp32 at two sequence lengths and, for one family of each distinct set
of LLM ops, in bf16.

fp32: torch.testing's defaults (rtol 1.3e-6, atol 1e-5) on the logits: the kernels compute in
fp32 like eager and only reorder sums. bf16: against the fp32 model, within twice eager bf16's
own error plus one bf16 ulp of the largest logit (`report.low_precision_bound`): the kernels
keep fp32 between ops where eager rounds every result, so they differ from eager bf16 by a few
ulps that later GEMMs spread; eager's own error is the yardstick. The interpreter rounds the
kernels' bf16 stores to nearest there, as a GPU does (`interpreter.nearest_bf16_rounding`)."""

from __future__ import annotations

from typing import Any

import pytest
from kernel_guard import graph_kernels, no_dropped_ops

from ad_mlir.bench import families
from ad_mlir.bench.families import MATRIX, SEQ_LENS, sweep_family
from ad_mlir.runtime import kernels

LLAMA = {"ad.add_rms_norm": 1, "ad.rms_norm": 1, "ad.rope_attention": 1, "ad.silu_and_mul": 1}

FUSED_OPS: dict[str, dict[str, int]] = {
    "llama": LLAMA,
    "qwen2": LLAMA,
    "mistral": LLAMA,
    "gemma": {"ad.add_rms_norm": 1, "ad.gelu_and_mul": 1, "ad.rms_norm": 1, "ad.rope_attention": 1},
    "gemma2": {"ad.add_rms_norm": 1, "ad.gelu_and_mul": 1, "ad.rms_norm": 3, "ad.rope_attention": 1},
    "gemma3_text": {"ad.add_rms_norm": 1, "ad.gelu_and_mul": 1, "ad.rms_norm": 3, "ad.rope_attention": 1},
    "qwen3": {"ad.add_rms_norm": 1, "ad.rms_norm": 1, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "olmo2": {"ad.rms_norm": 4, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "phi3": {"ad.add_rms_norm": 1, "ad.rms_norm": 1, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "gpt2": {"ad.activation": 1, "ad.add_layer_norm": 2, "ad.attention": 1},
    "opt": {"ad.activation": 1, "ad.add_layer_norm": 2, "ad.attention": 1},
    "falcon": {"ad.activation": 1, "ad.layer_norm": 1, "ad.rope_attention": 1},
    "starcoder2": {"ad.activation": 1, "ad.add_layer_norm": 1, "ad.layer_norm": 1, "ad.rope_attention": 1},
    "gpt_neox": {"ad.activation": 1, "ad.layer_norm": 2, "ad.rope_attention": 1},
    "phi": {"ad.activation": 1, "ad.layer_norm": 1, "ad.rope_attention": 1},
    "gptj": {"ad.activation": 1, "ad.layer_norm": 1, "ad.rope_attention": 1},
    "ernie4_5": {"ad.add_rms_norm": 1, "ad.rms_norm": 1, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "glm": {"ad.add_rms_norm": 1, "ad.rms_norm": 1, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "glm4": {"ad.add_rms_norm": 1, "ad.rms_norm": 3, "ad.rope_attention": 1, "ad.silu_and_mul": 1},
    "bloom": {"ad.activation": 1, "ad.add_layer_norm": 1, "ad.layer_norm": 1},
    "mpt": {"ad.activation": 1, "ad.add_layer_norm": 1, "ad.layer_norm": 1},
    "mixtral": {"ad.add_rms_norm": 1, "ad.moe": 1, "ad.rms_norm": 1, "ad.rope_attention": 1},
    "qwen3_moe": {"ad.add_rms_norm": 1, "ad.moe": 1, "ad.rms_norm": 1, "ad.rope_attention": 1},
    "qwen2_moe": {"ad.add_rms_norm": 1, "ad.moe": 1, "ad.rms_norm": 1, "ad.rope_attention": 1},
}
"""The LLM-level ops of decoder layer 0 after the default pipeline (generic `ad.fused` regions
aside), per family of the matrix."""

BF16_FAMILIES = {next(f for f in sorted(FUSED_OPS) if FUSED_OPS[f] == ops) for ops in FUSED_OPS.values()}
"""The families checked in bf16 too: the first of each distinct set of LLM ops (11 of 24). The
others' kernels are the same templates on the same dtypes (the fp32 check runs each family's
own), and each bf16 export and compile costs the suite ~4 s a family."""


def test_the_matrix_is_covered() -> None:
    assert sorted(FUSED_OPS) == sorted(MATRIX)


@pytest.fixture
def kernels_only_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A region that runs its reference semantics outside `reference_kernels` fails the test:
    the interpreter path then checks the kernels themselves."""
    reference = kernels.run_reference

    def only_when_asked(*args: object) -> object:
        assert kernels._FORCE_REFERENCE, "a region ran its reference semantics, not its kernel"
        return reference(*args)

    monkeypatch.setattr(kernels, "run_reference", only_when_asked)


@pytest.fixture
def compiled_graphs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The graphs the sweep compiles, in order."""
    graphs: list[Any] = []
    real = families._compile

    def spy(*args: Any) -> tuple[Any, Any]:
        gm, module = real(*args)
        graphs.append(gm)
        return gm, module

    monkeypatch.setattr(families, "_compile", spy)
    return graphs


@pytest.mark.parametrize("family", sorted(MATRIX))
def test_family_compiles_and_matches_eager(family: str, kernels_only_in_the_interpreter: None,
                                           compiled_graphs: list[Any]) -> None:
    """Every LLM-level op of the fp32 graph is a generated kernel (none left as its reference op
    or as torch calls), so its interpreter path runs only kernels."""
    # the quantized column is the checkpoint tests' (tests/models/test_generate_*.py) and
    # test_bench's: nothing here reads it, and its export is a third of a shipped family's time
    with no_dropped_ops():
        row = sweep_family(family, bf16=family in BF16_FAMILIES, quantized=False)
    graph_kernels(compiled_graphs[0])
    assert row.status == "ok", f"{family} ({MATRIX[family]}): {row.status}: {row.reason}"
    assert sorted(row.reference_error) == sorted(row.interpreter_error) == sorted(SEQ_LENS), "both paths ran"
    if family in BF16_FAMILIES:
        assert {"reference", "interpreter"} <= set(row.bf16_error), "bf16 ran on both paths"
    assert row.kernel_calls > 0, "no kernel of ours in the compiled graph: the interpreter path checked nothing"
    assert row.kernels_after is not None and row.kernels_after < row.kernels_before, "the pipeline fused nothing"
    llm_ops = {op: n for op, n in row.fused_ops.items() if op != "ad.fused"}
    assert llm_ops == FUSED_OPS[family], f"{family} ({MATRIX[family]}): layer 0 holds {row.fused_ops}"


def test_the_generation_column_narrows_the_init_until_hf_tokens_vary() -> None:
    """Gemma2 at initializer_range 0.5 repeats the last prompt token (the sweep said "HF repeats",
    which proves nothing); the column narrows the init, and then compares varied tokens."""
    row = families.FamilyRow("gemma2", status="ok")
    families.check_generation(row)
    assert (row.generation, row.generation_reason) == ("equal", "")
