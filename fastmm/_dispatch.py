"""NumPy's matrix-product functions on device arrays: float32 products on fastmm's kernels, others on CuPy.

The shape, dtype and ``out=`` rules live in `_rules` (pure, tested against NumPy); building and launching the
GEMM problems of float32 products lives in `_gemm`. Results are plain CuPy arrays; `fastmm._array` wraps them.
"""

from __future__ import annotations

import math

import numpy as np

from . import _errors, _gemm
from ._rules import (_gufunc_core_error, _too_few_dims, check_dot_out, check_out, dot_shapes,
                     einsum_as_gemm, inner_shapes, input_dtype, matmul_shapes, tensordot_axes)
from ._gemm import _cupy, empty, problem_for, plan_matmul  # noqa: F401  (plan_matmul: public through here)

__all__ = ["to_device", "matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot",
           "problem_for", "plan_matmul"]

_F32 = np.dtype(np.float32)

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
        return cp.asarray(np.asarray(x), dtype=dtype)
    except cp.cuda.memory.OutOfMemoryError as e:
        raise _errors.OutOfMemoryError(str(e)) from None
    except cp.cuda.runtime.CUDARuntimeError as e:
        raise _errors.CUDAUnavailableError(f"fastmm needs a CUDA GPU and could not use one: {e}") from None



def _deliver(result, out):
    """Write a device result into `out` (device or host array) and return what the caller should get."""
    if out is None:
        return result
    if isinstance(out, np.ndarray):
        out[...] = result.get()
    elif out is not result:
        out[...] = result
    return out



