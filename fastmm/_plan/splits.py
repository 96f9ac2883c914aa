"""How split-K cuts K: its depths, the count of slices on the small tiles, the cut into one batched launch and a
rest (docs/kernels/split-k.md)."""

from __future__ import annotations

from ..kernels.configs import KernelConfig, WarpTile
from .problem import Device, Problem

__all__ = ["split_cut", "slices_of", "balanced_splits"]

# Split-K: only worth its workspace and extra pass when K dwarfs the output.
_SPLIT_MIN_K = 4096
_SPLIT_K_OVER_MN = 16
_SPLIT_SLICE = 512
_SPLIT_MIN_SLICE = 256


def _even_splits(problem: Problem, config: KernelConfig, most: int, min_depth: int) -> list[int]:
    """Slice counts from 2 to `most` that cut K into whole K-tile steps, slices at least `min_depth` deep: the split
    then runs as one batched launch (an uneven last slice runs as a launch of its own, at a fraction of the SMs)."""
    return [s for s in range(2, most + 1) if problem.k % (config.bk * s) == 0 and problem.k // s >= min_depth]


def slices_of(problem: Problem, device: Device, config: KernelConfig) -> int:
    """Slices of K on a small tile (64x64, or the narrow 32x128 and 128x32): about _SPLIT_SLICE deep, deeper only
    where that leaves less than a wave of blocks (never shallower than _SPLIT_MIN_SLICE), at least 2."""
    wave = -(-config.min_blocks * device.sm_count // problem.tiles(config))
    return max(2, problem.k // _SPLIT_SLICE, min(wave, problem.k // _SPLIT_MIN_SLICE))


# Split-K on the unrolled warp tiles (any depth, one launch) takes, of these counts (and the rule's own), the one that
# leaves the busiest SM the least work: its blocks, ceil(tiles x slices / SMs), each as deep as a slice plus a block's
# fixed cost, slowed where fewer than _BUSY_WARPS warps share the SM; a split adds its sum's pass. On 169 single
# products of the random sweep (seeds 0-3) this took the geomean from 0.95x to 1.00x cuBLAS (the best count of each:
# 1.01x), 91 -> 68 below 0.9x (docs/kernels/split-k.md, section 'How many slices').
_BALANCED_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
_BALANCED_MIN_DEPTH = 128
_BUSY_WARPS = 8
_BLOCK_STEPS = 32  # a block's prologue and epilogue, in steps of k
_SUM_STEPS = 50  # the slice-sum pass, in steps of k of a 64x64 block


def balanced_splits(problem: Problem, device: Device, config: WarpTile, own: int, least: int = 2) -> int:
    """The count of slices, of _BALANCED_COUNTS from `least` and the rule's `own`, each at least _BALANCED_MIN_DEPTH
    deep, that puts the least work on the busiest SM (see above); `own` where none is that deep."""
    tiles = problem.tiles(config)
    warps = config.threads // 32
    area = config.bm * config.bn / 4096

    def work(splits: int) -> float:
        blocks = -(-tiles * splits // device.sm_count)  # on the busiest SM
        speed = min(1.0, min(blocks, config.min_blocks) * warps / _BUSY_WARPS)
        steps = blocks * (-(-problem.k // splits) + _BLOCK_STEPS) * area / speed
        return steps + (_SUM_STEPS if splits > 1 else 0)

    counts = [s for s in {*_BALANCED_COUNTS, own} if s >= least and problem.k // s >= _BALANCED_MIN_DEPTH]
    return min(counts, key=lambda s: (work(s), s), default=own)


def split_cut(k: int, splits: int, config: KernelConfig | None = None) -> tuple[int, int, int]:
    """How split-K cuts K into `splits` slices: (depth, slices, the K left over), the slices one batched launch.

    The unrolled warp tiles take any depth at full speed (a slice's last K-tile zero-filled) and a last slice short of
    the others (the kernel's k_total): for `config` among them, ceil(k / splits) deep, the last ending at K, nothing
    left over (docs/kernels/split-k.md, section 'The cut: what is left of K'). Elsewhere slices are whole 16-deep
    steps (every tile's K-tile divides 16; the sub-tile loops need them) and the rest, up to 16 values a slice (27
    slices of 7157: 256 deep, 245 left), runs as one shallow launch of its own after them."""
    if isinstance(config, WarpTile) and not config.sub_k and k // splits >= config.bk:
        depth = -(-k // splits)
        return depth, -(-k // depth), 0
    depth = max(8, k // splits // 16 * 16)
    full = min(splits, k // depth)
    return depth, full, k - full * depth
