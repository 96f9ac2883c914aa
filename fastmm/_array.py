"""fastmm.ndarray: a CuPy array whose matrix products run on fastmm's kernels.

Why a subclass of ``cupy.ndarray`` rather than a wrapper: every CuPy function, method, indexing operation
and protocol (``__cuda_array_interface__``, ``__dlpack__``) keeps working on it with no forwarding code,
and NumPy's dispatch tries a subclass before its base class, so in a product of a fastmm array with a plain
CuPy array fastmm still decides. A wrapper would have to re-expose CuPy's whole surface.

How NumPy reaches us:
* ``np.matmul`` (and ``np.matvec``, ``np.vecmat``, ``np.vecdot``) are ufuncs -> ``__array_ufunc__``;
* ``np.dot``, ``np.inner``, ``np.vdot``, ``np.tensordot``, ``np.einsum``, ``np.linalg.matmul`` are functions
  -> ``__array_function__``;
* ``a @ b``, ``b @ a``, ``a @= b`` -> ``__matmul__``, ``__rmatmul__``, ``__imatmul__``.
Everything else is handed to CuPy with host (NumPy) operands uploaded, and CuPy results come back as
fastmm arrays, so a chain of NumPy calls stays on the GPU and on fastmm.
"""

from __future__ import annotations

import numpy as np

try:
    import cupy as _cp
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("fastmm arrays need CuPy: pip install 'fastmm[cuda13]' (or [cuda12])") from e

from ._dispatch import products as _dispatch
from ._runtime.arrays import cupy_base

__all__ = ["ndarray", "asarray", "asnumpy"]


def _wrap(x):
    """CuPy results (arrays, tuples, lists of them) as fastmm arrays; anything else untouched.

    `base` stays what CuPy would give: a result that owns its memory becomes a fastmm array that owns it (base
    None) rather than a view of a hidden CuPy array, and a view keeps the base of the array it views.
    """
    t = type(x)
    if t is _cp.ndarray or t is not ndarray and isinstance(x, _cp.ndarray):
        if x.base is None:
            return _owning(x)
        return x.view(ndarray)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


# CuPy's base array class, where CuPy has one: `_can_retype` tries a bare object of it.
_base = cupy_base(_cp)


def _owning(x):
    """A fastmm array that owns `x`'s memory, as `x` does: CuPy's compiled initialiser (the dispatch layer's
    `owning`), then retyped."""
    if _RETYPE:
        return _retype(_dispatch.owning(x))
    return ndarray(x.shape, x.dtype, x.data, x.strides)  # pragma: no cover - another CuPy's internals


def _retype(x):
    """`x`, a CuPy array that fastmm has just made and nothing else refers to, made a fastmm array in place."""
    x.__class__ = ndarray
    return x


def _fresh(x, *operands):
    """A product's result as a fastmm array, with no new object where that is safe.

    Every array a product returns without ``out=`` was made during the call (by fastmm, or by CuPy for
    fastmm): a new result or a new view. Such an object has no other owner, so its type can be changed in place
    (``__class__`` assignment: fastmm's type adds no fields to CuPy's) instead of making a second object that
    shares its memory, which a small product would pay for on every call. An operand handed back (no product
    does that, but a check is cheaper than a doubt) is wrapped as `_wrap` does, never retyped: it is the user's.
    """
    if type(x) is _cp.ndarray and _RETYPE:
        for o in operands:
            if x is o:
                return _wrap(x)
        x.__class__ = ndarray  # as _retype, inline: this is every small product's path
        return x
    return _wrap(x)


def _returned(result, out, *operands):
    """NumPy returns `out` itself when one is given; otherwise results are fastmm arrays."""
    if out is not None:
        return result if result is out else _wrap(result)
    return _fresh(result, *operands)


def _upload(x):
    """Host arrays among a call's arguments become device arrays (CuPy refuses mixed host/device input)."""
    if isinstance(x, np.ndarray):
        return _cp.asarray(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_upload(v) for v in x)
    return x


