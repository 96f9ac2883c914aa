"""Which tile: the kernels' configurations by name, and how the table picks a block tile for a product (the largest
that gives half the SMs a block with little padding, past one wave no mostly idle last one)."""

from __future__ import annotations

from typing import Callable

from ..kernels import configs
from ..kernels.configs import KernelConfig, get_config
from .problem import Device, Problem, few_rows

__all__ = ["wave_efficiency"]

# The table's configurations by name: the objects are built once, in kernels/configs.py.
NAIVE, SMEM16, SMEM32 = configs.NAIVE.name, configs.SMEM16.name, configs.SMEM32.name
RT128, RT128x64, RT64 = configs.RT128.name, configs.RT128x64.name, configs.RT64.name
WT256_LOOP, WT256_32, WT256 = configs.WT256_LOOP.name, configs.WT256_32.name, configs.WT256.name
WT256_LOOP16, WT256_SLICES = configs.WT256_LOOP16.name, configs.WT256_SLICES.name
WT128x64_LOOP, WT128x64, WT128x64_RUNS = configs.WT128x64_LOOP.name, configs.WT128x64.name, configs.WT128x64_RUNS.name
WT128x64_SUMS, WT64 = configs.WT128x64_SUMS.name, configs.WT64.name
SKINNY = tuple(c.name for c in configs.SKINNY)
TF32_TILES, TF32X3_TILES = tuple(c.name for c in configs.TF32_TILES), tuple(c.name for c in configs.TF32X3_TILES)
TF32_WG, TF32X3_WG = configs.TF32_WG.name, configs.TF32X3_WG.name

# A tile is worth taking when the problem gives at least half the SMs a block (a larger tile's reuse beats
# idle SMs: 768^3 ran 0.74x cuBLAS on 72 tiles of 128x64, 0.69x on 144 of 64x64; 2048^3 0.90x on 128 tiles of
# 128x256, 0.81x on 512 of 128x64) and the tiles waste little work on padding past the matrix edges (4097^3 on
# 128x256 tiles computes 9% padding and ran 0.83x, on 128x64 tiles 4.5%: 0.90x).
_MIN_WAVE = 0.5
_MIN_USEFUL = 0.95
# On less than this fraction of a wave, cuBLAS (which then splits K, we infer) is 3x more accurate than one
# running sum per element: 768^3 relative error 2.5x cuBLAS's with plain 128x64 tiles, 0.76x with per-tile
# sums (0.74x against 0.75x the speed). From 1000^3 (128 tiles) up the plain tiles match cuBLAS's error.
_SUMS_BELOW_WAVE = 0.75
# The 32-deep large tile halves the barriers per FMA but doubles the pipeline's fill: it wins from two waves
# up (4096^3: 0.92x cuBLAS against 0.89x; 2048^3, one wave: 0.87x against 0.90x), where rows are 16-byte aligned:
# with scalar loads the 16-deep tile is ahead (H100, time against cuBLAS's whole product: 4096x4096x4097 97% against
# 110%, 8192x8192x8193 103% against 108%, 6144x6144x6145 100% against 105%).
_DEEP_WAVES = 2
# ... except for A with unit stride along m (A^T.B of C-ordered arrays), where both operands copy in 16-byte
# pieces and the 16-deep tile ran faster in every run (H100, 4096^3: 1.01-1.03x cuBLAS against 0.96x; 8192^3:
# 1.00x against 0.96x).
# Sub-tile loops (loop bodies that the instruction cache holds; docs/kernels.md, third round) serve products
# whose K is a multiple of the K-tile (others would run the unrolled edge path throughout). The 32-deep large
# tile's 8-step loop, from K = 1024: H100, 2048^3 1.01x cuBLAS against 0.95x for the unrolled 16-deep tile,
# 4096^3 1.00-1.01x against 0.98x for the unrolled 32-deep one; at K = 256 (batch 64 x 256^3) 0.96x, where
# the 16-deep tile looping over whole K-tiles runs 1.00x (A^T.B 4096^3: 1.02x), and at K = 64 1.17x against
# the unrolled 32-deep tile's 1.25x. With B transposed (x @ w.T) the 16-step bodies ran 2-3% ahead of the
# 8-step ones in every round (4096^3 0.98-0.99x against 0.97x, 8192^3 0.96x against 0.93x, 2048^3 1.03x
# against 1.00x; both transposed 1.04x against 0.99x), and K an odd multiple of 16 keeps the loop too. The
# 128x64 tile's 8-step loop below one wave of blocks (three per SM):
# 1024^3 (0.3 waves) 0.98x against 0.94x, 2048x1024x2048 (0.65) 0.96x against 0.85x; from about three waves
# the unrolled tile, with two more blocks per SM to hide its fetch stalls, is ahead: 3072^3 1.05x against
# 1.03x, 4096^3 0.88x against 0.87x (65536x128x128, 2.6 waves of K = 128: 0.99x against 1.01x).
_LOOP_MIN_K = 1024
# Past one wave, a large tile whose last wave leaves more than this fraction of the SMs' time idle gives way to
# the 128x64 tile, three blocks to an SM (3000^3: 288 tiles of 128x256 are 2.2 waves, 0.85x cuBLAS; 1128 of
# 128x64 are 2.85 waves of 396 blocks, 1.05x).
_MIN_WAVE_EFFICIENCY = 0.85


