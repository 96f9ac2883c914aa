"""Public matrix products: NumPy's signatures, fastmm's kernels for float32, CuPy for everything else.

Each function takes fastmm, CuPy or NumPy arrays (host data is uploaded once per call) and returns fastmm
arrays on the current CuPy device. ``kernel=`` forces a kernel family (``"naive"``, ``"smem"``, ``"regtile"``,
``"warptile"``) or one configuration (see `fastmm.kernel_names`) for float32 products; the default ``"auto"``
follows the heuristic table (`fastmm.explain` shows which rule fires). ``precision=`` ("highest", the default;
"high": 3xTF32 on the tensor cores; "medium": one TF32 pass) overrides `fastmm.set_float32_matmul_precision` for
one call. Products of other dtypes run on CuPy and ignore both.

The same functions are importable from the top-level package (``fastmm.matmul is fastmm.linalg.matmul``), and
NumPy's own functions reach them when an operand is a fastmm array: ``np.matmul(a, b)``, ``a @ b``,
``np.dot(a, b)`` and so on.

How every function here differs from NumPy's function of the same name:

- results are fastmm arrays in GPU memory, not NumPy arrays (``fastmm.asnumpy`` copies one to the host);
- the extra keyword ``kernel=``;
- float32 products round differently from NumPy's BLAS (relative error near 1e-6 against a float64 product,
  as for any FP32 GEMM), and float16 products accumulate in float32 on the GPU: more accurate than NumPy's,
  not bit-identical;
- object, string, void and long-double arrays raise `TypeError`: the GPU has no such types.

Further differences are listed under each function.
"""

from __future__ import annotations

import contextlib

from ._dispatch import products as _dispatch
from . import _plan
from ._array import _fresh, _returned

__all__ = ["matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot"]


_CURRENT = contextlib.nullcontext()  # reusable, and one object fewer per call


def _precise(precision):
    """The block a product runs in: `precision` when given (``precision=``), else the current one."""
    return _CURRENT if precision is None else _plan.matmul_precision(precision)


def matmul(a, b, out=None, *, kernel=None, precision=None, **kwargs):
    """Matrix product of two arrays, as `numpy.matmul`; float32 products on fastmm's kernels.

    NumPy's rules for shapes: 2-D operands multiply as matrices, N-D operands as stacks of matrices whose batch
    axes broadcast, and a 1-D operand is promoted to a matrix whose added axis is removed from the result.
    Transposed views, slices, broadcast batch axes and unaligned offsets are read in place, without copies.

    Parameters
    ----------
    a, b : array_like
        Operands of any dtype `numpy.matmul` takes and a GPU can hold: fastmm, CuPy or NumPy arrays, or
        nested sequences. Scalars raise NumPy's `ValueError`, as in NumPy.
    out : ndarray, optional
        Where to put the result: a device (fastmm or CuPy) or host (NumPy) array with the result's shape and a
        dtype the result casts to under `casting`. It may be a non-contiguous view and may share memory with
        an operand (the product is then computed into a temporary first).
    kernel : str, optional
        The kernel for a float32 product: ``"auto"`` (the default), a family or a configuration name from
        `kernel_names`. Overrides an enclosing `use_kernel`. Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.
    **kwargs
        The keywords of NumPy's matmul ufunc: ``dtype``, ``casting``, ``signature``, ``order``, ``subok``,
        ``axes``, ``axis``, ``keepdims``, with NumPy's rules and NumPy's errors.

    Returns
    -------
    ndarray
        A fastmm array with NumPy's result shape and dtype, or `out` when given. With ``subok=False``, a plain
        ``cupy.ndarray``.

    Raises
    ------
    ValueError
        For NumPy's shape errors (mismatched core dimensions, non-broadcastable batch axes, a scalar operand,
        an `out` of the wrong shape), with NumPy's messages.
    TypeError
        For dtypes without a loop or a GPU type, or an `out` the result cannot be cast to.
    KeyError
        For an unknown `kernel` name; the message lists the valid ones.
    CUDAError
        Or one of its subclasses, when the GPU runtime fails (see the exceptions below).
    NvccNotFoundError
        When a float32 product needs a kernel that is not in the cache and no ``nvcc`` is found.

    See Also
    --------
    numpy.matmul : NumPy's function, which reaches this one for fastmm operands.
    dot, matvec, vecmat, vecdot : The other products of the family.
    explain : Which kernel a product runs, and why.

    Notes
    -----
    Differs from `numpy.matmul` in what the module's docstring lists (fastmm arrays on the GPU, ``kernel=``,
    float32 rounding) and in nothing else: shapes, dtypes, keywords and error types are NumPy's.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((2, 3), np.float32))         # doctest: +SKIP
    >>> b = fastmm.asarray(np.ones((3, 4), np.float32))         # doctest: +SKIP
    >>> fastmm.matmul(a, b).shape                                # doctest: +SKIP
    (2, 4)
    >>> c = a @ b                            # the same product  # doctest: +SKIP
    >>> d = fastmm.matmul(a, b, kernel="regtile")                # doctest: +SKIP
    """
    if precision is None:  # the common call, without a block's cost (small products pay it on every call)
        return _returned(_dispatch.matmul(a, b, out=out, kernel=kernel, **kwargs), out, a, b)
    with _plan.matmul_precision(precision):
        return matmul(a, b, out, kernel=kernel, **kwargs)


