"""`ad.linear_nvfp4`'s reference (`torch.ops.ad_mlir.linear_nvfp4`) against the dequantized
weight's linear in float64, the weight decoded here from the bits (not through `zoo/fp4.py`'s
table); the op's verifier; and the path from a ModelOpt NVFP4 checkpoint to the op: the export
routes `Nvfp4Linear` through it with the packed codes and scales as graph weights, the importer
makes the `ad` op, and `fuse-gemms`' merged Q/K/V and gate/up (their global scales folded into one
per row) compute what the parts did (`ad-opt --verify-each`, on the checkpoint's weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float32Type,
    IntegerType,
    Signedness,
    TensorType,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.test_value import create_ssa_value

from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.semantics import torch_ops  # noqa: F401 (registers torch.ops.ad_mlir.*)
from ad_mlir.tools import ad_opt
from ad_mlir.zoo import nvfp4
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.modelopt import write_nvfp4_checkpoint
from ad_mlir.zoo.tiny import TinyConfig, build_model


def _decoded(packed: torch.Tensor) -> torch.Tensor:
    """float64 [N, K] of uint8 [N, K / 2], from each code's bits: (-1)^s * m / 2 when its exponent
    e is 0, else (-1)^s * 2^(e-1) * (1 + m / 2); element 2i in the byte's low nibble."""
    codes = torch.stack([packed & 15, packed >> 4], -1).flatten(-2).long()
    sign, e, m = 1 - 2 * (codes >> 3), (codes >> 1) & 3, (codes & 1).double()
    magnitude = torch.where(e == 0, m / 2, torch.exp2((e - 1).double()) * (1 + m / 2))
    return sign * magnitude


CASES = {
    "fp32_3d": (torch.float32, (2, 5, 64), 48, False, False),
    "bf16_bias": (torch.bfloat16, (7, 96), 32, True, False),
    "fp16_per_row_scale": (torch.float16, (3, 32), 40, True, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_is_the_dequantized_linear(case: str) -> None:
    """The product of the decoded weight, its block scales and its global scale with the input,
    in float64. Tolerance: the reference's fp32 sums (error ~K * 2^-24 of the sum of magnitudes)
    and, in bf16 / fp16, one rounding of the output (2^-9 / 2^-12 relative, the bias added
    before it)."""
    dtype, shape, n, with_bias, per_row = CASES[case]
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * torch.logspace(-2, 1, shape[-1])).to(dtype)
    packed, block, scale_2 = nvfp4.quantize(torch.randn(n, shape[-1], generator=g))
    if per_row:
        scale_2 = torch.rand(n, generator=g) * 1e-3
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    got = torch.ops.ad_mlir.linear_nvfp4(x, packed, block, scale_2, bias)
    assert got.dtype == dtype and got.shape == (*shape[:-1], n)
    w = _decoded(packed) * block.double().repeat_interleave(16, 1) * scale_2.double().reshape(-1, 1)
    expected = x.double() @ w.T + (bias.double() if bias is not None else 0)
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=rtol * expected.abs().max().item())


def test_the_eager_weight_is_modelopt_s_dequantized_weight() -> None:
    """The weight the reference multiplies (`scaled_codes` times the global scale) is ModelOpt's
    dequantized weight (`nvfp4.dequantize`, its order of products) within one fp32 rounding."""
    packed, block, scale_2 = nvfp4.quantize(torch.randn(24, 64, generator=torch.Generator().manual_seed(2)))
    torch.testing.assert_close(nvfp4.scaled_codes(packed, block) * scale_2, nvfp4.dequantize(packed, block, scale_2),
                               rtol=2.0**-23, atol=0)


def _op(k: int, n: int, scale_shape: list[int], weight_type: object = None) -> ad.LinearNvfp4Op:
    ui8 = IntegerType(8, Signedness.UNSIGNED)
    x = create_ssa_value(TensorType(BFloat16Type(), [3, k]))
    w = create_ssa_value(TensorType(weight_type or ui8, [n, k // 2]))
    ws = create_ssa_value(TensorType(Float8E4M3FNType(), [n, k // 16]))
    gs = create_ssa_value(TensorType(Float32Type(), scale_shape))
    return ad.LinearNvfp4Op(x, w, ws, gs, None, TensorType(BFloat16Type(), [3, n]))


def test_the_verifier_names_what_is_wrong() -> None:
    _op(64, 32, []).verify()
    _op(64, 32, [32]).verify()
    with pytest.raises(VerifyException, match="weight_scale_2 must be f32 of one value or \\[32\\]"):
        _op(64, 32, [16]).verify()
    with pytest.raises(VerifyException, match="weight must be a static 2-D ui8 tensor"):
        _op(64, 32, [], Float8E4M3FNType()).verify()
    with pytest.raises(VerifyException, match="input features 40 do not match"):
        _op(40, 32, []).verify()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model(TinyConfig(family="qwen2", layers=1, dtype="bfloat16"))
    return write_nvfp4_checkpoint(model, tmp_path_factory.mktemp("nvfp4") / "ckpt")


def test_export_keeps_the_packed_codes_and_the_import_makes_the_op(checkpoint: Path) -> None:
    """Every quantized linear exports as `ad_mlir.linear_nvfp4` on its uint8 codes, e4m3 block
    scales and fp32 global scale (graph weights); the import makes `ad.linear_nvfp4` of those
    arguments (biases too: Qwen2's q/k/v); only the LM head stays an `ad.linear`."""
    model, _ = load_causal_lm(str(checkpoint))
    ep = export_model(model)
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    routed = [n for n in calls if n.target is torch.ops.ad_mlir.linear_nvfp4.default]
    assert len(routed) == 7
    for node in routed:
        dtypes = [node.args[i].meta["val"].dtype for i in range(1, 4)]
        assert dtypes == [torch.uint8, torch.float8_e4m3fn, torch.float32]
        assert all(node.args[i].name in ep.graph_signature.inputs_to_parameters for i in range(1, 4))
    assert sum(n.target is torch.ops.aten.linear.default for n in calls) == 1  # the LM head
    fn = import_program(ep).module.ops.first
    ops = [op for op in fn.body.block.ops if isinstance(op, ad.LinearNvfp4Op)]
    assert len(ops) == 7 and sum(op.bias is not None for op in ops) == 3
    assert [type(op).__name__ for op in fn.body.block.ops if isinstance(op, ad.LinearOp)] == ["LinearOp"]


def test_merged_gemms_compute_what_the_parts_did(checkpoint: Path, capsys: pytest.CaptureFixture) -> None:
    """`--verify-each` runs the graph before and after each pass of the default pipeline on the
    checkpoint's weights: fuse-gemms' Q/K/V and gate/up over folded per-row global scales (each
    part's own scale, which differ: checked) must give the parts' outputs."""
    model, _ = load_causal_lm(str(checkpoint))
    attention = model.model.layers[0].self_attn
    assert len({float(p.weight_scale_2) for p in (attention.q_proj, attention.k_proj, attention.v_proj)}) == 3
    ad_opt.main(["--model", str(checkpoint), "--verify-each", "-p", "default"])
    out = capsys.readouterr().out
    assert out.count("ad.linear_nvfp4 %") == 4 and "tensor<128xf32>" in out
