"""FX -> ad -> FX round trip of the five HF families: bit-exact against the original
torch.export graph on the same inputs, at two sequence lengths (the dimension is dynamic),
fp32 and bf16, before and after run_decompositions()."""

from __future__ import annotations

import pytest
import torch
from xdsl.dialects.builtin import NameLoc
from xdsl.parser import Parser

from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import make_context
from ad_mlir.runtime.fx_export import export_program
from ad_mlir.semantics.reference import evaluate
from ad_mlir.zoo.tiny import FAMILIES, example_input_ids

SEQ_LENS = (5, 11)
CASES = [
    pytest.param(family, dtype, decompose, id=f"{family}-{dtype}-{'core' if decompose else 'export'}")
    for family in FAMILIES
    for dtype in ("float32", "bfloat16")
    for decompose in (False, True)
]


def _leaves(out: object) -> list[torch.Tensor]:
    return torch.utils._pytree.tree_leaves(out)


@pytest.mark.parametrize(("family", "dtype", "decompose"), CASES)
def test_round_trip_is_bit_exact(exported, family: str, dtype: str, decompose: bool) -> None:
    cfg, ep = exported(family, dtype, decompose)
    program = import_program(ep)
    gm = export_program(program)
    for seq in SEQ_LENS:
        ids = example_input_ids(cfg, seq, seed=seq)
        with torch.no_grad():
            expected = _leaves(ep.module()(input_ids=ids))
            got = list(gm(ids))
            evaluated = list(evaluate(program.module, program.weights, [ids]))
        assert expected[0].shape == (1, seq, cfg.vocab_size)
        assert expected[0].dtype == getattr(torch, dtype)
        for e, g, v in zip(expected, got, evaluated, strict=True):
            assert torch.equal(e, g), f"exported graph differs at seq {seq}: {(e - g).abs().max()}"
            assert torch.equal(e, v), f"reference evaluator differs at seq {seq}: {(e - v).abs().max()}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_printed_ir_reparses_identically(exported, family: str) -> None:
    _, ep = exported(family, "float32", False)
    module = import_program(ep).module
    text = str(module)
    reparsed = Parser(make_context(), text).parse_module()
    reparsed.verify()
    assert str(reparsed) == text
    assert reparsed.is_structurally_equivalent(module)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_weights_keep_their_names_and_values(exported, family: str) -> None:
    _, ep = exported(family, "bfloat16", False)
    program = import_program(ep)
    gm = export_program(program)
    exported_state = {**dict(gm.named_parameters()), **dict(gm.named_buffers())}
    weight_names = set(ep.graph_signature.parameters) | set(ep.graph_signature.buffers)
    for name in weight_names:  # non-persistent buffers (rotary inv_freq) live in ep.constants
        tensor = ep.state_dict[name] if name in ep.state_dict else ep.constants[name]
        assert torch.equal(exported_state[name], tensor), name
    names = {
        attrs.data[key].data
        for attrs in program.function.arg_attrs.data
        for key in ("ad.param", "ad.buffer")
        if key in attrs.data
    }
    assert names == weight_names


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_ops_are_located_at_their_hf_module(exported, family: str) -> None:
    _, ep = exported(family, "float32", False)
    fn = import_program(ep).function
    linears = [op for op in fn.walk() if isinstance(op, ad.LinearOp)]
    locations = [op.location.desc.data for op in linears if isinstance(op.location, NameLoc)]
    assert locations == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.0.mlp.up_proj",
        "model.layers.0.mlp.down_proj",
        "lm_head",
    ]
    # Gemma2 runs eager attention (logit soft-capping): matmul/softmax instead of sdpa.
    attention_op = ad.SoftmaxOp if family == "gemma2" else ad.AttentionOp
    attention = [op for op in fn.walk() if isinstance(op, attention_op)]
    assert [op.location.desc.data for op in attention] == ["model.layers.0.self_attn"]
