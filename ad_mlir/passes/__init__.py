"""The pass registry: pass name -> getter of its ModulePass class (imported lazily, so
`ad-opt` starts fast). A new pass joins by adding one entry to `_AD_PASSES`."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _canonicalize() -> type[ModulePass]:
    from xdsl.transforms.canonicalize import CanonicalizePass

    return CanonicalizePass


def _dce() -> type[ModulePass]:
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    return DeadCodeElimination


_XDSL_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize": _canonicalize,
    "dce": _dce,
}
"""xDSL's own passes that our pipelines use (xdsl-opt already knows them)."""

_AD_PASSES: dict[str, Callable[[], type[ModulePass]]] = {}
"""Passes defined by ad-mlir (also registered with xdsl-opt through the universe)."""


def get_ad_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    return dict(_AD_PASSES)


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    return {**_XDSL_PASSES, **_AD_PASSES}
