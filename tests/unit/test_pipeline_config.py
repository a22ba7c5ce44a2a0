"""Pipelines by name, as pass strings and as AutoDeploy-shaped YAML, all onto one registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kernel_guard import graph_kernels

import ad_mlir
from ad_mlir.passes import get_ad_passes
from ad_mlir.passes.canonicalize import CanonicalizePass
from ad_mlir.passes.fuse_elementwise import FuseElementwisePass
from ad_mlir.passes.pipeline import PIPELINES, PipelineConfig, PipelineConfigError, load_pipeline


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def test_names_and_pass_strings() -> None:
    assert PIPELINES["default"] == (
        "canonicalize,match-layernorm,match-rmsnorm,fuse-add-rmsnorm,fuse-add-layernorm,match-moe,fuse-gemms,"
        "fuse-silu-mul,fuse-gelu-mul,fuse-activation,fuse-rmsnorm-quant,fuse-rope-attention,optimize-rope,decompose,"
        "fuse-elementwise"
    )
    assert [p.name for p in load_pipeline("default").passes] == PIPELINES["default"].split(",")
    assert load_pipeline("none").passes == ()
    assert load_pipeline("canonicalize,fuse-elementwise{max-ops=4}").passes == (CanonicalizePass(),
                                                                                  FuseElementwisePass(max_ops=4))
    assert load_pipeline("canonicalize,fuse-elementwise{max-ops=4}").spec == "canonicalize,fuse-elementwise{max_ops=4}"


def test_a_pipeline_of_pass_objects_is_taken_as_it_is() -> None:
    config = PipelineConfig((FuseElementwisePass(max_ops=2),), skip_on_error=False)
    assert load_pipeline(config) is config


def test_yaml_in_order_with_options_and_disabled_passes(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "transforms:\n"
        "  canonicalize: {enabled: true}\n"
        "  decompose: {enabled: false}\n"
        "  fuse_elementwise:\n"
        "    max_ops: 2\n"
        "    allow_reductions: false\n",
    )
    assert load_pipeline(path).passes == (CanonicalizePass(), FuseElementwisePass(max_ops=2, allow_reductions=False))
    assert load_pipeline(str(path)) == load_pipeline(path)


def test_compile_takes_a_yaml_file(tmp_path: Path) -> None:
    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(-x).sin().cos() * 2.0

    x = torch.randn(4, 8)
    ep = torch.export.export(Chain(), (x,))
    path = _yaml(tmp_path, "transforms:\n  fuse_elementwise: {max_ops: 2}\n")
    gm = ad_mlir.compile(ep, pipeline=path)
    assert len(graph_kernels(gm)) == 3  # neg+exp, sin+cos, mul: two ops per region at most
    torch.testing.assert_close(gm(x)[0], Chain()(x))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("transforms:\n  fuse_everything: {}\n", "unknown transform 'fuse_everything' (known: canonicalize"),
        ("passes: [canonicalize]\n", "expected 'transforms:' mapping pass names to their options"),
        ("transforms:\n  canonicalize: yes please\n", "options of 'canonicalize' must be a mapping"),
        ("transforms: {canonicalize: [\n", "while parsing a flow"),
        ("transforms:\n  fuse_elementwise: {max_ops: many}\n", "Incompatible types"),
    ],
)
def test_bad_yaml_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = _yaml(tmp_path, text)
    with pytest.raises(PipelineConfigError, match=None) as info:
        load_pipeline(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


@pytest.mark.parametrize("name", sorted(get_ad_passes()))
def test_every_pass_is_a_frozen_dataclass(name: str) -> None:
    """A pass is its options (`-p 'name{option=value}'`), fixed once made: nothing can be set on
    it afterwards, an option or not."""
    instance = get_ad_passes()[name]()()
    with pytest.raises(dataclasses.FrozenInstanceError):
        instance.anything = 1  # type: ignore[attr-defined]
