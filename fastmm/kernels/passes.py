"""The passes around the products: split-K's ordered slice sum, the aligned copies (repitch) and the TF32 split.
Each is launched through the same runtime as the products, one binary for every layout."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import MAX_GRID_Y, KernelConfig

__all__ = ["SliceSum", "Repitch", "Split", "SLICE_SUM", "REPITCH", "SPLIT", "AUXILIARY"]


class _Auxiliary(KernelConfig):
    """A kernel that is not a product's (never planned, forced or benchmarked as one), launched through the same
    runtime as the products: one binary for every layout, THREADS threads in a row, named by its family."""

    THREADS: ClassVar[int] = 256

    @property
    def name(self) -> str:
        return self.family

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.THREADS, 1, 1)

    def _tile_macros(self) -> dict[str, int]:
        return {}

    def _check(self) -> list[str]:
        return []


@dataclasses.dataclass(frozen=True)
class SliceSum(_Auxiliary):
    """Not a product's kernel: split-K's ordered sum of the slices' partial products into C
    (fastmm/kernels/pass_slice_sum.cu), launched through the same runtime as the products (M x N the result, K the number
    of slices). A block adds 4 consecutive elements per group of threads, over every slice: with many slices its
    threads split into groups that each add every G-th slice (`slice_groups`)."""

    family: ClassVar[str] = "slicesum"
    source: ClassVar[str] = "pass_slice_sum.cu"

    @staticmethod
    def slice_groups(slices: int) -> int:
        """pass_slice_sum.cu's slice_groups: 1 up to 15 slices, then doubling with the slices, at most 32."""
        g = 1
        while g < 32 and 16 * g <= slices:
            g *= 2
        return g

    @property
    def tile(self) -> tuple[int, int]:
        # One row per grid row for the runtime's split of more than 65535 rows into launches; the grid itself is
        # flat (below).
        return (1, 4 * self.THREADS)

    @property
    def smem_bytes(self) -> int:
        return 16 * self.THREADS

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        per_block = 4 * (self.THREADS // self.slice_groups(k))
        return (max(1, -(-m * n // per_block)), 1, 1)


@dataclasses.dataclass(frozen=True)
class Repitch(_Auxiliary):
    """Not a product's kernel: an operand copied into rows padded to 16 bytes (fastmm/kernels/pass_repitch.cu), for the
    plan's aligned copies. M x K the operand (its rows along the unit stride), a_sm its row stride; M x N the copy
    (N >= K, zeros past K), c_sm its row stride."""

    family: ClassVar[str] = "repitch"
    source: ClassVar[str] = "pass_repitch.cu"

    ROWS: ClassVar[int] = 4  # rows per thread (pass_repitch.cu's ROWS)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.ROWS, 4 * self.THREADS)

    @property
    def smem_bytes(self) -> int:
        return 0


@dataclasses.dataclass(frozen=True)
class Split(_Auxiliary):
    """Not a product's kernel: the split pass of the wgmma kernels (fastmm/kernels/pass_tf32_split.cu). One operand (R x K, any
    strides) written as TF32 big and small parts in swizzled block tiles of b_sk rows by whole K-tiles, k contiguous,
    zero-padded, and a flag per 32 x 32 tile: whether it holds an infinity. M = R, N = the padded rows, K = K,
    c_sm = the padded K."""

    family: ClassVar[str] = "split"
    source: ClassVar[str] = "pass_tf32_split.cu"
    headers: ClassVar[tuple[str, ...]] = ("tf32_round.cuh",)

    TILE: ClassVar[int] = 32  # pass_tf32_split.cu's square tile, one flag each

    @property
    def tile(self) -> tuple[int, int]:
        return (self.TILE, self.TILE)

    @property
    def smem_bytes(self) -> int:
        return self.TILE * (self.TILE + 1) * 4

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        return (max(1, -(-k // self.TILE)), max(1, -(-n // self.TILE)), 1)

    def rows_per_launch(self, block_rows: int, max_grid_y: int = MAX_GRID_Y) -> int:
        """The most rows of an operand, in whole block tiles of `block_rows`, that one launch splits: a block per 32
        padded rows along y. Neither this pass nor the layout it writes is made for a second launch at an offset,
        so a longer operand is split (and multiplied) in pieces of this many rows."""
        return self.TILE * max_grid_y // block_rows * block_rows


SLICE_SUM = SliceSum()
REPITCH = Repitch()
SPLIT = Split()
# Kernels that are not products (never planned, forced or benchmarked as one), compiled and checked like the rest.
AUXILIARY: tuple[KernelConfig, ...] = (SLICE_SUM, REPITCH, SPLIT)
