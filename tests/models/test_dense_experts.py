"""MoE blocks that loop over the experts their routing hit (DBRX, LongCat-Flash with its
zero-compute experts) export with every expert on every token (`export_patches.DENSE_EXPERTS`):
the exported program equals HF's eager forward, at another length than it was traced at, and
HF's own forward is back after the export."""

from __future__ import annotations

import pytest
import torch

from ad_mlir.frontends.export import export_with_ids
from ad_mlir.frontends.export_patches import routed_for_export
from ad_mlir.zoo.small import model_from_config, small_config


@pytest.mark.parametrize(("family", "experts"), [("dbrx", "DbrxExperts"), ("longcat_flash", "LongcatFlashExperts")])
def test_moe_with_a_loop_over_hit_experts_exports_and_equals_eager(family: str, experts: str) -> None:
    config = small_config(family)
    config.initializer_range = 0.5  # routing weights far from uniform: a wrong weight shows
    model = model_from_config(config)
    cls = next(type(m) for m in model.modules() if type(m).__name__ == experts)
    hf_forward = cls.forward
    with routed_for_export() as routed:
        assert f"{cls.__module__}.{experts}.forward" in routed and cls.forward is not hf_forward
    assert cls.forward is hf_forward
    ids = torch.randint(1, 1000, (1, 11), generator=torch.Generator().manual_seed(0))
    ep = export_with_ids(model, ids[:, :5], max_seq=64)
    assert cls.forward is hf_forward
    picked: list[torch.Tensor] = []
    for m in model.modules():
        if type(m) is cls:
            m.register_forward_pre_hook(lambda _, args: picked.append(args[1]))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with routed_for_export():
            dense = model(input_ids=ids).logits
        got = ep.module()(input_ids=ids).logits
    torch.testing.assert_close(got, dense)  # the export of the dense form: the same fp32 ops
    # the dense form against HF's: the same sums in HF's order (plus exact zeros), but the expert
    # matmuls run on every row where HF's run on the routed rows, and BLAS rounds a row another way
    # with another row count; a few ulps, grown through 2 layers with the wide init (measured: 11
    # ulps of the largest logit for DBRX, 3 for LongCat); a wrong weight or expert is O(logits)
    largest = expected.abs().max().item()
    torch.testing.assert_close(dense, expected, rtol=0, atol=32 * torch.finfo(torch.float32).eps * largest)
    hit = torch.cat([p.flatten() for p in picked]).unique()
    assert len(hit) > 2  # several experts were hit, not all tokens routed alike
    if family == "longcat_flash":  # a zero-compute expert was among them
        assert (hit >= config.n_routed_experts).any()
