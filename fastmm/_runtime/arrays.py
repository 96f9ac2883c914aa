"""float32 device arrays as the kernels see them: CuPy (its one access point for the runtime), results made
quickly, and an array's layout -> a GEMM problem.

Layouts: every kernel reads A and B through (row stride, column stride) pairs, so transposed, sliced,
negatively strided and broadcast views need no copy as long as one of the two core axes of each operand has
unit stride. Only an operand with no unit-stride axis (e.g. ``a[::2, ::2]``) is copied, with a
PerformanceWarning. C needs unit stride along n; an output with unit stride along m is handled by computing
C^T = B^T A^T instead, and anything else is computed into a temporary and copied.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _errors, _plan
from .._errors import format_shape as _fmt

__all__ = ["cupy", "cupy_base", "problem_for", "empty", "owning", "may_overlap", "span", "apart"]

_F32 = np.dtype(np.float32)
_cp = None


def cupy():
    """CuPy, imported on first use (importing fastmm never imports it): the runtime's one access to the module."""
    global _cp
    if _cp is None:
        import cupy

        _cp = cupy
    return _cp



_maker = (None, None)  # (the CuPy module, its quickest way to make an array: new, or over existing memory)


def _make_maker(cp):
    """CuPy's compiled array initialiser on a bare object where CuPy has one: what ``cupy.empty`` and CuPy's
    constructor end in, without their Python frames, which cost more than the initialiser on every small product
    (docs/dispatch.md, section 'Per-call cost'); else ``cupy.empty`` and CuPy's constructor."""
    global _maker
    base = cupy_base(cp)
    if base is not None and hasattr(base, "_init"):
        new, array_type = base.__new__, cp.ndarray

        def make(shape, dtype, memptr=None, strides=None):
            x = new(array_type)
            x._init(shape, dtype, memptr, strides)
            return x
    else:
        def make(shape, dtype, memptr=None, strides=None):
            return cp.empty(shape, dtype) if memptr is None else cp.ndarray(shape, dtype, memptr, strides)
    _maker = (cp, make)
    return make


def _make(cp):
    module, make = _maker
    return make if module is cp else _make_maker(cp)


def owning(view):
    """`view`'s memory as a new CuPy array that owns it (no base). For a view of an array that a call made and
    holds alone (a product's result reshaped or transposed), this is the result NumPy and CuPy would give."""
    return _make(cupy())(view.shape, view.dtype, view.data, view.strides)


def empty(shape, dtype=_F32):
    """A new uninitialised C-ordered CuPy array; fastmm's errors for a full or broken device."""
    cp = cupy()
    try:
        return _make(cp)(shape, dtype)
    except cp.cuda.memory.OutOfMemoryError as e:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        raise _errors.OutOfMemoryError(
            f"out of GPU memory allocating a {_fmt(shape)} {np.dtype(dtype)} result ({nbytes / 2**20:.1f} MiB): "
            f"{e}") from None
    except cp.cuda.runtime.CUDARuntimeError as e:  # a context broken by an earlier fault, say: a fastmm error
        from . import cuda as _cuda

        raise _cuda.as_fastmm_error(e, cp.cuda.runtime.getDevice(),
                                    f"allocating a {_fmt(shape)} {np.dtype(dtype)} result") from None


def _extent(x) -> tuple[int, int]:
    """[low, high) byte range that x's elements can touch."""
    lo = hi = x.data.ptr
    for s, st in zip(x.shape, x.strides):
        if st > 0:
            hi += (s - 1) * st
        else:
            lo += (s - 1) * st
    return lo, hi + x.itemsize


def span(x) -> tuple[int, int] | None:
    """[low, high) byte range that x's elements can touch, relative to its data pointer (it depends on shape and
    strides alone); None for an empty array."""
    if x.size == 0:
        return None
    lo, hi = _extent(x)
    return lo - x.data.ptr, hi - x.data.ptr


