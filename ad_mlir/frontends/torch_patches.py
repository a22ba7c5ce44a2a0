"""Symbolic-shape reasoning that torch.export needs from torch and that torch before 2.13 lacks,
supplied while the project exports (`multiples_collapsed`).

torch before 2.13 (2.11, the GPU machines' torch, checked; 2.13 has it) leaves the minimum of two
multiples of one size unsimplified: `Min(64*s, 192*s)` stays as it is where 2.13 gives `64*s`
(`torch.utils._sympy.functions.MinMaxBase._collapse_known_multiplicative_terms`, new in 2.13).
Reshaping a contiguous [batch, kv_heads, n_rep, seq, head_dim] into [batch, heads, seq, head_dim]
gives the merged heads such a stride (`torch._prims._collapse_view_helper` takes the least stride
of the dims it merges), and the contiguity check of the result then guards on
`Eq(Min(64*seq, 192*seq), 64*seq)`: true for every length, but torch.export cannot prove it and
refuses the dynamic sequence ("Constraints violated (seq)"). HF's `repeat_kv` is that reshape, so
every grouped-query model failed to export with a dynamic length under torch 2.11, on any device
and in any dtype (seen first as SmolLM2 in bf16 on an H100; the same failure on the CPU under
2.11, and with fake CUDA tensors). One key/value head leaves no heads to merge, which is why
models with one passed there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sympy
from torch.utils._sympy import functions


def _collapse_multiples(cls: type, values: list[sympy.Expr]) -> sympy.Expr | None:
    """Min or Max (`cls`) of two multiples `a*t`, `b*t` of one nonnegative or nonpositive term
    with comparable coefficients: the one that is least (Min) or greatest (Max); else None. What
    torch 2.13's `_collapse_known_multiplicative_terms` does."""
    if len(values) != 2:
        return None
    (a_coeff, a_term), (b_coeff, b_term) = (v.as_coeff_Mul() for v in values)
    if a_term != b_term or not (a_coeff.is_comparable and b_coeff.is_comparable):
        return None
    if a_term.is_nonnegative:
        a_smaller = bool(a_coeff <= b_coeff)
    elif a_term.is_nonpositive:
        a_smaller = bool(a_coeff >= b_coeff)
    else:
        return None
    return values[0] if a_smaller == (cls is functions.Min) else values[1]


def forget_min_max_results() -> None:
    """Clear torch's caches of the Min and Max expressions of SymInts (an `lru_cache` per SymNode
    method, process-wide): a Min built before `multiples_collapsed` (another export, a
    torch.compile) would otherwise come back unsimplified within it. Found through the methods'
    closures, as torch keeps them nowhere else."""
    from torch.fx.experimental.sym_node import SymNode

    seen: set[int] = set()
    todo = [getattr(SymNode, "_sym_min", None), getattr(SymNode, "_sym_max", None)]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
            continue
        todo.extend(cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
                    if callable(cell.cell_contents))


def _collapses_multiples() -> bool:
    """Whether this torch simplifies the Min of two multiples of a size by itself."""
    size = sympy.Symbol("s", integer=True, positive=True)
    return functions.Min(64 * size, 192 * size) == 64 * size


@contextlib.contextmanager
def multiples_collapsed() -> Iterator[None]:
    """Within it, torch's symbolic Min and Max collapse two multiples of one size as torch 2.13
    does (`_collapse_multiples`, tried before torch's own simplification); nothing changes where
    torch does it already."""
    if _collapses_multiples():
        yield
        return
    original = functions.MinMaxBase.__dict__["_find_localzeros"]
    forget_min_max_results()

    def find_localzeros(cls: type, values: Any, **options: Any) -> Any:
        values = list(values)
        collapsed = None if any(v.is_Number for v in values) else _collapse_multiples(cls, values)
        return {collapsed} if collapsed is not None else original.__func__(cls, values, **options)

    functions.MinMaxBase._find_localzeros = classmethod(find_localzeros)
    try:
        yield
    finally:
        functions.MinMaxBase._find_localzeros = original
