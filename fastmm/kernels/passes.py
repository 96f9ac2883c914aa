"""The passes around the products: split-K's ordered slice sum, the aligned copies (repitch), the TF32 split, and Ozaki
scheme II's scaling, residue and reconstruction passes. Each is launched through the same runtime as the products, one
binary for every layout."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import MAX_GRID_Y, KernelConfig

__all__ = ["SliceSum", "Repitch", "Split", "SLICE_SUM", "REPITCH", "SPLIT", "OZAKI_MODULI", "NONFINITE",
           "OZAKI_NORM_SLACK", "OzakiScale", "OzakiResidues", "OzakiCrt", "OZAKI_SCALE", "OZAKI_RESIDUES", "OZAKI_CRT",
           "NonfiniteFix", "NONFINITE_FIX", "AUXILIARY"]


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
    of slices). A block adds a quad of 4 elements per group of threads, over every slice: with many slices its threads
    split into groups that each add every G-th slice (`slice_groups`)."""

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
        # Quads of 4 elements: a row's own where the workspace's rows are padded, else of the flattened M x N (fewer).
        per_block = self.THREADS // self.slice_groups(k)
        return (max(1, -(-m * -(-n // 4) // per_block)), 1, max(1, batch))  # z: a batch of split products


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


class _SquareTile:
    """A pass that moves TILE x TILE squares of 4-byte values through shared memory, padded by a column (no bank
    conflicts on the transposed reads)."""

    TILE: ClassVar[int]

    @property
    def tile(self) -> tuple[int, int]:
        return (self.TILE, self.TILE)

    @property
    def smem_bytes(self) -> int:
        return self.TILE * (self.TILE + 1) * 4


@dataclasses.dataclass(frozen=True)
class Split(_SquareTile, _Auxiliary):
    """Not a product's kernel: the split pass of the wgmma kernels (fastmm/kernels/pass_tf32_split.cu). One operand (R x K, any
    strides) written as TF32 big and small parts in swizzled block tiles of b_sk rows by whole K-tiles, k contiguous,
    zero-padded, and a flag per 32 x 32 tile: whether it holds an infinity. M = R, N = the padded rows, K = K,
    c_sm = the padded K."""

    family: ClassVar[str] = "split"
    source: ClassVar[str] = "pass_tf32_split.cu"
    headers: ClassVar[tuple[str, ...]] = ("tf32_round.cuh",)

    TILE: ClassVar[int] = 32  # pass_tf32_split.cu's square tile, one flag each

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        return (max(1, -(-k // self.TILE)), max(1, -(-n // self.TILE)), 1)

    def rows_per_launch(self, block_rows: int, max_grid_y: int = MAX_GRID_Y) -> int:
        """The most rows of an operand, in whole block tiles of `block_rows`, that one launch splits: a block per 32
        padded rows along y. Neither this pass nor the layout it writes is made for a second launch at an offset,
        so a longer operand is split (and multiplied) in pieces of this many rows."""
        return self.TILE * max_grid_y // block_rows * block_rows


# Ozaki scheme II's moduli (fastmm/_plan/ozaki.py says why these): compiled into its passes as constants, so that each
# `%` is a multiplication.
OZAKI_MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 211, 199, 197, 193, 191, 181, 179, 173, 167)
# The scaling pass's shift for a row or column that holds a NaN or an infinity (it takes the FP32 path instead).
NONFINITE = -(1 << 30)
# The scaling pass takes a row's 2-norm, summed in double, this much larger: past the sum's rounding (K 2^-53), so that
# the bound it keeps holds.
OZAKI_NORM_SLACK = 1 + 2.0**-30


class _Ozaki(_Auxiliary):
    """An Ozaki scheme II pass: the moduli and the non-finite marker as macros."""

    def _tile_macros(self) -> dict[str, int | str]:
        return {"NMODULI": len(OZAKI_MODULI), "MODULI": ", ".join(map(str, OZAKI_MODULI)), "NONFINITE": NONFINITE,
                "NORM_SLACK": repr(OZAKI_NORM_SLACK)}


@dataclasses.dataclass(frozen=True)
class OzakiScale(_Ozaki):
    """Not a product's kernel: Ozaki scheme II's scaling pass (fastmm/kernels/pass_ozaki_scale.cu). One operand (R x K,
    any strides; B as B^T) gets a shift per row: the power of two that puts its 2-norm just below 2^bits, or
    NONFINITE. M = R, K = K, C the shifts, c_sn = bits; a block per 32 rows."""

    family: ClassVar[str] = "ozakiscale"
    source: ClassVar[str] = "pass_ozaki_scale.cu"

    ROWS: ClassVar[int] = 32  # rows per block (pass_ozaki_scale.cu's ROWS)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.ROWS, 1)

    @property
    def smem_bytes(self) -> int:
        return 8 * self.ROWS * (4 + 8)  # the warps' largest magnitudes and sums of squares

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        return (max(1, -(-m // self.ROWS)), 1, 1)


@dataclasses.dataclass(frozen=True)
class OzakiResidues(_SquareTile, _Ozaki):
    """Not a product's kernel: Ozaki scheme II's residue pass (fastmm/kernels/pass_ozaki_residues.cu). One operand (R x
    K, any strides; B as B^T), scaled by its shifts and rounded, written as the int8 residues of each of the first n
    moduli in the INT8 product kernel's tiles (`fastmm._plan.ozaki.tiles`). M = R, N = the padded rows, K = K, b_sk =
    the tile's rows, b_sn = n, c_sm = the padded K, c_sb0 = bytes per modulus; a block per 64 x 64 tile."""

    family: ClassVar[str] = "ozakiresidues"
    source: ClassVar[str] = "pass_ozaki_residues.cu"

    TILE: ClassVar[int] = 64  # pass_ozaki_residues.cu's square tile

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        return (max(1, 2 * -(-k // 128)), max(1, -(-n // self.TILE)), 1)  # whole 128-deep K-tiles, padded rows

    def rows_per_launch(self) -> int:
        """The most rows one launch writes (the grid's y): the pass's layout is not made for a second launch at an
        offset, so Ozaki scheme II takes operands up to this many rows."""
        return self.TILE * MAX_GRID_Y // 256 * 256


@dataclasses.dataclass(frozen=True)
class OzakiCrt(_Ozaki):
    """Not a product's kernel: Ozaki scheme II's reconstruction (fastmm/kernels/pass_ozaki_crt.cu): C from the uint8
    residues of the n INT8 products (int8wg_..._mod's) by the Chinese remainder theorem, scaled back, as float32. M x N the result (one launch: at most
    MAX_GRID_Y rows), K = n; A the products, B the table and the shifts, C and c_sm the result."""

    family: ClassVar[str] = "ozakicrt"
    source: ClassVar[str] = "pass_ozaki_crt.cu"

    COLUMNS: ClassVar[int] = 4  # of C per thread: 4-byte loads of each modulus's residues, 16-byte stores

    @property
    def tile(self) -> tuple[int, int]:
        return (1, self.THREADS * self.COLUMNS)

    @property
    def smem_bytes(self) -> int:
        return 0

    def _tile_macros(self) -> dict[str, int | str]:
        return {**super()._tile_macros(), "COLUMNS": self.COLUMNS}


@dataclasses.dataclass(frozen=True)
class NonfiniteFix(_Auxiliary):
    """Not a product's kernel: after a one-pass wgmma product whose operands went through tensor maps
    (fastmm/kernels/pass_nonfinite_fix.cu), each element of C that is not finite, in the block tiles the product
    flagged with its mark, computed again in FP32 from A and B as they are (M x N x K the product's; a_sb0 the
    flags' address, a_sb1 the block tiles in a row, b_sb0 the product's mark). Where nothing is flagged, its blocks
    return at once."""

    family: ClassVar[str] = "nonfinitefix"
    source: ClassVar[str] = "pass_nonfinite_fix.cu"
    bm: int = 128  # the product's block tile (6_wgmma.cu's BM x BN)
    bn: int = 256

    @property
    def tile(self) -> tuple[int, int]:
        return (self.bm, self.bn)

    @property
    def smem_bytes(self) -> int:
        return 0

    def _tile_macros(self) -> dict[str, int | str]:
        return {"BM": self.bm, "BN": self.bn}


SLICE_SUM = SliceSum()
REPITCH = Repitch()
NONFINITE_FIX = NonfiniteFix()
SPLIT = Split()
# Kernels that are not products (never planned, forced or benchmarked as one), compiled and checked like the rest.
OZAKI_SCALE = OzakiScale()
OZAKI_RESIDUES = OzakiResidues()
OZAKI_CRT = OzakiCrt()
AUXILIARY: tuple[KernelConfig, ...] = (SLICE_SUM, REPITCH, SPLIT, OZAKI_SCALE, OZAKI_RESIDUES, OZAKI_CRT, NONFINITE_FIX)
