"""Problem -> kernel: the heuristic table, forced kernels, and `explain`.

Pure Python by design (no CuPy, no CUDA): the table runs and is tested on a machine without a GPU.
The dispatcher describes each product as a `Problem`; `choose` walks `RULES` in order and the first rule
whose test holds names the kernel. The numbers in the rules are break-even points measured on an H100/H200
with ``python -m fastmm bench`` (docs/kernels.md has the tables they come from).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Callable, Iterator

from .kernels.configs import (_BY_NAME, CONFIGS, FAMILIES, SPLIT, RegTile, Skinny, TensorTile, Variant, WarpTile,
                              WgTile, _Config, get_config, validate)

__all__ = ["Problem", "Device", "Choice", "Rule", "RULES", "choose", "use_kernel", "forced_kernel", "kernel_names",
           "tune_bucket", "tune_cache_path", "tuned_entries", "reload_tuned", "wave_efficiency", "CUBLAS_AHEAD",
           "cublas_ahead", "CublasAhead", "yielding_to_cublas", "yield_to_cublas", "PRECISIONS",
           "set_float32_matmul_precision", "get_float32_matmul_precision", "matmul_precision"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One batched product C[b] (m x n) = A[b] (m x k) @ B[b] (k x n), as the kernels will see it."""

    m: int
    n: int
    k: int
    batch: int = 1
    a_t: bool = False      # A has unit stride along m (e.g. ``a.T`` of a C-ordered array)
    b_t: bool = False      # B has unit stride along k
    aligned: bool = True   # A's and B's rows start 16-byte aligned: 128-bit copies are legal (C's rows decide only
    #                        the kernels' stores, which each block checks)
    a_aligned: bool = True  # ... in A alone (the few-column kernel reads only A in 16-byte pieces)
    b_aligned: bool = True  # ... in B alone (A of the transposed product, for few rows)
    runs: bool = False  # sum K in runs of 512 where a kernel does (the product on aligned copies: see aligned_copies)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def variant(self) -> Variant:
        return Variant(self.a_t, self.b_t, 4 if self.aligned else 1)

    def variant_for(self, config: _Config) -> Variant:
        """The layout variant `config` runs: the few-column kernel needs only A aligned for its wide loads, and
        for few rows it runs the transposed product, whose A is B^T and whose B is A^T."""
        if isinstance(config, Skinny):
            if few_rows(self):
                return Variant(not self.b_t, not self.a_t, 4 if self.b_aligned else 1)
            return Variant(self.a_t, self.b_t, 4 if self.a_aligned else 1)
        return self.variant

    def blocks(self, config: _Config) -> int:
        """Blocks of `config` one launch needs (the transposed product's, for few rows on the few-column kernel)."""
        if isinstance(config, Skinny):  # each block of rows over a cluster's blocks (split K) or one
            problem = dataclasses.replace(self, m=self.n, n=self.m) if few_rows(self) else self
            return problem.tiles(config) * config.cluster
        return self.tiles(config)

    def tiles(self, config: _Config) -> int:
        bm, bn = config.tile
        return -(-self.m // bm) * -(-self.n // bn) * self.batch


@dataclasses.dataclass(frozen=True)
class Device:
    """What the plan needs to know of a GPU. The default is an H100/H200 (for `explain` without a GPU)."""

    name: str = "NVIDIA H100/H200 (assumed: no GPU queried)"
    sm_count: int = 132
    compute_capability: tuple[int, int] = (9, 0)
    max_threads_per_block: int = 1024
    max_smem_per_block: int = 48 * 1024
    max_smem_optin: int = 227 * 1024  # dynamic shared memory a kernel may opt in to (Hopper: 227 KiB)
    max_regs_per_block: int = 65536
    driver_version: int = 0  # CUDA driver version (e.g. 13000); part of the autotune cache's key

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclasses.dataclass(frozen=True)
class Choice:
    config: _Config
    variant: Variant
    rule: str
    reason: str
    splits: int = 1  # split-K: K cut into this many slices, multiplied as a batch and summed in a fixed order
    peel: tuple[int, int] = (0, 0)  # rows and columns of C's ragged bottom and right edges run as few-column products
    pad: bool = False  # A and B (those not 16-byte aligned) copied into rows padded to 16 bytes, the product on those

    @property
    def name(self) -> str:
        return self.config.name

    def explain(self, problem: Problem, device: Device) -> str:
        shape = f"{problem.m}x{problem.n}x{problem.k}" + (f", batch {problem.batch}" if problem.batch != 1 else "")
        wide = self.variant.vec == 4
        layout = (f"A {'m' if problem.a_t else 'k'}-contiguous, B {'k' if problem.b_t else 'n'}-contiguous, "
                  f"{'16-byte aligned' if wide else 'not 16-byte aligned (scalar loads)'}")
        if self.pad:
            padded = aligned_copies(problem)
            copies = " and ".join(x for x, ok in (("A", problem.a_aligned), ("B", problem.b_aligned))
                                  if not ok or padded.k != problem.k)
            if padded.k != problem.k:
                copies += f", K padded with zeros to {padded.k}"
            inner = choose(padded, device, "auto")
            return (inner.explain(padded, device).replace(" (A ", f" (on aligned copies of {copies}; A ", 1)
                    + f"\n  copy    {self.rule}: {self.reason}")
        split = f", split-K into {self.splits} slices" if self.splits > 1 else ""
        if getattr(self.config, "cluster", 1) > 1:
            split = f", K split over a cluster of {self.config.cluster} blocks that sums it"
        if self.peel != (0, 0):
            problem = interior(problem, self.peel)
            split = (f" on the {problem.m}x{problem.n} interior; the last {self.peel[0]} rows and {self.peel[1]} "
                     "columns on the few-column kernel")
        return (f"{shape} float32 ({layout}) on {device.name}:\n"
                f"  kernel  {self.config.binary_name(self.variant)}{split}\n"
                f"  mode    {self.config.precision}: {PRECISIONS[self.config.precision]}\n"
                f"  rule    {self.rule}: {self.reason}\n"
                f"  grid    {problem.blocks(self.config) * self.splits} blocks of {self.config.threads} threads "
                f"for {device.sm_count} SMs")


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    reason: str
    test: Callable[[Problem, Device], bool]
    kernel: str | Callable[[Problem, Device], str]
    splits: Callable[[Problem, Device], int] | None = None  # slices of K (None: the product runs whole)
    peel: Callable[[Problem, Device], tuple[int, int]] | None = None  # ragged edges run apart (see Choice.peel)
    pad: bool = False  # the product runs on aligned copies of its operands (see Choice.pad)


NAIVE, SMEM16, SMEM32 = "naive_32x8", "smem_16", "smem_32"
RT128, RT128x64, RT64 = "regtile_128x128x8_8x8", "regtile_128x64x8_8x8", "regtile_64x64x8_8x8"
WT256_LOOP = "warptile_128x256x32_64x64_8x16_s4_spread_sub8"
WT256_32 = "warptile_128x256x32_64x64_8x16_s4_spread"
WT256_LOOP16 = "warptile_128x256x16_64x64_8x16_s4_spread_sub16"
WT256_SLICES = "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"
WT256 = "warptile_128x256x16_64x64_8x16_s4_spread"
WT128x64_LOOP = "warptile_128x64x16_32x64_8x8_s4_sub8"
WT128x64, WT128x64_SUMS = "warptile_128x64x16_32x64_8x8_s4", "warptile_128x64x16_32x64_8x8_s4_tsum"
WT128x64_RUNS = "warptile_128x64x16_32x64_8x8_s3_sub8_f512"
WT64 = "warptile_64x64x16_32x32_8x4_s4_tsum"

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


def _useful(problem: Problem, config: _Config) -> float:
    """Fraction of the tiles' area that lies inside C."""
    bm, bn = config.tile
    return problem.m * problem.n / (-(-problem.m // bm) * bm * -(-problem.n // bn) * bn)


def wave_efficiency(problem: Problem, config: _Config, device: Device) -> float:
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


# Split-K: only worth its workspace and extra pass when K dwarfs the output.
_SPLIT_MIN_K = 4096
_SPLIT_K_OVER_MN = 16
_SPLIT_SLICE = 512
_SPLIT_MIN_SLICE = 256


# Skinny products (an output side below this) with a long K are split too, for accuracy as much as speed:
# 8192x1x8192 had 10.9x cuBLAS's relative error as one running sum per element, 2.8x with per-tile sums.
_SKINNY = 32


def _skinny(problem: Problem) -> bool:
    return min(problem.m, problem.n) < _SKINNY


def _long_k(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or problem.k < _SPLIT_MIN_K:
        return False
    few = problem.k >= _SPLIT_K_OVER_MN * max(problem.m, problem.n) and _few_tiles(problem, device)
    return few or _skinny(problem)


def _split_for(problem: Problem, device: Device) -> str:
    """The tile of split-K's slices: 128x256 where both sides of the output hold it with little padding, 128x64 where
    they hold that, else 64x64; the large tiles on their sub-tile loops (slices are whole 16-deep steps).

    Measured (H100, x cuBLAS in the same process): 256x256x65536 0.85x with 128x256 tiles against 0.71x with 64x64
    ones (slices 512 deep); 128x128x65536 1.03-1.04x with 128x64 tiles against 0.93x with 64x64 ones. On the loops,
    in the same slices: 256x256x65536 0.99x (16-deep loop; unrolled 0.93-0.94x, 32-deep loop 0.98x), 512x512x32768
    1.01x (0.94x), 128x128x65536 1.10x (1.03x). 384x384x65536 on 128x256 tiles (a quarter of their area padding) ran
    0.58x, on 128x64 ones 0.84-0.88x. The 128x256 slices sum their K in runs of 512 (partial sums): at the same speed
    (512x512x32768 1.000x against 1.001x, 256x256x65536 0.987x against 0.984x) the error falls below cuBLAS's
    (4.1e-7 against 8.1e-7 and 5.9e-7)."""
    if _skinny(problem):
        return WT64
    side = min(problem.m, problem.n)
    if side >= 256 and _useful(problem, get_config(WT256_SLICES)) >= _MIN_USEFUL:
        return WT256_SLICES
    return WT128x64_LOOP if side >= 128 else WT64


def _even_splits(problem: Problem, config: _Config, most: int, min_depth: int) -> list[int]:
    """Slice counts from 2 to `most` that cut K into whole K-tile steps, slices at least `min_depth` deep: the split
    then runs as one batched launch (an uneven last slice runs as a launch of its own, at a fraction of the SMs)."""
    return [s for s in range(2, most + 1) if problem.k % (config.bk * s) == 0 and problem.k // s >= min_depth]


def split_count(problem: Problem, device: Device) -> int:
    """Slices of K for split-K. On the 128x256 and 128x64 tiles, the most that keep all blocks in one wave, in whole
    16-deep steps (see below); otherwise (64x64 tiles, or no even cut) about _SPLIT_SLICE deep, deeper only where
    that leaves less than a wave of blocks (never shallower than _SPLIT_MIN_SLICE).

    Measured (H100, x cuBLAS in the same run) on 64x64 tiles: the best depth was about 500 whatever the output,
    while filling the SMs was not enough: 128x128x65536 0.68x in 66 slices of 993 (two blocks per SM), 0.93x in
    132 slices of 496 or 256 of 256; 64x64x262144 1.09x / 1.07x / 1.01x in 264 / 528 / 1024 slices. On 128x256
    tiles a second wave cost more than the deeper slices of one: 256x256x65536 0.62x / 0.85x / 0.79x in 66 (uneven)
    / 132 / 256 slices, then 0.94x in 64 even ones.
    """
    name = _split_for(problem, device)
    config = get_config(name)
    tiles = problem.tiles(config)
    if name != WT64:
        # The large tiles: the most slices that keep every block in one wave, cut in whole 16-deep steps (an uneven
        # last slice runs as a launch of its own). Measured (H100): 256x256x65536 on 128x256 tiles 0.94x cuBLAS in 64
        # slices (one wave of 128 blocks) against 0.89x in 128; 512x512x32768 0.95x in 16 against 0.87x in 64;
        # 128x128x65536 on 128x64 tiles 1.04x in 128 (256 blocks of 396 slots).
        even = _even_splits(problem, config, config.min_blocks * device.sm_count // tiles, _SPLIT_MIN_SLICE)
        if even:
            return max(even)
    wave = -(-config.min_blocks * device.sm_count // tiles)
    slices = max(problem.k // _SPLIT_SLICE, min(wave, problem.k // _SPLIT_MIN_SLICE))
    return max(2, slices)


# Few columns (or rows): at most this many, against more of the other side. Such products read each element of the
# large operand for 2 FLOPs: bound by memory, where the few-column kernel reads it once in wide loads.
_FEW = 16
SKINNY = ("skinny_n1", "skinny_n4", "skinny_n16")


def _few_columns(problem: Problem) -> bool:
    return problem.n <= _FEW and problem.m >= problem.n


def few_rows(problem: Problem) -> bool:
    """Few rows against many columns: the few-column kernel runs on the transposed product C^T = B^T A^T."""
    return problem.m <= _FEW and problem.n > _FEW


def _few(problem: Problem, device: Device) -> bool:
    """The few-column rule's products: few columns or rows, on a GPU with the shared memory for the block that holds
    them (16 columns take 104 KiB: more than Ada's 99; those products then run on the tiles)."""
    return ((_few_columns(problem) or few_rows(problem))
            and get_config(_skinny_for(problem, device)).smem_bytes <= device.max_smem_optin)


def _skinny_for(problem: Problem, device: Device) -> str:
    """The narrowest few-column configuration that holds the product's few columns (or rows) in one block."""
    few = problem.m if few_rows(problem) else problem.n
    # (Forced on a wide product, the widest: its blocks then cover the columns 16 at a time.)
    return next((name for name in SKINNY if get_config(name).nmax >= few), SKINNY[-1])


def _skinny_count(problem: Problem, device: Device) -> int:
    """Slices of K for the few-column kernel (single products only, as for split-K; slices at least _SPLIT_SLICE
    deep). Up to 8 (where the GPU has clusters) a cluster's blocks split K: 2, 4 or 8, the most whose blocks fit
    one per SM for up to 4 columns, min_blocks per SM for 16 (more FMAs per byte read; see _CLUSTERS). Rows so few that more
    than 16 slices would fill the SMs take those, summed by the slice-sum kernel: of the counts that fill min_blocks
    blocks per SM, the one whose blocks fill their waves best (time ~ waves / slices; the fewest on a tie).

    Rounded up to fill the SMs, a count can leave a mostly idle last wave: 4096x16x4096 has 128 blocks of rows,
    and 3 slices make 384 blocks, 1.45 waves of an H100's 264 block slots (the second half empty), where 2 slices
    make 256, one wave; 8192 rows (256 blocks) need no slices at all."""
    if problem.batch != 1:
        return 1
    config = get_config(_skinny_for(problem, device))
    rows = problem.n if few_rows(problem) else problem.m
    blocks = -(-rows // config.tile[0])
    slots = config.min_blocks * device.sm_count
    most = max(1, min(-(-slots // blocks), problem.k // _SPLIT_SLICE))
    count = min(range(1, most + 1), key=lambda s: -(-blocks * s // slots) / s)
    if not _clusters(device) or count > 2 * _CLUSTERS[-1]:
        return count
    per_sm = config.min_blocks if config.nmax > 4 else 1
    return max(c for c in (1, *_CLUSTERS) if c == 1 or blocks * c <= per_sm * device.sm_count
               and problem.k // c >= _SPLIT_SLICE)


# Few-column products split K over a thread-block cluster of this many blocks, in one launch that sums the slices
# itself (skinny.cu); more slices than a cluster holds run as a batch summed by the slice-sum kernel. Measured on an
# H100 (x cuBLAS in the same process; workspace split -> cluster): 2048x1x16384 0.93x -> 0.98x (2 blocks; the slice
# sum alone took 4.5-8.5% of such products), 4096x16x4096 1.02x -> 1.29x (2), 1024x1x65536 1.15x -> 1.17x (4),
# 1000x3x50000 1.36x -> 1.49x (4). More blocks than one per SM (up to 4 columns) or min_blocks per SM (16 columns)
# lost: 2048x1x16384 0.92x in clusters of 4, 0.95x of 8; 1000x3x50000 1.21x of 8; 4096x16x4096 unsplit 1.21x.
_CLUSTERS = (2, 4, 8)


def _clusters(device: Device) -> bool:
    return device.compute_capability >= (9, 0)


def _skinny_kernel(problem: Problem, device: Device) -> str:
    """The few-column configuration, split over a cluster where its count of slices is one."""
    name, count = _skinny_for(problem, device), _skinny_count(problem, device)
    return f"{name}_c{count}" if count in _CLUSTERS and _clusters(device) else name


def skinny_splits(problem: Problem, device: Device) -> int:
    """Slices of K summed by the slice-sum kernel (a cluster sums its own: 1)."""
    count = _skinny_count(problem, device)
    return 1 if count in _CLUSTERS and _clusters(device) else count


# Split-K over a short K, where the tiled rule's tile would leave SMs idle: slices of 128x64 tiles, counted so that
# the busiest SM's share of the work (blocks per SM, rounded up, times each block's depth) is least. Measured on an
# H100 (x cuBLAS in the same run, unsplit -> split): 768^3 0.72x -> 1.02x (3 slices), 896^3 0.71x -> 0.97x (4),
# 1536^3 0.75x -> 1.01x (4), 1792^3 0.92x -> 1.03x (2), 512x512x2048 0.44x -> 0.95x (4), 768x3072x768 0.75x -> 0.91x
# (4); where the tiles give at least 80% of the SMs a block (1024^3 0.98x, 2048^3 0.99x, 2048x2048x512 0.98x,
# 1024x1024x4096 0.82x) every split measured slower. Slices divide K into whole 16-deep steps: an uneven last slice
# runs as a launch of its own (896^3 in 3 slices: below 0.71x). Small products stay whole: a second launch costs
# more than idle SMs there (640^3 runs 1.22x cuBLAS unsplit on 64x64 tiles).
#
# Small outputs (from _MID_SUMS_TILES[0] to [1] 64x64 tiles per SM: m x n from about 512^2 to 768^2 on an H100) take
# 64x64 tiles with tile sums instead, in slices _MID_SUMS_DEPTH deep (at most _MID_SUMS_MOST of them): their error is
# less than half cuBLAS's (768^3: 1.1e-7 against 2.9e-7 on 128x64 slices, cuBLAS 2.0e-7). These calls are bound by
# the host (about 35 us per call on the measuring host, cuBLAS's too), so through fastmm.matmul the two plans ran
# within a few percent (H100, x cuBLAS, interleaved, 128x64 slices -> 64x64 sums): 640x640x1024 0.80x -> 0.84-0.88x,
# 768^3 1.01-1.02x -> 0.99x, 768x768x512 0.98-0.99x -> 0.98x; replayed alone (no dispatch) the sums ran faster
# (640x640x768 1.03x -> 1.23x, 768x768x1536 0.81x -> 0.87x). Fewer tiles lost (384x384x2048, 36 tiles: 0.99x ->
# 0.85-0.93x) or drew (512x512x2048 0.94x -> 0.93x); more lost on the GPU (896^3 0.97x -> 0.79x, 1536^3 1.02x ->
# 0.77x replayed), as did slices of 64 where the sum of many slices costs more than they gain (768x768x1536 in 24:
# 0.61x).
_IDLE_SMS = 0.8
_MID_MIN_DEPTH = 128
_MID_MIN_MACS = 1 << 28
_MID_SUMS_TILES = (0.5, 1.25)
_MID_SUMS_DEPTH = 128
_MID_SUMS_MOST = 8


def _idle_sms(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or _skinny(problem) or problem.m * problem.n * problem.k < _MID_MIN_MACS:
        return False
    tiled = get_config(_fill(problem, device))
    return problem.tiles(tiled) < _IDLE_SMS * device.sm_count and mid_splits(problem, device) > 1


def _mid_sums_splits(problem: Problem, device: Device) -> int:
    """Slices of 64x64 tile-sum tiles for a small output (see above), or 1 where the output is larger or smaller or K has
    no even split into slices at least _MID_SUMS_DEPTH deep."""
    config = get_config(WT64)
    low, high = _MID_SUMS_TILES
    if not low * device.sm_count <= problem.tiles(config) <= high * device.sm_count:
        return 1
    return max(_even_splits(problem, config, min(_MID_SUMS_MOST, problem.k // _MID_SUMS_DEPTH), _MID_SUMS_DEPTH),
               default=1)


def _mid_kernel(problem: Problem, device: Device) -> str:
    return WT64 if _mid_sums_splits(problem, device) > 1 else WT128x64


def mid_splits(problem: Problem, device: Device) -> int:
    """Slices of K for split-K on a short K (see _IDLE_SMS); 1 where K has no even split into 16-deep steps."""
    sums = _mid_sums_splits(problem, device)
    if sums > 1:
        return sums
    config = get_config(WT128x64)
    tiles = problem.tiles(config)
    counts = _even_splits(problem, config, problem.k // _MID_MIN_DEPTH, _MID_MIN_DEPTH)
    # The busiest SM's share of the work; on a tie the fewest slices (each adds a slice to the sum's pass).
    return min(counts, key=lambda s: (-(-tiles * s // device.sm_count) * (problem.k // s), s), default=1)


# Ragged edges: a large product whose rows (or columns) run a few past a multiple of 128 pays for a whole row of
# mostly empty tiles, and often a mostly idle last wave, for those few (4097^3 on 128x256 tiles: 561 tiles, 4.25 waves
# of an H100's 132 SMs, where 4096 rows and columns make 512, 3.9). Those last rows and columns are a few-row and a
# few-column product, bound by memory and run as such; the interior keeps whole tiles, where its own plan gives at
# least _IDLE_SMS of the SMs a block. Measured on an H100 (x cuBLAS in the same process), whole -> peeled: 2049^3
# 0.91x -> 1.05x, 3073^3 0.89x -> 0.98x, 4097^3 0.93x -> 1.00x (A^T.B 0.90x -> 0.95x), 8193^3 0.92x -> 0.97x,
# 4100^3 1.05x -> 1.13x, 5000^3 0.96x -> 1.02x, 2049x2049x8192 0.85x -> 1.18x. Smaller products lost: their
# interiors leave SMs idle, and the edges' launches cost more than the padded tiles (1537^3 0.91x -> 0.61x with 72
# tiles of 128x256 inside, 1793^3 0.87x -> 0.79x with 98, 1153^3 0.88x -> 0.57x with 162 of 128x64).
_PEEL_MAX = _FEW
_PEEL_MIN_MACS = 1 << 33


def peel_edges(problem: Problem, device: Device) -> tuple[int, int]:
    """Rows and columns past the last multiple of 128 of a large single product, where there are at most _PEEL_MAX
    of them (each side on its own: (rows, 0), (0, cols) or both) and the interior's plan keeps the SMs busy; (0, 0)
    where there is nothing to peel."""
    if problem.batch != 1 or _skinny(problem) or problem.m * problem.n * problem.k < _PEEL_MIN_MACS:
        return (0, 0)
    rows, cols = problem.m % 128, problem.n % 128
    peel = (rows if rows <= _PEEL_MAX else 0, cols if cols <= _PEEL_MAX else 0)
    if peel == (0, 0):
        return peel
    inside = interior(problem, peel)
    plan = choose(inside, device, "auto")  # never peeled again: its sides are whole multiples of 128 or long edges
    busy = inside.blocks(plan.config) * plan.splits >= _IDLE_SMS * device.sm_count
    return peel if busy else (0, 0)


# Rows that do not start 16-byte aligned (an odd leading dimension: 3001^3) cost the tiles their 16-byte copies, the
# 128x64 tile most. A large single product copies its unaligned A and B into rows padded to 16 bytes (repitch.cu, one
# pass over each at 2.6 TB/s on an H100: 2-4% of these products) and runs on the copies; C needs none (its rows
# decide only the stores). Measured on an H100, x cuBLAS in the same process, on 4-byte copies -> with aligned copies:
# 2999^3 0.89x -> 1.00x, 3001^3 0.89x -> 0.99x, 3001x3001x6001 0.85x -> 0.95x, 3073^3 (peeled) 0.94x -> 1.07x (all
# on the 128x64 tile), A^T.B 4097^3 0.94x -> 1.01x (A copied transposing), 6001^3 0.93x -> 0.99x, 8193^3 0.97x ->
# 1.00x. Smaller products lost (1793^3 0.89x -> 0.87x), so the rule starts at 2^34 (2580^3).
# The copies also pad K with zeros to whole 16-deep K-tiles, so that the tiles run their loops there, in runs of 512
# (partial sums): on these shapes cuBLAS sums more accurately than one running sum per element (4097^3: 6.6e-7
# against 1.15e-6; 3001^3: 4.9e-7 against 9.8e-7), and only shorter sums bring the error to its level or below
# (docs/kernels.md, "Accuracy, third round").
_PAD_MIN_MACS = 1 << 34
_PAD_K = 16


def pads(problem: Problem, device: Device) -> bool:
    """A large single product whose A or B rows are not 16-byte aligned runs on aligned copies of them (see above)."""
    if problem.batch != 1 or problem.aligned or _skinny(problem):
        return False
    return problem.m * problem.n * problem.k >= _PAD_MIN_MACS


def padded_k(k: int) -> int:
    """K of the aligned copies: whole 16-deep K-tiles, zeros past the operands' own K."""
    return -(-k // _PAD_K) * _PAD_K


def aligned_copies(problem: Problem) -> Problem:
    """The product on copies of A and B whose rows start 16-byte aligned, K padded with zeros to whole K-tiles and
    summed in runs where the kernel allows."""
    return dataclasses.replace(problem, k=padded_k(problem.k), aligned=True, a_aligned=True, b_aligned=True,
                               runs=True)


# Set while the dispatcher multiplies the aligned copies: the products it then describes sum K in runs.
_on_copies: contextvars.ContextVar[bool] = contextvars.ContextVar("fastmm_on_copies", default=False)


@contextlib.contextmanager
def on_copies() -> Iterator[None]:
    """Within: the products are the aligned copies' (see aligned_copies), and sum K in runs where a kernel does."""
    token = _on_copies.set(True)
    try:
        yield
    finally:
        _on_copies.reset(token)


def summed_in_runs() -> bool:
    return _on_copies.get()


def _padded_kernel(problem: Problem, device: Device) -> str:
    return choose(aligned_copies(problem), device, "auto").name


def without_copies(problem: Problem, device: Device) -> Choice:
    """The table's plan for `problem` with no aligned copies: what runs where the copies do not fit in memory."""
    return _lighter(_by_rules(problem, device, _RULES_WITHOUT_COPIES), device)


def interior(problem: Problem, peel: tuple[int, int]) -> Problem:
    """The product left once `peel` = (rows, columns) of C's bottom and right edges are taken off."""
    return dataclasses.replace(problem, m=problem.m - peel[0], n=problem.n - peel[1])


def _peeled_kernel(problem: Problem, device: Device) -> str:
    return choose(interior(problem, peel_edges(problem, device)), device, "auto").name


RULES: tuple[Rule, ...] = (
    Rule("empty", "nothing to multiply (a zero-size dimension): the result is empty or zeros, no kernel runs",
         lambda p, d: p.m * p.n * p.batch == 0 or p.k == 0, NAIVE),
    Rule("few-columns", f"at most {_FEW} columns (or rows, computed transposed) against more of the other side: "
         "bound by memory, each element of the large operand read once in wide loads, K split into slices where "
         "the rows alone would leave SMs idle (over a cluster of 2, 4 or 8 blocks that sums them, or in more slices "
         "summed in a fixed order)", _few, _skinny_kernel, skinny_splits),
    Rule("split-k", f"K >= {_SPLIT_MIN_K} and either >= {_SPLIT_K_OVER_MN}x the output's sides with too few tiles for "
         f"the SMs, or an output side below {_SKINNY}: slices of K multiplied side by side, then summed in a fixed "
         "order", _long_k, _split_for, split_count),
    Rule("aligned-copy", f"a product of >= 2^{_PAD_MIN_MACS.bit_length() - 1} multiply-adds whose A or B rows do not "
         "start 16-byte aligned (an odd leading dimension): those operands copied into rows padded to 16 bytes (one "
         "pass over each, a few percent of the product) so that the tiles copy 16 bytes at a time, C written in place; "
         f"K padded with zeros to whole {_PAD_K}-deep K-tiles (both operands copied where it is not), so that the "
         "tiles run their loops, K summed in runs of 512 (cuBLAS's accuracy on these shapes)", pads, _padded_kernel,
         pad=True),
    Rule("ragged-edge", f"a product of >= 2^{_PEEL_MIN_MACS.bit_length() - 1} multiply-adds whose rows or columns run "
         f"1 to {_PEEL_MAX} past a multiple of 128: the interior on whole tiles (its own rule's kernel), the last rows "
         "and columns on the few-column kernel, instead of a row of mostly empty tiles and a mostly idle last wave "
         f"(where the interior's own plan gives >= {_IDLE_SMS:.0%} of the SMs a block)",
         lambda p, d: peel_edges(p, d) != (0, 0), _peeled_kernel, peel=peel_edges),
    Rule("split-k-mid", f"the tiled rule's tile would give fewer than {_IDLE_SMS:.0%} of the SMs a block: K split "
         "into whole 16-deep slices of 128x64 tiles, as many as put the least work on the busiest SM (of 64x64 tiles "
         f"with tile sums, {_MID_SUMS_DEPTH} deep or more, at most {_MID_SUMS_MOST}, where those number "
         f"{_MID_SUMS_TILES[0]:g} to {_MID_SUMS_TILES[1]:g} per SM), then summed in a fixed order", _idle_sms,
         _mid_kernel, mid_splits),
    Rule("tiled", "warp tiling; the largest block tile that gives half the SMs a block with little padding and, "
         "past one wave, no mostly idle last wave (64x64 for small and skinny products)", lambda p, d: True, _fill),
)
_RULES_WITHOUT_COPIES = tuple(r for r in RULES if not r.pad)

# --------------------------------------------------------------------------------------------------------
# Where cuBLAS is ahead: shape classes whose table kernel the bench measured behind cuBLAS (docs/kernels.md,
# full bench table, H100). fastmm arrays still run fastmm's kernel there (the user chose fastmm); plain CuPy
# code under `accelerate_cupy` lets CuPy run them, so the hook never makes a product slower than CuPy alone.
# --------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ahead:
    name: str
    measured: str
    test: Callable[[Problem, Choice, Device], bool]


# Skinny products below this many multiply-adds per output column of the long side are bound by the per-call
# cost, where fastmm's path is the cheaper one (64x64: 13.8 us a call against CuPy's 18.1).
_SKINNY_MIN_ELEMENTS = 1 << 22

CUBLAS_AHEAD: tuple[Ahead, ...] = (
    Ahead("skinny", f"an output side of 17 to {_SKINNY - 1} with a long K: split-K on 64x64 tiles, which ran "
          "4096x16x4096 at 0.50x cuBLAS before the few-column kernel took N <= 16",
          lambda p, c, d: _skinny(p) and c.rule == "split-k" and p.k * max(p.m, p.n) * p.batch >= _SKINNY_MIN_ELEMENTS),
    Ahead("partial wave", f"fewer 128x64 tiles than {_SUMS_BELOW_WAVE:g} of a wave on a K too short or a product too "
          "small to split (768^3 ran 0.73x cuBLAS so before split-K took it)",
          lambda p, c, d: c.config.name == WT128x64_SUMS),
    Ahead("unaligned", "rows or operands not 16-byte aligned, over a full wave of tiles, where the operands are not "
          f"copied aligned (below 2^{_PAD_MIN_MACS.bit_length() - 1} multiply-adds): 4-byte copies (2501^3 0.81x "
          "cuBLAS; from 2^34 on aligned copies, K padded and summed in runs, 3001^3 0.93x, 4097^3 1.09x; below it, with "
          "a ragged edge of at most 16 rows or columns peeled off instead, 2049^3 1.05x)",
          lambda p, c, d: c.variant.vec == 1 and p.blocks(c.config) >= d.sm_count
          and c.rule not in ("few-columns", "ragged-edge", "aligned-copy")),
)


def cublas_ahead(problem: Problem, choice: Choice, device: Device) -> str | None:
    """Why cuBLAS is measured ahead of `choice` for `problem` (a line of `CUBLAS_AHEAD`), or None.

    A forced kernel is never second-guessed: the user asked for it; nor a tensor-core precision mode."""
    if choice.rule in ("forced", "tensor"):  # measured for the FP32 paths; a tensor-core mode was asked for
        return None
    for ahead in CUBLAS_AHEAD:
        if ahead.test(problem, choice, device):
            return f"{ahead.name}: {ahead.measured}"
    return None


class CublasAhead(Exception):
    """Raised before any launch when the products are yielding to cuBLAS and the plan says it is ahead."""


_yield: contextvars.ContextVar[bool] = contextvars.ContextVar("fastmm_yield_to_cublas", default=False)


def yielding_to_cublas() -> bool:
    return _yield.get()


class yield_to_cublas:
    """Inside the block, a product whose class `CUBLAS_AHEAD` names raises `CublasAhead` before any launch.

    A class rather than a generator-based context manager: the CuPy hook enters one per product."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _yield.set(True)

    def __exit__(self, *exc):
        _yield.reset(self._token)
        return False


# --------------------------------------------------------------------------------------------------------
# Precision modes (PyTorch's names): which arithmetic a float32 product may use.
# --------------------------------------------------------------------------------------------------------

PRECISIONS: dict[str, str] = {
    "highest": "FP32 FMAs on the SIMT cores (float32 products as NumPy's BLAS computes them)",
    "high": "3xTF32 on the tensor cores (each operand split into two TF32 parts; FP32 accuracy)",
    "medium": "one TF32 pass on the tensor cores (operands rounded to 10-bit mantissas: relative error near 3e-4)",
}
TF32X3_TILES = ("tf32x3_128x128x32_64x32_s3", "tf32x3_128x128x16_64x32_s3", "tf32x3_64x64x16_32x32_s4")
TF32_TILES = ("tf32_128x256x16_64x64_s3", "tf32_64x64x16_32x32_s4")
_TENSOR_TILES = {"high": TF32X3_TILES, "medium": TF32_TILES}
# Hopper's warpgroup MMA on operands split beforehand (wgmma.cu, split.cu): single products large enough that the
# split passes (a read and a write of each operand, twice for 3xTF32's two parts) are a small part of the time.
# Measured on an H100 (TFLOP/s, same run): 3xTF32 on wgmma against mma.sync's best tile and the FP32 table: 512^3
# 8.7 / 11.5 / 12.7, 768^3 20.3 / 18.9 / 25.1, 1000^3 34.9 / 33.6 / 34.5, 1536^3 46.5 / 34.1 / 39.0, 4096^3
# 86.8 / 41.4 / 51.5; one TF32 pass on wgmma against mma.sync's best: 512^3 10.7 / 13.0, 768^3 26.5 / 23.4,
# 4096^3 219 / 95. On Hopper, "high" below its threshold runs the FP32 table: as accurate, and faster there than
# either tensor-core path (3xTF32 on mma.sync ran slower than FP32 FMAs on every shape class measured).
# With specialised warps (rung 5b's second version), 3xTF32 on wgmma against the FP32 table ("high" either way), x
# cuBLAS SGEMM in the same run: 768^3 0.86x / 1.03x (36 block tiles of 128x128: a quarter of the SMs), 1000^3
# 1.29x / 1.05x (64 tiles), 1024^3 1.32x / 1.03x, 1536^3 1.55x / 1.02x: the threshold moved down to 8 x 8 tiles.
TF32X3_WG = "tf32x3wg_128x128x32_s3"
TF32_WG = "tf32wg_128x256x32_s4"
_WG_TILES = {"high": TF32X3_WG, "medium": TF32_WG}
_WG_MIN_MACS = {"high": 960 ** 3, "medium": 1 << 28}
# ... and an output at least this wide both ways: the split passes move 12 bytes per element of A and B against
# 2 * M * N * K FLOPs, a share ~ 1/M + 1/N of the time (65536x128x128: "high" on wgmma 0.69x cuBLAS SGEMM where
# the FP32 table runs 1.00x; 16384x16384x64: 1.49x against 1.25x).
_WG_MIN_SIDE = {"high": 960, "medium": 512}


def _macs(n: int) -> str:
    """A threshold of multiply-adds as the docs write it: 2^k, or s^3."""
    if n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{round(n ** (1 / 3))}^3"


def _hopper(device: Device) -> bool:
    return device.compute_capability == (9, 0)


def _wgmma(problem: Problem, device: Device, precision: str) -> bool:
    """A product the wgmma kernels take in a tensor-core precision: a single large one, on Hopper."""
    # Each operand split in one launch (about 2.1 million rows of A, and of B^T: the split pass's grid; see
    # Split.rows_per_launch): a longer one would be multiplied in pieces, which the FP32 tiles need not do.
    bm, bn = get_config(_WG_TILES[precision]).tile
    return (_hopper(device) and problem.batch == 1 and min(problem.m, problem.n) >= _WG_MIN_SIDE[precision]
            and problem.m * problem.n * problem.k >= _WG_MIN_MACS[precision]
            and problem.m <= SPLIT.rows_per_launch(bm) and problem.n <= SPLIT.rows_per_launch(bn))


_precision_default = "highest"  # the process-wide setting (set_float32_matmul_precision)
_precision: contextvars.ContextVar[str | None] = contextvars.ContextVar("fastmm_precision", default=None)


def _check_precision(mode) -> str:
    if mode not in PRECISIONS:
        raise ValueError(f"unknown float32 matmul precision {mode!r}; valid values: "
                         f"{', '.join(repr(p) for p in PRECISIONS)}")
    return mode


def set_float32_matmul_precision(precision: str) -> None:
    """Set the arithmetic of fastmm's float32 products for the whole process, as PyTorch's function of this name.

    Parameters
    ----------
    precision : {"highest", "high", "medium"}
        ``"highest"`` (the default): FP32 FMAs, as NumPy's and CuPy's float32 products. ``"high"``: 3xTF32 on the
        tensor cores, FP32 accuracy. ``"medium"``: one TF32 pass on the tensor cores, relative error near 3e-4
        (what ``CUPY_TF32=1`` gives cuBLAS).

    Raises
    ------
    ValueError
        For any other value; the message lists the valid ones.

    See Also
    --------
    get_float32_matmul_precision, matmul_precision
    explain : Names the mode and the kernel of a product.

    Notes
    -----
    A `matmul_precision` block and the ``precision=`` keyword of fastmm's product functions override it.
    Products of other dtypes are unaffected. NumPy has no counterpart; JAX's ``precision=`` and CuPy's
    ``CUPY_TF32`` are compared on the kernels page of the documentation.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.set_float32_matmul_precision("high")
    >>> fastmm.get_float32_matmul_precision()
    'high'
    >>> fastmm.set_float32_matmul_precision("highest")
    """
    global _precision_default
    _precision_default = _check_precision(precision)


def get_float32_matmul_precision() -> str:
    """The precision float32 products use here and now: an enclosing `matmul_precision` block's, else the
    process-wide one (`set_float32_matmul_precision`).

    Returns
    -------
    str
        ``"highest"``, ``"high"`` or ``"medium"``.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.get_float32_matmul_precision()
    'highest'
    """
    return _precision.get() or _precision_default


class matmul_precision(contextlib.ContextDecorator):
    """Use `precision` for every float32 product inside the block (of this thread or asyncio task).

    Parameters
    ----------
    precision : {"highest", "high", "medium"}
        As for `set_float32_matmul_precision`.

    Raises
    ------
    ValueError
        On entering the block, for an unknown value.

    See Also
    --------
    set_float32_matmul_precision : The process-wide setting.

    Examples
    --------
    >>> import fastmm
    >>> with fastmm.matmul_precision("medium"):
    ...     fastmm.get_float32_matmul_precision()
    'medium'
    >>> print(fastmm.explain((4096, 4096), (4096, 4096), precision="high"))  # doctest: +ELLIPSIS
    4096x4096x4096 float32 ...
      kernel  tf32x3wg_128x128x32_s3
      mode    high: 3xTF32 on the tensor cores ...
    """

    # A class rather than a generator-based context manager: fastmm's functions enter one per call of theirs that
    # names ``precision=``, and a generator costs a microsecond or two of such a call.
    def __init__(self, precision: str):
        self.precision = precision
        self._tokens = []  # a stack: the same block may be entered again inside itself

    def __enter__(self) -> None:
        self._tokens.append(_precision.set(_check_precision(self.precision)))

    def __exit__(self, *exc) -> bool:
        _precision.reset(self._tokens.pop())
        return False

    def _recreate_cm(self):
        # As a decorator: a block of its own for each call, so that calls from several threads never share tokens.
        return type(self)(self.precision)


def _tensor(problem: Problem, device: Device, precision: str) -> tuple[str, str, str]:
    """(kernel, rule, reason) of a product in a tensor-core precision."""
    if _wgmma(problem, device, precision):
        return (_WG_TILES[precision], "tensor-wgmma",
                f"precision {precision!r}, a single product of >= {_macs(_WG_MIN_MACS[precision])} "
                f"multiply-adds with both output sides >= {_WG_MIN_SIDE[precision]} on Hopper: warpgroup MMA (wgmma) "
                "on A and B split into TF32 parts by a pass over each, as swizzled block tiles that one warpgroup "
                "copies in while two multiply")
    names = _TENSOR_TILES[precision]
    return (_fill_from(names)(problem, device), "tensor",
            f"precision {precision!r}: tensor-core tiles, the largest that gives half the SMs a block with little "
            "padding")


# What `kernel="<family>"` means: the table restricted to one family.
_FAMILY_DEFAULT: dict[str, Callable[[Problem, Device], str]] = {
    "naive": lambda p, d: NAIVE,
    "smem": _smem_for,
    "regtile": _fill_regtile,
    "warptile": _fill,
    "tf32x3": _fill_from(TF32X3_TILES),
    "tf32": _fill_from(TF32_TILES),
    "tf32x3wg": lambda p, d: TF32X3_WG,
    "tf32wg": lambda p, d: TF32_WG,
    "skinny": _skinny_for,
}


def kernel_names() -> list[str]:
    """Every name ``kernel=`` and `use_kernel` accept.

    Returns
    -------
    list of str
        ``"auto"`` (the heuristic table, or an autotuned entry), then the kernel families (``"naive"``,
        ``"smem"``, ``"regtile"``, ``"warptile"``: the table restricted to that family, tile chosen for the
        shape), then every kernel configuration by name.

    See Also
    --------
    use_kernel, explain

    Notes
    -----
    The configurations are described in the kernel ladder (docs/kernels.md); ``python -m fastmm compile``
    lists their ptxas resources. NumPy has no counterpart.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.kernel_names()[:5]
    ['auto', 'naive', 'smem', 'regtile', 'warptile']
    >>> "regtile_128x128x8_8x8" in fastmm.kernel_names()
    True
    """
    return ["auto", *FAMILIES, *(c.name for c in CONFIGS)]


_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("fastmm_forced_kernel", default=None)


def _check_name(name: str) -> str:
    if name != "auto" and name not in FAMILIES:
        try:
            get_config(name)
        except KeyError:
            raise KeyError(f"unknown kernel {name!r}; valid names: {', '.join(kernel_names())}") from None
    return name


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    """Force one kernel (a family or a configuration name) for every float32 product inside the block.

    A context manager. Products of other dtypes are unaffected, and a ``kernel=`` argument to a product
    still wins over it. Blocks nest (the innermost wins) and are local to the thread or asyncio task that
    enters them (a `contextvars.ContextVar`): another thread's products keep their own choice.

    Parameters
    ----------
    name : str
        ``"auto"``, a family (``"naive"``, ``"smem"``, ``"regtile"``, ``"warptile"``) or a configuration
        name, as listed by `kernel_names`.

    Raises
    ------
    KeyError
        On entering the block, for an unknown name; the message lists the valid ones.

    See Also
    --------
    kernel_names, explain
    matmul : Its ``kernel=`` keyword forces a kernel for one product.

    Notes
    -----
    NumPy has no counterpart. The name is checked when the block is entered, before any product runs.

    Examples
    --------
    >>> import fastmm
    >>> with fastmm.use_kernel("regtile"):
    ...     print(fastmm.explain((1024, 1024), (1024, 1024)))  # doctest: +ELLIPSIS
    1024x1024x1024 float32 ...
      kernel  regtile_...
      rule    forced: kernel family 'regtile' was requested; tile chosen for the shape
      grid    ...
    >>> with fastmm.use_kernel("fastest"):
    ...     pass
    Traceback (most recent call last):
        ...
    KeyError: "unknown kernel 'fastest'; valid names: auto, naive, smem, regtile, warptile, ..."

    On a GPU machine every float32 product inside the block runs the shared-memory kernel:

    >>> import numpy as np
    >>> a = fastmm.asarray(np.ones((256, 256), np.float32))   # doctest: +SKIP
    >>> with fastmm.use_kernel("smem"):
    ...     c = a @ a                                          # doctest: +SKIP
    """
    token = _forced.set(_check_name(name))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_kernel() -> str | None:
    return _forced.get()


def settings() -> tuple:
    """What the plan of a product depends on besides its operands, in one call (a small product's replay key reads
    it on every call): the forced kernel, the float32 precision, and whether to yield to cuBLAS."""
    return _forced.get(), _precision.get() or _precision_default, _yield.get()


def invalid(config: _Config, device: Device) -> str | None:
    """Why `device` cannot run `config` (`validated`'s message), or None where it can."""
    try:
        validated(config, device)
    except ValueError as e:
        return str(e)
    return None


def validated(config: _Config, device: Device, regs_per_thread: int | None = None) -> _Config:
    """`config`, after checking it against `device` (and its compiled register count, when known)."""
    validate(config, max_threads=device.max_threads_per_block, max_smem=device.max_smem_per_block,
             max_smem_optin=device.max_smem_optin, max_regs_per_block=device.max_regs_per_block,
             regs_per_thread=regs_per_thread, compute_capability=device.compute_capability)
    return config


# --------------------------------------------------------------------------------------------------------
# Autotuned entries: written by fastmm/_autotune.py (which times candidates on the GPU), only read here.
# --------------------------------------------------------------------------------------------------------

def _size_class(x: int) -> int:
    """x rounded up to the grid 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and the halfway 1.5x steps).

    Powers of two alone put 768 with 1024, where the best tile differs (measured: 64x64 wins at 768^3 by 5%).
    """
    p = 1 << max(0, (x - 1).bit_length())
    return p * 3 // 4 if p >= 4 and x <= p * 3 // 4 else p


def tune_bucket(problem: Problem) -> str:
    """The class of problems one tuned entry stands for: sizes rounded up to `_size_class`, batched or not,
    and the layout variant (nn/tn/nt/tt, v4/v1)."""
    p = problem
    return (f"{_size_class(p.m)}x{_size_class(p.n)}x{_size_class(p.k)}{'_batched' if p.batch > 1 else ''}"
            f"_{p.variant.suffix}")


def tune_cache_path(device: Device):
    """Per GPU model, driver and fastmm version, under the user's cache directory ($FASTMM_CACHE_DIR too)."""
    import re

    from . import __version__
    from .kernels.build import cache_dir

    slug = re.sub(r"[^A-Za-z0-9]+", "-", device.name).strip("-")
    return cache_dir().parent / "autotune" / f"{slug}-{device.arch}-drv{device.driver_version}-fastmm{__version__}.json"


_tuned: dict[Device, dict] = {}
_reload_hooks: list[Callable[[], None]] = []


def tuned_entries(device: Device) -> dict:
    """The autotune cache for `device` (read once per process; empty when absent or unreadable)."""
    entries = _tuned.get(device)
    if entries is None:
        import json

        try:
            entries = json.loads(tune_cache_path(device).read_text()).get("entries", {})
        except (OSError, ValueError):
            entries = {}
        _tuned[device] = entries
    return entries


def reload_tuned() -> None:
    """Forget cached decisions after the autotune cache changed (the dispatcher's replays too)."""
    _tuned.clear()
    _memo.clear()
    for hook in _reload_hooks:
        hook()


def on_reload(hook: Callable[[], None]) -> None:
    _reload_hooks.append(hook)


_memo: dict[tuple, Choice] = {}


def _by_rules(problem: Problem, device: Device, rules: tuple[Rule, ...]) -> Choice:
    """The first of `rules` that applies to `problem` (the last one always does)."""
    for rule in rules:
        if rule.test(problem, device):
            name = rule.kernel(problem, device) if callable(rule.kernel) else rule.kernel
            splits = rule.splits(problem, device) if rule.splits else 1
            peel = rule.peel(problem, device) if rule.peel else (0, 0)
            config = get_config(name)
            return Choice(config, problem.variant_for(config), rule.name, rule.reason, splits, peel, rule.pad)
    raise AssertionError("the last rule applies to every problem")


# Where a GPU cannot give a block the table's configuration's shared memory (Hopper: 227 KiB; A100: 163 KiB; Ada:
# 99 KiB), the same block tile with 16-deep stages (half the bytes) runs instead: the table's choices stay the
# measured ones on Hopper, and no GPU that runs the warp tiles meets a configuration it cannot launch.
_LIGHTER = {
    WT256_LOOP: WT256_LOOP16,      # 196 KiB -> 98 KiB
    WT256_32: WT256,               # 196 KiB -> 98 KiB
    WT256_SLICES: WT256_LOOP16,    # 226 KiB (the partial sums' slots) -> 98 KiB: one running sum
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


def choose(problem: Problem, device: Device = Device(), kernel: str | None = None, *, tuned: bool = True,
           precision: str | None = None) -> Choice:
    """The kernel for `problem`: `kernel` if given, else the enclosing `use_kernel`, else an autotuned entry
    for its class (unless `tuned` is False), else the table; in `precision` (default: the current one, see
    `get_float32_matmul_precision`)."""
    kernel = kernel if kernel is not None else (_forced.get() or "auto")
    precision = precision or _precision.get() or _precision_default
    key = (problem, device, kernel, tuned, precision)
    hit = _memo.get(key)
    if hit is not None:
        return hit
    _check_name(kernel)
    if kernel == "auto":
        choice = _by_rules(problem, device, RULES)
        if precision != "highest":
            if choice.rule in ("split-k", "few-columns"):  # memory-bound or split: the FP32 paths
                choice = dataclasses.replace(choice, reason=choice.reason + f" (in every precision: {precision!r} "
                                             "uses FP32 FMAs here)")
            elif precision == "high" and _hopper(device) and not _wgmma(problem, device, precision):
                choice = dataclasses.replace(choice, reason=choice.reason + " (in 'high' precision: FP32 FMAs, as "
                                             "accurate as 3xTF32 and faster than it below "
                                             f"{_macs(_WG_MIN_MACS['high'])} multiply-adds or an output "
                                             f"side of {_WG_MIN_SIDE['high']} on Hopper)")
            elif choice.rule != "empty":
                name, rule, reason = _tensor(problem, device, _check_precision(precision))
                choice = Choice(get_config(name), problem.variant, rule, reason)
        choice = _lighter(choice, device)
        # A tuned entry for this problem class overrides the table, except where the table's answer is not a
        # choice of configuration (nothing to do, or a split-K plan the tuner does not time).
        entry = None
        if tuned and choice.splits == 1 and choice.rule not in ("empty", "tensor", "tensor-wgmma", "few-columns",
                                                                "ragged-edge", "aligned-copy"):
            entry = tuned_entries(device).get(tune_bucket(problem))
        if entry is not None and entry.get("kernel") in _BY_NAME:
            choice = Choice(get_config(entry["kernel"]), problem.variant, "tuned",
                            f"autotuned on this GPU for {tune_bucket(problem)}: {entry['tflops']:.1f} TFLOP/s "
                            f"against {entry['heuristic_tflops']:.1f} for the table's {entry['heuristic']}")
    elif kernel in FAMILIES:
        config = get_config(_FAMILY_DEFAULT[kernel](problem, device))
        choice = _lighter(Choice(config, problem.variant_for(config), "forced",
                                 f"kernel family {kernel!r} was requested; tile chosen for the shape"), device)
    else:
        config = get_config(kernel)
        choice = Choice(config, problem.variant_for(config), "forced", f"kernel {kernel!r} was requested")
    validated(choice.config, device)
    if len(_memo) > 4096:
        _memo.clear()
    _memo[key] = choice
    return choice


# Names the rules use must exist: catch a renamed configuration at import, not at the first product.
for _name in (NAIVE, SMEM16, SMEM32, RT128, RT128x64, RT64, WT256_LOOP, WT256_32, WT256_LOOP16, WT256_SLICES, WT256,
              WT128x64_LOOP, WT128x64, WT128x64_SUMS, WT64, *TF32X3_TILES, *TF32_TILES, *SKINNY):
    get_config(_name)
assert all(isinstance(get_config(n), TensorTile) for n in TF32X3_TILES + TF32_TILES)
assert all(isinstance(get_config(n), WgTile) for n in _WG_TILES.values())
assert isinstance(get_config(RT128), RegTile) and isinstance(get_config(WT64), WarpTile)