def _useful(problem: Problem, config: KernelConfig) -> float:
    """Fraction of the tiles' area that lies inside C."""
    bm, bn = config.tile
    return problem.m * problem.n / (-(-problem.m // bm) * bm * -(-problem.n // bn) * bn)


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


# A transposed operand and a long K: the 16-deep loop that adds its partial sums to the accumulators every 512 of K
# (split-K's slice kernel). One FP32 chain over all of K left fastmm's error above cuBLAS's for A^T.B, whose kernels
# for transposed operands sum in shorter runs. H100, x cuBLAS in one run, rel. error against float64 (cuBLAS's):
# A^T.B 4096^3 1.055x 1.15e-6 -> 1.001x 4.1e-7 (8.1e-7); 8192^3 1.003x 1.62e-6 -> 0.961x 4.1e-7 (9.4e-7);
# 4096x4096x8192 1.011x 1.62e-6 -> 0.970x 4.1e-7 (1.15e-6); A.B^T 4096^3 1.016x -> 1.028x, 1.15e-6 -> 4.1e-7
# (1.15e-6). At 2048^3 (A^T.B 1.009x -> 0.973x) the one chain is as accurate as cuBLAS (8.1e-7): the loop stays.
_FLUSH_MIN_K = 4096


def _fill(problem: Problem, device: Device) -> str:
    """Warp tiles, largest first: big tiles reuse more of each load, idle SMs and padding cost more.

    Measured (docs/kernels.md, H100): 128x256 tiles from 2048^3 up: with the 8-step sub-tile loop where K is a
    long multiple of 32 (2048^3 1.01x cuBLAS, 4096^3 1.00x, 8192^3 1.01x), the 16-deep loop for long K with an
    operand transposed (A^T.B 1.02x, A.B^T 1.00x), else unrolled and 32 deep from two waves (16384x16384x64
    1.25x), else 16 deep, looping over whole K-tiles where K allows (batch 64 x 256^3 1.00x); 128x64 tiles
    where 128x256 would leave a ragged last wave (3000^3 1.05x), at 768^3-1024^3, 4097^3 (0.93x) and
    65536x128x128 (0.99x), with the sub-tile loop below one wave of blocks where K is a multiple of 16; 64x64
    tiles for everything smaller or skinnier, where they beat every other kernel, shared-memory tiles included
    (512^3: 13.3 TFLOP/s against smem_32's 7.8; 4096x16x4096: 4.0 against smem_16's 3.0).
    """
    big = get_config(WT256)
    ragged = (problem.tiles(big) > device.sm_count and wave_efficiency(problem, big, device) < _MIN_WAVE_EFFICIENCY
              and _fits(problem, device, WT128x64))
    if _fits(problem, device, WT256) and not ragged:
        long_k = problem.k >= _LOOP_MIN_K
        if long_k and problem.runs and _whole_k_tiles(problem, WT256_SLICES):
            return WT256_SLICES  # on K-padded copies: cuBLAS's accuracy on ragged products (see aligned_copies)
        if long_k and not problem.a_t and not problem.b_t and _whole_k_tiles(problem, WT256_LOOP):
            return WT256_LOOP
        if long_k and _whole_k_tiles(problem, WT256_LOOP16):  # a transposed operand, or K an odd multiple of 16
            if (problem.a_t or problem.b_t) and problem.k >= _FLUSH_MIN_K:
                return WT256_SLICES  # partial sums over runs of 512: cuBLAS's accuracy (see _FLUSH_MIN_K)
            return WT256_LOOP16
        if problem.tiles(big) >= _DEEP_WAVES * device.sm_count and not problem.a_t and problem.aligned:
            return WT256_32
        return WT256_LOOP16 if _whole_k_tiles(problem, WT256_LOOP16) else WT256
    name = _fill_small_warptile(problem, device)
    if name == WT128x64:
        if problem.tiles(get_config(name)) < _SUMS_BELOW_WAVE * device.sm_count:
            return WT128x64_SUMS
        if problem.runs and problem.k >= _LOOP_MIN_K and _whole_k_tiles(problem, WT128x64_RUNS):
            return WT128x64_RUNS
        loop = get_config(WT128x64_LOOP)
        # The loop pays where fetch stalls are not hidden behind other blocks: below one wave of blocks.
        one_wave = problem.tiles(loop) < loop.min_blocks * device.sm_count
        return WT128x64_LOOP if one_wave and _whole_k_tiles(problem, WT128x64_LOOP) else WT128x64
    return name


def _whole_k_tiles(problem: Problem, name: str) -> bool:
    """K is a multiple of the configuration's K-tile: its interior blocks run the sub-tile loop."""
    return problem.k % get_config(name).bk == 0


def _few_tiles(problem: Problem, device: Device) -> bool:
    """Even the smallest 64x64 tile leaves most SMs idle (128x128x65536: 4 tiles, 1.0 TFLOP/s unsplit)."""
    return problem.tiles(get_config(WT64)) < device.sm_count // 2


def _smem_for(problem: Problem, device: Device) -> str:
    """32x32 tiles when they alone fill the SMs, else 16x16 tiles: four times as many blocks."""
    return SMEM32 if problem.tiles(get_config(SMEM32)) >= device.sm_count else SMEM16


def _skinny_for(problem: Problem, device: Device) -> str:
    """The narrowest few-column configuration that holds the product's few columns (or rows) in one block."""
    few = problem.m if few_rows(problem) else problem.n
    # (Forced on a wide product, the widest: its blocks then cover the columns 16 at a time.)
    return next((name for name in SKINNY if get_config(name).nmax >= few), SKINNY[-1])
