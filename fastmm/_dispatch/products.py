"""NumPy's matrix-product functions on device arrays: float32 products on fastmm's kernels, others on CuPy.

The shape, dtype and keyword rules live in `_rules` (pure, tested against NumPy); building and launching the
GEMM problems of float32 products lives in `_gemm`. Results are plain CuPy arrays; `fastmm._array` wraps them.

Every call into CuPy goes through `_plain` views of the operands (one exception, `_cupy_dot`, says why it is
safe there). A fastmm array is a ``cupy.ndarray`` whose matrix-product methods are fastmm's, and some CuPy routines
call methods of their arguments (``cupy.dot(a, b)`` is ``a.dot(b)``): handed a fastmm array, CuPy would call
fastmm back, which would call CuPy again, forever. A plain view shares the memory (and, as CuPy's views do, points
its ``base`` at the array that owns it).
For the same reason CuPy's product functions are taken from the modules that define them (`cupy_own`), never
through ``cupy.matmul`` and friends, which `fastmm.accelerate_cupy` rebinds to fastmm's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import warnings

import numpy as np

from .. import _errors, _plan
from .._runtime import arrays as _arrays
from .._runtime import gemm as _gemm
from .._runtime.arrays import _Meta, _core_layout, _meta, cupy_base, empty, owning, problem_for
from .._runtime.arrays import cupy as _cupy
from ..kernels.configs import FewColumns
from .numpy_rules import (_MATMUL_SIG, _fmt, _too_few_dims, check_dot_out, check_gufunc_keywords, check_out, dot_shapes,
                     einsum_as_gemm, einsum_subscripts, gufunc_axes, inner_shapes, input_dtype, matmul_shapes,
                     tensordot_axes, ufunc_dtypes, vector_product_shape)

__all__ = ["to_device", "matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot",
           "problem_for", "plan_matmul", "owning", "plain", "current_device", "cupy_own"]

_F32 = np.dtype(np.float32)
# The dtypes a CuPy array can have (NumPy's longdouble, object, string and void types have no GPU form).
_GPU_KINDS = frozenset("?bBhHiIlLqQefdFD")
# Same-dtype products that CuPy's ndarray.dot computes as NumPy's dot does: not float32 (fastmm's own) and
# not bool (see _cupy_product).
_CUPY_DOT = _GPU_KINDS - frozenset("?f")


# --------------------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------------------

def to_device(x, dtype=None):
    """Any array-like as a CuPy array: device arrays without a copy, host data uploaded once."""
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return x if dtype is None else x.astype(dtype, copy=False)
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return cp.asarray(x, dtype=dtype)
        if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
            dev_type, _ = x.__dlpack_device__()
            if dev_type in (2, 13):  # kDLCUDA, kDLCUDAManaged: zero-copy on the GPU
                return cp.from_dlpack(x) if dtype is None else cp.from_dlpack(x).astype(dtype, copy=False)
        host = np.asarray(x)
        if host.dtype.char not in _GPU_KINDS:
            raise TypeError(f"a {host.dtype} array cannot live on the GPU: CuPy (and fastmm) arrays hold bool, "
                            "integer, float16/32/64 and complex64/128 data; convert it with .astype() first")
        return cp.asarray(host, dtype=dtype)
    except cp.cuda.memory.OutOfMemoryError as e:
        raise _errors.OutOfMemoryError(str(e)) from None
    except cp.cuda.runtime.CUDARuntimeError as e:
        from .._runtime.cuda import why_no_gpu

        raise _errors.CUDAUnavailableError(f"fastmm needs a CUDA GPU and could not use one: "
                                           f"{why_no_gpu() or e}") from None


def plain(x):
    """`x` as a plain ``cupy.ndarray`` sharing its memory (see the module's docstring); anything else as it is."""
    cp = _cupy()
    if type(x) is not cp.ndarray and isinstance(x, cp.ndarray):
        module, view = _plain_view
        return (view if module is cp else _make_plain_view(cp))(x)
    return x


_plain_view = (None, None)  # (the CuPy module, how to make a plain view with it)
_own = (None, None)  # (the CuPy module, its own product functions)


def cupy_own():
    """CuPy's own product functions (``matmul``, ``dot``, ``inner``, ``vdot``, ``tensordot``, ``einsum``, and
    ``ndarray_dot``, the method), from where CuPy defines them: the CuPy hook rebinds the public names to
    fastmm's, and fastmm's products of other dtypes must reach CuPy's, not come back. Taken on first use; the
    hook asks for them before it rebinds anything, so another CuPy's layout falls back to names not yet rebound."""
    global _own
    cp = _cupy()
    module, own = _own
    if module is cp:
        return own
    linalg = getattr(cp, "linalg", None)
    homes = [getattr(linalg, "_product", None), getattr(linalg, "_einsum", None)]

    def find(name):
        for home in homes:
            f = getattr(home, name, None)
            if f is not None:
                return f
        return getattr(cp, name)

    base = cupy_base(cp) or cp.ndarray
    own = types.SimpleNamespace(**{name: find(name) for name in ("matmul", "dot", "inner", "vdot", "tensordot",
                                                                  "einsum")}, ndarray_dot=base.dot)
    _own = (cp, own)
    return own


def _make_plain_view(cp):
    """CuPy's compiled ``view`` of its base class where CuPy has one (``cupy.ndarray``'s Python wrapper of it costs
    a third more, in every product of other dtypes); else the public method."""
    global _plain_view
    base = cupy_base(cp)
    if base is not None and hasattr(base, "view"):
        base_view, array_type = base.view, cp.ndarray
        view = lambda x: base_view(x, None, array_type)  # noqa: E731
    else:
        view = functools.partial(cp.ndarray.view, type=cp.ndarray)
    _plain_view = (cp, view)
    return view


def _dtype_of(x) -> np.dtype:
    """The dtype `x` has, or would have as an array, without uploading it."""
    dt = getattr(x, "dtype", None)
    return dt if isinstance(dt, np.dtype) else np.asarray(x).dtype


def _check_ufunc_operands(*operands) -> None:
    for x in operands:
        if getattr(type(x), "__array_ufunc__", 0) is None:
            raise TypeError(f"operand '{type(x).__name__}' does not support ufuncs (__array_ufunc__=None)")


_peers: dict[tuple[int, int], bool] = {}


def _peer_access(device_id: int, other: int) -> None:
    """CuPy's rule for an array on another device: readable through peer access (enabled once, with a warning,
    as CuPy enables it), or CuPy's ValueError."""
    cp = _cupy()
    msg = f"The device where the array resides ({other}) is different from the current device ({device_id})."
    ok = _peers.get((device_id, other))
    if ok is None:
        rt = cp.cuda.runtime
        ok = bool(rt.deviceCanAccessPeer(device_id, other))
        if ok:
            # From the current device, which is `device_id`. CuPy's own helper also clears the runtime's error
            # state when access was already enabled (by CuPy's kernels, say), which a plain enable leaves set.
            enable = getattr(rt, "_deviceEnsurePeerAccess", None) or rt.deviceEnablePeerAccess
            try:
                enable(other)
            except rt.CUDARuntimeError as e:
                if "PeerAccessAlreadyEnabled" not in str(e):
                    # Not a "no": the driver failed (a context broken by an earlier fault, say). Nothing is
                    # remembered, so a later product asks again.
                    from .._runtime import cuda as _cuda

                    raise _cuda.as_fastmm_error(e, device_id, f"enabling peer access to device {other}") from None
        _peers[(device_id, other)] = ok
        if ok:
            warnings.warn(f"{msg} Peer access has been activated automatically.", _errors.PerformanceWarning,
                          stacklevel=4)
    if not ok:
        raise ValueError(f"{msg} Peer access is unavailable between these devices.")


def current_device(*arrays) -> int:
    """The device that runs a product: the current one, as in CuPy. Operands (and `out`) on another device must
    be readable from it through peer access, as CuPy requires."""
    cp = _cupy()
    device_id = cp.cuda.runtime.getDevice()
    for x in arrays:
        if isinstance(x, cp.ndarray) and x.data.device_id != device_id:
            _peer_access(device_id, x.data.device_id)
    return device_id


def _deliver(result, out):
    """Write a device result into `out` (device or host array) and return what the caller should get."""
    if out is None:
        return result
    if isinstance(out, np.ndarray):
        out[...] = result.get()
    elif out is not result:
        out[...] = result
    return out


def _cupy_dot(cp, a, b, shape_rule):
    """The short path of other dtypes' products (float64 `x.dot(y)`, `x @ y` of matrices and vectors): CuPy's own
    ndarray.dot, at what CuPy's own product costs, when the device operands have one dtype CuPy's dot computes as
    NumPy's does (_CUPY_DOT) and live on the current device; else None, and the caller takes the long path.

    (An array's dtype of a GPU kind is one of NumPy's singletons, so `is` finds the common equal pairs; any other
    pair, e.g. int64 as 'l' and as 'q', or a dtype with metadata, takes the long path, with the same result.)

    The one CuPy routine handed the operands as they are, not as plain views: it is the compiled method of CuPy's
    base array class, called through that class, so it never reaches fastmm's ``dot`` (no call back), and it asks
    each operand only for ``astype(its own dtype, copy=False)`` (which fastmm's answers without a call), ``copy``
    for an operand with no unit-stride axis and, for two vectors, ``ravel`` (fastmm arrays, as CuPy's would be).
    Two plain views cost more (measured: 1.16x CuPy's call against 1.22x at 64 x 64). A shape mismatch raises
    NumPy's error (`shape_rule`'s) rather than CuPy's."""
    dtype = a.dtype
    if dtype is not b.dtype or dtype.char not in _CUPY_DOT \
            or not a.data.device_id == cp.cuda.runtime.getDevice() == b.data.device_id:
        return None
    module, own = _own
    try:
        return (own if module is cp else cupy_own()).ndarray_dot(a, b)
    except ValueError:
        shape_rule(a.shape, b.shape)
        raise


def _cupy_product(func, a, b, dtype, *args):
    """CuPy's `func` on plain views of `a` and `b` cast to `dtype`.

    Boolean products are computed on integers and compared with zero: NumPy's bool matmul/dot is an OR of ANDs,
    which CuPy does not compute for bool operands.
    """
    a, b = plain(a), plain(b)  # first: then astype is CuPy's own method, with no fastmm wrapping in between
    if dtype == np.bool_:
        i32 = np.dtype(np.int32)
        return func(a.astype(i32, copy=False), b.astype(i32, copy=False), *args) != 0
    if a.dtype != dtype:
        a = a.astype(dtype)
    if b.dtype != dtype:
        b = b.astype(dtype)
    return func(a, b, *args)


# --------------------------------------------------------------------------------------------------------
# The matmul family: generalised ufuncs (matmul, matvec, vecmat, vecdot)
# --------------------------------------------------------------------------------------------------------

class _Gufunc:
    """What differs between the four products that are NumPy gufuncs: name, signature, core dimensions, the
    output's shape rule, and how an operand pair is one batched matmul a2 @ b2 = c2.

    `indices(andim, bndim)` gives the index expressions that make a2, b2 and c2 out of a, b and a result-shaped c:
    views that add the size-1 axes a vector lacks (never reshapes, which could copy a user's `out`)."""

    def __init__(self, name, sig, cores, shape, indices, conj_a):
        self.name, self.sig, self.cores, self.shape, self.indices, self.conj_a = \
            name, sig, cores, shape, indices, conj_a
        self.ufunc = getattr(np, name, None)  # matvec, vecmat, vecdot: NumPy >= 2.2

    def views(self, a, b, c=None):
        """a2, b2 (and c2 when c is given) for the batched matmul."""
        ia, ib, ic = self.indices(a.ndim, b.ndim)
        return a[ia], b[ib], None if c is None else c[ic]

    def unview(self, r, andim: int, bndim: int):
        """The gufunc's result from the batched matmul's result `r` (the inverse of c2's view)."""
        ic = self.indices(andim, bndim)[2]
        return r[tuple(0 if i is None else i for i in ic)]


_ALL, _EVERY = slice(None), Ellipsis


def _matmul_cores(andim, bndim):
    ca, cb = min(andim, 2), min(bndim, 2)
    return ca, cb, (ca == 2) + (cb == 2)


def _matmul_indices(andim, bndim):
    # 1-D operands are promoted (a to a row, b to a column) and the promoted axes dropped from the result.
    ia = (None, _ALL) if andim == 1 else (_EVERY,)
    ib = (_ALL, None) if bndim == 1 else (_EVERY,)
    ic = (None, None) if andim == 1 and bndim == 1 else (_EVERY, None, _ALL) if andim == 1 else \
        (_EVERY, None) if bndim == 1 else (_EVERY,)
    return ia, ib, ic


_MATMUL = _Gufunc("matmul", _MATMUL_SIG, _matmul_cores, lambda a, b: matmul_shapes(a, b)[0], _matmul_indices,
                  False)
_MATVEC = _Gufunc("matvec", "(m,n),(n)->(m)", lambda andim, bndim: (2, 1, 1),
                  lambda a, b: vector_product_shape("matvec", a, b),
                  lambda andim, bndim: ((_EVERY,), (_EVERY, None), (_EVERY, None)), False)
_VECMAT = _Gufunc("vecmat", "(n),(n,m)->(m)", lambda andim, bndim: (1, 2, 1),
                  lambda a, b: vector_product_shape("vecmat", a, b),
                  lambda andim, bndim: ((_EVERY, None, _ALL), (_EVERY,), (_EVERY, None, _ALL)), True)
_VECDOT = _Gufunc("vecdot", "(n),(n)->()", lambda andim, bndim: (1, 1, 0),
                  lambda a, b: vector_product_shape("vecdot", a, b),
                  lambda andim, bndim: ((_EVERY, None, _ALL), (_EVERY, _ALL, None), (_EVERY, None, None)), True)


def _core_last(x, core: tuple[int, ...]):
    """A view of x with the axes `core` moved to the end, in that order (the layout the products expect)."""
    if core == tuple(range(x.ndim - len(core), x.ndim)):
        return x
    return x.transpose([i for i in range(x.ndim) if i not in core] + list(core))


def _core_at(x, core: tuple[int, ...]):
    """The inverse of `_core_last`: a view of x whose last len(core) axes sit at the positions `core`."""
    if core == tuple(range(x.ndim - len(core), x.ndim)):
        return x
    order = [i for i in range(x.ndim) if i not in core] + list(core)
    return x.transpose([order.index(i) for i in range(x.ndim)])


def _gufunc(g: _Gufunc, a, b, out, kernel, kwargs):
    """A matmul-family call with any of NumPy's gufunc keywords: the general path."""
    cp = _cupy()
    check_gufunc_keywords(g.name, kwargs)
    if out is not None and not isinstance(out, (cp.ndarray, np.ndarray)):
        raise TypeError("return arrays must be of ArrayType")
    _check_ufunc_operands(a, b)
    dtype, casting = kwargs.get("dtype"), kwargs.get("casting", "same_kind")
    in_dtypes = (_dtype_of(a), _dtype_of(b))
    if g.ufunc is not None:
        loop = ufunc_dtypes(g.ufunc, in_dtypes, None if out is None else out.dtype, dtype,
                            kwargs.get("signature"), casting)
    else:  # NumPy without this ufunc: NumPy's promotion rules
        res = input_dtype(*(np.empty(0, d) for d in in_dtypes), dtype, casting, g.name)
        loop = (res, res, res)
    if any(d.char not in _GPU_KINDS for d in loop):
        raise TypeError(f"{g.name}: fastmm computes on the GPU, which has no {loop[2]} loop (CuPy's dtypes are bool, "
                        "integers, float16/32/64 and complex64/128)")
    a, b = to_device(a), to_device(b)
    current_device(a, b, out)
    if g is _MATMUL:
        for i, x in enumerate((a, b)):
            if x.ndim == 0:
                raise _too_few_dims(g.name, g.sig, i, 0, 1)
    ca, cb, cout = g.cores(a.ndim, b.ndim)
    out_ndim = max(a.ndim - ca, b.ndim - cb) + cout
    (axa, axb, axc), keepdims = gufunc_axes(g.name, g.sig, (ca, cb, cout), (a.ndim, b.ndim, out_ndim),
                                           axes=kwargs.get("axes"), axis=kwargs.get("axis"),
                                           keepdims=kwargs.get("keepdims"))
    a0, b0 = a, b
    a, b = _core_last(a, axa), _core_last(b, axb)
    try:
        shape = g.shape(a.shape, b.shape)
    except ValueError as e:
        if not str(e).startswith("operands could not be broadcast"):
            raise
        # NumPy names the operands' shapes as given, before axes= moved their core dimensions.
        raise ValueError(str(e).replace(f"{_fmt(a.shape)}->", f"{_fmt(a0.shape)}->", 1)
                         .replace(f" {_fmt(b.shape)}->", f" {_fmt(b0.shape)}->", 1)) from None
    a, b = a.astype(loop[0], copy=False), b.astype(loop[1], copy=False)
    if loop[2] == _F32:  # float32 vectors are real: conjugating the first one changes nothing
        r = empty(shape)
        _gemm.gemm(*g.views(a, b, r), kernel)
    else:
        if g.conj_a and loop[0].kind == "c":
            a = a.conj()
        a2, b2, _ = g.views(a, b)
        r = g.unview(_cupy_product(cupy_own().matmul, a2, b2, loop[2]), a.ndim, b.ndim)
    if keepdims:
        r = r[..., None]
    r = _core_at(r, axc)
    order = str(kwargs.get("order") or "K").upper()
    if order == "F" or order == "A" and all(x.flags.f_contiguous and not x.flags.c_contiguous for x in (a, b)):
        r = cp.asfortranarray(r)
    if out is not None:
        check_out(out, r.shape)
        return _deliver(r, out)
    # r is this call's own (a new array, or CuPy's new result), seen through reshapes for vectors and moved axes:
    # a result with no base, as NumPy's and CuPy's are.
    return r if r.base is None else owning(r)


def matmul(a, b, out=None, *, kernel=None, **kwargs):
    """``np.matmul`` with NumPy's rules and keywords; float32 products run on fastmm's kernels, others on CuPy."""
    cp = _arrays._cp or _cupy()  # CuPy, once imported (every product but the first): no call
    if kwargs or not (isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray)):
        return _gufunc(_MATMUL, a, b, out, kernel, kwargs)
    # `is` answers at once for NumPy's float32 dtype object, the one CuPy's arrays hold; `==` for any equal one.
    dta, dtb = a.dtype, b.dtype
    if not ((dta is _F32 or dta == _F32) and (dtb is _F32 or dtb == _F32)
            and (out is None or isinstance(out, cp.ndarray) and out.dtype == _F32)):
        # Device operands of other dtypes with no keywords (float64 `x @ w`): NumPy's loop for a matmul of two
        # GPU dtypes is their promoted type, so the general path's dtype resolution can be skipped.
        if out is None and 0 < a.ndim <= 2 and 0 < b.ndim <= 2:
            r = _cupy_dot(cp, a, b, matmul_shapes)  # on matrices and vectors, matmul is dot
            if r is not None:
                return r
        res = np.result_type(dta, dtb)
        if out is not None or res == _F32 or a.ndim == 0 or b.ndim == 0 or res.char not in _GPU_KINDS:
            return _gufunc(_MATMUL, a, b, out, kernel, kwargs)
        current_device(a, b)
        matmul_shapes(a.shape, b.shape)
        return _cupy_product(cupy_own().matmul, a, b, res)
    # The common case: float32 device operands, no keywords. A small product's host time is spent here: a replay is
    # one lookup and one call of the recorded runner.
    device_id = cp.cuda.runtime.getDevice()
    if a.data.device_id != device_id or b.data.device_id != device_id or \
            out is not None and out.data.device_id != device_id:
        current_device(a, b, out)
    pa, pb = a.data.ptr, b.data.ptr
    key = _gemm.signature(a, b, out, kernel, device_id)
    hit = _gemm.replays.get(key)
    if hit is not None:
        out_shape, run, spans = hit
        if out is None:
            c = empty(out_shape)
            run(pa, pb, c.data.ptr)
            return c
        # A replay into `out` needs what the signature cannot promise: an `out` of the right shape that shares no
        # memory with the operands (else the full path below raises NumPy's error or goes through a temporary).
        if out.shape == out_shape and _arrays.apart(pc := out.data.ptr, pa, pb, spans):
            run(pa, pb, pc)
            return out
    out_shape = matmul_shapes(a.shape, b.shape)[0]
    check_out(out, out_shape)
    c = empty(out_shape) if out is None else out
    record = _gemm.Recorder(pa, pb, c.data.ptr)
    _gemm.gemm(*_MATMUL.views(a, b, c), kernel, record)
    if None not in record:
        spans = None if out is None else (_arrays.span(a), _arrays.span(b), _arrays.span(out))
        _gemm.remember(key, out_shape, tuple(record), spans)
    return c