def dot(a, b, out=None, *, kernel=None, precision=None):
    """Dot product of two arrays, as `numpy.dot`; float32 products on fastmm's kernels.

    For 2-D operands a matrix product, for 1-D operands an inner product, for a scalar operand a
    multiplication; for N-D operands a sum over the last axis of `a` and the second-to-last axis of `b`,
    computed as one batched product.

    Parameters
    ----------
    a, b : array_like
        Operands: fastmm, CuPy or NumPy arrays, or nested sequences.
    out : ndarray, optional
        Where to put the result. NumPy's stricter rules for `numpy.dot` apply: the exact result dtype and
        C-contiguous. A device or host array.
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.

    Returns
    -------
    ndarray
        A fastmm array (0-d for two 1-D operands), or `out` when given.

    Raises
    ------
    ValueError
        When the summed axes differ in length (``shapes (2,3) and (4,5) not aligned: ...``) or `out` does not
        fit NumPy's rules.
    TypeError
        For dtypes a GPU cannot hold, or an `out` that is not an array.
    KeyError
        For an unknown `kernel` name.

    See Also
    --------
    numpy.dot : NumPy's function, which reaches this one for fastmm operands.
    matmul : Broadcasts batch axes instead of pairing every batch of `a` with every batch of `b`.

    Notes
    -----
    Differs from `numpy.dot` only as the module's docstring says. The method ``a.dot(b)`` of a fastmm array
    is this function too.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((2, 3), np.float32))    # doctest: +SKIP
    >>> fastmm.dot(a, a.T).shape                            # doctest: +SKIP
    (2, 2)
    >>> np.dot(a, a.T).shape                  # the same   # doctest: +SKIP
    (2, 2)
    """
    if precision is None:  # as in matmul
        return _returned(_dispatch.dot(a, b, out=out, kernel=kernel), out, a, b)
    with _plan.matmul_precision(precision):
        return dot(a, b, out, kernel=kernel)


def inner(a, b, *, kernel=None, precision=None):
    """Inner product over the last axes, as `numpy.inner`; float32 products on fastmm's kernels.

    For N-D operands the result has shape ``a.shape[:-1] + b.shape[:-1]``; it is computed as one product
    ``a2 @ b2.T`` with no copy of `b`.

    Parameters
    ----------
    a, b : array_like
        Operands whose last axes have the same length (a scalar operand multiplies).
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.

    Returns
    -------
    ndarray
        A fastmm array.

    Raises
    ------
    ValueError
        When the last axes differ in length.

    See Also
    --------
    numpy.inner : NumPy's function, which reaches this one for fastmm operands.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((2, 3), np.float32))    # doctest: +SKIP
    >>> fastmm.inner(a, a).shape                            # doctest: +SKIP
    (2, 2)
    """
    with _precise(precision):
        return _fresh(_dispatch.inner(a, b, kernel=kernel), a, b)


