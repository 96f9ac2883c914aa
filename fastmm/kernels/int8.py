"""The INT8 products of Ozaki scheme II on wgmma (fastmm/kernels/8_int8_wgmma.cu): configurations as data, like the
float32 families in configs.py, kept apart from them because they multiply int8 tiles into int32, not float32
operands: the plan never picks them for a float32 product and they cannot be forced on one (they are not in
``configs.CONFIGS``); `compile`, the CPU tests and `validate` cover them as they do every kernel.

Pure Python (no CUDA imports).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import KernelConfig
from .passes import OZAKI_MODULI

__all__ = ["Warpgroups", "Int8Tile", "INT8_WG"]


class Warpgroups:
    """What the wgmma kernels share (6_wgmma.cu's TF32 products, 8_int8_wgmma.cu's INT8 ones): BM / 64 multiplying
    warpgroups and one copying, a BM x BN block tile, `stages` stages of block tiles in 128-byte-swizzled shared memory
    aligned to 1024 bytes, `group` rows of block tiles per group of the launch order; Hopper (sm_90a) only."""

    bm: int
    bn: int
    stages: int
    group: int
    headers: ClassVar[tuple[str, ...]] = ("cp_async.cuh", "wgmma.cuh")
    dynamic_smem: ClassVar[bool] = True
    arch_suffix: ClassVar[str] = "a"  # wgmma exists only in sm_90a's instruction set
    compute_capability: ClassVar[tuple[int, int] | None] = (9, 0)  # ... which only Hopper runs
    ALIGN: ClassVar[int] = 1024  # bytes of slack for aligning the swizzled stages

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.bm * 2 + 128, 1, 1)  # BM / 64 multiplying warpgroups and one copying

    @property
    def tile(self) -> tuple[int, int]:
        return (self.bm, self.bn)

    def _warpgroup_errors(self) -> list[str]:
        errors = []
        if self.bm not in (64, 128) or self.bn not in (128, 256):
            errors.append(f"block tile {self.bm}x{self.bn}: BM must be 64 or 128 (warpgroups of 64 rows), BN 128 or 256")
        if self.stages < 2:
            errors.append(f"stages must be at least 2 (got {self.stages})")
        if self.group < 1:
            errors.append(f"group must be at least 1 (got {self.group})")
        return errors


@dataclasses.dataclass(frozen=True)
class Int8Tile(Warpgroups, KernelConfig):
    """Exact INT8 products through Hopper's warpgroup MMA (s8 x s8 -> s32, sm_90a only) on operands already laid out as
    K-major swizzled tiles (fastmm/_plan/ozaki.py's `tiles`), a batch of them (one per modulus) along the grid's z.
    Specialised warps as `WgTile`'s: one warpgroup copies block tiles in with bulk copies, BM / 64 multiply, each 64 rows
    of a BM x BN block tile; K-tiles of 128 int8 values (one 128-byte swizzled row) in `stages` stages. With `cluster`
    2, pairs of blocks along m share their tiles of B^T through multicast copies."""

    bm: int = 128
    bn: int = 256
    stages: int = 4
    group: int = 8  # rows of clusters per group of the launch order (1: row by row)
    # 2: clusters of two blocks one above the other, each copying half of their common tile of B^T into both
    cluster: int = 1
    # True: C receives each product reduced modulo its batch item's modulus (OZAKI_MODULI[z]) as uint8, a quarter of the
    # int32 products' bytes for the reconstruction pass to read (Ozaki scheme II); False: the int32 products.
    residues: bool = False
    # True: about one block per SM (SMS along x, a batch item each along z), each walking the tiles of its batch item.
    persistent: bool = False
    family: ClassVar[str] = "int8wg"
    source: ClassVar[str] = "8_int8_wgmma.cu"

    BK: ClassVar[int] = 128  # 8_int8_wgmma.cu's K-tile: int8 values in one 128-byte swizzled row

    @property
    def function(self) -> str:
        return "fastmm_int8"

    @property
    def precision(self) -> str:
        return "high"  # Ozaki scheme II's float32 products: FP32 accuracy

    @property
    def name(self) -> str:
        return (f"{self.family}_{self.bm}x{self.bn}x{self.BK}_s{self.stages}"
                + (f"_g{self.group}" if self.group != 8 else "") + (f"_c{self.cluster}" if self.cluster > 1 else "")
                + ("_mod" if self.residues else "") + ("_p" if self.persistent else ""))

    # The SMs of an H100 SXM or H200: a persistent launch's blocks along x (fewer SMs run the rest in a second wave).
    SMS: ClassVar[int] = 132

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        x, y, z = super().grid(m, n, batch, k)
        if self.persistent:
            return (min(x * y, self.SMS), 1, z)
        return (x, -(-y // self.cluster) * self.cluster, z)  # whole clusters along y

    @property
    def smem_bytes(self) -> int:
        return self.stages * ((self.bm + self.bn) * self.BK + 16) + self.ALIGN  # stages (one byte a value), barriers

    def _tile_macros(self) -> dict[str, int | str]:
        return {"BM": self.bm, "BN": self.bn, "STAGES": self.stages, "THREADS": self.threads, "GROUP": self.group,
                "CLUSTER": self.cluster, "RESIDUES": int(self.residues), "PERSISTENT": int(self.persistent),
                "NMODULI": len(OZAKI_MODULI),
                "MODULI": ", ".join(map(str, OZAKI_MODULI))}

    def _check(self) -> list[str]:
        errors = self._warpgroup_errors()
        if self.cluster not in (1, 2):
            errors.append(f"cluster must be 1 or 2 (got {self.cluster})")
        if self.persistent and self.cluster != 1:
            errors.append("a persistent launch takes no clusters (cluster must be 1)")
        return errors


# Large products (the Ozaki passes' 6 to 10 residue products of one shape): 48 KiB stages, four of them in 193 KiB,
# alone or in pairs sharing B^T's tiles; and 128 x 128 tiles (32 KiB stages, six), twice the blocks for shapes that
# leave a wave of 128 x 256 ones short. Last, the one Ozaki scheme II runs: 128 x 256, its products as residues.
INT8_WG: tuple[Int8Tile, ...] = (Int8Tile(bm=128, bn=256, stages=4), Int8Tile(bm=128, bn=256, stages=4, cluster=2),
                                 Int8Tile(bm=128, bn=128, stages=6), Int8Tile(bm=128, bn=256, stages=4, residues=True),
                                 Int8Tile(bm=128, bn=256, stages=4, residues=True, persistent=True),
                                 Int8Tile(bm=128, bn=256, stages=4, cluster=2, residues=True))