def matvec(a, b, out=None, *, kernel=None, **kwargs):
    """``np.matvec``: (..., m, n) x (..., n) -> (..., m), as a matmul with the vector as a column."""
    return _gufunc(_MATVEC, a, b, out, kernel, kwargs)


def vecmat(a, b, out=None, *, kernel=None, **kwargs):
    """``np.vecmat``: (..., n) x (..., n, m) -> (..., m), conjugating the vector."""
    return _gufunc(_VECMAT, a, b, out, kernel, kwargs)


def vecdot(a, b, out=None, *, kernel=None, **kwargs):
    """``np.vecdot``: (..., n) x (..., n) -> (...), conjugating the first vector."""
    return _gufunc(_VECDOT, a, b, out, kernel, kwargs)


# --------------------------------------------------------------------------------------------------------
# The other products: dot, inner, vdot, tensordot, einsum (NumPy functions, not ufuncs)
# --------------------------------------------------------------------------------------------------------

def _operands(*xs, out=None):
    """The operands on the device, checked (with `out`) against the current device by CuPy's rule."""
    xs = tuple(to_device(x) for x in xs)
    current_device(*xs, out)
    return xs


def dot(a, b, out=None, *, kernel=None):
    """``np.dot``: N-D operands contract a's last axis with b's second-to-last, as one batched product."""
    cp = _cupy()
    if out is None and isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray) and a.ndim and b.ndim:
        r = _cupy_dot(cp, a, b, dot_shapes)
        if r is not None:
            return r
    if out is not None and not isinstance(out, (cp.ndarray, np.ndarray)):
        raise TypeError("'out' must be an array")
    a, b = _operands(a, b, out=out)
    if a.ndim == 0 or b.ndim == 0:  # NumPy: a product with a scalar is np.multiply
        return _deliver(cp.multiply(plain(a), plain(b)), out)
    shape = dot_shapes(a.shape, b.shape)
    res = np.result_type(a.dtype, b.dtype)
    check_dot_out(out, shape, res)
    if a.shape[-1] == 0:  # an empty sum (and no reshape can infer an axis next to a zero-length one)
        return _deliver(cp.zeros(shape, res), out)
    if res != _F32:
        return _deliver(_cupy_product(cupy_own().ndarray_dot, a, b, res), out)
    if a.ndim <= 2 and b.ndim <= 2:
        if isinstance(out, np.ndarray):
            return _deliver(matmul(a, b, kernel=kernel), out)
        return matmul(a, b, out=out, kernel=kernel)
    # a (..., k) x b (p..., k, n): every batch item of b meets all rows of a, and lands in c[..., p..., n].
    k = a.shape[-1]
    a, b = a.astype(_F32, copy=False), b.astype(_F32, copy=False)  # float16, int8, bool with float32
    n = 1 if b.ndim == 1 else b.shape[-1]
    a2 = a.reshape(-1, k)
    b3 = b.reshape(-1, k, n)
    c = out if isinstance(out, cp.ndarray) else empty(shape)
    c3 = c.reshape(a2.shape[0], b3.shape[0], n).swapaxes(0, 1)
    _gemm.gemm(a2[None], b3, c3, kernel)
    return _deliver(c, out)


