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


# The small-sequence attention kernel (``small_attention``): its tile's least side (tl.dot's) and its largest tile
# (query rows by head dim).
SMALL_ATTENTION_MIN_DOT = 16
SMALL_ATTENTION_MAX_ROWS = 128
SMALL_ATTENTION_MAX_HEAD_DIM = 128


def small_attention_tile(group: int, length: int, head_dim: int) -> tuple[int, int] | None:
    """(query rows, keys) of the small-attention tile for ``group`` query heads per kv head over ``length`` tokens:
    the stacked heads' rows and the keys, each a power of two of at least 16. None when the kernel does not take the
    shape (SDPA runs it): more rows than ``SMALL_ATTENTION_MAX_ROWS``, or a head dim that is not a power of two from
    16 to ``SMALL_ATTENTION_MAX_HEAD_DIM``."""
    rows = max(SMALL_ATTENTION_MIN_DOT, _next_power_of_2(group * length))
    fits_dim = SMALL_ATTENTION_MIN_DOT <= head_dim <= SMALL_ATTENTION_MAX_HEAD_DIM and not head_dim & (head_dim - 1)
    if length < 1 or group < 1 or rows > SMALL_ATTENTION_MAX_ROWS or not fits_dim:
        return None
    return rows, max(SMALL_ATTENTION_MIN_DOT, _next_power_of_2(length))


def small_attention_grid(batch: int, kv_heads: int) -> tuple[int, int]:
    """One program per (batch row, kv head), over all its query heads."""
    return batch, kv_heads


def small_attention_warps(rows: int, head_dim: int, element_size: int, rope: bool = False) -> int:
    """Warps of a small-attention program: one per 4 KB of its query tile, at least 4, so that the query tile and the
    output accumulator fit the registers without spilling (bf16 [128, 128]: 8 warps, ~120 registers a thread). With
    RoPE inside, the query tile's fp32 rotation (the tile, its rotated half and the cos and sin rows: four fp32 tiles
    at once) counts: one warp per 4 KB of a float32 query tile (bf16 [128, 128]: 16 warps). A float32 model's IEEE dots
    (no TF32) need one warp per 2 KB of its query tile (float32 [128, 128]: 32 warps): at 4 KB, Triton 3.6's ptxas
    spills them (4.8 KB a thread at [128, 128], tests/kernels/test_compile_sm90.py)."""
    per_element = 8 if element_size == 4 else 4 if rope else element_size
    return max(4, rows * head_dim * per_element // 4096)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
