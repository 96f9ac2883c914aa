"""Which tile: the kernels' configurations by name, and how the table picks a block tile for a product (the largest
that gives half the SMs a block with little padding, past one wave no mostly idle last one)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..kernels import configs
from ..kernels.configs import KernelConfig, get_config
from .problem import Choice, Device, Problem

__all__ = ["wave_efficiency", "small_tile", "SMALL_TILES"]

# The table's configurations by name: the objects are built once, in kernels/configs.py.
NAIVE, SMEM16, SMEM32 = configs.NAIVE.name, configs.SMEM16.name, configs.SMEM32.name
NAIVE_F64, NAIVE_F64_DOT, NAIVE_SHORT = configs.NAIVE_F64.name, configs.NAIVE_F64_DOT.name, configs.NAIVE_SHORT.name
RT128, RT128x64, RT64 = configs.RT128.name, configs.RT128x64.name, configs.RT64.name
WT256_LOOP, WT256_32, WT256 = configs.WT256_LOOP.name, configs.WT256_32.name, configs.WT256.name
WT256_LOOP16, WT256_SLICES = configs.WT256_LOOP16.name, configs.WT256_SLICES.name
WT128x64_LOOP, WT128x64, WT128x64_RUNS = configs.WT128x64_LOOP.name, configs.WT128x64.name, configs.WT128x64_RUNS.name
WT128x64_SUMS, WT64, WT64_SHORT = configs.WT128x64_SUMS.name, configs.WT64.name, configs.WT64_SHORT.name
WT64_SHORT8 = configs.WT64_SHORT8.name
WT32x128, WT128x32 = configs.WT32x128.name, configs.WT128x32.name
WT256_LOOP16_RAGGED, WT256_SLICES_RAGGED = configs.WT256_LOOP16_RAGGED.name, configs.WT256_SLICES_RAGGED.name
# Each sub-tile loop's twin for a K that is not a multiple of its K-tile (the last K % 16 terms after the loop).
_RAGGED = {WT256_LOOP16: WT256_LOOP16_RAGGED, WT256_SLICES: WT256_SLICES_RAGGED,
           WT128x64_LOOP: configs.WT128x64_LOOP_RAGGED.name, WT128x64_RUNS: configs.WT128x64_RUNS_RAGGED.name}
FEW_COLUMNS = tuple(c.name for c in configs.FEW_COLUMNS)
FEW_COLUMNS_32 = configs.FEW_COLUMNS_WIDE[0].name  # 17 to 32 columns, a lane per row of C
TF32_TILES, TF32X3_TILES = tuple(c.name for c in configs.TF32_TILES), tuple(c.name for c in configs.TF32X3_TILES)
TF32_WG, TF32X3_WG = configs.TF32_WG.name, configs.TF32X3_WG.name

# Outputs of 17 to 32 rows (columns) against at least this many columns (rows) that the 32-column kernel leaves run
# on 32x128 (128x32) tiles instead of 64x64, a third of the padding or less: 18x3622x9839 0.48x -> 0.73x cuBLAS,
# 28x15383x10694 0.58x -> 0.99x (docs/kernels/heuristic.md, section 'The heuristic's break-even points', 17 to 32
# rows or columns).
_NARROW_TILE_OTHER = 64


def _narrow_tile(problem: Problem) -> str:
    """The narrow-tiles rule's tile: 32x128 for few rows, 128x32 for few columns."""
    return WT32x128 if problem.m < problem.n else WT128x32


# The 64x64, 32x128 and 128x32 tiles are one design (four warps, 8x4 sums a thread, sums per run of 4 K-tiles, four
# blocks an SM): a narrow one runs where its tiles cover at most this share of the 64x64 tiles' area (an output side far
# past a multiple of 64 and near one of 32), in a batch or from the second constant's K. Replays on the sweeps'
# problems: 1.05-1.17x the 64x64 tile's speed below this share, 0.93-0.98x above it; single products with a shorter K
# lost 5-20% on the 128x32 tile (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_NARROW_AREA, _NARROW_MIN_K = 0.9, 1024
SMALL_TILES = (WT64, WT32x128, WT128x32)


