"""What the plan reasons about: a product as the kernels see it (`Problem`), the GPU (`Device`), the plan's answer
(`Choice`) and a line of the table (`Rule`). Plain data, no CUDA."""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable

from ..kernels.configs import FewColumns, KernelConfig, RegTile, Variant

__all__ = ["Problem", "Device", "Choice", "Rule", "RuleName", "few_rows"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One batched product C[b] (m x n) = A[b] (m x k) @ B[b] (k x n), as the kernels will see it."""

    m: int
    n: int
    k: int
    batch: int = 1
    a_t: bool = False      # A has unit stride along m (e.g. ``a.T`` of a C-ordered array)
    b_t: bool = False      # B has unit stride along k
    # The tiles' 16-byte copies are legal: the rows of the operands they copy so (A with unit stride along M, B along N;
    # the others they copy 4 bytes at a time, transposing) start 16-byte aligned. C's rows decide only the stores,
    # which each block checks.
    aligned: bool = True
    a_aligned: bool = True  # ... in A alone (the few-column kernel reads only A in 16-byte pieces)
    b_aligned: bool = True  # ... in B alone (A of the transposed product, for few rows)
    runs: bool = False  # sum K in runs of 512 where a kernel does (the product on aligned copies: see aligned_copies)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def variant(self) -> Variant:
        return Variant(self.a_t, self.b_t, 4 if self.aligned else 1)

    def variant_for(self, config: KernelConfig) -> Variant:
        """The layout variant `config` runs: the few-column kernel needs only A aligned for its wide loads, and
        for few rows it runs the transposed product, whose A is B^T and whose B is A^T."""
        if isinstance(config, RegTile):  # 16-byte loads along either operand's unit stride: both aligned
            return Variant(self.a_t, self.b_t, 4 if self.a_aligned and self.b_aligned else 1)
        if isinstance(config, FewColumns):
            if few_rows(self, config):
                return Variant(not self.b_t, not self.a_t, 4 if self.b_aligned else 1)
            return Variant(self.a_t, self.b_t, 4 if self.a_aligned else 1)
        return self.variant

    def blocks(self, config: KernelConfig) -> int:
        """Blocks of `config` one launch needs (the transposed product's, for few rows on the few-column kernel)."""
        if isinstance(config, FewColumns):  # each block of rows over a cluster's blocks (split K) or one
            problem = dataclasses.replace(self, m=self.n, n=self.m) if few_rows(self, config) else self
            return problem.tiles(config) * config.cluster
        if getattr(config, "maps", "") == "rb" and not (self.a_t or self.b_t):  # (run as C^T = B^T A^T)
            return dataclasses.replace(self, m=self.n, n=self.m).tiles(config)
        return self.tiles(config)

    def tiles(self, config: KernelConfig) -> int:
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
    def full_rate_fp64(self) -> bool:
        """Whether float64 runs at half the float32 rate (the data-centre parts: P100, V100, A100, H100/H200, B200),
        not at 1/32-1/64 of it."""
        return self.compute_capability in ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


class RuleName(str, enum.Enum):
    """Which rule made a choice: what code compares (a rule's display text, its reason, is free to change). Equal to
    the name `explain` prints, so that a name read back from `explain` or a log compares too."""

    EMPTY = "empty"
    SMALL = "small"
    SHORT_K = "short-k"
    OUTER_PRODUCTS = "outer-products"
    FEW_COLUMNS_TILES = "few-columns-tiles"
    FEW_COLUMNS = "few-columns"
    WIDE_FEW_COLUMNS = "wide-few-columns"
    SPLIT_K = "split-k"
    NARROW_TILES = "narrow-tiles"
    ALIGNED_COPY = "aligned-copy"
    RAGGED_EDGE = "ragged-edge"
    SPLIT_K_MID = "split-k-mid"
    SPLIT_K_IDLE = "split-k-idle"
    NARROW_FEW_COLUMNS = "narrow-few-columns"
    SPLIT_K_WAVE = "split-k-wave"
    TILED = "tiled"
    TENSOR = "tensor"
    TENSOR_WGMMA = "tensor-wgmma"
    OZAKI = "ozaki-ii"
    FORCED = "forced"
    TUNED = "tuned"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


@dataclasses.dataclass(frozen=True)
class Choice:
    config: KernelConfig
    variant: Variant
    rule: RuleName
    reason: str
    splits: int = 1  # split-K: K cut into this many slices, multiplied as a batch and summed in a fixed order
    peel: tuple[int, int] = (0, 0)  # rows and columns of C's ragged bottom and right edges run as products of their own
    pad: bool = False  # A and B (those not 16-byte aligned) copied into rows padded to 16 bytes, the product on those

    @property
    def name(self) -> str:
        return self.config.name


@dataclasses.dataclass(frozen=True)
class Rule:
    name: RuleName
    reason: str
    test: Callable[[Problem, Device], bool]
    kernel: str | Callable[[Problem, Device], str]
    splits: Callable[[Problem, Device], int] | None = None  # slices of K (None: the product runs whole)
    peel: Callable[[Problem, Device], tuple[int, int]] | None = None  # ragged edges run apart (see Choice.peel)
    pad: bool = False  # the product runs on aligned copies of its operands (see Choice.pad)


# Few columns (or rows): at most this many, against more of the other side. Such products read each element of the
# large operand for 2 FLOPs: bound by memory, where the few-column kernel reads it once in wide loads.
_FEW = 16


def few_rows(problem: Problem, config: KernelConfig | None = None) -> bool:
    """Few rows against more columns: the few-column kernel runs on the transposed product C^T = B^T A^T. Up to
    _FEW rows on any few-column configuration (3x9 as its mirror 9x3 does), up to as many as a configuration holds
    columns (32 or 64: the wide-few-columns rule's 17 to 32 rows); past that, a forced few-column kernel's blocks
    cover the columns nmax at a time, untransposed."""
    if problem.n <= problem.m:
        return False
    return problem.m <= _FEW or getattr(config, "nmax", 0) >= problem.m
