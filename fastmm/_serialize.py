"""Dask distributed's serializers for fastmm arrays: a chunk sent from one worker to another arrives as a fastmm
array, so the products that read it there still run fastmm's kernels.

Without them, distributed serializes a fastmm array as the CuPy array it also is, and CuPy's deserializer makes a
plain ``cupy.ndarray`` (the received operands of a product then go to cuBLAS); and those serializers exist only
where numba or rmm is installed (pickling through ordinary host memory otherwise). Here:

- "cuda" (UCX: device buffers sent as they are): the array's bytes as one device frame, received as a view of it.
- "dask" (TCP: through host memory): float32 chunks go down and come up through fastmm's staging threads (pinned
  memory, at the link's speed, where CuPy's copies into and out of ordinary memory run at a few GB/s), anything
  else through CuPy's copies.

Registered when ``fastmm.dask`` is imported, and when ``fastmm`` is imported in a process that already runs
``distributed`` (a worker unpickling a fastmm array's type imports fastmm there).
"""

from __future__ import annotations

import numpy as np

__all__ = ["register"]

_done = False


def _layout(x):
    """(C-contiguous array with x's data, whether it is x's transpose): an F-ordered array travels as its transpose,
    anything else as a contiguous copy."""
    if x.flags.c_contiguous:
        return x, False
    if x.flags.f_contiguous:
        return x.T, True
    return x.copy(order="C"), False


def _header(x, transposed: bool) -> dict:
    return {"shape": tuple(x.shape), "dtype": x.dtype.str, "transposed": transposed}


def _cuda_serialize(x):
    import cupy

    c, transposed = _layout(x)
    frame = cupy.ndarray((c.nbytes,), np.uint8, memptr=c.data)
    return _header(c, transposed), [frame]


def _array_from(header, dev):
    from ._array import _wrap

    x = _wrap(dev.view(np.dtype(header["dtype"])).reshape(header["shape"]))
    return x.T if header["transposed"] else x


def _cuda_deserialize(header, frames):
    import cupy

    (frame,) = frames
    return _array_from(header, cupy.asarray(frame).view(np.uint8).reshape(-1))


def _staged(nbytes: int, dtype) -> bool:
    from ._hooks import staged

    return np.dtype(dtype) == np.float32 and 0 < nbytes <= staged.MAX_STAGING_BYTES


def _dask_serialize(x):
    from ._hooks import staged

    c, transposed = _layout(x)
    host = np.empty(c.shape, c.dtype)
    if _staged(c.nbytes, c.dtype) and c.device.id == _cupy_device():
        staged._get(c, host)
    else:
        c.get(out=host)
    return _header(c, transposed), [memoryview(host.reshape(-1).view(np.uint8))]


def _cupy_device() -> int:
    import cupy

    return cupy.cuda.runtime.getDevice()


def _dask_deserialize(header, frames):
    import cupy

    from ._hooks import staged

    (frame,) = frames
    host = np.frombuffer(frame, np.uint8)
    nbytes, dtype = host.nbytes, np.dtype(header["dtype"])
    if _staged(nbytes, dtype):
        dev = staged._put(host.view(np.float32)).view(np.uint8)
    else:
        dev = cupy.asarray(host)
    return _array_from(header, dev)


def register() -> bool:
    """Register fastmm's array type with distributed's "cuda" and "dask" serializer families (once); False where
    distributed (or CuPy) is not importable."""
    global _done
    if _done:
        return True
    try:
        from distributed.protocol import cuda_deserialize, cuda_serialize, dask_deserialize, dask_serialize

        from ._array import ndarray
    except ImportError:  # no distributed, or no CuPy (no fastmm arrays either)
        return False

    cuda_serialize.register(ndarray)(_cuda_serialize)
    cuda_deserialize.register(ndarray)(_cuda_deserialize)
    dask_serialize.register(ndarray)(_dask_serialize)
    dask_deserialize.register(ndarray)(_dask_deserialize)
    _done = True
    return True
