"""Where cuBLAS is ahead: shape classes whose table kernel the bench measured behind cuBLAS (docs/kernels/heuristic.md,
section 'The heuristic's break-even points', cuBLAS-ahead classes).

fastmm arrays still run fastmm's kernel there (the user chose fastmm); plain CuPy code under `accelerate_cupy`
lets CuPy run them, so the hook never makes a product slower than CuPy alone.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Callable

from .problem import Choice, Device, Problem, RuleName
from .table import _PAD_MIN_MACS, _NARROW, _narrow_output
from .tiles import _SUMS_BELOW_WAVE, WT128x64_SUMS

__all__ = ["CUBLAS_AHEAD", "cublas_ahead", "CublasAhead", "yielding_to_cublas", "yield_to_cublas"]

# --------------------------------------------------------------------------------------------------------
# Where cuBLAS is ahead (see the module's docstring).
# --------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Ahead:
    name: str
    measured: str
    test: Callable[[Problem, Choice, Device], bool]


# Narrow products below this many multiply-adds per output column are bound by the per-call cost, where fastmm's
# path is the cheaper one (docs/kernels/heuristic.md, section 'The heuristic's break-even points', cuBLAS-ahead classes).
_NARROW_MIN_ELEMENTS = 1 << 22
# The narrow tiles beat cuBLAS on few rows against at least this many columns and this K (32x128 tiles); short of
# either, and on few columns (128x32), cuBLAS was ahead (docs/kernels/heuristic.md, section 'The heuristic's
# break-even points', 17 to 32 rows or columns).
_NARROW_TILES_AHEAD = 4096

CUBLAS_AHEAD: tuple[Ahead, ...] = (
    Ahead("narrow output", f"an output side of 17 to {_NARROW - 1} with a long K: split-K, or the narrow tiles short "
          f"of {_NARROW_TILES_AHEAD} columns and of K = {_NARROW_TILES_AHEAD} (18x3622x9839 0.73x cuBLAS, "
          "23x3567x11324 0.81x; columns: 8000x20x9000 0.79x; past both, rows: 19x12000x6000 1.52x, 25x4096x4096 1.09x)",
          lambda p, c, d: _narrow_output(p) and (c.rule == RuleName.SPLIT_K or c.rule == RuleName.NARROW_TILES and not (
              p.m < p.n and p.n >= _NARROW_TILES_AHEAD and p.k >= _NARROW_TILES_AHEAD))
          and p.k * max(p.m, p.n) * p.batch >= _NARROW_MIN_ELEMENTS),
    Ahead("partial wave", f"fewer 128x64 tiles than {_SUMS_BELOW_WAVE:g} of a wave on a K too short or a product too "
          "small to split (768^3 ran 0.73x cuBLAS so before split-K took it)",
          lambda p, c, d: c.config.name == WT128x64_SUMS),
    Ahead("few tiles on a long K", "split-k-idle's 64x64 slices: 0.42x -> 0.91x (seed 0) and 0.39x -> 0.77x (seed 1) "
          "geomean on the random sweep's products (H200), still behind cuBLAS, which also splits them (not a batch's, "
          "every item's slices in one launch: 1.03-20x cuBLAS over 70 batches)",
          lambda p, c, d: c.rule == RuleName.SPLIT_K_IDLE and p.batch == 1),
    Ahead("unaligned", "rows or operands not 16-byte aligned, over a full wave of tiles, where the operands are not "
          f"copied aligned (below 2^{_PAD_MIN_MACS.bit_length() - 1} multiply-adds): 4-byte copies (2501^3 0.81x "
          "cuBLAS; from 2^34 on aligned copies, K padded and summed in runs, 3001^3 0.93x, 4097^3 1.09x; below it, with "
          "a ragged edge of at most 16 rows or columns peeled off instead, 2049^3 1.05x)",
          lambda p, c, d: c.variant.vec == 1 and p.blocks(c.config) >= d.sm_count
          and c.rule not in (RuleName.FEW_COLUMNS, RuleName.RAGGED_EDGE, RuleName.ALIGNED_COPY, RuleName.SMALL)
          and not _outer_ahead_of_cublas(p, c)),
)


def _outer_ahead_of_cublas(problem: Problem, choice: Choice) -> bool:
    """Outer products (K <= 3: their rows are never 16-byte aligned) writing C in 16-byte stores, N a multiple of 4:
    1.09-3.39x cuBLAS over 72 products of K 1-3 in four layouts and batches; where C's rows take no 16-byte stores
    0.90-1.51x (docs/kernels/heuristic.md, section 'The heuristic's break-even points', cuBLAS-ahead classes)."""
    return choice.rule == RuleName.OUTER_PRODUCTS and problem.n % 4 == 0


def cublas_ahead(problem: Problem, choice: Choice, device: Device) -> str | None:
    """Why cuBLAS is measured ahead of `choice` for `problem` (a line of `CUBLAS_AHEAD`), or None.

    A forced kernel is never second-guessed: the user asked for it; nor a tensor-core precision mode."""
    if choice.rule in (RuleName.FORCED, RuleName.TENSOR, RuleName.OZAKI):  # measured for the FP32 paths only
        return None
    for ahead in CUBLAS_AHEAD:
        if ahead.test(problem, choice, device):
            return f"{ahead.name}: {ahead.measured}"
    return None


class CublasAhead(Exception):
    """Raised before any launch when the products are yielding to cuBLAS and the plan says it is ahead."""


_yield: contextvars.ContextVar[bool] = contextvars.ContextVar("fastmm_yield_to_cublas", default=False)


def yielding_to_cublas() -> bool:
    return _yield.get()


class yield_to_cublas:
    """Inside the block, a product whose class `CUBLAS_AHEAD` names raises `CublasAhead` before any launch.

    A class rather than a generator-based context manager: the CuPy hook enters one per product."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _yield.set(True)

    def __exit__(self, *exc):
        _yield.reset(self._token)
        return False
