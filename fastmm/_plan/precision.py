"""Precision modes (PyTorch's names): which arithmetic a float32 product may use, and the tensor-core tiles."""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import warnings

from ..kernels.configs import INT8_WG, SPLIT, get_config
from . import ozaki
from .problem import Device, Problem, RuleName
from .tiles import TF32_TILES, TF32_WG, TF32X3_TILES, TF32X3_WG, _fill_from

__all__ = ["PRECISIONS", "set_float32_matmul_precision", "get_float32_matmul_precision", "matmul_precision",
           "current_precision"]

# --------------------------------------------------------------------------------------------------------
# Precision modes (PyTorch's names): which arithmetic a float32 product may use.
# --------------------------------------------------------------------------------------------------------

PRECISIONS: dict[str, str] = {
    "highest": "FP32 FMAs on the SIMT cores (float32 products as NumPy's BLAS computes them)",
    "high": "3xTF32 on the tensor cores (each operand split into two TF32 parts; FP32 accuracy)",
    "medium": "one TF32 pass on the tensor cores (operands rounded to 10-bit mantissas: relative error near 3e-4)",
}
_TENSOR_TILES = {"high": TF32X3_TILES, "medium": TF32_TILES}
# Hopper's wgmma (6_wgmma.cu, operands split by pass_tf32_split.cu) for products whose split passes take a small
# part of the time (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tensor/wgmma thresholds).
_WG_TILES = {"high": TF32X3_WG, "medium": TF32_WG}
_WG_MIN_MACS = {"high": 960 ** 3, "medium": 1 << 28}
# ... and an output at least this wide both ways: the split passes' share of the time grows as 1/M + 1/N
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', tensor/wgmma thresholds).
_WG_MIN_SIDE = {"high": 960, "medium": 512}


# Ozaki scheme II (fastmm/_plan/ozaki.py) on the INT8 tensor cores for 'high': only for products this large, each side
# at least this long. Against 3xTF32 on an H100 it ran 0.62x at 4096^3, 1.05-1.1x at 8192^3 and 1.2x at 16384^3 once its
# products came out as residues and the reconstruction ran at the memory's rate (docs/kernels/ozaki.md).
_OZAKI_MIN_MACS = 8192 ** 3
_OZAKI_MIN_SIDE = 8192
# The INT8 product kernel of the Ozaki launch sequence: 128 x 256 tiles, one block each, 1.5-1.6x cuBLAS's INT8 rate on an
# H100 from 4096^3 up; the cluster pairs' multicast copies (int8wg_128x256x128_s4_c2) ran at 0.41-0.48x of it, so no
# plan names them. Its sums leave as residues (uint8), a quarter of int32's bytes to write and to read back.
OZAKI_INT8 = next(c for c in INT8_WG if c.residues)


def _ozaki(problem: Problem, device: Device) -> bool:
    """A product that 'high' runs by Ozaki scheme II: a single large one on Hopper, K within the exact int32 range."""
    return (_hopper(device) and problem.batch == 1 and min(problem.m, problem.n, problem.k) >= _OZAKI_MIN_SIDE
            and problem.m * problem.n * problem.k >= _OZAKI_MIN_MACS and ozaki.fits(problem.m, problem.n,
                                                                                       problem.k) is None)


def ozaki_reason(problem: Problem) -> str:
    """What `explain` says of an Ozaki scheme II product: the moduli and why that many."""
    moduli = ozaki.choose_moduli(problem.k)
    h_a, h_b = ozaki.side_bits(moduli)
    total = math.prod(moduli)
    why = ozaki.fits(problem.m, problem.n, problem.k)
    return (f"{len(moduli)} moduli for K = {problem.k} ({moduli[0]}, {moduli[1]}, ..., {moduli[-1]}: product "
            f"2^{total.bit_length() - 1}) hold every element of C exactly: A's rows and B's columns scaled by powers "
            f"of two to 2-norms below 2^{h_a} and 2^{h_b} and rounded to integers, their int8 residues multiplied "
            f"exactly on the INT8 tensor cores ({OZAKI_INT8.name}, one product per modulus), C rebuilt by the Chinese "
            "remainder theorem; rows and columns holding NaN or an infinity computed on 3xTF32"
            + (f" (here on 3xTF32 whole: {why})" if why else ""))


