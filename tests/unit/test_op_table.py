"""The op table: Python argument values <-> attributes round-trip exactly, and every `ad` op
has one table entry, so import, export and the evaluator share one definition."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ad_mlir.dialects import ad
from ad_mlir.semantics import op_table as T

_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.none(),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64]),
    st.sampled_from([torch.device("cpu"), torch.device("cuda", 1), torch.strided, torch.contiguous_format]),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


def _same(a: object, b: object) -> bool:
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@settings(suppress_health_check=[HealthCheck.too_slow])  # a timing check: it failed CI on a loaded machine
@given(_values)
def test_argument_values_round_trip_through_attributes(value: object) -> None:
    assert _same(T.attr_to_value(T.value_to_attr(value)), value)


@given(st.dictionaries(st.text(min_size=1, max_size=6), _scalars, max_size=4))
def test_keyword_arguments_round_trip(kwargs: dict[str, object]) -> None:
    back = T.attr_to_value(T.value_to_attr(kwargs))
    assert back.keys() == kwargs.keys() and all(_same(back[k], v) for k, v in kwargs.items())


def test_every_typed_op_has_one_table_entry() -> None:
    """Constants are values, torch_op carries its own target, fused/yield are structure."""
    covered = [spec.op for spec in T.SPECS]
    assert len(covered) == len(set(covered))
    untabled = {
        op.name for op in ad.Ad.operations if op not in covered and op not in (ad.ConstantOp, ad.TorchOp, ad.FusedOp, ad.YieldOp)
    }
    assert untabled == set()
