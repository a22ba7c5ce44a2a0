"""The table of kernel emitters (`codegen/emitters.py`) names each template by its module: each
entry must resolve to that module's `KernelEmitter`, and each template module must be in the
table (a template no op reaches would be dead)."""

import importlib
from pathlib import Path

import pytest

from ad_mlir.codegen import emitters, lowering, templates
from ad_mlir.dialects import ad


@pytest.mark.parametrize("op_type", list(emitters.TEMPLATES), ids=lambda t: t.name)
def test_every_templated_op_has_its_template_s_emitter(op_type: type) -> None:
    module = importlib.import_module(f"ad_mlir.codegen.templates.{emitters.TEMPLATES[op_type]}")
    assert isinstance(module.EMITTER, emitters.KernelEmitter)


def test_every_op_template_is_in_the_table() -> None:
    modules = {p.stem for p in Path(templates.__file__).parent.glob("*_kernel.py")} - {"region_kernel"}
    assert modules == set(emitters.TEMPLATES.values())


def test_kernel_ops_are_the_llm_level_ops_and_the_templated_ops_that_write_state() -> None:
    writers = {ad.CachedAttentionOp, ad.CachedMlaAttentionOp,
               ad.CachedIndexTopkOp, ad.CachedCausalConv1dOp, ad.CachedSsmScanOp, ad.CachedSelectiveScanOp,
               ad.CachedGatedDeltaRuleOp, ad.CachedRgLruOp,
               ad.CachedWkvOp}
    assert set(lowering.KERNEL_OPS) == {ad.KernelOp, *writers}