def vdot(a, b, *, kernel=None, precision=None):
    """Dot product of the flattened operands, conjugating the first, as `numpy.vdot`.

    Parameters
    ----------
    a, b : array_like
        Operands with the same number of elements (their shapes may differ).
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.

    Returns
    -------
    ndarray
        A 0-d fastmm array. NumPy returns a scalar; fastmm keeps the value on the GPU, as CuPy does
        (``float(result)`` or ``result.item()`` copies it to the host).

    Raises
    ------
    ValueError
        When the element counts differ (the message is worded differently from NumPy's).

    See Also
    --------
    numpy.vdot : NumPy's function, which reaches this one for fastmm operands.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.arange(3, dtype=np.float32))  # doctest: +SKIP
    >>> float(fastmm.vdot(a, a))                             # doctest: +SKIP
    5.0
    """
    with _precise(precision):
        return _fresh(_dispatch.vdot(a, b, kernel=kernel), a, b)


def tensordot(a, b, axes=2, *, kernel=None, precision=None):
    """Sum of products over the given axes, as `numpy.tensordot`; float32 products on fastmm's kernels.

    The summed axes are moved together and flattened, so the contraction runs as one matrix product.

    Parameters
    ----------
    a, b : array_like
        Operands.
    axes : int or (sequence of int, sequence of int), optional
        An integer N sums over the last N axes of `a` and the first N of `b`; a pair of sequences names the
        axes of each. Default 2, as in NumPy.
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.

    Returns
    -------
    ndarray
        A fastmm array with the free axes of `a` followed by those of `b`.

    Raises
    ------
    ValueError
        When summed axes differ in length (``shape-mismatch for sum``).

    See Also
    --------
    numpy.tensordot : NumPy's function, which reaches this one for fastmm operands.
    einsum : The general contraction.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((3, 4, 5), np.float32))            # doctest: +SKIP
    >>> b = fastmm.asarray(np.ones((4, 3, 2), np.float32))            # doctest: +SKIP
    >>> fastmm.tensordot(a, b, axes=([1, 0], [0, 1])).shape            # doctest: +SKIP
    (5, 2)
    """
    with _precise(precision):
        return _fresh(_dispatch.tensordot(a, b, axes, kernel=kernel), a, b)


def einsum(*operands, kernel=None, precision=None, **kwargs):
    """Einstein summation, as `numpy.einsum`; single float32 products on fastmm's kernels.

    A contraction of two float32 operands with an explicit output that amounts to one (batched) matrix product
    runs on fastmm's kernels; every other contraction (diagonals, traces, an implicit output, three or more
    operands, other dtypes) runs on CuPy's ``einsum``.

    Parameters
    ----------
    *operands
        Either NumPy's subscripts form, ``einsum("ij,jk->ik", a, b)``, or its sublist form,
        ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` (with ``Ellipsis`` for ``...``).
    kernel : str, optional
        The kernel for a float32 product on fastmm's path (see `matmul`).
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.
    **kwargs
        NumPy's keywords: ``out`` (filled after the product, with NumPy's ``casting="safe"`` check),
        ``dtype``, ``order``, ``casting``, ``optimize``. Any keyword other than ``out`` and ``optimize`` sends
        the call to CuPy.

    Returns
    -------
    ndarray
        A fastmm array (a view of an operand where NumPy returns one, e.g. ``einsum("ii->i", a)``), or `out`.

    Raises
    ------
    ValueError
        For malformed subscripts or mismatched sizes, or an `out` of the wrong shape.
    TypeError
        When the result cannot be cast to `out`'s dtype.

    See Also
    --------
    numpy.einsum : NumPy's function, which reaches this one for fastmm operands.
    tensordot, matmul : Products with fixed forms.

    Notes
    -----
    Besides what the module's docstring lists, ``order=`` is ignored on CuPy's path (CuPy's ``einsum`` has
    none): results are laid out as CuPy lays them out.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((8, 2, 3), np.float32))     # doctest: +SKIP
    >>> b = fastmm.asarray(np.ones((8, 3, 4), np.float32))     # doctest: +SKIP
    >>> fastmm.einsum("bij,bjk->bik", a, b).shape               # doctest: +SKIP
    (8, 2, 4)
    >>> fastmm.einsum(a, [0, 1, 2], b, [0, 2, 3], [0, 1, 3]).shape  # doctest: +SKIP
    (8, 2, 4)
    """
    with _precise(precision):
        return _returned(_dispatch.einsum(*operands, kernel=kernel, **kwargs), kwargs.get("out"), *operands)