def apart(pc: int, pa: int, pb: int, spans) -> bool:
    """Whether C at address pc shares no byte with A at pa nor B at pb, given their `span`s (A's, B's, C's): the
    overlap test of a replay, two comparisons an operand, where `may_overlap` walks shapes and strides."""
    sa, sb, sc = spans
    if sc is None:
        return True
    c0, c1 = pc + sc[0], pc + sc[1]
    return all(s is None or not (p + s[0] < c1 and c0 < p + s[1]) for p, s in ((pa, sa), (pb, sb)))


def may_overlap(x, y) -> bool:
    if x.size == 0 or y.size == 0:
        return False
    (a0, a1), (b0, b1) = _extent(x), _extent(y)
    return a0 < b1 and b0 < a1


def _core_layout(x) -> tuple[bool, int] | None:
    """(transposed?, leading dimension) of x's last two axes, or None when neither has unit stride.

    A size-1 axis has no meaningful stride, so it never forces a copy: its stride is reported as 0.
    """
    rows, cols = x.shape[-2:]
    sr, sc = (s // 4 if s % 4 == 0 else None for s in x.strides[-2:])
    if (sc == 1 or cols == 1) and (sr is not None or rows == 1):
        return False, (sr if rows > 1 else 0)
    if (sr == 1 or rows == 1) and sc is not None:
        return True, (sc if cols > 1 else 0)
    return None


def _laid_out(x, name: str):
    """x and its core layout; a contiguous copy of x (with a PerformanceWarning) when no layout fits."""
    layout = _core_layout(x)
    if layout is not None and all(s % 4 == 0 for s in x.strides[:-2]):
        return x, layout
    _errors.warn_once(f"copy-{name}", f"operand {name} has no unit-stride axis (strides {x.strides}); fastmm copies "
                      "it to a contiguous array first")
    x = cupy().ascontiguousarray(x)
    return x, _core_layout(x)


def _batch_dims(c_batch, *operands) -> list[tuple[int, list[int]]]:
    """Collapse the broadcast batch axes to as few (size, [element stride per operand]) axes as possible."""
    dims = []
    for axis, size in enumerate(c_batch):
        if size == 1:
            continue
        strides = []
        for x in operands:
            xb = x.ndim - 2
            j = axis - (len(c_batch) - xb)
            strides.append(0 if j < 0 or x.shape[j] == 1 else x.strides[j] // 4)
        if dims and all(p == s * size for p, s in zip(dims[-1][1], strides)):
            dims[-1] = (dims[-1][0] * size, strides)
        else:
            dims.append((size, strides))
    return dims


def problem_for(a, b, c, runs: bool = False) -> tuple[_plan.Problem, dict]:
    """Describe ``c = a @ b`` (float32 device arrays, c with unit stride along n) for the plan and the launch; `runs`:
    the operands are aligned copies, on which the kernels may sum K in runs (see `_plan.aligned_copies`)."""
    a0, b0 = a, b
    a, (a_t, lda) = _laid_out(a, "a") if not isinstance(a, _Meta) else (a, _core_layout(a))
    b, (b_t, ldb) = _laid_out(b, "b") if not isinstance(b, _Meta) else (b, _core_layout(b))
    m, k = a.shape[-2:]
    n = b.shape[-1]
    dims = _batch_dims(c.shape[:-2], a, b, c)
    outer, inner = dims[:-2], dims[-2:]
    if len(inner) == 0:
        inner = [(1, [0, 0, 0]), (1, [0, 0, 0])]
    elif len(inner) == 1:
        inner = [(1, [0, 0, 0]), inner[0]]
    (n0, s0), (n1, s1) = inner
    ldc = c.strides[-2] // 4 if m > 1 else 0
    a_sm, a_sk = (1, lda) if a_t else (lda, 1)
    b_sk, b_sn = (1, ldb) if b_t else (ldb, 1)
    strides = [lda, ldb, ldc, *s0, *s1, *(s for _, st in outer for s in st)]
    ptrs = (a.data.ptr, b.data.ptr, c.data.ptr)
    # Each operand's rows start 16-byte aligned (its pointer, leading dimension and batch strides): the kernels then
    # copy it 16 bytes at a time. C's rows decide only the stores, which each block checks for itself.
    a_aligned, b_aligned = (ptrs[i] % 16 == 0 and all(s % 4 == 0 for s in (strides[i], s0[i], s1[i],
                                                                            *(st[i] for _, st in outer)))
                            for i in (0, 1))
    # The tiles copy 16 bytes at a time only the operands whose unit stride runs along M or N (A transposed, B
    # row-major); the others they copy 4 bytes at a time, transposing, whatever their alignment (pipeline.cuh).
    tiles_aligned = (a_aligned or not a_t) and (b_aligned or b_t)
    problem = _plan.Problem(m, n, k, n0 * n1, a_t, b_t, tiles_aligned, a_aligned, b_aligned, runs)
    # C's stride along n: 1 for every kernel but the few-column one, which also writes C^T (for few rows).
    c_sn = c.strides[-1] // 4 if n > 1 else 1
    args = dict(m=m, n=n, k=k, a=ptrs[0], a_sm=a_sm, a_sk=a_sk, b=ptrs[1], b_sk=b_sk, b_sn=b_sn,
                c=ptrs[2], c_sm=ldc, c_sn=c_sn, batch=n0 * n1, batch_inner=n1,
                batch_strides=(s0[0], s1[0], s0[1], s1[1], s0[2], s1[2]))
    # `keep` holds any contiguous copies alive until the caller has launched on them.
    return problem, dict(args=args, outer=outer, copied=a is not a0 or b is not b0, keep=(a, b))


class _Meta:
    """Shape, strides and address of an array that need not exist: what `explain` plans with."""

    def __init__(self, shape, strides, ptr=0):
        self.shape, self.strides, self.ndim = tuple(shape), tuple(strides), len(shape)
        self.size = math.prod(shape)
        self.data = type("ptr", (), {"ptr": ptr})

    def swapaxes(self, i, j):
        shape, strides = list(self.shape), list(self.strides)
        shape[i], shape[j], strides[i], strides[j] = shape[j], shape[i], strides[j], strides[i]
        return _Meta(shape, strides, self.data.ptr)


def _meta(x, shape=None) -> _Meta:
    """A float32 stand-in for x: a device array as it is; host data as the upload will lay it out (CuPy keeps
    a Fortran-ordered NumPy array Fortran-ordered, and makes anything else C-ordered)."""
    shape = tuple(np.shape(x)) if shape is None else shape
    if hasattr(x, "strides") and hasattr(x, "data") and hasattr(x.data, "ptr") and x.dtype == _F32:
        return _Meta(x.shape, x.strides, x.data.ptr)
    fortran = isinstance(x, np.ndarray) and x.flags.f_contiguous and not x.flags.c_contiguous
    return _Meta(shape, contiguous_strides(shape, fortran))


def contiguous_strides(shape, fortran: bool = False) -> tuple[int, ...]:
    """The byte strides of a contiguous float32 array of `shape`, C-ordered (or Fortran-ordered), as CuPy lays out
    a new one."""
    order = tuple(shape) if fortran else tuple(shape)[::-1]
    strides = tuple(int(s) * 4 for s in np.cumprod((1,) + order[:-1])) if order else ()
    return strides if fortran else strides[::-1]


def cupy_base(cp):
    """CuPy's compiled base array class (cupy.ndarray derives from it), or None where this CuPy has none."""
    return getattr(getattr(getattr(cp, "_core", None), "core", None), "_ndarray_base", None)


def _batch_item(x, index: tuple[int, ...]):
    """x's 2-D matrix for batch index `index` of the result, NumPy's broadcasting of x's own batch axes."""
    own = index[len(index) - (x.ndim - 2):] if x.ndim > 2 else ()
    return x[tuple(i if size > 1 else 0 for i, size in zip(own, x.shape[:-2]))]
