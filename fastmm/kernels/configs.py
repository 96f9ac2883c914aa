"""Kernel configurations as data.

Each configuration is a small frozen object whose name is derived from its fields (``regtile_128x128x8_8x8``)
and used everywhere a kernel is named: ``kernel=`` arguments, ``explain``, logs, cache keys and benchmark
ids. A configuration knows its CUDA source file, its ``-D`` macros, its launch geometry and the resources
it needs; `validate` checks those against a device and says which number failed.

Layout variants are not configurations: they are chosen per call by the plan (``a_t``, ``b_t``, ``vec``)
and enter the same source as extra macros, each compiled once on first use.

This module is pure Python (no CUDA imports): the planner and the CPU tests use it on any machine.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

from .base import MAX_GRID_Y, MAX_GRID_Z, Variant, KernelConfig
from .int8 import INT8_WG, Int8Tile, Warpgroups
from .passes import AUXILIARY, REPITCH, SLICE_SUM, SPLIT, Repitch, SliceSum, Split
from .simple import Naive, Smem

__all__ = ["KernelConfig", "MAX_GRID_Y", "MAX_GRID_Z", "Naive", "Smem", "RegTile", "WarpTile", "TensorTile", "WgTile",
           "FewColumns", "Int8Tile", "INT8_WG", "SliceSum", "Split", "SPLIT", "SLICE_SUM", "Repitch", "REPITCH",
           "AUXILIARY", "Variant", "CONFIGS", "FAMILIES", "current_name", "get_config", "validate"]

@dataclasses.dataclass(frozen=True)
class RegTile(KernelConfig):
    """Register tiling: a BM x BN x BK block tile, a TM x TN thread tile, two shared-memory stages."""

    bm: int = 128
    bn: int = 128
    bk: int = 8
    tm: int = 8
    tn: int = 8
    min_blocks: int = 2  # blocks per SM the register budget is planned for (__launch_bounds__)
    family: ClassVar[str] = "regtile"
    source: ClassVar[str] = "3_regtile.cu"
    layout_macros: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return f"regtile_{self.bm}x{self.bn}x{self.bk}_{self.tm}x{self.tn}"

    @property
    def block(self) -> tuple[int, int, int]:
        return ((self.bm // self.tm) * (self.bn // self.tn), 1, 1)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.bm, self.bn)

    @property
    def smem_bytes(self) -> int:
        return 2 * self.bk * (self.bm + self.bn) * 4

    def _tile_macros(self) -> dict[str, int]:
        return {"BM": self.bm, "BN": self.bn, "BK": self.bk, "TM": self.tm, "TN": self.tn,
                "MIN_BLOCKS": self.min_blocks}

    def _check(self) -> list[str]:
        errors = []
        if self.tm % 4 or self.tn % 4 or self.bk % 4:
            errors.append(f"TM, TN and BK must be multiples of 4 (got {self.tm}, {self.tn}, {self.bk})")
        if self.bm % self.tm or self.bn % self.tn:
            errors.append(f"the thread tile {self.tm}x{self.tn} must divide the block tile {self.bm}x{self.bn}")
        elif (self.bm * self.bk // 4) % self.threads or (self.bn * self.bk // 4) % self.threads:
            errors.append(
                f"{self.threads} threads cannot share the {self.bm}x{self.bk} and {self.bk}x{self.bn} tiles "
                "evenly in 4-vectors"
            )
        return errors


class _Pipelined:
    """What the kernels on pipeline.cuh's cp.async stages share: one warp per WM x WN warp tile of a BM x BN block
    tile, STAGES BK-deep stages of A and B in dynamic shared memory, rows padded by PAD floats, layouts compiled in."""

    layout_macros: ClassVar[bool] = True
    dynamic_smem: ClassVar[bool] = True
    headers: ClassVar[tuple[str, ...]] = ("cp_async.cuh", "pipeline.cuh")
    PAD: ClassVar[int] = 4  # floats of padding per shared-memory row (pipeline.cuh's layout)

    @property
    def block(self) -> tuple[int, int, int]:
        return ((self.bm // self.wm) * (self.bn // self.wn) * 32, 1, 1)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.bm, self.bn)

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.bk * (self.bm + self.bn + 2 * self.PAD) * 4

    def _pipeline_macros(self) -> dict[str, int]:
        return {"BM": self.bm, "BN": self.bn, "BK": self.bk, "WM": self.wm, "WN": self.wn, "STAGES": self.stages,
                "MIN_BLOCKS": self.min_blocks, "THREADS": self.threads, "PAD": self.PAD}

    def _slices_divide(self) -> list[str]:
        """Every thread issues the same number of copies (4-byte ones for a transposing operand)."""
        for side in (self.bm, self.bn):
            if (side * self.bk) % self.threads or (side * self.bk // 4) % self.threads:
                return [f"{self.threads} threads cannot share a {side}x{self.bk} slice evenly"]
            if self.threads % side:  # a pass of 4-byte copies along the side covers whole rows of it (pipeline.cuh)
                return [f"{self.threads} threads cannot copy {side}-wide rows in whole passes of 4-byte copies (the "
                        "threads must be a multiple of the side)"]
        return []


@dataclasses.dataclass(frozen=True)
class WarpTile(_Pipelined, KernelConfig):
    """Warp tiling: a BM x BN x BK block tile cut into WM x WN warp tiles of TM x TN thread tiles, fed by a
    STAGES-deep cp.async pipeline (fastmm/kernels/4_warptile.cu)."""

    bm: int = 128
    bn: int = 128
    bk: int = 16
    wm: int = 32
    wn: int = 64
    tm: int = 8
    tn: int = 8
    stages: int = 3
    min_blocks: int = 2  # blocks per SM the register budget is planned for (__launch_bounds__)
    # Spread the next tile's copies over the K steps (large tiles: 0.95x against 0.91x cuBLAS at 4096^3) or
    # issue them in one burst after the first step (128x64 tiles: 1.00x against 0.95x at 1024^3).
    spread: bool = False
    # Sum the products of each run of this many K-tiles apart before adding them to the accumulators (twice the
    # accumulator registers, one FADD per tile_sums * BK FMAs; 0: off): relative error on 4096x16x4096 0.7x cuBLAS's
    # instead of 2.8x.
    tile_sums: int = 0
    # Interior blocks (tile inside A, B and C, K a multiple of bk; any block and any K with `ragged`) run a loop of
    # sub_k-step bodies instead of the fully unrolled K-tile, which the instruction cache could not hold (0 = always
    # unrolled).
    sub_k: int = 0
    # Steps of k per partial sum on the sub-tile loop (0: one running sum over all of K). The accumulators are added
    # to slots in shared memory every `flush` steps and restart from zero, so a long K is summed in runs: relative
    # error ~ sqrt(flush + K / flush) instead of ~ sqrt(K) (4096^3 A^T.B: 4.1e-7 against 1.1e-6, cuBLAS 8.1e-7).
    flush: int = 0
    # The sub-tile loop for any K (the last K % bk terms from global memory after it) and for blocks across C's edges
    # (copies zeroed past the edge) where registers allow (`loops_edges`). Configurations of their own, for such
    # products only: the extra code moved ptxas' schedule of the whole-K interior loop, whose binaries stay as tuned.
    ragged: bool = False
    # Where C's rows take neither 16- nor 8-byte stores and K fits one K-tile, C through shared memory: each warp store
    # 32 consecutive floats of a row, not pieces 16 bytes apart (a configuration of its own, for such short products:
    # the other binaries keep their schedules).
    staged_c: bool = False
    family: ClassVar[str] = "warptile"
    source: ClassVar[str] = "4_warptile.cu"

    @property
    def _tsum(self) -> str:
        """The name's tile-sums part: `_tsum` for sums per K-tile, `_tsum4` for runs of 4, nothing without."""
        return f"_tsum{self.tile_sums if self.tile_sums > 1 else ''}" if self.tile_sums else ""

    @property
    def name(self) -> str:
        return (f"warptile_{self.bm}x{self.bn}x{self.bk}_{self.wm}x{self.wn}_{self.tm}x{self.tn}"
                f"_s{self.stages}{'_spread' if self.spread else ''}{self._tsum}"
                f"{f'_sub{self.sub_k}' if self.sub_k else ''}{f'_f{self.flush}' if self.flush else ''}"
                + "_ragged" * self.ragged + "_cstage" * self.staged_c)

    @property
    def smem_bytes(self) -> int:
        return self.shared_for(self.flush + 1)

    def loops_edges(self, variant: Variant) -> bool:
        """Whether blocks across C's edges take the loop (4_warptile.cu's EDGE_LOOP): not on 128x256 tiles whose B is
        copied transposing (B^T, unit stride along k), where the edges' masks spilled registers."""
        return self.ragged and not (variant.b_t and self.bn > 128)

    def shared_for(self, k: int) -> int:
        # Past the stages, where a product's K makes partial sums: each thread's TM x TN slots. A shorter K launches
        # without them, so that it keeps the L1 cache that shared memory would take (1-2% at 4097^3).
        return super().smem_bytes + (4 * self.threads * self.tm * self.tn if self.flush and k > self.flush else 0)

    def _tile_macros(self) -> dict[str, int]:
        return {**self._pipeline_macros(), "TM": self.tm, "TN": self.tn, "SPREAD": int(self.spread),
                "TILE_SUMS": int(self.tile_sums), "SUB_K": self.sub_k, "FLUSH": self.flush,
                "RAGGED": int(self.ragged), "STAGED_C": int(self.staged_c)}

    def _check(self) -> list[str]:
        errors = []
        if self.bm % self.wm or self.bn % self.wn or self.wm % self.tm or self.wn % self.tn:
            errors.append(f"tiles must nest: block {self.bm}x{self.bn}, warp {self.wm}x{self.wn}, "
                          f"thread {self.tm}x{self.tn}")
        elif (self.wm // self.tm) * (self.wn // self.tn) != 32:
            errors.append(f"a {self.wm}x{self.wn} warp tile of {self.tm}x{self.tn} thread tiles has "
                          f"{(self.wm // self.tm) * (self.wn // self.tn)} threads, not a warp's 32")
        if self.tm % 4 or self.tn % 4 or self.bk % 8:
            errors.append(f"TM and TN must be multiples of 4 and BK of 8 (got {self.tm}, {self.tn}, {self.bk})")
        if self.stages < 2:
            errors.append(f"a cp.async pipeline needs at least 2 stages (got {self.stages})")
        if not errors:
            errors += self._slices_divide()
        if self.sub_k and not errors:
            # A body copies sub_k rows of each operand in whole passes of the block's threads: 8 rows for a
            # transposing copy, threads * 4 / side (or threads / side, 4-byte copies) rows otherwise.
            passes = [8] + [max(1, self.threads * v // side) for side in (self.bm, self.bn) for v in (4, 1)]
            if self.bk % self.sub_k or self.sub_k < 2 or any(self.sub_k % p for p in passes):
                errors.append(f"sub_k {self.sub_k} must divide BK ({self.bk}) and be a multiple of "
                              f"{max(passes)} (the rows one pass of copies covers)")
            if self.tile_sums:
                errors.append("sub_k and tile_sums cannot be combined")
        if self.tile_sums < 0:
            errors.append(f"tile_sums counts K-tiles per partial sum (0: none), not {self.tile_sums}")
        if self.ragged and not self.sub_k:
            errors.append("ragged extends the sub-tile loop to any K and to blocks across C's edges: it needs "
                          "sub_k > 0")
        if self.flush % self.bk or self.flush < 0 or (self.flush and not self.sub_k):
            errors.append(f"flush {self.flush} must be a multiple of BK ({self.bk}) on a sub-tile loop (sub_k > 0): "
                          "partial sums span whole K-tiles of the loop")
        return errors


class _Passes:
    """Tensor-core configurations: one TF32 pass ("medium") or three (3xTF32, "high"), named by the family
    ``tf32`` / ``tf32x3`` plus the kernel's own suffix."""

    passes: int
    SUFFIX: ClassVar[str] = ""

    @property
    def family(self) -> str:  # two families, one source: the number of passes
        return ("tf32x3" if self.passes == 3 else "tf32") + self.SUFFIX

    @property
    def precision(self) -> str:
        return "high" if self.passes == 3 else "medium"


@dataclasses.dataclass(frozen=True)
class TensorTile(_Passes, _Pipelined, KernelConfig):
    """Tensor cores: mma.sync m16n8k8 TF32 on the warp-tiled kernel's cp.async pipeline (fastmm/kernels/5_tf32.cu),
    in one pass (``tf32``, "medium" precision) or three (``tf32x3``: 3xTF32, FP32 accuracy, "high")."""

    bm: int = 128
    bn: int = 128
    bk: int = 16
    wm: int = 64
    wn: int = 32
    stages: int = 3
    passes: int = 3
    min_blocks: int = 1  # blocks per SM the register budget is planned for (__launch_bounds__)
    source: ClassVar[str] = "5_tf32.cu"
    headers: ClassVar[tuple[str, ...]] = ("cp_async.cuh", "pipeline.cuh", "tf32_round.cuh")
    PAD: ClassVar[int] = 8  # the mma fragments' reads hit banks 8t + g: conflict-free only with rows of 8 mod 32

    @property
    def function(self) -> str:
        return "fastmm_tf32"

    @property
    def name(self) -> str:
        return f"{self.family}_{self.bm}x{self.bn}x{self.bk}_{self.wm}x{self.wn}_s{self.stages}"

    def _tile_macros(self) -> dict[str, int]:
        return {**self._pipeline_macros(), "PASSES": self.passes, "SUB_K": 0}

    def _check(self) -> list[str]:
        errors = []
        if self.bm % self.wm or self.bn % self.wn or self.wm % 16 or self.wn % 8:
            errors.append(f"tiles must nest: block {self.bm}x{self.bn}, warp {self.wm}x{self.wn}, mma 16x8")
        if self.bk % 8 or self.stages < 2:
            errors.append(f"BK must be a multiple of 8 and stages at least 2 (got {self.bk}, {self.stages})")
        if self.passes not in (1, 3):
            errors.append(f"passes must be 1 (TF32) or 3 (3xTF32), not {self.passes}")
        if not errors:
            errors += self._slices_divide()
        return errors


@dataclasses.dataclass(frozen=True)
class WgTile(_Passes, Warpgroups, KernelConfig):
    """Tensor cores through Hopper's warpgroup MMA (wgmma, sm_90a only) on operands split beforehand by `Split`
    (fastmm/kernels/6_wgmma.cu): one TF32 pass (``tf32wg``, "medium") or three (``tf32x3wg``, 3xTF32, "high").
    Specialised warps: one warpgroup copies block tiles in with bulk copies, BM / 64 multiply, each 64 rows of a
    BM x BN block tile; 32-deep K-tiles in `stages` stages."""

    bm: int = 128
    bn: int = 128
    stages: int = 3
    passes: int = 3
    group: int = 8  # rows of block tiles per group of the launch order (1: row by row)
    maps: str = ""  # one pass: "a", "b", "ab", "r", "rb": operands copied by tensor maps (rounded there), not split
    source: ClassVar[str] = "6_wgmma.cu"

    BK: ClassVar[int] = 32  # 6_wgmma.cu's K-tile: one 128-byte swizzled row

    SUFFIX: ClassVar[str] = "wg"

    @property
    def fallback(self) -> str:
        """The family that multiplies in the same precision without the split operands' memory (mma.sync tiles)."""
        return "tf32x3" if self.passes == 3 else "tf32"

    @property
    def function(self) -> str:
        return "fastmm_wgmma"

    @property
    def name(self) -> str:
        return (f"{self.family}_{self.bm}x{self.bn}x{self.BK}_s{self.stages}"
                + (f"_g{self.group}" if self.group != 8 else "") + (f"_map{self.maps}" if self.maps else ""))

    @property
    def smem_bytes(self) -> int:
        parts = 2 if self.passes == 3 else 1
        return self.stages * (parts * (self.bm + self.bn) * self.BK * 4 + 16) + self.ALIGN  # stages, barriers

    def _tile_macros(self) -> dict[str, int]:
        return {"BM": self.bm, "BN": self.bn, "STAGES": self.stages, "PASSES": self.passes, "THREADS": self.threads,
                "GROUP": self.group, "A_TMA": int("a" in self.maps), "B_TMA": int("b" in self.maps),
                "A_RS": int("r" in self.maps)}  # ("r": A along M, wgmma's register operand)

    def _check(self) -> list[str]:
        errors = self._warpgroup_errors()
        if self.passes not in (1, 3):
            errors.append(f"passes must be 1 (TF32) or 3 (3xTF32), not {self.passes}")
        if self.maps and (self.passes != 1 or self.maps not in ("a", "b", "ab", "r", "rb")):
            errors.append(f"maps must be 'a', 'b', 'ab', 'r' or 'rb' on one pass (a map's copy rounds, it has no "
                          f"small part), not {self.maps!r} on {self.passes}")
        if "r" in self.maps and self.threads != 384:  # (6_wgmma.cu's setmaxnreg values)
            errors.append(f"maps 'r' needs two multiplying warpgroups (bm = 128), not bm = {self.bm}")
        return errors


@dataclasses.dataclass(frozen=True)
class FewColumns(KernelConfig):
    """Few columns (N <= nmax): bound by memory, each element of A read once, A's and B's 128-deep steps copied into
    a ring of `stages` shared-memory slots ahead of the FMAs, a fixed-order reduction (fastmm/kernels/7_few_columns.cu).
    Few rows run it transposed. Past 16 columns a lane owns a row of C in every layout (LANE_ROWS)."""

    nmax: int = 16
    stages: int = 4
    min_blocks: int = 2  # blocks per SM the shared memory is planned for: (stages - 1) steps of A in flight each
    # > 1: K split over a thread-block cluster of this many blocks, summed in it (sm_90; single products)
    cluster: int = 1
    family: ClassVar[str] = "fewcol"
    source: ClassVar[str] = "7_few_columns.cu"
    headers: ClassVar[tuple[str, ...]] = ("cp_async.cuh",)
    layout_macros: ClassVar[bool] = True
    dynamic_smem: ClassVar[bool] = True

    ROWS: ClassVar[int] = 32  # rows of C per block (7_few_columns.cu's ROWS_PER_BLOCK)
    STEP: ClassVar[int] = 128  # k per step (7_few_columns.cu's STEP)
    STAGES: ClassVar[int] = 4  # the default ring, left out of the name

    @property
    def name(self) -> str:
        return (f"fewcol_n{self.nmax}" + (f"_s{self.stages}" if self.stages != self.STAGES else "")
                + (f"_c{self.cluster}" if self.cluster > 1 else ""))

    @property
    def block(self) -> tuple[int, int, int]:
        return (256, 1, 1)

    @property
    def tile(self) -> tuple[int, int]:
        return (self.ROWS, self.nmax)

    @property
    def smem_bytes(self) -> int:
        # 7_few_columns.cu's slots: A's step, then B's in the largest of its layouts (k-contiguous rows of STEP + 4,
        # j-contiguous rows of JPITCH, or for a matrix-vector product 4 values per thread), rounded to 16 bytes.
        return self.stages * 4 * self._slot_floats

    @property
    def _slot_floats(self) -> int:
        jpitch = 1 if self.nmax == 1 else self.nmax + 4 if self.nmax % 4 == 0 else self.nmax + 1
        b = max(self.nmax * (self.STEP + 4), self.STEP * jpitch, 4 * 256 if self.nmax == 1 else 0)
        # rows of 36 where A's columns are unaligned (A_T = 1), of 33 for a row-major A staged k-major (past 16 columns)
        a = (self.ROWS + 4) * self.STEP
        return a + -(-b // 4) * 4

    def _tile_macros(self) -> dict[str, int]:
        return {"NMAX": self.nmax, "STAGES": self.stages, "THREADS": 256, "MIN_BLOCKS": self.min_blocks,
                "CLUSTER": self.cluster}

    @property
    def batch_per_launch(self) -> int:
        return MAX_GRID_Z // self.cluster

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        x, y, _ = super().grid(m, n, batch, k)
        return (x, y, max(1, min(batch, self.batch_per_launch)) * self.cluster)  # a cluster per batch item, along z

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        return (9, 0) if self.cluster > 1 else None  # thread-block clusters: Hopper and later

    def _check(self) -> list[str]:
        if self.stages < 2 or self.nmax < 1 or not 1 <= self.cluster <= 16:
            return [f"stages must be at least 2, nmax at least 1, cluster 1 to 16 (got {self.stages}, {self.nmax}, "
                    f"{self.cluster})"]
        if self.nmax > 16:
            # 7_few_columns.cu's end: the 8 warps' partial sums (rows of nmax + 1), then a cluster's block sums, in the
            # ring
            partials = 8 * self.ROWS * (self.nmax + 1)
            need = max(partials, self._slot_floats) + (self.ROWS * self.nmax if self.cluster > 1 else 0)
            if self.nmax % 4 or need > self.stages * self._slot_floats:
                return [f"past 16 columns nmax must be a multiple of 4 (got {self.nmax}) and the ring of "
                        f"{self.stages * self._slot_floats} floats must hold {need} floats of sums"]
        return []


# The configurations the plan names (fastmm/_plan/tiles.py), built once here; CONFIGS below lists them all.
NAIVE = Naive(block_x=32, block_y=8)
# the small rule's: C rounded once from float64 sums, a thread or (a longer K) a warp per element
NAIVE_F64, NAIVE_F64_DOT = Naive(block_x=32, block_y=8, f64_sums=True), Naive(32, 8, f64_sums=True, k_lanes=True)
# outer products (K <= 3): bound by writing C, a thread per 4x4 piece of it, 16-byte stores, no shared memory
NAIVE_SHORT = Naive(block_x=32, block_y=8, tm=4, tn=4)
SMEM16, SMEM32 = Smem(tile_size=16), Smem(tile_size=32)
# the seeds' design: 256 threads, 2 blocks (16 warps) per SM
RT128 = RegTile(bm=128, bn=128, bk=8, tm=8, tn=8, min_blocks=2)
# 128 threads: twice the tiles of the above, for mid-size problems
RT128x64 = RegTile(bm=128, bn=64, bk=8, tm=8, tn=8, min_blocks=3)
# 64 threads: four times the tiles, for problems that leave SMs idle
RT64 = RegTile(bm=64, bn=64, bk=8, tm=8, tn=8, min_blocks=6)
# Warp tiles: (block tile, BK, warp tile, thread tile, stages, blocks per SM). 256 threads of 8x16 for
# large products (one block per SM, up to 255 registers), 8x8 and 8x4 thread tiles for the rest.
# large products, long K: sub-tile loop
WT256_LOOP = WarpTile(bm=128, bn=256, bk=32, wm=64, wn=64, tm=8, tn=16, stages=4, min_blocks=1, spread=True, sub_k=8)
# large products: 32-deep stages, fewer barriers
WT256_32 = WarpTile(bm=128, bn=256, bk=32, wm=64, wn=64, tm=8, tn=16, stages=4, min_blocks=1, spread=True)
# a wave, short K, A^T.B: K-tile loop
WT256_LOOP16 = WarpTile(bm=128, bn=256, bk=16, wm=64, wn=64, tm=8, tn=16, stages=4, min_blocks=1, spread=True, sub_k=16)
# split-K slices: runs of 512
WT256_SLICES = WarpTile(bm=128, bn=256, bk=16, wm=64, wn=64, tm=8, tn=16, stages=4, min_blocks=1, spread=True, sub_k=16,
                        flush=512)
# ... the same where K is not a multiple of 16
WT256 = WarpTile(bm=128, bn=256, bk=16, wm=64, wn=64, tm=8, tn=16, stages=4, min_blocks=1, spread=True)
# mid sizes (1024^3), n = 128, the sub-tile loop
WT128x64_LOOP = WarpTile(bm=128, bn=64, bk=16, wm=32, wn=64, tm=8, tn=8, stages=4, min_blocks=3, sub_k=8)
# ... ragged sizes (1000^3, 4097^3)
WT128x64 = WarpTile(bm=128, bn=64, bk=16, wm=32, wn=64, tm=8, tn=8, stages=4, min_blocks=3)
# ... on K-padded copies, K in runs of 512 (3001^3): 3 stages, so that 3 blocks and their slots fit an SM
WT128x64_RUNS = WarpTile(bm=128, bn=64, bk=16, wm=32, wn=64, tm=8, tn=8, stages=3, min_blocks=3, sub_k=8, flush=512)
# ... on less than a wave (768^3)
WT128x64_SUMS = WarpTile(bm=128, bn=64, bk=16, wm=32, wn=64, tm=8, tn=8, stages=4, min_blocks=2, tile_sums=True)
# The sub-tile loops above for a K that is not a multiple of 16 (the last K % 16 terms after the loop) and for blocks
# across C's edges
WT256_LOOP16_RAGGED, WT256_SLICES_RAGGED, WT128x64_LOOP_RAGGED, WT128x64_RUNS_RAGGED = (
    dataclasses.replace(c, ragged=True) for c in (WT256_LOOP16, WT256_SLICES, WT128x64_LOOP, WT128x64_RUNS))
# small and narrow products, split-K slices; sums per 4 K-tiles (docs/kernels/warptile.md, 'Sums per run of K-tiles')
WT64 = WarpTile(bm=64, bn=64, bk=16, wm=32, wn=32, tm=8, tn=4, stages=4, min_blocks=4, tile_sums=4)
# (the same for K of at most 16, one K-tile: C through shared memory where its rows take neither 16- nor 8-byte stores)
WT64_SHORT = dataclasses.replace(WT64, tile_sums=1, staged_c=True)
# ... and for K of at most 8, in one 8-deep K-tile (no sums: at most 8 terms): half the 16-deep tile's multiply-adds
# on zeros (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tiled)
WT64_SHORT8 = dataclasses.replace(WT64, bk=8, tile_sums=0, staged_c=True)
# ... of 17-32 rows or columns: a third of the 64x64 tile's padding rows or less (docs/kernels/heuristic.md, '17 to
# 32 rows or columns')
WT32x128 = WarpTile(bm=32, bn=128, bk=16, wm=32, wn=32, tm=8, tn=4, stages=4, min_blocks=4, tile_sums=4)
WT128x32 = WarpTile(bm=128, bn=32, bk=16, wm=32, wn=32, tm=8, tn=4, stages=4, min_blocks=4, tile_sums=4)
# Tensor cores (precision "high" and "medium"): (block tile, BK, warp tile, stages, passes).
# 3xTF32 stops at 64 x 32 warp tiles: with 64 x 64 ones (128 x 256 blocks) the per-k-step partial sums pushed
# the kernel past 255 registers and it spilled.
# large products: 32-deep stages, half the barriers
TF32X3_TILES = (TensorTile(bm=128, bn=128, bk=32, wm=64, wn=32, stages=3, passes=3),
                TensorTile(bm=128, bn=128, bk=16, wm=64, wn=32, stages=3, passes=3),  # mid sizes
                TensorTile(bm=64, bn=64, bk=16, wm=32, wn=32, stages=4, passes=3, min_blocks=2))  # small products
TF32_TILES = (TensorTile(bm=128, bn=256, bk=16, wm=64, wn=64, stages=3, passes=1),
              TensorTile(bm=64, bn=64, bk=16, wm=32, wn=32, stages=4, passes=1, min_blocks=2))
# ... through Hopper's warpgroup MMA on operands split beforehand (sm_90a): large single products.
TF32X3_WG = WgTile(bm=128, bn=128, stages=3, passes=3)
TF32_WG = WgTile(bm=128, bn=256, stages=4, passes=1)
# (the runtime's, where A's rows, B's columns or both are K-contiguous)
TF32_WG_MAPS = tuple(dataclasses.replace(TF32_WG, maps=m) for m in ("a", "b", "ab", "r", "rb"))
# Few columns or rows (matrix-vector and a handful of right-hand sides): columns per block.
FEW_COLUMNS = (FewColumns(nmax=1), FewColumns(nmax=4), FewColumns(nmax=8), FewColumns(nmax=16))
# 17 to 64 columns in one pass over A, a lane per row of C (docs/kernels/few-columns.md, section 'Up to 64 columns'):
# the plan's wide-few-columns rule runs 32; 64 is forced only (`use_kernel`). 32 columns: two blocks per SM (3 slots
# each); 64: one (3 slots), since 64 sums per thread and the copies' addresses spill at two blocks' 128 registers.
FEW_COLUMNS_WIDE = (FewColumns(nmax=32, stages=3), FewColumns(nmax=64, stages=3, min_blocks=1))

# Every configuration fastmm ships, in teaching order. Plans, `compile`, the tests and `bench` use this list.
CONFIGS: tuple[KernelConfig, ...] = (
    NAIVE, NAIVE_F64, NAIVE_F64_DOT, NAIVE_SHORT, SMEM16, SMEM32, RT128, RT128x64, RT64,
    WT256_LOOP, WT256_32, WT256_LOOP16, WT256_SLICES, WT256,
    WT128x64_LOOP, WT128x64, WT128x64_RUNS, WT128x64_SUMS, WT64, WT64_SHORT, WT64_SHORT8, WT32x128, WT128x32,
    WT256_LOOP16_RAGGED, WT256_SLICES_RAGGED, WT128x64_LOOP_RAGGED, WT128x64_RUNS_RAGGED,
    *TF32X3_TILES, *TF32_TILES, TF32X3_WG, TF32_WG, *TF32_WG_MAPS, *FEW_COLUMNS,
    # K split in one launch over a cluster of 2 to 8 blocks or 16 (Hopper; past 8 a non-portable size): matrix-vector
    # and few-column products whose rows alone leave SMs idle.
    *(FewColumns(nmax=nmax, cluster=c) for nmax in (1, 4, 8, 16) for c in (*range(2, 9), 16)),
    *FEW_COLUMNS_WIDE, *(dataclasses.replace(f, cluster=c) for f in FEW_COLUMNS_WIDE for c in (2, 4, 8)),
    dataclasses.replace(FEW_COLUMNS_WIDE[0], cluster=16),
)

FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(c.family for c in CONFIGS))


BY_NAME = {c.name: c for c in CONFIGS}


# Names of an earlier version, still accepted with a DeprecationWarning: the few-column family was "skinny".
FORMER_NAMES = {"skinny": "fewcol"}


def current_name(name: str) -> str:
    """`name` as this version spells it (a family or configuration name of an earlier version, renamed)."""
    for old, new in FORMER_NAMES.items():
        if name == old or name.startswith(old + "_"):
            renamed = new + name[len(old):]
            warnings.warn(f"kernel name {name!r} is now {renamed!r}; the old name will stop working in a future "
                          "version", DeprecationWarning, stacklevel=4)
            return renamed
    return name


def get_config(name: str) -> KernelConfig:
    """Look a configuration up by its derived name; the KeyError lists the valid names."""
    try:
        return BY_NAME[name] if name in BY_NAME else BY_NAME[current_name(name)]
    except KeyError:
        raise KeyError(f"unknown kernel configuration {name!r}; valid names: {', '.join(BY_NAME)}") from None


def arch_errors(config: KernelConfig, compute_capability: tuple[int, int]) -> list[str]:
    """Why a GPU of this compute capability cannot run `config` at all, whatever its limits: the wgmma kernels need
    sm_90 itself, the cluster kernels sm_90 or newer."""
    errors, cc = [], compute_capability
    if config.compute_capability and cc != config.compute_capability:
        major, minor = config.compute_capability
        errors.append(f"runs on compute capability {major}.{minor} (sm_{major}{minor}{config.arch_suffix}) only; this "
                      f"device is {cc[0]}.{cc[1]}")
    oldest = config.min_compute_capability
    if oldest and cc < oldest:
        errors.append(f"needs compute capability {oldest[0]}.{oldest[1]} or newer; this device is {cc[0]}.{cc[1]}")
    return errors


def validate(config: KernelConfig, *, max_threads: int = 1024, max_smem: int = 48 * 1024,
             max_smem_optin: int = 227 * 1024, max_regs_per_block: int = 65536,
             regs_per_thread: int | None = None, compute_capability: tuple[int, int] | None = None) -> None:
    """Check a configuration against device limits; raise ValueError giving the numbers that failed.

    ``max_smem`` bounds static shared memory; a kernel with dynamic shared memory may opt in to
    ``max_smem_optin``. ``regs_per_thread`` is the compiled kernel's count (from ptxas or the loaded
    function), when known.
    """
    errors = list(config._check())
    if compute_capability:
        errors += arch_errors(config, tuple(compute_capability))
    if config.threads > max_threads:
        errors.append(f"needs {config.threads} threads per block; the device allows {max_threads}")
    limit = max_smem_optin if config.dynamic_smem else max_smem
    if config.smem_bytes > limit:
        errors.append(
            f"needs {config.smem_bytes / 1024:.1f} KiB of shared memory per block; the device allows "
            f"{limit / 1024:.1f} KiB per block" + (" (with opt-in)" if config.dynamic_smem else " without opt-in")
        )
    if regs_per_thread is not None and regs_per_thread * config.threads > max_regs_per_block:
        errors.append(
            f"needs {regs_per_thread} registers x {config.threads} threads = {regs_per_thread * config.threads} "
            f"registers per block; the device has {max_regs_per_block}"
        )
    if errors:
        raise ValueError(f"kernel configuration {config.name}: " + "; ".join(errors))


for _c in CONFIGS + INT8_WG + AUXILIARY:
    validate(_c)  # a shipped configuration that breaks its own rules is a bug: fail at import
