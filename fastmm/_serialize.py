"""Dask distributed's serializers for fastmm arrays: a chunk sent from one worker to another arrives as a fastmm
array, so the products that read it there still run fastmm's kernels.

Without them, distributed serializes a fastmm array as the CuPy array it also is, and CuPy's deserializer makes a
plain ``cupy.ndarray`` (the received operands of a product then go to cuBLAS); and those serializers exist only
where numba or rmm is installed (pickling through ordinary host memory otherwise). Here:

- "cuda" (UCX: device buffers sent as they are): the array's memory as one device frame, received as a view of it.
- "dask" (TCP: through host memory): float32 chunks go down and come up through fastmm's staging threads (pinned
  memory, at the link's speed, where CuPy's copies into and out of ordinary memory run at a few GB/s), anything
  else through CuPy's copies.

The header is CuPy's (shape, typestr, strides), so that a process where these are not registered (a client that
imported fastmm before distributed and never fastmm.dask) still reads what a worker sends, as a CuPy array, and
a worker reads what such a client sends, as a fastmm array. Registered when ``fastmm.dask`` is imported, and when
``fastmm`` is imported in a process that already runs ``distributed`` (a worker unpickling a fastmm array's type
imports fastmm there).
"""

from __future__ import annotations

import numpy as np

__all__ = ["register"]

_done = False


def _contiguous(x):
    """x, or a C-ordered copy where its memory is not one block (CuPy's serializer does the same)."""
    return x if x.flags.c_contiguous or x.flags.f_contiguous else x.copy()


def _header(x) -> dict:
    return {"shape": tuple(x.shape), "typestr": x.dtype.str, "strides": tuple(x.strides)}


def _memory(x, dtype=np.uint8):
    """x's memory (C- or F-contiguous) as a 1-D device array of `dtype`."""
    import cupy

    return cupy.ndarray((x.nbytes // np.dtype(dtype).itemsize,), dtype, memptr=x.data)


def _array_from(header, memory):
    """The array `header` describes, over the device memory of `memory` (a 1-D device array), as a fastmm array."""
    import cupy

    from ._array import _wrap

    x = cupy.ndarray(tuple(header["shape"]), np.dtype(header["typestr"]), memptr=memory.data,
                     strides=tuple(header["strides"]))
    return _wrap(x)


def _cuda_serialize(x):
    x = _contiguous(x)
    return _header(x), [_memory(x)]


def _cuda_deserialize(header, frames):
    import cupy

    (frame,) = frames
    return _array_from(header, cupy.asarray(frame))


def _dask_serialize(x):
    from ._hooks import staged

    x = _contiguous(x)
    host = staged.to_host(_memory(x, x.dtype))
    return _header(x), [memoryview(host.view(np.uint8))]


def _dask_deserialize(header, frames):
    import cupy

    from ._hooks import staged

    (frame,) = frames
    host = np.frombuffer(frame, np.uint8).view(np.dtype(header["typestr"]))
    return _array_from(header, staged.to_device(host) if staged.stages(host) else cupy.asarray(host))


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