def ozaki_fallback(problem: Problem, device: Device) -> str:
    """The 3xTF32 kernel that takes an Ozaki product's place: its non-finite rows and columns, a product one launch
    sequence cannot take, or one whose workspace does not fit."""
    return _tensor(problem, device, "high")[0]


def _macs(n: int) -> str:
    """A threshold of multiply-adds as the docs write it: 2^k, or s^3."""
    if n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{round(n ** (1 / 3))}^3"


def _hopper(device: Device) -> bool:
    return device.compute_capability == (9, 0)


def _wgmma(problem: Problem, device: Device, precision: str) -> bool:
    """A product the wgmma kernels take in a tensor-core precision: a single large one, on Hopper."""
    # Each operand split in one launch (about 2.1 million rows of A, and of B^T: the split pass's grid; see
    # Split.rows_per_launch): a longer one would be multiplied in pieces, which the FP32 tiles need not do.
    bm, bn = get_config(_WG_TILES[precision]).tile
    return (_hopper(device) and problem.batch == 1 and min(problem.m, problem.n) >= _WG_MIN_SIDE[precision]
            and problem.m * problem.n * problem.k >= _WG_MIN_MACS[precision]
            and problem.m <= SPLIT.rows_per_launch(bm) and problem.n <= SPLIT.rows_per_launch(bn))


def _from_environment() -> str:
    """The process-wide mode to start with: $FASTMM_PRECISION where set (as NVIDIA_TF32_OVERRIDE and CUPY_TF32 set
    theirs), else "highest"."""
    mode = os.environ.get("FASTMM_PRECISION", "").strip().lower()
    if not mode:
        return "highest"
    if mode not in PRECISIONS:
        warnings.warn(f"FASTMM_PRECISION={mode!r} is not a float32 matmul precision; valid values: "
                      f"{', '.join(PRECISIONS)}; fastmm uses 'highest'", stacklevel=2)
        return "highest"
    return mode


_precision_default = _from_environment()  # the process-wide setting (set_float32_matmul_precision)
_precision: contextvars.ContextVar[str | None] = contextvars.ContextVar("fastmm_precision", default=None)


def _check_precision(mode) -> str:
    if mode not in PRECISIONS:
        raise ValueError(f"unknown float32 matmul precision {mode!r}; valid values: "
                         f"{', '.join(repr(p) for p in PRECISIONS)}")
    return mode


def set_float32_matmul_precision(precision: str) -> None:
    """Set the arithmetic of fastmm's float32 products for the whole process, as PyTorch's function of this name.

    Parameters
    ----------
    precision : {"highest", "high", "medium"}
        ``"highest"`` (the default): FP32 FMAs, as NumPy's and CuPy's float32 products. ``"high"``: 3xTF32 on the
        tensor cores, FP32 accuracy; on Hopper, a single product with every side from 8192 runs Ozaki scheme II on
        the INT8 tensor cores instead, also FP32-accurate and faster there (``explain`` says which). ``"medium"``:
        one TF32 pass on the tensor cores, relative error near 3e-4 (what ``CUPY_TF32=1`` gives cuBLAS).

    Raises
    ------
    ValueError
        For any other value; the message lists the valid ones.

    See Also
    --------
    get_float32_matmul_precision, matmul_precision
    explain : Names the mode and the kernel of a product.

    Notes
    -----
    A `matmul_precision` block and the ``precision=`` keyword of fastmm's product functions override it.
    Products of other dtypes are unaffected. NumPy has no counterpart; JAX's ``precision=`` and CuPy's
    ``CUPY_TF32`` are compared on the kernels page of the documentation.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.set_float32_matmul_precision("high")
    >>> fastmm.get_float32_matmul_precision()
    'high'
    >>> fastmm.set_float32_matmul_precision("highest")
    """
    global _precision_default
    _precision_default = _check_precision(precision)


def current_precision() -> str:
    """The precision a product takes now: the innermost `matmul_precision` block's, else the process-wide one."""
    return _precision.get() or _precision_default


