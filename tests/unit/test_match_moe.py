"""`match-moe` on real exports: HF's MoE blocks (the grouped form transformers 5 exports) and a
hand-written per-expert loop become one `ad.moe` whose meaning (the reference evaluator, which
runs the op's torch reference) equals the eager block; what does not fit stays byte-identical,
and the log says why."""

from __future__ import annotations

import logging

import pytest
import torch
from moe_blocks import LoopMoe, hf_block, moe_config

from ad_mlir.dialects import ad
from ad_mlir.frontends.fx_import import ImportedProgram, import_program
from ad_mlir.passes.pipeline import run_pipeline
from ad_mlir.semantics.reference import evaluate

GONE = ("aten.topk.default", "aten.sort.default", "aten.histc.default", "aten.cumsum.default",
        "transformers.grouped_mm_fallback.default", "aten._grouped_mm.default", "aten.index.Tensor",
        "aten.index_put_.default", "aten.index_add_.default", "aten.where.default", "aten.one_hot.default",
        "aten._assert_scalar.default")


def _export(block: torch.nn.Module, x: torch.Tensor, tokens_dim: int) -> ImportedProgram:
    with torch.no_grad():
        ep = torch.export.export(block, (x,), dynamic_shapes=({tokens_dim: torch.export.Dim("T", max=1024)},),
                                 strict=False)
    program = import_program(ep)
    run_pipeline(program.module, "canonicalize")
    return program


def _ops(program: ImportedProgram) -> list:
    return list(program.function.body.block.ops)


def _matched(program: ImportedProgram) -> ad.MoeOp:
    run_pipeline(program.module, "match-moe")
    ops = _ops(program)
    moes = [op for op in ops if isinstance(op, ad.MoeOp)]
    assert len(moes) == 1
    assert not [op.target.data for op in ops if isinstance(op, ad.TorchOp) and op.target.data in GONE]
    return moes[0]


def _check_outputs(program: ImportedProgram, block: torch.nn.Module, shapes: list[tuple[int, ...]],
                   dtype: torch.dtype) -> None:
    """fp32: torch.testing's defaults (the reference loop sums each token's experts in another
    order). bf16: the op sums in fp32 and rounds once where the blocks round the products and
    partial sums (Qwen) or the loop's adds (index_add_ in bf16): a few bf16 ulps (2^-8 relative)."""
    tolerance = {} if dtype == torch.float32 else {"atol": 4 * 2.0**-8, "rtol": 4 * 2.0**-8}
    for shape in shapes:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[-2])).to(dtype)
        with torch.no_grad():
            expected = block(x)
        got = evaluate(program.module, program.weights, [x])[0]
        torch.testing.assert_close(got.float(), expected.float(), **tolerance)


@pytest.mark.parametrize(("family", "dtype", "properties"), [
    ("mixtral", torch.float32, {"top_k": 2, "normalize": True}),
    ("mixtral", torch.bfloat16, {"top_k": 2, "normalize": True}),
    ("qwen3_moe", torch.bfloat16, {"top_k": 2, "round_weights": True}),
    ("olmoe", torch.float32, {"top_k": 2}),
    ("qwen2_moe", torch.float32, {"top_k": 2, "shared_experts": 2}),
    ("qwen2_moe", torch.bfloat16, {"top_k": 2, "shared_experts": 2, "round_weights": True}),
])
def test_hf_blocks_become_one_moe_op(family: str, dtype: torch.dtype, properties: dict) -> None:
    block = hf_block(family, moe_config(family), dtype)
    program = _export(block, torch.randn(1, 5, 48, dtype=dtype), 1)
    moe = _matched(program)
    assert {name: getattr(moe, name) is not None for name in ("normalize", "round_weights")} == {
        name: name in properties for name in ("normalize", "round_weights")}
    assert moe.top_k.value.data == properties["top_k"] and moe.num_shared == properties.get("shared_experts", 0)
    assert (moe.shared_gate is not None) == ("shared_experts" in properties)
    _check_outputs(program, block, [(1, 1, 48), (1, 11, 48)], dtype)


@pytest.mark.parametrize(("dtype", "topk_first"), [(torch.float32, False), (torch.bfloat16, False),
                                                   (torch.float32, True)])
def test_the_per_expert_loop_becomes_one_moe_op_with_stacked_weights(dtype: torch.dtype, topk_first: bool) -> None:
    torch.manual_seed(0)
    block = LoopMoe(experts=3, topk_first=topk_first).eval().to(dtype)
    program = _export(block, torch.randn(5, 48, dtype=dtype), 0)
    moe = _matched(program)
    assert moe.normalize is not None and (moe.round_weights is not None) == (dtype != torch.float32)
    assert [op.name for op in (moe.gate_up.owner, moe.down.owner)] == ["ad.reshape", "ad.reshape"]
    assert len(moe.gate_up.owner.input.owner.operands) == 6  # w1, w3 of each expert, in order
    _check_outputs(program, block, [(1, 48), (13, 48)], dtype)


