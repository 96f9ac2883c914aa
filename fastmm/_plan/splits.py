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
    """How split-K cuts K into `splits` slices: (depth, full slices of that depth, the K left over). Slices are
    whole 16-deep steps (every tile's K-tile divides 16), so that they run as one batched launch; the rest runs as
    one shallow launch of its own, after them (docs/kernels/split-k.md, section 'Ragged edges: peeled off as few-row
    and few-column products').

    That rest is up to 16 values a slice: at 27 slices of 7157 (256 deep), 245. The unrolled warp tiles take any
    depth at full speed (a slice's last K-tile zero-filled), so for `config` among them slices may instead be
    k // splits deep, leaving fewer than `splits` values: the cut that runs fewer K-tiles one after another (a launch
    of the rest counted as one more) wins, ties to whole steps (docs/kernels/split-k.md, section 'The cut: what is
    left of K')."""
    depth = max(8, k // splits // 16 * 16)
    full = min(splits, k // depth)
    whole = (depth, full, k - full * depth)
    if isinstance(config, WarpTile) and not config.sub_k and k // splits >= config.bk:
        exact = (k // splits, splits, k % splits)
        if _in_series(exact, config.bk) < _in_series(whole, config.bk):
            return exact
    return whole


def _in_series(cut: tuple[int, int, int], bk: int) -> int:
    """K-tiles a cut runs one after another: a slice's, then the rest's launch (its K-tiles and one for the launch)."""
    depth, _, rest = cut
    return -(-depth // bk) + (-(-rest // bk) + 1 if rest else 0)