def matvec(a, b, out=None, *, kernel=None, precision=None, **kwargs):
    """Matrix-vector product, as `numpy.matvec`: ``(..., m, n) x (..., n) -> (..., m)``.

    Runs as a product with the vector as a column; batch axes broadcast.

    Parameters
    ----------
    a : array_like
        Stack of matrices, shape ``(..., m, n)``.
    b : array_like
        Stack of vectors, shape ``(..., n)``.
    out : ndarray, optional
        Where to put the result, shape ``(..., m)``; a device or host array.
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.
    **kwargs
        The gufunc keywords of `numpy.matvec`, with NumPy's rules and errors.

    Returns
    -------
    ndarray
        A fastmm array, or `out` when given.

    Raises
    ------
    ValueError
        For NumPy's shape errors, with NumPy's messages.

    See Also
    --------
    numpy.matvec : NumPy's function (NumPy 2.2 and later), which reaches this one for fastmm operands.
    vecmat, matmul

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((5, 2, 3), np.float32))     # doctest: +SKIP
    >>> v = fastmm.asarray(np.ones(3, np.float32))             # doctest: +SKIP
    >>> fastmm.matvec(a, v).shape                               # doctest: +SKIP
    (5, 2)
    """
    with _precise(precision):
        return _returned(_dispatch.matvec(a, b, out=out, kernel=kernel, **kwargs), out, a, b)


def vecmat(a, b, out=None, *, kernel=None, precision=None, **kwargs):
    """Vector-matrix product, as `numpy.vecmat`: ``(..., n) x (..., n, m) -> (..., m)``, conjugating the vector.

    Parameters
    ----------
    a : array_like
        Stack of vectors, shape ``(..., n)``.
    b : array_like
        Stack of matrices, shape ``(..., n, m)``.
    out : ndarray, optional
        Where to put the result, shape ``(..., m)``; a device or host array.
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.
    **kwargs
        The gufunc keywords of `numpy.vecmat`, with NumPy's rules and errors.

    Returns
    -------
    ndarray
        A fastmm array, or `out` when given.

    Raises
    ------
    ValueError
        For NumPy's shape errors, with NumPy's messages.

    See Also
    --------
    numpy.vecmat : NumPy's function (NumPy 2.2 and later), which reaches this one for fastmm operands.
    matvec, vecdot

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> v = fastmm.asarray(np.ones(3, np.float32))             # doctest: +SKIP
    >>> b = fastmm.asarray(np.ones((3, 4), np.float32))        # doctest: +SKIP
    >>> fastmm.vecmat(v, b).shape                               # doctest: +SKIP
    (4,)
    """
    with _precise(precision):
        return _returned(_dispatch.vecmat(a, b, out=out, kernel=kernel, **kwargs), out, a, b)


def vecdot(a, b, out=None, *, kernel=None, precision=None, **kwargs):
    """Vector dot product over the last axis, as `numpy.vecdot`: ``(..., n) x (..., n) -> (...)``.

    The first operand is conjugated (for complex dtypes); batch axes broadcast.

    Parameters
    ----------
    a, b : array_like
        Stacks of vectors whose last axes have the same length.
    out : ndarray, optional
        Where to put the result; a device or host array.
    kernel : str, optional
        The kernel for a float32 product (see `matmul`). Ignored for other dtypes.
    precision : {"highest", "high", "medium"}, optional
        The arithmetic of a float32 product (see `set_float32_matmul_precision`); by default the current
        one (`get_float32_matmul_precision`). Ignored for other dtypes.
    **kwargs
        The gufunc keywords of `numpy.vecdot`, with NumPy's rules and errors.

    Returns
    -------
    ndarray
        A fastmm array, or `out` when given.

    Raises
    ------
    ValueError
        For NumPy's shape errors, with NumPy's messages.

    See Also
    --------
    numpy.vecdot : NumPy's function (NumPy 2.0 and later), which reaches this one for fastmm operands.
    vdot : Flattens its operands instead.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> x = fastmm.asarray(np.ones((4, 3), np.float32))        # doctest: +SKIP
    >>> fastmm.vecdot(x, x).shape                               # doctest: +SKIP
    (4,)
    """
    with _precise(precision):
        return _returned(_dispatch.vecdot(a, b, out=out, kernel=kernel, **kwargs), out, a, b)