def matmul(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.matmul`` with NumPy's rules; float32 products run on fastmm's kernels, others on CuPy."""
    cp = _cupy()
    fast = dtype is None and isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray) \
        and a.dtype == _F32 and b.dtype == _F32 and (out is None or isinstance(out, cp.ndarray) and out.dtype == _F32)
    if fast:
        key = _gemm.signature(a, b, out, kernel)
        hit = _gemm.replays.get(key)
        # A replay needs what the signature cannot promise: an `out` of the right shape that shares no memory
        # with the operands (else the full path below raises NumPy's error or goes through a temporary).
        if hit is not None and (out is None or out.shape == hit[0] and not (_gemm.may_overlap(out, a)
                                                                             or _gemm.may_overlap(out, b))):
            out_shape, steps = hit
            c = empty(out_shape) if out is None else out
            _gemm.replay(steps, a, b, c)
            return c
    a, b = to_device(a), to_device(b)
    out_shape, m, n, k = matmul_shapes(a.shape, b.shape)
    res = input_dtype(a, b, dtype, casting, "matmul")
    check_out(out, out_shape, res, casting, "matmul")
    if res != _F32:
        cp = _cupy()
        r = cp.matmul(a.astype(res, copy=False), b.astype(res, copy=False))
        return _deliver(r, out)
    a = a.astype(_F32, copy=False)
    b = b.astype(_F32, copy=False)
    # Write straight into a device `out` of our dtype; anything else goes through a fresh result.
    cp = _cupy()
    direct = out is not None and isinstance(out, cp.ndarray) and out.dtype == _F32
    c = out if direct else empty(out_shape)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    # Views of c (never reshapes, which could copy a user's `out`) with the promoted axes put back.
    c2 = c[None, None] if a.ndim == 1 and b.ndim == 1 else c[..., None, :] if a.ndim == 1 else \
        c[..., None] if b.ndim == 1 else c
    record = _gemm.Recorder(a.data.ptr, b.data.ptr, c.data.ptr) if fast else None
    _gemm.gemm(a2, b2, c2, kernel, record)
    if fast and None not in record:
        if len(_gemm.replays) >= _gemm.REPLAYS_MAX:
            _gemm.replays.clear()
        _gemm.replays[key] = (out_shape, tuple(record))
    return _deliver(c, out) if not direct else out


def _scalar_multiply(a, b, out):
    cp = _cupy()
    r = cp.multiply(a, b)
    return _deliver(r, out)



def dot(a, b, out=None, *, kernel=None):
    """``np.dot``: N-D operands contract a's last axis with b's second-to-last, as one batched product."""
    a, b = to_device(a), to_device(b)
    if a.ndim == 0 or b.ndim == 0:
        return _scalar_multiply(a, b, out)
    shape = dot_shapes(a.shape, b.shape)
    res = np.result_type(a.dtype, b.dtype)
    check_dot_out(out, shape, res)
    if res != _F32 or a.ndim <= 2 and b.ndim <= 2:
        if res != _F32:
            return _deliver(_cupy().dot(a, b), out)
        return matmul(a, b, out=out, kernel=kernel)
    # a (..., k) x b (p..., k, n): every batch item of b meets all rows of a, and lands in c[..., p..., n].
    k = a.shape[-1]
    n = 1 if b.ndim == 1 else b.shape[-1]
    a2 = a.reshape(-1, k)
    b3 = b.reshape(-1, k, n)
    c = out if out is not None and isinstance(out, _cupy().ndarray) else empty(shape)
    c3 = c.reshape(a2.shape[0], b3.shape[0], n).swapaxes(0, 1)
    _gemm.gemm(a2[None], b3, c3, kernel)
    return _deliver(c, out)


def inner(a, b, *, kernel=None):
    """``np.inner``: contract the last axes, i.e. a2 @ b2.T without copying b."""
    a, b = to_device(a), to_device(b)
    if a.ndim == 0 or b.ndim == 0:
        return _scalar_multiply(a, b, None)
    shape = inner_shapes(a.shape, b.shape)
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().inner(a, b)
    k = a.shape[-1]
    c = matmul(a.reshape(-1, k), b.reshape(-1, k).T, kernel=kernel)
    return c.reshape(shape)


def vdot(a, b, *, kernel=None):
    """``np.vdot``: the dot product of the flattened operands (conjugating a) as a 1 x k x 1 product."""
    a, b = to_device(a), to_device(b)
    if a.size != b.size:
        raise ValueError(f"vdot: the operands have {a.size} and {b.size} elements; they must have the same number")
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().vdot(a, b)
    return matmul(a.ravel(), b.ravel(), kernel=kernel)


def tensordot(a, b, axes=2, *, kernel=None):
    """``np.tensordot`` as one product: move the summed axes together, flatten, multiply, unflatten."""
    a, b = to_device(a), to_device(b)
    axes_a, axes_b = tensordot_axes(a.ndim, b.ndim, axes)
    for ia, ib in zip(axes_a, axes_b):
        if a.shape[ia] != b.shape[ib]:
            raise ValueError("shape-mismatch for sum")
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().tensordot(a, b, axes)
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [i for i in range(b.ndim) if i not in axes_b]
    k = math.prod(a.shape[i] for i in axes_a)
    a2 = a.transpose(free_a + axes_a).reshape(-1, k)
    b2 = b.transpose(axes_b + free_b).reshape(k, -1)
    c = matmul(a2, b2, kernel=kernel)
    return c.reshape([a.shape[i] for i in free_a] + [b.shape[i] for i in free_b])


def einsum(subscripts, *operands, kernel=None, **kwargs):
    """``np.einsum``: a two-operand contraction that is one batched product runs on fastmm, the rest on CuPy."""
    cp = _cupy()
    ops = [to_device(x) for x in operands]
    spec = None
    if len(ops) == 2 and isinstance(subscripts, str) and not kwargs:
        spec = einsum_as_gemm(subscripts, ops[0].shape, ops[1].shape)
    if spec is None or np.result_type(*(x.dtype for x in ops)) != _F32:
        return cp.einsum(subscripts, *ops, **kwargs)
    la, lb, batch, m, k, n, out, sizes = spec
    a, b = ops
    size = lambda labels: math.prod(sizes[c] for c in labels)  # noqa: E731
    a3 = a.transpose([la.index(c) for c in batch + m + k]).reshape(size(batch), size(m), size(k))
    b3 = b.transpose([lb.index(c) for c in batch + k + n]).reshape(size(batch), size(k), size(n))
    c = matmul(a3, b3, kernel=kernel).reshape([sizes[c] for c in batch + m + n])
    order = batch + m + n
    return c.transpose([order.index(c) for c in out])


_MATVEC_SIG, _VECMAT_SIG, _VECDOT_SIG = "(m,n),(n)->(m)", "(n),(n,m)->(m)", "(n),(n)->()"


def _vector_product(name, sig, a, b, a_core, b_core, kdims, out, dtype, casting, kernel, conj_a):
    a, b = to_device(a), to_device(b)
    for i, (x, need) in enumerate(((a, a_core), (b, b_core))):
        if x.ndim < need:
            raise _too_few_dims(name, sig, i, x.ndim, need)
    ka, kb = a.shape[kdims[0]], b.shape[kdims[1]]
    if ka != kb:
        raise _gufunc_core_error(name, sig, 1, 0, kb, ka)
    res = input_dtype(a, b, dtype, casting, name)
    if conj_a and res.kind == "c":
        a = a.conj()
    return a, b, res


def matvec(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.matvec``: (..., m, n) x (..., n) -> (..., m), as a matmul with the vector as a column."""
    a, b, res = _vector_product("matvec", _MATVEC_SIG, a, b, 2, 1, (-1, -1), out, dtype, casting, kernel, False)
    r = matmul(a, b[..., None], dtype=res, casting=casting, kernel=kernel)[..., 0]
    return _deliver(r, out)


def vecmat(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.vecmat``: (..., n) x (..., n, m) -> (..., m), conjugating the vector."""
    a, b, res = _vector_product("vecmat", _VECMAT_SIG, a, b, 1, 2, (-1, -2), out, dtype, casting, kernel, True)
    r = matmul(a[..., None, :], b, dtype=res, casting=casting, kernel=kernel)[..., 0, :]
    return _deliver(r, out)


def vecdot(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.vecdot``: (..., n) x (..., n) -> (...), conjugating the first vector."""
    a, b, res = _vector_product("vecdot", _VECDOT_SIG, a, b, 1, 1, (-1, -1), out, dtype, casting, kernel, True)
    r = matmul(a[..., None, :], b[..., :, None], dtype=res, casting=casting, kernel=kernel)[..., 0, 0]
    return _deliver(r, out)

