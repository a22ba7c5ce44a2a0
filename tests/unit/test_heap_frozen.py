"""`heap_frozen`: while exporting and compiling, the objects that existed before are left out of
the cyclic garbage collection (a full collection over a 32-layer model's export costs ~0.5 s),
and taken back after; a caller's own `gc.freeze` is left as it was."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import ad_mlir
import ad_mlir.compiler
from ad_mlir.frontends.export import heap_frozen


class _Old:
    """A tracked object made before the freeze."""


@pytest.fixture(autouse=True)
def _nothing_frozen() -> None:
    assert gc.get_freeze_count() == 0, "the test needs a process whose heap is not frozen"


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_older_objects_are_frozen_within_and_taken_back_after() -> None:
    old = _Old()
    with heap_frozen():
        assert gc.get_freeze_count() > 0 and not _tracked(old)
        new = _Old()
        assert _tracked(new)
    assert gc.get_freeze_count() == 0 and _tracked(old)


def test_taken_back_when_the_body_raises() -> None:
    with pytest.raises(ValueError), heap_frozen():
        raise ValueError
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_alone() -> None:
    """Neither frozen again within (an object made after the caller's freeze stays tracked) nor
    taken back after (the caller's frozen objects stay frozen). Not an exact count: a frozen
    object another thread frees (pytest-xdist's) leaves the count."""
    gc.freeze()
    try:
        after_freeze = _Old()
        with heap_frozen():
            assert _tracked(after_freeze)
        assert gc.get_freeze_count() > 0 and _tracked(after_freeze)
    finally:
        gc.unfreeze()


def test_compile_generates_code_with_the_heap_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    build = ad_mlir.compiler.build_kernels

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_freeze_count())
        return build(*args, **kwargs)

    monkeypatch.setattr(ad_mlir.compiler, "build_kernels", recording)
    ep = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    ad_mlir.compile(ep, pipeline="none")
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0
