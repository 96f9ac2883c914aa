"""The first two rungs of the ladder as configurations: one thread per element of C (`Naive`, also the small
rule's kernel with float64 sums), and shared-memory tiles (`Smem`). Pure Python, like configs.py."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import KernelConfig

__all__ = ["Naive", "Smem"]


@dataclasses.dataclass(frozen=True)
class Naive(KernelConfig):
    """One thread per element of C (or per `tm` x `tn` piece of it)."""

    block_x: int = 32
    block_y: int = 8
    f64_sums: bool = False  # sums in float64: C is the exact product rounded once
    k_lanes: bool = False  # a warp per element of C, its lanes sharing K (with f64_sums)
    tm: int = 1  # rows of C per thread ...
    tn: int = 1  # ... and columns (4: a 16-byte store; the outer-products kernel)
    family: ClassVar[str] = "naive"
    source: ClassVar[str] = "1_naive.cu"

    @property
    def name(self) -> str:
        sums = ("_f64dot" if self.k_lanes else "_f64sum") if self.f64_sums else ""
        piece = f"_{self.tm}x{self.tn}" if (self.tm, self.tn) != (1, 1) else ""
        return f"naive_{self.block_x}x{self.block_y}{sums}{piece}"

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.block_x, self.block_y, 1)

    @property
    def tile(self) -> tuple[int, int]:
        return (1, self.block_y) if self.k_lanes else (self.block_y * self.tm, self.block_x * self.tn)

    @property
    def smem_bytes(self) -> int:
        return 0

    def _tile_macros(self) -> dict[str, int]:
        return {"BLOCK_X": self.block_x, "BLOCK_Y": self.block_y, "F64_SUMS": int(self.f64_sums),
                "K_LANES": int(self.k_lanes), "TM": self.tm, "TN": self.tn}

    def _check(self) -> list[str]:
        if self.k_lanes and (self.block_x != 32 or not self.f64_sums):
            return [f"k_lanes needs block_x 32 (a warp) and f64_sums (got {self.block_x}, {self.f64_sums})"]
        if (self.tm, self.tn) != (1, 1) and (self.tn != 4 or self.tm < 1 or self.f64_sums or self.k_lanes):
            return [f"a piece of C per thread needs tn 4 (a 16-byte store), tm >= 1 and FP32 sums (got tm {self.tm}, "
                    f"tn {self.tn}, f64_sums {self.f64_sums}, k_lanes {self.k_lanes})"]
        return []


@dataclasses.dataclass(frozen=True)
class Smem(KernelConfig):
    """Shared-memory tiling over K with TILE x TILE tiles, one thread per element of C."""

    tile_size: int = 32
    family: ClassVar[str] = "smem"
    source: ClassVar[str] = "2_smem.cu"

    @property
    def name(self) -> str:
        return f"smem_{self.tile_size}"

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.tile_size, self.tile_size, 1)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.tile_size, self.tile_size)

    @property
    def smem_bytes(self) -> int:
        return 2 * self.tile_size * self.tile_size * 4

    def _tile_macros(self) -> dict[str, int]:
        return {"TILE": self.tile_size}

    def _check(self) -> list[str]:
        return []