def _one_out(kwargs):
    out = kwargs.pop("out", None)
    if isinstance(out, tuple):
        if len(out) != 1:
            raise ValueError(f"matmul takes 1 output, got {len(out)}")
        out = out[0]
    return out


_GEMM_UFUNCS = {"matmul": _dispatch.matmul}
_NP_MATMUL = np.matmul  # __array_ufunc__'s direct path
for _name in ("matvec", "vecmat", "vecdot"):
    if hasattr(np, _name):
        _GEMM_UFUNCS[_name] = getattr(_dispatch, _name)

_GEMM_FUNCTIONS = {
    np.dot: _dispatch.dot,
    np.inner: _dispatch.inner,
    np.vdot: _dispatch.vdot,
    np.tensordot: _dispatch.tensordot,
    np.einsum: _dispatch.einsum,
    np.matmul: _dispatch.matmul,
}
if hasattr(np, "linalg") and hasattr(np.linalg, "matmul"):
    _GEMM_FUNCTIONS[np.linalg.matmul] = lambda a, b: _dispatch.matmul(a, b)
for _name in ("matvec", "vecmat", "vecdot"):
    if hasattr(np.linalg, _name) and getattr(np.linalg, _name) is not getattr(np, _name, None):
        _GEMM_FUNCTIONS[getattr(np.linalg, _name)] = getattr(_dispatch, _name)


def _defers_to(self, other, inplace=False) -> bool:
    """NumPy's rule for a binary operator (NEP 13): give the other operand its turn (return NotImplemented)?

    Not for arrays of our own type, NumPy arrays or scalars. An operand that defines ``__array_ufunc__`` gets its
    turn only if it set it to None (and never for an in-place operator); one that does not define it gets its
    turn when its ``__array_priority__`` is higher than ours and it is not a subclass of ours.
    """
    if other is None or type(other) is type(self) or type(other) is np.ndarray \
            or isinstance(other, (int, float, complex, np.generic)):
        return False
    attr = getattr(type(other), "__array_ufunc__", _MISSING)
    if attr is not _MISSING:
        return not inplace and attr is None
    if isinstance(other, type(self)):
        return False
    return self.__array_priority__ < getattr(other, "__array_priority__", -1e6)


_MISSING = object()


