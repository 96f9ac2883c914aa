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


def matmul(a, b, out=None, *, kernel=None, **kwargs):
    """Matrix product of two arrays, with NumPy's broadcasting and 1-D rules.

    Parameters
    ----------
    a, b : array_like
        Operands of any dtype NumPy's matmul takes and a GPU can hold; scalars are rejected as by NumPy.
    out : ndarray, optional
        Where to write the result (right shape, a dtype the result casts to); device or host array.
    kernel : str, optional
        Force a kernel for float32 products.
    **kwargs
        The ``numpy.matmul`` ufunc's keywords: ``dtype``, ``casting``, ``signature``, ``order``, ``subok``,
        ``axes``, ``axis``, ``keepdims``, with NumPy's rules and errors.

    .. seealso:: :func:`numpy.matmul`
    """
    return _returned(_dispatch.matmul(a, b, out=out, kernel=kernel, **kwargs), out)


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


def einsum(*operands, kernel=None, **kwargs):
    """Einstein summation; two-operand contractions that are one batched product run on fastmm.

    Both of NumPy's forms: ``einsum("ij,jk->ik", a, b)`` and ``einsum(a, [0, 1], b, [1, 2], [0, 2])``.

    .. seealso:: :func:`numpy.einsum`
    """
    return _returned(_dispatch.einsum(*operands, kernel=kernel, **kwargs), kwargs.get("out"))


def matvec(a, b, out=None, *, kernel=None, **kwargs):
    """Matrix-vector product. .. seealso:: :func:`numpy.matvec`"""
    return _returned(_dispatch.matvec(a, b, out=out, kernel=kernel, **kwargs), out)


def vecmat(a, b, out=None, *, kernel=None, **kwargs):
    """Vector-matrix product. .. seealso:: :func:`numpy.vecmat`"""
    return _returned(_dispatch.vecmat(a, b, out=out, kernel=kernel, **kwargs), out)


def vecdot(a, b, out=None, *, kernel=None, **kwargs):
    """Vector dot product over the last axis. .. seealso:: :func:`numpy.vecdot`"""
    return _returned(_dispatch.vecdot(a, b, out=out, kernel=kernel, **kwargs), out)