def test_a_shared_expert_of_another_size_stays_outside(caplog: pytest.LogCaptureFixture) -> None:
    """A shared intermediate size of 40, not a multiple of the experts' 32: the routed experts
    become `ad.moe`, the shared expert's linears and gate stay, and the result is still right."""
    block = hf_block("qwen2_moe", moe_config("qwen2_moe", shared_expert_intermediate_size=40))
    program = _export(block, torch.randn(1, 5, 48), 1)
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.match_moe"):
        moe = _matched(program)
    assert moe.num_shared == 0 and moe.shared_gate is None
    assert "its intermediate size 40 is not a multiple of the experts' 32" in caplog.text
    assert sum(isinstance(op, ad.LinearOp) for op in _ops(program)) == 5  # router, shared gate/up/down, sigmoid gate
    _check_outputs(program, block, [(1, 7, 48)], torch.float32)


@pytest.mark.parametrize(("config", "reason"), [
    ({"hidden_act": "gelu"}, "experts whose activation is not silu(gate) * up"),
])
def test_blocks_that_do_not_fit_stay_byte_identical(config: dict, reason: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    block = hf_block("mixtral", moe_config("mixtral", **config))
    program = _export(block, torch.randn(1, 5, 48), 1)
    before = str(program.module)
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.match_moe"):
        run_pipeline(program.module, "match-moe")
    assert str(program.module) == before
    assert f"is not an MoE block this pass knows: {reason}" in caplog.text and "gate" in caplog.text


def test_a_loop_that_skips_an_expert_stays_byte_identical(caplog: pytest.LogCaptureFixture) -> None:
    """A loop over all experts but the last: its tokens get nothing from it, which `ad.moe`
    cannot say."""

    class Skipping(LoopMoe):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            experts, self.experts = self.experts, self.experts[:-1]
            try:
                return super().forward(x)
            finally:
                self.experts = experts

    torch.manual_seed(0)
    program = _export(Skipping(experts=3).eval(), torch.randn(5, 48), 0)
    before = str(program.module)
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.match_moe"):
        run_pipeline(program.module, "match-moe")
    assert str(program.module) == before
    assert "a loop that does not visit every expert once" in caplog.text


class _LoopVariant(LoopMoe):
    """`LoopMoe` (its default form: softmax, top-k, normalized) with one thing changed: the
    softmax over `softmax_dim`, the normalization out of place (`w / w.sum(...)`, an `ad.div`,
    where HF's `w /= ...` stays torch's `div_`), or each expert's up projection reading its
    tokens reversed along the hidden dim."""

    def __init__(self, softmax_dim: int = 1, out_of_place: bool = False, flip_up: bool = False):
        super().__init__(experts=3)
        self.softmax_dim, self.out_of_place, self.flip_up = softmax_dim, out_of_place, flip_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.gate(x), dim=self.softmax_dim, dtype=torch.float)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        total = weights.sum(dim=-1, keepdim=True)
        if self.out_of_place:
            weights = weights / total
        else:
            weights /= total
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, num_classes=self.num_experts).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, tokens = torch.where(mask[e])
            h = x[tokens]
            up = expert.w3(h.flip(-1) if self.flip_up else h)
            y = expert.w2(torch.nn.functional.silu(expert.w1(h)) * up) * weights[tokens, slot, None]
            out.index_add_(0, tokens, y.to(x.dtype))
        return out


def test_a_normalization_written_out_of_place_is_matched_too() -> None:
    torch.manual_seed(0)
    block = _LoopVariant(out_of_place=True).eval()
    program = _export(block, torch.randn(5, 48), 0)
    assert any(isinstance(op, ad.DivOp) for op in _ops(program))
    assert _matched(program).normalize is not None
    _check_outputs(program, block, [(1, 48), (13, 48)], torch.float32)


@pytest.mark.parametrize(("variant", "reason"), [
    ({"softmax_dim": 0}, "the top-k values"),  # a softmax over the tokens is no router: its top-k is read otherwise
    ({"flip_up": True}, "an expert's gate and up projections that are not linears of its tokens"),
])
def test_near_misses_of_the_loop_stay_byte_identical(variant: dict, reason: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    program = _export(_LoopVariant(**variant).eval(), torch.randn(5, 48), 0)
    before = str(program.module)
    with caplog.at_level(logging.INFO, logger="ad_mlir.passes.match_moe"):
        run_pipeline(program.module, "match-moe")
    assert str(program.module) == before
    assert "is not an MoE block this pass knows" in caplog.text and reason in caplog.text, caplog.text
