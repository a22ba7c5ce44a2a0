"""`ad.linear_int4`'s reference (`torch.ops.ad_mlir.linear_int4`) against the formats' arithmetic
written out independently in float64 from the bits, and the path from a GPTQ checkpoint to the
op: the export routes `Int4Linear` through it with the packed words, zero points, scales and
g_idx as graph weights, the importer makes the `ad` op, and `fuse-gemms` merges Q/K/V and gate/up
only where their g_idx are one tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from xdsl.context import Context

from ad_mlir.dialects import ad
from ad_mlir.frontends.export import export_model
from ad_mlir.frontends.fx_import import import_program
from ad_mlir.passes.fuse_gemms import FuseGemmsPass
from ad_mlir.semantics import torch_ops  # noqa: F401 (registers torch.ops.ad_mlir.*)
from ad_mlir.zoo.checkpoints import load_causal_lm
from ad_mlir.zoo.gptq import act_order_groups, write_gptq_checkpoint
from ad_mlir.zoo.int4 import pack_columns, pack_rows, quantize_groups
from ad_mlir.zoo.tiny import TinyConfig, build_model


def _expected(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: torch.Tensor, offset: int) -> torch.Tensor:
    """The format in float64, one weight at a time from its nibbles: w[n, k] = (code - zero -
    offset) * scale of row k's group; the weight rounded to x's dtype, out = x @ w.T."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    w = torch.empty(n, k, dtype=torch.float64)
    for row in range(k):
        g = int(g_idx[row])
        for col in range(n):
            code = (int(qweight[row // 8, col]) >> (4 * (row % 8))) & 15
            zero = (int(qzeros[g, col // 8]) >> (4 * (col % 8))) & 15
            w[col, row] = (code - zero - offset) * float(scales[g, col])
    w = w.to(x.dtype).double()
    return x.double().reshape(-1, k) @ w.T


CASES = {
    "fp32_groups": (torch.float32, (2, 3, 64), 24, 16, False, 1, False),
    "fp32_act_order_bias": (torch.float32, (5, 48), 16, 16, True, 1, True),
    "bf16_one_group": (torch.bfloat16, (4, 32), 40, 32, False, 0, True),
    "bf16_act_order": (torch.bfloat16, (1, 64), 32, 8, True, 0, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_is_the_int4_format(case: str) -> None:
    """Tolerance: the same weights (exact in fp32, then one rounding to x's dtype, as written
    out), products added in fp32 (~K * 2^-24 of the sum of magnitudes) and rounded to x's dtype
    (bf16: 2^-8), the bias added in fp32 and rounded again."""
    dtype, shape, n, group, act_order, offset, with_bias = CASES[case]
    k = shape[-1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    g_idx = act_order_groups(torch.rand(k, generator=g), group) if act_order else torch.arange(k) // group
    codes, zeros, scales = quantize_groups(torch.randn(n, k, generator=g), group, False, g_idx, min_zero=offset)
    qweight, qzeros = pack_rows(codes), pack_columns(zeros - offset)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    got = torch.ops.ad_mlir.linear_int4(x, qweight, qzeros, scales, g_idx.to(torch.int32) if act_order else None,
                                        bias, group, offset)
    assert got.dtype == dtype and got.shape == (*shape[:-1], n)
    expected = _expected(x, qweight, qzeros, scales, g_idx, offset).view(*shape[:-1], n)
    if bias is not None:
        expected = expected.to(dtype).double() + bias.double()
    rtol = 2.0**-8 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=rtol * expected.abs().max().item())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_model(TinyConfig(family="llama", layers=1, dtype="float16"))
    return write_gptq_checkpoint(model, tmp_path_factory.mktemp("gptq") / "ckpt", 16, sym=False, desc_act=True)


def _exported(directory: Path) -> torch.export.ExportedProgram:
    model, _ = load_causal_lm(str(directory))
    return export_model(model)


@pytest.fixture(scope="module")
def exported(checkpoint: Path) -> torch.export.ExportedProgram:
    return _exported(checkpoint)


def test_export_keeps_int4_weights_and_the_import_makes_the_op(exported: torch.export.ExportedProgram) -> None:
    """Every quantized linear exports as `ad_mlir.linear_int4` on its int32 words, zero points,
    float16 scales and g_idx (graph weights); the import makes `ad.linear_int4` of those
    arguments with the checkpoint's group size and v1 zero offset; the LM head stays `ad.linear`."""
    ep = exported
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    routed = [n for n in calls if n.target is torch.ops.ad_mlir.linear_int4.default]
    assert len(routed) == 7
    for node in routed:
        qweight, qzeros, scales, g_idx = node.args[1:5]
        assert [t.meta["val"].dtype for t in (qweight, qzeros, scales, g_idx)] == [torch.int32, torch.int32,
                                                                                   torch.float16, torch.int32]
        assert qweight.name in ep.graph_signature.inputs_to_parameters
    assert sum(n.target is torch.ops.aten.linear.default for n in calls) == 1
    fn = import_program(ep).module.ops.first
    ops = [op for op in fn.body.block.ops if isinstance(op, ad.LinearInt4Op)]
    assert len(ops) == 7 and all(op.group_size.value.data == 16 and op.zero_offset.value.data == 1 for op in ops)


def _fused(ep: torch.export.ExportedProgram) -> list[ad.LinearInt4Op]:
    module = import_program(ep).module
    FuseGemmsPass().apply(Context(), module)
    return [op for op in module.ops.first.body.block.ops if isinstance(op, ad.LinearInt4Op)]


def test_fuse_gemms_merges_projections_sharing_their_g_idx(exported: torch.export.ExportedProgram) -> None:
    """Q/K/V share one act-order (one g_idx tensor), so do gate/up: 4 GEMMs, the fused ones over
    128 and 256 columns with that g_idx."""
    ops = _fused(exported)
    assert sorted(op.features()[0] for op in ops) == [64, 64, 128, 256]
    assert all(op.g_idx is not None for op in ops)


def test_fuse_gemms_refuses_projections_with_another_g_idx(checkpoint: Path, tmp_path: Path) -> None:
    """K's act-order made another (a valid one: a permutation of K's groups): Q and V still share
    theirs and fuse; K, whose rows fall in other groups, stays alone."""
    tensors = safetensors.torch.load_file(str(checkpoint / "model.safetensors"))
    key = "model.layers.0.self_attn.k_proj.g_idx"
    tensors[key] = tensors[key].flip(0).contiguous()
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    ops = _fused(_exported(tmp_path))
    assert sorted(op.features()[0] for op in ops) == [32, 64, 64, 96, 256]
