"""`canonicalize` on graphs torch produces: identity casts in all three spellings go (and
only when nothing but the dtype is asked for); results stay bit-exact."""

from __future__ import annotations

import pytest
import torch

from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.runtime.fx_export import export_program

aten, prims = torch.ops.aten, torch.ops.prims
X = torch.randn(2, 3, 4, 5)


def _graph_of_one_call(target, *args, **kwargs) -> torch.fx.GraphModule:
    """x -> target(x, *args, **kwargs) -> neg (so the call's result has a user)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    call = graph.call_function(target, (x, *args), kwargs)
    graph.output((graph.call_function(aten.neg.default, (call,)),))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _canonicalized(gm: torch.fx.GraphModule):
    program = import_program(gm, example_inputs=[X])
    run_pipeline(program.module, "canonicalize")
    ops = [op for op in program.function.walk() if op.name.startswith("ad.")]
    return program, ops


IDENTITY_CASTS = {
    "aten.to.dtype": (aten.to.dtype, (torch.float32,), {}),
    "aten._to_copy": (aten._to_copy.default, (), {"dtype": torch.float32}),
    "aten._to_copy same device, strided": (
        aten._to_copy.default, (), {"dtype": torch.float32, "device": torch.device("cpu"), "layout": torch.strided}
    ),
    "prims.convert_element_type": (prims.convert_element_type.default, (torch.float32,), {}),
}


@pytest.mark.parametrize("case", sorted(IDENTITY_CASTS))
def test_identity_cast_is_removed(case: str) -> None:
    target, args, kwargs = IDENTITY_CASTS[case]
    gm = _graph_of_one_call(target, *args, **kwargs)
    program, ops = _canonicalized(gm)
    assert [op.name for op in ops] == ["ad.neg"]
    assert torch.equal(export_program(program)(X)[0], gm(X)[0])


KEPT_CASTS = {
    "copy=True": (aten.to.dtype, (torch.float32, False, True), {}),
    "memory_format": (aten._to_copy.default, (), {"dtype": torch.float32, "memory_format": torch.channels_last}),
    "other device": (aten._to_copy.default, (), {"dtype": torch.float32, "device": torch.device("meta")}),
}


@pytest.mark.parametrize("case", sorted(KEPT_CASTS))
def test_cast_asking_for_more_than_a_dtype_stays(case: str) -> None:
    target, args, kwargs = KEPT_CASTS[case]
    _, ops = _canonicalized(_graph_of_one_call(target, *args, **kwargs))
    assert [op.name for op in ops] == ["ad.torch_op", "ad.neg"]


def test_real_cast_stays() -> None:
    _, ops = _canonicalized(_graph_of_one_call(prims.convert_element_type.default, torch.bfloat16))
    assert [op.name for op in ops] == ["ad.cast", "ad.neg"]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_canonicalized_model_is_bit_exact(exported, family: str, dtype: str) -> None:
    from ad_mlir.zoo.tiny import example_input_ids

    cfg, ep = exported(family, dtype, False)
    program = import_program(ep)
    before = sum(1 for _ in program.module.walk())
    run_pipeline(program.module, "canonicalize")
    after = list(program.module.walk())
    assert len(after) < before
    assert not any(isinstance(op, ad.AliasOp) for op in after)
    assert not any(isinstance(op, ad.CastOp) and op.input.type == op.result.type for op in after)
    assert not any(isinstance(op, ad.TorchOp) and "assert" in op.target.data for op in after)
    gm = export_program(program)
    ids = example_input_ids(cfg, 9)
    with torch.no_grad():
        assert torch.equal(gm(ids)[0], ep.module()(input_ids=ids).logits)