def _area(problem: Problem, config: KernelConfig) -> int:
    """Area of C's tiles under `config`: C rounded up to whole tiles."""
    bm, bn = config.tile
    return -(-problem.m // bm) * bm * -(-problem.n // bn) * bn


def small_tile(problem: Problem) -> str:
    """Of the four-warp tiles (see above), the 64x64 one unless a narrow one pads far less."""
    if problem.batch == 1 and problem.k < _NARROW_MIN_K:
        return WT64
    area = {name: _area(problem, get_config(name)) for name in SMALL_TILES}
    narrow = min((WT32x128, WT128x32), key=area.get)
    return narrow if area[narrow] <= _NARROW_AREA * area[WT64] else WT64


# A tile is worth taking when it gives at least half the SMs a block (its reuse beats idle SMs) and wastes little
# work on padding past C's edges (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_MIN_WAVE = 0.5
_MIN_USEFUL = 0.95
# Below this fraction of a wave the 128x64 tile keeps a sum per K-tile: one running sum per element there has
# several times cuBLAS's error (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_SUMS_BELOW_WAVE = 0.75
# The 32-deep large tile halves the barriers per FMA but doubles the pipeline's fill: it pays from this many waves
# on aligned rows, A not m-contiguous (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_DEEP_WAVES = 2
# Sub-tile loops (bodies that the instruction cache holds) pay from this K; the tiles then sum K in runs of 512 (one
# FP32 chain over all of K has up to twice cuBLAS's error; runs cost under 2% on 128x256 tiles) (docs/kernels/
# heuristic.md, section 'The heuristic's break-even points', tiled).
_LOOP_MIN_K = 1024
# The 128x64 tile's one chain over K matched cuBLAS's error up to K = 1024 and had 1.7-2.6x it at K = 1559-3074. Under
# a wave of its blocks, a single product (both output sides >= 128) with K from this and not a multiple of 16 takes
# 64x64 tiles with sums per run of K-tiles, which the split-k-wave rule may then cut along K: 1.00-1.29x the unrolled
# 128x64 tile's speed on the three measured, at 0.3-0.7x cuBLAS's error (docs/kernels/heuristic.md, section 'The
# heuristic's break-even points', tiled).
_ONE_CHAIN_MAX_K = 1536
# ... up to this K: past it, sums per K-tile added more than the running-sum bound of K-tile sums, where runs of 512 add
# about 512 (`accuracy.SERIAL_RUN_BOUND` x 16; the 64x64 tile's runs of 4 K-tiles since 2026-11-29 would allow 4x that,
# not measured).
_TILE_SUMS_MAX_K = 65536
# Past this K (the running-sum bound, `accuracy.SERIAL_RUN_BOUND`) the 128x64 tile sums K in runs of 512; below it,
# one chain, whose runs cost 3-8% (5-7% on the aligned copies)... except from _ONE_CHAIN_MAX_K on fewer than the
# second constant's waves of blocks, where cuBLAS (splitting K, we infer) had 1.4-2.8x less error than one chain
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_RUNS_128x64_MIN_K, _RUNS_128x64_WAVES = 4096, 2.5
# Past one wave, a large tile whose last wave leaves more than 1 - this of the SMs' time idle gives way to the
# 128x64 tile, three blocks to an SM (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_MIN_WAVE_EFFICIENCY = 0.85


def _useful(problem: Problem, config: KernelConfig) -> float:
    """Fraction of the tiles' area that lies inside C."""
    return problem.m * problem.n / _area(problem, config)


def wave_efficiency(problem: Problem, config: KernelConfig, device: Device) -> float:
    """Fraction of the SMs' time that whole waves of tiles would keep busy: tiles / (waves x blocks per wave),
    with `config.min_blocks` blocks per SM."""
    slots = device.sm_count * config.min_blocks
    tiles = problem.tiles(config)
    return tiles / (-(-tiles // slots) * slots)


def _fits(problem: Problem, device: Device, name: str) -> bool:
    config = get_config(name)
    return (problem.tiles(config) >= _MIN_WAVE * device.sm_count and _useful(problem, config) >= _MIN_USEFUL)


def _fill_from(names: tuple[str, ...]) -> Callable[[Problem, Device], str]:
    """Largest tile (in `names`, largest first) that fills the SMs with little padding; else the smallest."""
    def pick(problem: Problem, device: Device) -> str:
        for name in names:
            if _fits(problem, device, name):
                return name
        return names[-1]
    return pick


_fill_regtile = _fill_from((RT128, RT128x64, RT64))
_fill_small_warptile = _fill_from((WT128x64, WT64))


# Products with K at most this (any layout), or below the second where A's or B's rows are not 16-byte aligned, are
# bound by writing C: 64x64 tiles ran them 2-3x faster than 128x256 ones, and the naive and shared-memory kernels at
# a fifth of cuBLAS (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_SHORT_K = 16
_SHORT_K_UNALIGNED = 128
# ... up to this K, on 8-deep K-tiles: 0.70-0.80x cuBLAS -> 0.84-1.0x on the sweep's slowest, 1.2x on the rest; from K =
# 9 two 8-deep K-tiles lost to one of 16 (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_SHORTEST_K = 8
# Below this K the 128x256 tile is taken from more than one wave of its blocks (one block per SM) only, and not for
# A . B^T: up to one wave short products ran 1.1-2.0x faster on 128x64 or 64x64 tiles, A . B^T 1.3-1.8x past one wave
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled).
_SHORT_K_BIG_TILE = 256
# ... and below the sub-tile loops' K, from this fraction of a wave of its blocks only (else from `_MIN_WAVE`): under
# it the 128x64 tiles ran 15 aligned products of K 304-912 at 0.86-1.19x cuBLAS, against 0.64-0.87x (docs/kernels/
# heuristic.md, section 'The heuristic's break-even points', tiled).
_BIG_TILE_MIN_WAVE = 0.75


def _fill(problem: Problem, device: Device, big_tile_min_wave: float = _BIG_TILE_MIN_WAVE) -> str:
    """Warp tiles, largest first: big tiles reuse more of each load, idle SMs and padding cost more.

    128x256 tiles where they fill the SMs (below K = 1024: from three quarters of a wave; below K = 256: past one wave,
    and not for A.B^T): on their 16-deep loop in runs of 512 from K = 1024, else 32 deep from two waves on aligned
    rows, else on the loop; 128x64 tiles where 128x256
    ones would leave SMs idle, pad much or leave a ragged last wave (in runs past K = 4096); 64x64 tiles for everything
    smaller or skinnier, and for a long ragged K under a wave. The loops take any K (`_looped`). The measurements:
    docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled.
    """
    if problem.k <= _SHORTEST_K:
        return WT64_SHORT8  # (one 8-deep K-tile: half the multiply-adds on zeros)
    if problem.k <= _SHORT_K:
        return WT64_SHORT  # bound by writing C: the most blocks, each storing its tile soonest (whole rows of it)
    if problem.k < _SHORT_K_UNALIGNED and not problem.aligned:
        return small_tile(problem)
    big = get_config(WT256)
    ragged = (problem.tiles(big) > device.sm_count and wave_efficiency(problem, big, device) < _MIN_WAVE_EFFICIENCY
              and _fits(problem, device, WT128x64))
    long_k = problem.k >= _LOOP_MIN_K
    # A short K: one wave of large tiles or less, or A . B^T (both operands copied 4 bytes at a time, transposing)
    short_k_small_tiles = problem.k < _SHORT_K_BIG_TILE and (problem.tiles(big) <= device.sm_count
                                                            or problem.b_t and not problem.a_t)
    thin_wave = not long_k and problem.tiles(big) < big_tile_min_wave * device.sm_count
    if (_fits(problem, device, WT256) and not ragged and not short_k_small_tiles and not thin_wave
            and not _small_tiles_first(problem)):
        if long_k:
            return _looped(problem, WT256_SLICES)  # K in runs of 512: cuBLAS's accuracy, within 2% of one run
        if problem.tiles(big) >= _DEEP_WAVES * device.sm_count and not problem.a_t and problem.aligned:
            return WT256_32
        return _looped(problem, WT256_LOOP16)
    name = _fill_small_warptile(problem, device)
    if name == WT128x64:
        if problem.tiles(get_config(name)) < _SUMS_BELOW_WAVE * device.sm_count:
            return WT128x64_SUMS
        loop = get_config(WT128x64_LOOP)
        # The loop pays where fetch stalls are not hidden behind other blocks: below one wave of blocks.
        one_wave = problem.tiles(loop) < loop.min_blocks * device.sm_count
        if (_ONE_CHAIN_MAX_K <= problem.k <= _TILE_SUMS_MAX_K and one_wave and problem.k % 16 and problem.batch == 1
                and min(problem.m, problem.n) >= 128):
            return small_tile(problem)  # sums per run of K-tiles on four times the blocks
        few_waves = problem.tiles(loop) < _RUNS_128x64_WAVES * loop.min_blocks * device.sm_count
        if (problem.k > _RUNS_128x64_MIN_K or problem.k >= _ONE_CHAIN_MAX_K and few_waves
                or problem.runs and long_k):
            return _looped(problem, WT128x64_RUNS)  # K in runs of 512
        if not one_wave or problem.k % 16 and problem.k < _LOOP_MIN_K:
            return WT128x64  # a short ragged K: one chain is as accurate, and the loop's twin ran 7% slower (1000^3)
        return _looped(problem, WT128x64_LOOP)
    return small_tile(problem)


def _small_tiles_first(problem: Problem) -> bool:
    """Rows not 16-byte aligned (4-byte loads), or their aligned copies, on a K short of the sub-tile loops' runs: 128x64
    tiles ran 13-25% faster than 128x256 ones (docs/kernels/heuristic.md, section 'The heuristic's break-even points',
    tiled)."""
    return (not problem.aligned or problem.runs) and problem.k < _LOOP_MIN_K


def _looped(problem: Problem, name: str) -> str:
    """The sub-tile loop `name` for this product: itself on whole K-tiles, else its twin that reads the last K % 16
    terms after the loop; the twin too where it also takes the blocks across C's edges and sums in runs (those blocks'
    one running sum on the unrolled path then becomes runs as well)."""
    twin = get_config(_RAGGED[name])
    edges = twin.flush and twin.loops_edges(problem.variant_for(twin)) and (problem.m % twin.bm or problem.n % twin.bn)
    return twin.name if problem.k % twin.bk or edges else name


def _few_tiles(problem: Problem, device: Device) -> bool:
    """Even the smallest 64x64 tile leaves most SMs idle (128x128x65536: 4 tiles, 1.0 TFLOP/s unsplit)."""
    return problem.tiles(get_config(WT64)) < device.sm_count // 2


def _smem_for(problem: Problem, device: Device) -> str:
    """32x32 tiles when they alone fill the SMs, else 16x16 tiles: four times as many blocks."""
    return SMEM32 if problem.tiles(get_config(SMEM32)) >= device.sm_count else SMEM16


def _few_columns_for(problem: Problem, device: Device) -> str:
    """The narrowest few-column configuration that holds the product's few columns (or rows, computed transposed) in
    one block: up to 32 either way."""
    few = min(problem.m, problem.n)
    names = (*FEW_COLUMNS, FEW_COLUMNS_32)
    # (Forced on a wider product, the 16-column one: its blocks then cover the columns 16 at a time.)
    return next((name for name in names if get_config(name).nmax >= few), FEW_COLUMNS[-1])


# Where a GPU cannot give a block the table's configuration's shared memory (Hopper: 227 KiB; A100: 163 KiB; Ada:
# 99 KiB), the same block tile with 16-deep stages (half the bytes) runs instead: the table's choices stay the
# measured ones on Hopper, and no GPU that runs the warp tiles meets a configuration it cannot launch.
_LIGHTER = {
    WT256_LOOP: WT256_LOOP16,      # 196 KiB -> 98 KiB
    WT256_32: WT256,               # 196 KiB -> 98 KiB
    WT256_SLICES: WT256_LOOP16,    # 226 KiB (the partial sums' slots) -> 98 KiB: one running sum
    WT256_SLICES_RAGGED: WT256_LOOP16_RAGGED,  # ... on a ragged K
    TF32X3_TILES[0]: TF32X3_TILES[1],  # 102 KiB -> 51 KiB
}


def _lighter(choice: Choice, device: Device) -> Choice:
    """`choice`, or the lighter configuration of the same tile where the device lacks the shared memory for it."""
    config = choice.config
    if config.smem_bytes <= device.max_smem_optin or config.name not in _LIGHTER:
        return choice
    lighter = get_config(_LIGHTER[config.name])
    return dataclasses.replace(
        choice, config=lighter,
        reason=f"{choice.reason} (this GPU allows {device.max_smem_optin / 1024:.0f} KiB of shared memory per block, "
               f"fewer than {config.name}'s {config.smem_bytes / 1024:.0f} KiB: {lighter.name})")
