"""What every kernel configuration is: the hardware limits, the layout variants, and the base class whose fields name
a kernel and describe its launch (configs.py has the product families, passes.py the passes around them).

Pure Python (no CUDA imports): the planner and the CPU tests use it on any machine.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

__all__ = ["MAX_GRID_Y", "MAX_GRID_Z", "Variant", "KernelConfig"]

# Hardware limits that hold for every GPU fastmm supports (compute capability >= 7.0).
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535


@dataclasses.dataclass(frozen=True)
class Variant:
    """Per-call layout of a product, as the kernels see it.

    a_t: A has unit stride along m (a transposed view) instead of along k.
    b_t: B has unit stride along k (a transposed view) instead of along n.
    vec: 4 when the rows of the operands the kernel reads 16 bytes at a time start 16-byte aligned (the tiles: A
        where a_t, B where not b_t, the others being copied 4 bytes at a time; the register tiles: both), else 1.
    """

    a_t: bool = False
    b_t: bool = False
    vec: int = 4

    @property
    def suffix(self) -> str:
        return f"{'t' if self.a_t else 'n'}{'t' if self.b_t else 'n'}_v{self.vec}"


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    family: ClassVar[str]
    source: ClassVar[str]
    # Whether the kernel reads its layout from macros (one binary per Variant) or from the strides at
    # run time (one binary for every layout).
    layout_macros: ClassVar[bool] = False
    # Whether the kernel's shared memory is dynamic (sized at launch, may exceed 48 KiB after opt-in).
    dynamic_smem: ClassVar[bool] = False
    # Shared device code the source needs, placed between common.cuh and the family's file.
    headers: ClassVar[tuple[str, ...]] = ()
    # Appended to the device's architecture when compiling ("a": sm_90a, whose instructions exist on that GPU alone),
    # and the one compute capability such a kernel runs on (None: any that fastmm supports).
    arch_suffix: ClassVar[str] = ""
    compute_capability: ClassVar[tuple[int, int] | None] = None

    @property
    def min_compute_capability(self) -> tuple[int, int] | None:
        """The oldest GPU generation the kernel runs on, where it needs hardware newer than fastmm's floor."""
        return None

    # Subclasses define: name, block, tile, smem_bytes, _tile_macros(), _check().

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def function(self) -> str:
        """The kernel's entry point in its source."""
        return f"fastmm_{self.family}"

    @property
    def precision(self) -> str:
        """What its products compute in, by `fastmm.set_float32_matmul_precision`'s names."""
        return "highest"

    def macros(self, variant: Variant) -> dict[str, int]:
        return dict(self._tile_macros(), **(self._layout_macros(variant) if self.layout_macros else {}))

    @staticmethod
    def _layout_macros(variant: Variant) -> dict[str, int]:
        return {"A_T": int(variant.a_t), "B_T": int(variant.b_t), "VEC": variant.vec}

    def binary_name(self, variant: Variant) -> str:
        """Name of one compiled binary: the config, plus the layout when the layout is compiled in."""
        return f"{self.name}_{variant.suffix}" if self.layout_macros else self.name

    def shared_for(self, k: int) -> int:
        """Bytes of shared memory a launch over a K of `k` needs (at most smem_bytes)."""
        return self.smem_bytes

    @property
    def batch_per_launch(self) -> int:
        """Batch items one launch covers (the runtime launches again from z0 for the rest)."""
        return MAX_GRID_Z

    def grid(self, m: int, n: int, batch: int, k: int = 0) -> tuple[int, int, int]:
        """Launch grid; y and z are clamped to the hardware limits (the runtime launches again for the rest: `Launch`'s
        chunks, fastmm/kernels/common.cuh)."""
        bm, bn = self.tile
        return (
            max(1, -(-n // bn)),
            max(1, min(-(-m // bm), MAX_GRID_Y)),
            max(1, min(batch, MAX_GRID_Z)),
        )