def inner(a, b, *, kernel=None):
    """``np.inner``: contract the last axes, i.e. a2 @ b2.T without copying b."""
    cp = _cupy()
    a, b = _operands(a, b)
    if a.ndim == 0 or b.ndim == 0:
        return cp.multiply(plain(a), plain(b))
    shape = inner_shapes(a.shape, b.shape)
    res = np.result_type(a.dtype, b.dtype)
    if a.shape[-1] == 0:  # an empty sum (CuPy's inner divides by the zero length)
        return cp.zeros(shape, res)
    if res != _F32:
        return _cupy_product(cupy_own().inner, a, b, res)
    k = a.shape[-1]
    c = matmul(a.reshape(-1, k), b.reshape(-1, k).T, kernel=kernel)
    return owning(c.reshape(shape))


def vdot(a, b, *, kernel=None):
    """``np.vdot``: the dot product of the flattened operands (conjugating a) as a 1 x k x 1 product."""
    a, b = _operands(a, b)
    if a.size != b.size:
        raise ValueError(f"vdot: the operands have {a.size} and {b.size} elements; they must have the same number")
    res = np.result_type(a.dtype, b.dtype)
    if res != _F32:
        return _cupy_product(cupy_own().vdot, a, b, res)
    return matmul(a.ravel(), b.ravel(), kernel=kernel)


