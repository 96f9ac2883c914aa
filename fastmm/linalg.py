"""Public matrix products: NumPy's signatures, fastmm's kernels for float32, CuPy for everything else.

Each function accepts fastmm, CuPy or NumPy arrays (host data is uploaded once) and returns fastmm arrays.
``kernel=`` forces a kernel family ("naive", "smem", "regtile", "warptile") or configuration (see
``fastmm.kernel_names()``) for float32 products; the default "auto" follows the heuristic table
(``fastmm.explain`` shows which rule fires).
"""

from __future__ import annotations

from . import _dispatch
from ._array import _returned, _wrap

__all__ = ["matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot"]


def matmul(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """Matrix product of two arrays, with NumPy's broadcasting and 1-D rules.

    Parameters
    ----------
    a, b : array_like
        Operands; scalars are rejected as by NumPy.
    out : ndarray, optional
        Where to write the result (right shape, a dtype the result casts to); device or host array.
    dtype, casting
        As for the ``numpy.matmul`` ufunc.
    kernel : str, optional
        Force a kernel for float32 products.

    .. seealso:: :func:`numpy.matmul`
    """
    return _returned(_dispatch.matmul(a, b, out=out, dtype=dtype, casting=casting, kernel=kernel), out)


def dot(a, b, out=None, *, kernel=None):
    """Dot product; for N-D operands a sum over a's last and b's second-to-last axis.

    .. seealso:: :func:`numpy.dot`
    """
    return _returned(_dispatch.dot(a, b, out=out, kernel=kernel), out)


def inner(a, b, *, kernel=None):
    """Inner product over the last axes. .. seealso:: :func:`numpy.inner`"""
    return _wrap(_dispatch.inner(a, b, kernel=kernel))


def vdot(a, b, *, kernel=None):
    """Dot product of flattened operands, conjugating the first. .. seealso:: :func:`numpy.vdot`"""
    return _wrap(_dispatch.vdot(a, b, kernel=kernel))


def tensordot(a, b, axes=2, *, kernel=None):
    """Sum over the given axes. .. seealso:: :func:`numpy.tensordot`"""
    return _wrap(_dispatch.tensordot(a, b, axes, kernel=kernel))


def einsum(subscripts, *operands, kernel=None, **kwargs):
    """Einstein summation; two-operand contractions that are one batched product run on fastmm.

    .. seealso:: :func:`numpy.einsum`
    """
    return _wrap(_dispatch.einsum(subscripts, *operands, kernel=kernel, **kwargs))


def matvec(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """Matrix-vector product. .. seealso:: :func:`numpy.matvec`"""
    return _returned(_dispatch.matvec(a, b, out=out, dtype=dtype, casting=casting, kernel=kernel), out)


def vecmat(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """Vector-matrix product. .. seealso:: :func:`numpy.vecmat`"""
    return _returned(_dispatch.vecmat(a, b, out=out, dtype=dtype, casting=casting, kernel=kernel), out)


def vecdot(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """Vector dot product over the last axis. .. seealso:: :func:`numpy.vecdot`"""
    return _returned(_dispatch.vecdot(a, b, out=out, dtype=dtype, casting=casting, kernel=kernel), out)
