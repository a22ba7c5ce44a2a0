"""`ad_mlir.compile` with the default pipeline on the five HF families matches eager, with
every fused region run as its generated Triton kernel (in the Triton interpreter on CPU).

fp32: torch.testing's defaults (rtol 1.3e-6, atol 1e-5). The kernels compute in fp32 like
eager and only reorder sums (row reductions, the softmax decomposition), a few ulp.

bf16: eager rounds every op's result to bf16, the kernels keep fp32 between ops and round
once at each store (the interpreter even truncates there), so the two disagree by a few bf16
ulps that the following GEMMs spread over the logits. Elementwise closeness to eager is not
the right measure; closeness to the truth is. Both are compared with the same model in fp32
(`report.low_precision_bound`): the compiled graph's error must be at most twice eager bf16's
own error, plus one bf16 ulp (2^-8) of the logits' largest magnitude."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from kernel_guard import graph_kernels, kernels_ran

import ad_mlir
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.tools.report import low_precision_bound
from ad_mlir.zoo.tiny import FAMILIES, TinyConfig, build_model, example_input_ids


@pytest.fixture
def no_reference_fallback(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail if a region runs as its torch reference instead of its Triton kernel, or an op was
    left without a kernel (tests/kernel_guard.py)."""
    with kernels_ran(monkeypatch):
        yield


@pytest.mark.usefixtures("no_reference_fallback")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_kernels_match_eager(exported, family: str, dtype: str) -> None:
    cfg, ep = exported(family, dtype, False)
    gm = ad_mlir.compile(ep)
    graph_kernels(gm, at_least=4)  # two norms, the MLP activation, the final norm at least
    truth_model = build_model(TinyConfig(family=family, layers=1, dtype="float32"))
    for seq in (6, 13):
        ids = example_input_ids(cfg, seq, seed=seq)
        with torch.no_grad():
            expected = ep.module()(input_ids=ids).logits
            got = gm(ids)[0]
            truth = truth_model(input_ids=ids).logits
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if dtype == "float32":
            torch.testing.assert_close(got, expected)
            continue
        our_error = (got.float() - truth).abs().max().item()
        bound = low_precision_bound(expected, truth)
        assert our_error <= bound, f"bf16 error {our_error:.3g} against the fp32 model, bound {bound:.3g}"


LLM_OPS_PER_FAMILY = {
    # one layer: the input norm stands alone (its input is the embedding), the post-attention
    # norm and the final norm follow a residual add; RoPE + repeat_kv + SDPA is one op; the
    # MLP is silu(gate) * up.
    "llama": {"ad.rms_norm": 1, "ad.add_rms_norm": 2, "ad.rope_attention": 1, "ad.rope": 0, "ad.silu_and_mul": 1,
              "ad.gelu_and_mul": 0},
    "qwen2": {"ad.rms_norm": 1, "ad.add_rms_norm": 2, "ad.rope_attention": 1, "ad.rope": 0, "ad.silu_and_mul": 1,
              "ad.gelu_and_mul": 0},
    "mistral": {"ad.rms_norm": 1, "ad.add_rms_norm": 2, "ad.rope_attention": 1, "ad.rope": 0, "ad.silu_and_mul": 1,
                "ad.gelu_and_mul": 0},
    # Gemma's MLP is gelu(tanh)(gate) * up.
    "gemma": {"ad.rms_norm": 1, "ad.add_rms_norm": 2, "ad.rope_attention": 1, "ad.rope": 0, "ad.silu_and_mul": 0,
              "ad.gelu_and_mul": 1},
    # Gemma2 normalizes the attention and MLP outputs before each residual add (2 more norms
    # on linears), and the pre-feedforward norm follows the first residual add; its attention
    # soft-caps the logits (HF's eager matmul/tanh/softmax, no SDPA), one rope_attention too.
    "gemma2": {"ad.rms_norm": 3, "ad.add_rms_norm": 2, "ad.rope_attention": 1, "ad.rope": 0, "ad.silu_and_mul": 0,
               "ad.gelu_and_mul": 1},
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_pipeline_matches_every_norm_and_gated_mlp(exported, family: str, dtype: str) -> None:
    _, ep = exported(family, dtype, False)
    program = import_program(ep)
    run_pipeline(program.module, "default")
    names = [op.name for op in program.module.walk()]
    assert {name: names.count(name) for name in LLM_OPS_PER_FAMILY[family]} == LLM_OPS_PER_FAMILY[family]
    # nothing of an RMSNorm spelling or of a silu/gelu * up is left anywhere (regions included)
    assert not {"ad.rsqrt", "ad.mean", "ad.silu", "ad.gelu"} & set(names)
    if LLM_OPS_PER_FAMILY[family]["ad.rope_attention"]:
        assert "ad.attention" not in names


def test_fused_gemm_weights_are_concatenated_once(exported) -> None:
    """fuse-gemms concatenates Q/K/V and gate/up weights at compile time: the compiled graph
    holds the concatenations as buffers, not the parts, and concatenates nothing per call."""
    _, ep = exported("qwen2", "float32", False)
    gm = ad_mlir.compile(ep)
    state = {**dict(gm.named_parameters()), **dict(gm.named_buffers())}
    layer = "model.layers.0"
    for part in ("self_attn.q_proj.weight", "self_attn.q_proj.bias", "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        assert f"{layer}.{part}" not in state
    weights = ep.state_dict
    qkv = torch.cat([weights[f"{layer}.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([weights[f"{layer}.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert any(torch.equal(t, qkv) for t in state.values())
    assert any(torch.equal(t, gate_up) for t in state.values())
    cats = [n for n in gm.graph.nodes if n.target is torch.ops.aten.cat.default]
    assert not [n for n in cats if any(a.op == "get_attr" for a in n.args[0])]