def tensordot(a, b, axes=2, *, kernel=None):
    """``np.tensordot`` as one product: move the summed axes together, flatten, multiply, unflatten."""
    cp = _cupy()
    a, b = _operands(a, b)
    axes_a, axes_b = tensordot_axes(a.ndim, b.ndim, axes)
    for ia, ib in zip(axes_a, axes_b):
        if a.shape[ia] != b.shape[ib]:
            raise ValueError("shape-mismatch for sum")
    res = np.result_type(a.dtype, b.dtype)
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [i for i in range(b.ndim) if i not in axes_b]
    k = math.prod(a.shape[i] for i in axes_a)
    if k == 0:  # an empty sum (and no reshape can infer an axis next to a zero-length one)
        return cp.zeros([a.shape[i] for i in free_a] + [b.shape[i] for i in free_b], res)
    if res != _F32:
        return _cupy_product(cupy_own().tensordot, a, b, res, axes)
    a2 = a.transpose(free_a + axes_a).reshape(-1, k)
    b2 = b.transpose(axes_b + free_b).reshape(k, -1)
    c = matmul(a2, b2, kernel=kernel)
    return owning(c.reshape([a.shape[i] for i in free_a] + [b.shape[i] for i in free_b]))


def einsum(*args, kernel=None, **kwargs):
    """``np.einsum`` in both call forms (subscripts string, or operands with sublists): a two-operand
    contraction that is one batched float32 product runs on fastmm, everything else on CuPy."""
    subscripts, operands = einsum_subscripts(args)
    ops = _operands(*operands)
    out = kwargs.pop("out", None)
    casting = kwargs.pop("casting", "safe")  # used for `out` below: CuPy's einsum takes no casting=
    layout = kwargs.get("order", "K")
    if layout is not None and str(layout).upper() not in ("C", "F", "A", "K"):
        raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {layout!r})")
    if "dtype" in kwargs and (kwargs["dtype"] is None or np.dtype(kwargs["dtype"]) == np.result_type(*ops)):
        del kwargs["dtype"]  # the result's own dtype (Dask passes dtype=None to every chunk's einsum)
    spec = None
    if len(ops) == 2 and not set(kwargs) - {"optimize"}:
        spec = einsum_as_gemm(subscripts, ops[0].shape, ops[1].shape)
    if spec is None or np.result_type(*(x.dtype for x in ops)) != _F32:
        kwargs.pop("order", None)  # CuPy's einsum has no order=; results are laid out as CuPy lays them out
        r = cupy_own().einsum(subscripts, *(plain(x) for x in ops), **kwargs)
    else:
        la, lb, batch, m, k, n, out_labels, sizes = spec
        a, b = ops
        size = lambda labels: math.prod(sizes[c] for c in labels)  # noqa: E731
        a3 = a.transpose([la.index(c) for c in batch + m + k]).reshape(size(batch), size(m), size(k))
        b3 = b.transpose([lb.index(c) for c in batch + k + n]).reshape(size(batch), size(k), size(n))
        c = matmul(a3, b3, kernel=kernel).reshape([sizes[c] for c in batch + m + n])
        order = batch + m + n
        r = owning(c.transpose([order.index(c) for c in out_labels]))
    if out is None:
        return r
    if tuple(out.shape) != r.shape:
        raise ValueError(f"einsum: the output has shape {_fmt(out.shape)}, the result {_fmt(r.shape)}")
    if not np.can_cast(r.dtype, out.dtype, casting=casting):
        raise TypeError(f"Cannot cast array data from {r.dtype!r} to {out.dtype!r} according to the rule "
                        f"{casting!r}")
    return _deliver(r, out)


