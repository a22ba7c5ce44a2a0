"""`frontends/torch_patches.multiples_collapsed`: torch's symbolic Min and Max collapse two
multiples of one size as torch 2.13's do, where torch does not (emulated here as torch 2.11: its
`MinMaxBase` has no `_collapse_known_multiplicative_terms`), and nothing changes where it does."""

from __future__ import annotations

import pytest
import sympy
from torch.utils._sympy.functions import Max, Min, MinMaxBase

from ad_mlir.frontends.torch_patches import multiples_collapsed

S, T = sympy.symbols("s t", integer=True, positive=True)


@pytest.fixture
def torch_2_11_min(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MinMaxBase, "_collapse_known_multiplicative_terms", classmethod(lambda cls, values: None),
                        raising=False)


def test_two_multiples_of_one_size_collapse_within_and_not_after(torch_2_11_min: None) -> None:
    assert isinstance(Min(64 * S, 192 * S), Min)  # what torch 2.11 leaves
    with multiples_collapsed():
        assert Min(64 * S, 192 * S) == 64 * S
        assert Max(64 * S, 192 * S) == 192 * S
        assert Min(-2 * S, -3 * S) == -3 * S
    assert isinstance(Min(64 * S, 192 * S), Min)


def test_what_is_not_two_multiples_of_one_size_is_left_to_torch(torch_2_11_min: None) -> None:
    cases = [(64 * S, 192 * T), (-S, -S * T), (64 * S, 192 * S, 7 * T), (4, 64 * S)]
    expected = [Min(*case) for case in cases]
    with multiples_collapsed():
        assert [Min(*case) for case in cases] == expected


def test_a_torch_that_collapses_them_itself_is_left_alone() -> None:
    if isinstance(Min(64 * S, 192 * S), Min):
        pytest.skip("this torch leaves Min(64*s, 192*s) as it is (before 2.13)")
    before = MinMaxBase.__dict__["_find_localzeros"]
    with multiples_collapsed():
        assert MinMaxBase.__dict__["_find_localzeros"] is before
