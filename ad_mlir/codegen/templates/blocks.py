"""Block sizes and warps, keyed by the row length: one table shared by codegen (which picks a
single-tile or a looped row kernel) and the generated launchers (which pick at run time)."""

from __future__ import annotations

from ad_mlir.dialects.kernel_forms import next_power_of_2

MAX_ROW_BLOCK = 8192
"""Longest row a row kernel holds in one tile; longer rows loop over tiles of this size."""

POINTWISE_TILE = 1024
"""Elements per program of a pointwise kernel (rows x columns)."""


def _warps(elements: int) -> int:
    return 4 if elements <= 2048 else 8 if elements <= 8192 else 16


def pointwise_blocks(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps) for a pointwise kernel over `n_rows` rows of `n_cols`
    (no more tile rows than there are rows: a one-row domain does not mask off 3/4 of a tile)."""
    block_c = min(next_power_of_2(n_cols), POINTWISE_TILE)
    block_r = max(1, min(POINTWISE_TILE // block_c, next_power_of_2(n_rows)))
    return block_r, block_c, _warps(block_r * block_c)


def row_fits_one_tile(n_cols: int) -> bool:
    return next_power_of_2(n_cols) <= MAX_ROW_BLOCK


def row_blocks(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps) for a row kernel: the whole row in one tile when it fits
    (several short rows per program), else tiles of MAX_ROW_BLOCK."""
    block_c = min(next_power_of_2(n_cols), MAX_ROW_BLOCK)
    block_r = max(1, min(16, 1024 // block_c, next_power_of_2(n_rows)))
    return block_r, block_c, _warps(block_r * block_c)
