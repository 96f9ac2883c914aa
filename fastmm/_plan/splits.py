"""How split-K cuts K: its depths, the count of slices on the small tiles, the cut into one batched launch and a
rest (docs/kernels/split-k.md)."""

from __future__ import annotations

from ..kernels.configs import KernelConfig, WarpTile
from .problem import Device, Problem

__all__ = ["split_cut", "slices_of"]

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