def plan_matmul(a, b, device: _plan.Device, kernel=None,
                precision=None) -> tuple[_plan.Problem, _plan.Choice, list[str]] | str:
    """The plan `matmul(a, b)` would follow, from shapes and strides alone (no GPU work, no copies)."""
    # Device arrays have a dtype; only host data (lists, scalars) is asked for one through NumPy.
    dtype = np.result_type(*(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype for x in (a, b)))
    out_shape, m, n, k = matmul_shapes(np.shape(a), np.shape(b))
    if dtype != _F32:
        return f"{dtype} product: CuPy (cuBLAS); fastmm's own kernels are float32"
    ma, mb = _meta(a), _meta(b)
    if ma.ndim == 1:
        ma = _Meta((1,) + ma.shape, (0,) + ma.strides, ma.data.ptr)
    if mb.ndim == 1:
        mb = _Meta(mb.shape + (1,), mb.strides + (0,), mb.data.ptr)
    c = _meta(None, tuple(np.broadcast_shapes(ma.shape[:-2], mb.shape[:-2])) + (m, n))
    notes = []
    for name, x in (("a", ma), ("b", mb)):
        if _core_layout(x) is None:
            notes.append(f"operand {name} has no unit-stride axis and is copied first")
            x.strides = x.strides[:-2] + (x.shape[-1] * 4, 4)
    problem, _ = problem_for(ma, mb, c)
    choice = _plan.choose(problem, device, kernel, precision=precision)
    if isinstance(choice.config, FewColumns) and _plan.few_rows(problem, choice.config):
        # The launch's layout: that of the transposed product's own arguments, as `gemm` computes it.
        swapped, _ = problem_for(mb.swapaxes(-1, -2), ma.swapaxes(-1, -2), c.swapaxes(-1, -2))
        choice = dataclasses.replace(choice, variant=swapped.variant_for(choice.config))
    return problem, choice, notes
