"""Dask arrays whose chunks are fastmm arrays: matrix products beyond one GPU's memory, and across GPUs.

``dask.array``'s products (``da.matmul``, ``@``, ``da.dot``, ``da.tensordot``, ``da.einsum``) call NumPy's functions
or Dask's per-type lookups on each chunk. With fastmm chunks, ``np.matmul`` reaches fastmm through NumPy's protocols
with nothing to register; ``tensordot`` and ``einsum`` go through Dask's lookup tables, where a fastmm array would
otherwise be handled as the CuPy array it also is (``cupy.tensordot``: cuBLAS, and plain CuPy results). Importing
this module registers fastmm's functions there, and ``concatenate`` and ``empty`` so that assembled results stay
fastmm arrays.

Dask is an optional dependency (``pip install 'fastmm[dask]'``); the rest of fastmm never imports it.

Examples
--------
>>> import numpy as np, fastmm.dask, dask.array as da       # doctest: +SKIP
>>> x = fastmm.dask.from_array(np.random.rand(40000, 20000).astype(np.float32), chunks=(8192, 8192))  # doctest: +SKIP
>>> (x @ x.T).compute()             # chunks uploaded as needed, products on fastmm's kernels  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

try:
    import dask.array as _da
    from dask.array.dispatch import concatenate_lookup, einsum_lookup, empty_lookup, tensordot_lookup
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("fastmm.dask needs Dask: pip install 'fastmm[dask]' (dask[array], and distributed for a "
                      "cluster)") from e

from . import _array, linalg
from ._dispatch import products as _dispatch

__all__ = ["from_array", "meta", "to_host"]


def meta(dtype=np.float32, ndim: int = 2):
    """An empty fastmm array standing for the chunks' type in Dask's graph (Dask's ``meta``).

    It holds no memory, so a graph of products can be built where no GPU is (a client, a scheduler). A 0-d meta
    needs one element: it is a real one-element array on the current GPU, or NumPy's where there is none.

    Examples
    --------
    >>> import fastmm.dask                       # doctest: +SKIP
    >>> type(fastmm.dask.meta()).__name__        # doctest: +SKIP
    'ndarray'
    """
    if ndim == 0:
        try:
            return _array.asarray(np.zeros((), dtype))
        except Exception:  # noqa: BLE001 - no GPU here: NumPy's meta (Dask's default) rather than none
            return np.zeros((), dtype)
    return _null((0,) * ndim, dtype)


def _null(shape, dtype):
    """A fastmm array of `shape` (with a zero-length axis) over no memory: nothing can ever read it."""
    cp = _dispatch._cupy()
    try:
        device = cp.cuda.runtime.getDevice()
    except cp.cuda.runtime.CUDARuntimeError:  # no GPU here: a graph is built, chunks are computed elsewhere
        device = 0
    none = cp.cuda.memory.MemoryPointer(cp.cuda.memory.UnownedMemory(0, 0, None, device_id=device), 0)
    return _array.ndarray(shape, np.dtype(dtype), memptr=none)


def _to_fastmm(block):
    # Host float32 chunks go up through fastmm's pinned staging (the link's full speed: an out-of-core product
    # uploads every chunk once per use), anything else as fastmm.asarray does.
    from ._hooks import staged as _staged

    if isinstance(block, np.ndarray) and block.dtype == np.float32 and block.ndim >= 1 and \
            0 < block.nbytes <= _staged.MAX_STAGING_BYTES:  # (pinned memory is the whole machine's: bounded)
        return _array._wrap(_staged._put(block))
    return _array.asarray(block)


def from_array(x, chunks="auto") -> _da.Array:
    """A Dask array of fastmm chunks from a NumPy array (or memory map), a CuPy or fastmm array, or a Dask array.

    Nothing is copied to the GPU here: each chunk is uploaded when a task needs it, so a host operand larger than
    GPU memory streams through the GPU chunk by chunk (with Dask's threaded scheduler, as many chunks at a time
    as it runs tasks).

    Parameters
    ----------
    x : array_like or dask.array.Array
        The data. A Dask array keeps its chunks (`chunks` is ignored); anything else is cut into `chunks`.
    chunks : int, tuple or "auto", optional
        As for `dask.array.from_array`. Products run best on chunks of a few thousand rows and columns (see the
        Dask page of the documentation).

    Returns
    -------
    dask.array.Array
        Whose chunks, once computed, are fastmm arrays.

    See Also
    --------
    dask.array.from_array : The same for NumPy or CuPy chunks.
    to_host : Back to NumPy chunks.
    """
    if not isinstance(x, _da.Array):
        x = _da.from_array(x, chunks=chunks, asarray=False, meta=getattr(x, "_meta", None))
    return x.map_blocks(_to_fastmm, dtype=x.dtype, meta=meta(x.dtype, x.ndim))


def to_host(x: _da.Array) -> _da.Array:
    """The same Dask array with NumPy chunks (each copied to the host when computed)."""
    return x.map_blocks(_array.asnumpy, dtype=x.dtype, meta=np.empty((0,) * x.ndim, x.dtype))


def _concatenate(arrays, axis=0):
    arrays = list(arrays)
    if all(a.size == 0 for a in arrays):
        # Metas (Dask concatenates them to build a graph): the result's shape, with no GPU work.
        shape = np.concatenate([np.empty(a.shape, a.dtype) for a in arrays], axis=axis).shape
        if 0 in shape:
            return _null(shape, np.result_type(*arrays))
    cp = _dispatch._cupy()
    return _array._wrap(cp.concatenate([_dispatch.plain(a) for a in arrays], axis=axis))


def _einsum(*args, **kwargs):
    kwargs.pop("casting", None)  # Dask passes NumPy's einsum keywords; fastmm's einsum takes CuPy's
    kwargs.pop("order", None)
    return linalg.einsum(*args, **kwargs)


def _empty(*args, **kwargs):
    return _array._wrap(_dispatch._cupy().empty(*args, **kwargs))


concatenate_lookup.register(_array.ndarray, _concatenate)
tensordot_lookup.register(_array.ndarray, linalg.tensordot)
einsum_lookup.register(_array.ndarray, _einsum)
empty_lookup.register(_array.ndarray, _empty)
