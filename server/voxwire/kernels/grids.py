"""Launch grids of the Triton kernels in ``fused``, without Triton: the wrappers launch with them, and
``scripts/count_step_cost.py`` counts a step's programs (CTAs) with them.
"""

from __future__ import annotations

# Columns per program of the row-wise kernels (SiLU*mul), and the widest row tile of the row-tiled ones.
ELEMENTWISE_BLOCK = 1024
# Elements per program of the row-tiled VAE kernels: [TILE // BLOCK_T rows, BLOCK_T samples], so a stage
# with rows of 5 samples fills a program with many rows instead of masking 99 % of a 1024-wide block.
TILE = 2048
ROW_BLOCKS = (16, 128, ELEMENTWISE_BLOCK)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_block(length: int) -> int:
    """BLOCK_T of a row-tiled kernel over rows of ``length`` samples: the first of 16, 128 and 1024 that holds
    the row (longer rows take several programs along time). Three widths bound the compiled variants; the
    masked lanes of a part-filled row cost far less than the one-program-per-row launches they replace."""
    return next((block for block in ROW_BLOCKS if block >= length), ELEMENTWISE_BLOCK)


def row_tiles(rows: int, length: int) -> tuple[tuple[int, int], int, int]:
    """Grid, ROWS and BLOCK_T of a row-tiled kernel (Snake, Snake-with-past, conv-transpose output) over
    ``rows`` rows of ``length`` samples."""
    block_t = row_block(length)
    per_program = TILE // block_t
    return (cdiv(rows, per_program), cdiv(length, block_t)), per_program, block_t


def silu_mul_grid(rows: int, n_cols: int) -> tuple[int, int]:
    return rows, cdiv(n_cols, ELEMENTWISE_BLOCK)


def rms_norm_grid(rows: int) -> tuple[int]:
    return (rows,)


def rope_grid(batch: int, length: int) -> tuple[int, int]:
    """One program per (batch row, token), over all its q and k heads."""
    return batch, length