class ndarray(_cp.ndarray):
    """A CuPy array on which NumPy's matrix products run fastmm's SGEMM kernels.

    Create one with `fastmm.asarray` (not with the constructor, which takes CuPy's low-level arguments). It
    is a ``cupy.ndarray`` in every other respect: every CuPy function, method, operator and protocol works on
    it, and results stay fastmm arrays.

    What differs from ``cupy.ndarray``:

    - ``np.matmul``, ``np.matvec``, ``np.vecmat``, ``np.vecdot`` (through ``__array_ufunc__``), ``np.dot``,
      ``np.inner``, ``np.vdot``, ``np.tensordot``, ``np.einsum``, ``np.linalg.matmul`` (through
      ``__array_function__``) and the operators ``@``, ``@=`` run `fastmm.matmul` and its siblings:
      float32 products on fastmm's kernels, other dtypes on CuPy. The method ``dot`` is `fastmm.dot`.
    - Every other NumPy function called on it runs CuPy's implementation, with NumPy (host) operands
      uploaded, and returns fastmm arrays; so do the CuPy methods that would return a plain
      ``cupy.ndarray`` (reductions, ``astype``, ``reshape``, ...).
    - ``np.asarray(x)`` copies to the host; ``np.asarray(x, copy=False)`` raises `ValueError`, because no
      host view of GPU memory exists.
    - ``repr`` shows ``fastmm.array(...)``.
    - Like CuPy's arrays, it takes no attributes of its own (``a.note = 1`` raises `AttributeError`): it has
      exactly CuPy's layout, which lets a product's new result become a fastmm array without a second object.

    How it differs from ``numpy.ndarray``: it lives in GPU memory, on the device that was current when it
    was made, and the product functions differ as `fastmm.linalg` says.

    See Also
    --------
    asarray : Make one.
    asnumpy : Copy one to the host.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((4, 4), np.float32))   # doctest: +SKIP
    >>> isinstance(a @ a, fastmm.ndarray)                  # doctest: +SKIP
    True
    >>> isinstance(np.exp(a), fastmm.ndarray)              # doctest: +SKIP
    True
    """

    # No instance dictionary: CuPy's arrays take no attributes either, and the same layout as cupy.ndarray is
    # what lets `_fresh` retype a new CuPy result instead of wrapping it.
    __slots__ = ()
    __array_priority__ = 200.0  # above CuPy's 100: binary operators with plain CuPy arrays come to us

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is _NP_MATMUL and method == "__call__" and not kwargs:
            # np.matmul(a, b), every small product's path, tested first. NumPy hands a binary ufunc's __call__
            # exactly its two inputs (outputs come as out=).
            return _fresh(_GEMM_UFUNCS["matmul"](*inputs), *inputs)
        impl = _GEMM_UFUNCS.get(ufunc.__name__) if method == "__call__" else None
        if impl is not None:
            if not kwargs:
                return _fresh(impl(*inputs), *inputs)
            out = _one_out(kwargs)
            result = impl(*inputs, out=out, **kwargs)
            return result if out is None and kwargs.get("subok", True) is False else _returned(result, out, *inputs)
        inputs = _upload(inputs)
        if "out" in kwargs:
            kwargs["out"] = _upload(kwargs["out"])
        return _wrap(_cp.ndarray.__array_ufunc__(self, ufunc, method, *inputs, **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        impl = _GEMM_FUNCTIONS.get(func)
        if impl is not None:
            # np.dot's out may come positionally (np.dot(a, b, out)); the others take it by keyword only.
            out = kwargs.get("out", args[2] if func is np.dot and len(args) > 2 else None)
            return _returned(impl(*args, **kwargs), out, *args)
        return _wrap(_cp.ndarray.__array_function__(self, func, types, _upload(args), _upload(kwargs)))

    def __matmul__(self, other):
        # Another array of this type never gets the turn (`_defers_to`'s first rule), so `a @ b` skips the call.
        if type(other) is not type(self) and _defers_to(self, other):
            return NotImplemented
        return _fresh(_dispatch.matmul(self, other), self, other)

    def __rmatmul__(self, other):
        # The reflected operator is the last chance: NumPy never defers here (the ufunc raises instead).
        return _fresh(_dispatch.matmul(other, self), self, other)

    def __imatmul__(self, other):
        if _defers_to(self, other, inplace=True):
            return NotImplemented
        # NumPy semantics: in place, so the result must have a's shape (and a must be writable).
        _dispatch.matmul(self, other, out=self)
        return self

    def dot(self, b, out=None):
        if out is None:
            return _fresh(_dispatch.dot(self, b), self, b)
        return _returned(_dispatch.dot(self, b, out=out), out)

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a fastmm array lives on the GPU: converting it to NumPy always copies")
        host = self.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __repr__(self):
        return "fastmm." + repr(self.get())


# CuPy keeps the subclass through views (``view`` too, unless asked for another type) and elementwise
# operations, but its reductions and a few other methods return plain cupy.ndarray: wrap those so that results
# stay fastmm arrays.
def _returning_fastmm(method):
    def wrapper(self, *args, **kwargs):
        return _wrap(method(self, *args, **kwargs))

    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


_cupy_astype = _cp.ndarray.astype


def _astype(self, dtype, order="K", casting=None, subok=None, copy=True):
    # CuPy's product routines ask every operand for ``astype(its own dtype, order='K', copy=False)``, which is the
    # array itself: answered here, without CuPy's call and the wrapping.
    if copy is False and dtype is self.dtype and order == "K" and casting is None and subok is None:
        return self
    return _wrap(_cupy_astype(self, dtype, order, casting, subok, copy))


_astype.__name__, _astype.__doc__ = "astype", _cupy_astype.__doc__
ndarray.astype = _astype
# How code that cannot import this module (the CuPy hook, beside it) hands a product of fastmm arrays back as one.
ndarray.__fastmm_result__ = staticmethod(_wrap)

for _name in ("all", "any", "argmax", "argmin", "argpartition", "argsort", "choose", "clip", "compress",
              "conj", "conjugate", "copy", "cumprod", "cumsum", "diagonal", "flatten", "max", "mean", "min",
              "nonzero", "partition", "prod", "ptp", "ravel", "repeat", "reshape", "round", "squeeze", "std", "sum",
              "swapaxes", "take", "trace", "transpose", "var"):
    if hasattr(_cp.ndarray, _name):
        setattr(ndarray, _name, _returning_fastmm(getattr(_cp.ndarray, _name)))


def _can_retype() -> bool:
    """Whether this CuPy lets `_fresh` change an array's type in place (the layouts must match, and CuPy's array
    type must allow ``__class__`` assignment); tried on an array object that holds no memory."""
    if _base is None:  # pragma: no cover - another CuPy's internals
        return False
    try:
        _retype(_base.__new__(_cp.ndarray))
    except TypeError:  # pragma: no cover - another CuPy's internals
        return False
    return True


_RETYPE = _can_retype()


def asarray(obj, dtype=None) -> ndarray:
    """Convert `obj` to a fastmm array on the current CuPy device.

    NumPy arrays, nested sequences and scalars are copied to the GPU. CuPy arrays and any object with
    ``__cuda_array_interface__`` or a CUDA ``__dlpack__`` (PyTorch, JAX, Numba arrays on the GPU) are used in
    place, without a copy, when `dtype` allows; the result then shares their memory.

    Parameters
    ----------
    obj : array_like
        A NumPy or CuPy array, an object exposing GPU memory through ``__cuda_array_interface__`` or
        ``__dlpack__``, a nested sequence or a scalar.
    dtype : data-type, optional
        The dtype of the result; by default that of `obj` (NumPy's inference for sequences and scalars).
        A different dtype converts, and so copies.

    Returns
    -------
    ndarray
        A fastmm array in GPU memory.

    Raises
    ------
    TypeError
        For dtypes a GPU cannot hold (object, string, void, long double).
    OutOfMemoryError
        When the GPU has no room for the copy.
    CUDAUnavailableError
        When no CUDA GPU can be used.
    ImportError
        When CuPy is not installed.

    See Also
    --------
    numpy.asarray : Differs in where the result lives: NumPy's is in host memory, fastmm's on the GPU.
        Unlike NumPy's it has no ``order=`` or ``copy=`` keyword.
    cupy.asarray : Gives a plain ``cupy.ndarray``, whose products run on cuBLAS.
    asnumpy : The way back to the host.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))  # doctest: +SKIP
    >>> a.shape, a.dtype                                                 # doctest: +SKIP
    ((2, 3), dtype('float32'))
    >>> b = fastmm.asarray([[1, 2], [3, 4]], dtype=np.float32)           # doctest: +SKIP
    """
    return _wrap(_dispatch.to_device(obj, dtype))


def asnumpy(a, out=None) -> np.ndarray:
    """Copy a fastmm (or CuPy) array to a NumPy array on the host.

    Parameters
    ----------
    a : ndarray
        A fastmm or CuPy array (a NumPy array is returned as it is).
    out : numpy.ndarray, optional
        A host array of the same shape to copy into.

    Returns
    -------
    numpy.ndarray
        The data in host memory; `out` when given.

    See Also
    --------
    cupy.asnumpy : The same function (fastmm calls it).
    numpy.asarray : ``np.asarray(a)`` copies a fastmm array to the host as well.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> a = fastmm.asarray(np.ones((2, 2), np.float32))    # doctest: +SKIP
    >>> fastmm.asnumpy(a @ a)                               # doctest: +SKIP
    array([[2., 2.],
           [2., 2.]], dtype=float32)
    """
    return _cp.asnumpy(a, out=out)
