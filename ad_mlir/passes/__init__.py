"""The pass registry: pass name -> getter of its ModulePass class (imported lazily, so
`ad-opt` starts fast). A new pass joins by adding one entry to `_AD_PASSES`."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _cse() -> type[ModulePass]:
    from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination

    return CommonSubexpressionElimination


def _dce() -> type[ModulePass]:
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    return DeadCodeElimination


def _canonicalize() -> type[ModulePass]:
    from ad_mlir.passes.canonicalize import CanonicalizePass

    return CanonicalizePass


def _fuse_elementwise() -> type[ModulePass]:
    from ad_mlir.passes.fuse_elementwise import FuseElementwisePass

    return FuseElementwisePass


def _decompose() -> type[ModulePass]:
    from ad_mlir.passes.decompose import DecomposePass

    return DecomposePass


def _match_rmsnorm() -> type[ModulePass]:
    from ad_mlir.passes.match_rmsnorm import MatchRmsNormPass

    return MatchRmsNormPass


def _match_moe() -> type[ModulePass]:
    from ad_mlir.passes.match_moe import MatchMoePass

    return MatchMoePass


def _fuse_add_rmsnorm() -> type[ModulePass]:
    from ad_mlir.passes.fuse_add_rmsnorm import FuseAddRmsNormPass

    return FuseAddRmsNormPass


def _match_layernorm() -> type[ModulePass]:
    from ad_mlir.passes.match_layernorm import MatchLayerNormPass

    return MatchLayerNormPass


def _fuse_add_layernorm() -> type[ModulePass]:
    from ad_mlir.passes.fuse_add_layernorm import FuseAddLayerNormPass

    return FuseAddLayerNormPass


def _fuse_gemms() -> type[ModulePass]:
    from ad_mlir.passes.fuse_gemms import FuseGemmsPass

    return FuseGemmsPass


def _fuse_silu_mul() -> type[ModulePass]:
    from ad_mlir.passes.fuse_silu_mul import FuseSiluMulPass

    return FuseSiluMulPass


def _fuse_gelu_mul() -> type[ModulePass]:
    from ad_mlir.passes.fuse_gelu_mul import FuseGeluMulPass

    return FuseGeluMulPass


def _fuse_activation() -> type[ModulePass]:
    from ad_mlir.passes.fuse_activation import FuseActivationPass

    return FuseActivationPass


def _quantize_linear_fp8() -> type[ModulePass]:
    from ad_mlir.passes.quantize_linear_fp8 import QuantizeLinearFp8Pass

    return QuantizeLinearFp8Pass


def _fuse_rmsnorm_quant() -> type[ModulePass]:
    from ad_mlir.passes.fuse_rmsnorm_quant import FuseRmsNormQuantPass

    return FuseRmsNormQuantPass


def _fuse_rope_attention() -> type[ModulePass]:
    from ad_mlir.passes.fuse_rope_attention import FuseRopeAttentionPass

    return FuseRopeAttentionPass


def _optimize_rope() -> type[ModulePass]:
    from ad_mlir.passes.optimize_rope import OptimizeRopePass

    return OptimizeRopePass


def _insert_cached_attention() -> type[ModulePass]:
    from ad_mlir.passes.insert_cached_attention import InsertCachedAttentionPass

    return InsertCachedAttentionPass


def _shard() -> type[ModulePass]:
    from ad_mlir.passes.shard import ShardPass

    return ShardPass


def _capture_hidden_states() -> type[ModulePass]:
    from ad_mlir.passes.capture_hidden_states import CaptureHiddenStatesPass

    return CaptureHiddenStatesPass


def _default() -> type[ModulePass]:
    from ad_mlir.passes.default import DefaultPipelinePass

    return DefaultPipelinePass


_XDSL_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "cse": _cse,
    "dce": _dce,
}
"""xDSL's own passes that our pipelines use (xdsl-opt already knows them)."""

_AD_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize": _canonicalize,
    "decompose": _decompose,
    "fuse-elementwise": _fuse_elementwise,
    "match-rmsnorm": _match_rmsnorm,
    "fuse-add-rmsnorm": _fuse_add_rmsnorm,
    "match-layernorm": _match_layernorm,
    "fuse-add-layernorm": _fuse_add_layernorm,
    "match-moe": _match_moe,
    "fuse-gemms": _fuse_gemms,
    "fuse-silu-mul": _fuse_silu_mul,
    "fuse-gelu-mul": _fuse_gelu_mul,
    "fuse-activation": _fuse_activation,
    "fuse-rope-attention": _fuse_rope_attention,
    "optimize-rope": _optimize_rope,
    "quantize-linear-fp8": _quantize_linear_fp8,
    "fuse-rmsnorm-quant": _fuse_rmsnorm_quant,
    "shard": _shard,
    "insert-cached-attention": _insert_cached_attention,
    "capture-hidden-states": _capture_hidden_states,
    "default": _default,
}
"""Passes defined by ad-mlir. Those whose name xDSL does not use are registered with xdsl-opt
through the universe; xdsl-opt's own `canonicalize` still applies the `ad` patterns (traits)."""


def get_ad_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    return dict(_AD_PASSES)


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    return {**_XDSL_PASSES, **_AD_PASSES}