def get_float32_matmul_precision() -> str:
    """The precision float32 products use here and now: an enclosing `matmul_precision` block's, else the
    process-wide one (`set_float32_matmul_precision`).

    Returns
    -------
    str
        ``"highest"``, ``"high"`` or ``"medium"``.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.get_float32_matmul_precision()
    'highest'
    """
    return _precision.get() or _precision_default


class matmul_precision(contextlib.ContextDecorator):
    """Use `precision` for every float32 product inside the block (of this thread or asyncio task).

    Parameters
    ----------
    precision : {"highest", "high", "medium"}
        As for `set_float32_matmul_precision`.

    Raises
    ------
    ValueError
        On entering the block, for an unknown value.

    See Also
    --------
    set_float32_matmul_precision : The process-wide setting.

    Examples
    --------
    >>> import fastmm
    >>> with fastmm.matmul_precision("medium"):
    ...     fastmm.get_float32_matmul_precision()
    'medium'
    >>> print(fastmm.explain((4096, 4096), (4096, 4096), precision="high"))  # doctest: +ELLIPSIS
    4096x4096x4096 float32 ...
      kernel  tf32x3wg_128x128x32_s3
      mode    high: 3xTF32 on the tensor cores ...
    """

    # A class rather than a generator-based context manager: fastmm's functions enter one per call of theirs that
    # names ``precision=``, and a generator costs a microsecond or two of such a call.
    def __init__(self, precision: str):
        self.precision = precision
        self._tokens = []  # a stack: the same block may be entered again inside itself

    def __enter__(self) -> None:
        self._tokens.append(_precision.set(_check_precision(self.precision)))

    def __exit__(self, *exc) -> bool:
        _precision.reset(self._tokens.pop())
        return False

    def _recreate_cm(self):
        # As a decorator: a block of its own for each call, so that calls from several threads never share tokens.
        return type(self)(self.precision)


def _maps(problem: Problem) -> str:
    """The operands of a one-pass wgmma product that its tensor maps read, those with 16-byte aligned rows: "a" a
    K-major A, "r" an A along M (into registers), "b" a B given as B^T; A @ B with B along N runs as C^T = B^T A^T,
    "rb". The runtime checks the operands themselves (fastmm/_runtime/presplit.py, _presplit) and splits any that a map
    cannot read."""
    if not (problem.a_aligned and problem.b_aligned) or problem.a_t or problem.b_t or problem.k < 2:
        a = "a" if not problem.a_t else "r"
        return (a if problem.a_aligned else "") + ("b" if problem.b_t and problem.b_aligned else "")
    return "rb"  # (swapped)


def _maps_said(problem: Problem, maps: str) -> str:
    """How `_maps`'s operands come in, in words."""
    if maps == "rb" and not problem.a_t:
        return ("B^T through a TFLOAT32 tensor map into registers (wgmma's register operand) and A^T through another "
                "(rounded to TF32 by the copies), C^T = B^T A^T written transposed,")
    mapped = {"A": maps[0] in "ar", "B": "b" in maps}
    return " and ".join(f"{x} through a TFLOAT32 tensor map (rounded to TF32 by the copy)"
                        + (" into registers" if x == "A" and "r" in maps else "")
                        if mapped[x] else f"{x} split into TF32 by a pass" for x in ("A", "B"))


def _tensor(problem: Problem, device: Device, precision: str) -> tuple[str, str, str]:
    """(kernel, rule, reason) of a product in a tensor-core precision."""
    if _wgmma(problem, device, precision):
        name, how = _WG_TILES[precision], (" on A and B split into TF32 parts by a pass over each, as swizzled block "
                                           "tiles that one warpgroup copies in while two multiply")
        maps = _maps(problem) if precision == "medium" else ""
        if maps:
            name += f"_map{maps}"
            how = ", one warpgroup copying in " + _maps_said(problem, maps) + " while two multiply"
        return (name, RuleName.TENSOR_WGMMA,
                f"precision {precision!r}, a single product of >= {_macs(_WG_MIN_MACS[precision])} "
                f"multiply-adds with both output sides >= {_WG_MIN_SIDE[precision]} on Hopper: warpgroup MMA (wgmma)"
                + how)
    names = _TENSOR_TILES[precision]
    return (_fill_from(names)(problem, device), RuleName.TENSOR,
            f"precision {precision!r}: tensor-core tiles, the largest that gives half the SMs a block with little "
            "padding")
