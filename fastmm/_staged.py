"""A float32 product of host (NumPy) arrays computed on the GPU: operands staged through pinned memory, in pieces.

Used by `accelerate_numpy` (fastmm/_numpy_hook.py), whose loop hands over NumPy's own operand and output buffers.
Why pinned staging: the GPU copies from page-locked memory at the link's speed and from ordinary (pageable) memory
at a fraction of it (on an H100 host: 52.5 GB/s against 2.0 GB/s), while a copy into a reused pinned buffer costs
a host memcpy. Why pieces: the product may not fit in GPU memory (or in the staging buffer), so the batch is split
into groups of whole matrices, or, when one matrix is too large, C into blocks of rows and columns, each with its
slices of A and B; every piece is one fastmm product.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from . import _dispatch, _gemm
from ._errors import OutOfMemoryError

__all__ = ["matmul_host", "MAX_STAGING_BYTES"]

_F4 = 4
# One pinned buffer per thread (NumPy runs products in many threads at once), grown on demand up to this size:
# page-locked memory is taken from the whole machine, so it stays modest. Every piece's operands fit in it.
MAX_STAGING_BYTES = 256 << 20
_local = threading.local()


def _staging(shape, slot: str = "buf") -> np.ndarray:
    """This thread's pinned buffer `slot`, grown to hold `shape` float32, as a C-contiguous array of that shape."""
    size = int(np.prod(shape))
    buf = getattr(_local, slot, None)
    if buf is None or buf.size < size:
        mem = _gemm._cupy().cuda.alloc_pinned_memory(max(size * _F4, 1 << 20))
        buf = np.frombuffer(mem, np.float32)  # the array's base keeps the pinned memory alive
        setattr(_local, slot, buf)
    return buf[:size].reshape(shape)


# Host copies into and out of the pinned buffer are the slow part of staging (one core copies about 10 GB/s; the
# link moves 50 from pinned memory): large ones are cut into row blocks copied by several threads at once
# (NumPy releases the GIL while it copies).
_PARALLEL_BYTES = 8 << 20
_COPIERS = max(1, min(8, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity")
                      else (os.cpu_count() or 1) // 2))
_pool = None
_pool_lock = threading.Lock()


def _copy(dst: np.ndarray, src: np.ndarray, min_bytes: int = _PARALLEL_BYTES) -> None:
    """``dst[...] = src`` (same shape after NumPy broadcasting of src; never overlapping), in parallel row blocks
    from `min_bytes` up: the calling thread copies the first block, the copiers' pool the others."""
    global _pool
    rows = dst.shape[-2] if dst.ndim >= 2 else 0
    if _COPIERS == 1 or dst.nbytes < min_bytes or rows < 2 * _COPIERS:
        np.copyto(dst, src)
        return
    src = np.broadcast_to(src, dst.shape)
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_COPIERS, thread_name_prefix="fastmm-staging")
    step = -(-rows // _COPIERS)
    jobs = [_pool.submit(np.copyto, dst[..., r:r + step, :], src[..., r:r + step, :]) for r in range(step, rows, step)]
    try:
        np.copyto(dst[..., :step, :], src[..., :step, :])
        for job in jobs:
            job.result()
    except BaseException:
        # On an error or an interrupt, every block is done or cancelled before this returns: nothing may still
        # write `dst` once the caller goes on (NumPy's output buffer, or a pinned buffer about to be reused).
        from concurrent.futures import wait

        for job in jobs:
            job.cancel()
        wait(jobs)
        raise


def _put(host: np.ndarray):
    """A contiguous device copy of `host` (any strides), through the pinned buffer."""
    dev = _gemm.empty(host.shape)
    stage = _staging(host.shape)
    _copy(stage, host)
    try:
        dev.set(stage)
    finally:
        # From pinned memory the copy is truly asynchronous: it must finish before the buffer is filled again
        # (also when something failed after it was queued).
        _gemm._cupy().cuda.get_current_stream().synchronize()
    return dev


def _get(dev, host: np.ndarray) -> None:
    """`host[...] = dev` (NumPy broadcasting, any strides), through the pinned buffer."""
    stage = _staging(dev.shape)
    dev.get(out=stage)
    _copy(host, stage)


# A single product with an A at least this large is pipelined in row blocks of about _BLOCK_BYTES of A: the host
# copies of one block run while the GPU uploads, multiplies and downloads the one before.
_PIPELINE_BYTES = 16 << 20
_BLOCK_BYTES = 4 << 20
_PIPELINE_COPY_BYTES = 1 << 20  # a block's host copies are split among the copiers from this size


def _pipelined(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """``c[...] = a @ b`` for 2-D host arrays, A and C in row blocks through two pinned slots each.

    Per block, on the current stream: upload A's rows, multiply, download C's rows; meanwhile the host fills the
    other slot with the next block of A and empties the slot of the block before. An event per slot says when the
    GPU is done with it, so that no slot is overwritten while a copy still reads it.
    """
    cp = _gemm._cupy()
    stream = cp.cuda.get_current_stream()
    m, k = a.shape
    n = b.shape[1]
    db = _put(b)
    # Blocks of rows sized by the wider of A's and C's rows: both slots stay near _BLOCK_BYTES.
    rows = max(1, min(m, _BLOCK_BYTES // max(max(k, n) * _F4, 1)))
    slots = 1 if rows >= m else 2
    dev_a = [_gemm.empty((rows, k)) for _ in range(slots)]
    dev_c = [_gemm.empty((rows, n)) for _ in range(slots)]
    pin_a = [_staging((rows, k), f"pipe_a{i}") for i in range(slots)]
    pin_c = [_staging((rows, n), f"pipe_c{i}") for i in range(slots)]
    uploaded = [cp.cuda.Event(disable_timing=True) for _ in range(slots)]
    downloaded = [cp.cuda.Event(disable_timing=True) for _ in range(slots)]
    pending: list = [None] * slots  # per slot: the rows of C its download holds, not yet copied out
    try:
        _blocks(a, c, db, rows, stream, dev_a, dev_c, pin_a, pin_c, uploaded, downloaded, pending)
    except BaseException:
        # Nothing may still read or write the slots once this returns (they are reused, or freed with the thread).
        try:
            stream.synchronize()
        except Exception:  # noqa: BLE001 - a broken context: the original error is the one to report
            pass
        raise


def _blocks(a, c, db, rows, stream, dev_a, dev_c, pin_a, pin_c, uploaded, downloaded, pending) -> None:
    """`_pipelined`'s loop over blocks of rows, through len(pin_a) slots."""
    m = a.shape[0]
    slots = len(pin_a)
    for i, r in enumerate(range(0, m, rows)):
        slot, h = i % slots, min(rows, m - r)
        if i >= slots:
            uploaded[slot].synchronize()  # the upload two blocks back has read this slot
        _copy(pin_a[slot][:h], a[r:r + h], _PIPELINE_COPY_BYTES)
        dev_a[slot][:h].set(pin_a[slot][:h], stream=stream)
        uploaded[slot].record(stream)
        _dispatch.matmul(dev_a[slot][:h], db, out=dev_c[slot][:h])
        if pending[slot] is not None:  # empty the slot before the next download lands in it
            downloaded[slot].synchronize()
            r0, h0 = pending[slot]
            _copy(c[r0:r0 + h0], pin_c[slot][:h0], _PIPELINE_COPY_BYTES)
        dev_c[slot][:h].get(out=pin_c[slot][:h], stream=stream, blocking=False)
        downloaded[slot].record(stream)
        pending[slot] = (r, h)
    for slot in sorted(range(slots), key=lambda s: pending[s][0] if pending[s] else -1):
        if pending[slot] is not None:
            downloaded[slot].synchronize()
            r0, h0 = pending[slot]
            _copy(c[r0:r0 + h0], pin_c[slot][:h0], _PIPELINE_COPY_BYTES)


def _pieces(length: int, per_unit: int, room: int) -> int:
    """How many units of `per_unit` bytes fit in `room` bytes (at least 1; the caller checks that one fits)."""
    return max(1, min(length, room // max(per_unit, 1)))


def matmul_host(a: np.ndarray, b: np.ndarray, c: np.ndarray, budget: int | None = None) -> None:
    """``c[...] = a @ b`` on the GPU, for host float32 arrays a (batch, m, k), b (batch, k, n), c (batch, m, n).

    An operand with batch stride 0 (NumPy's broadcasting) is uploaded once. `budget` bounds the GPU memory one
    piece uses (default: half of what is free). Raises fastmm's errors (no GPU, out of memory, a driver fault);
    on failure `c` may be partly written, and the caller computes it again.
    """
    cp = _gemm._cupy()
    if budget is None:
        budget = cp.cuda.runtime.memGetInfo()[0] // 2
    room = min(budget, MAX_STAGING_BYTES)  # bytes of one operand piece (device and pinned)
    batch, m, k = a.shape
    n = b.shape[2]
    a_shared = batch == 1 or a.strides[0] == 0
    b_shared = batch == 1 or b.strides[0] == 0
    whole = (m * k + k * n + m * n) * _F4
    single = batch == 1 or a_shared and b_shared
    if single and m * k * _F4 >= _PIPELINE_BYTES and k * n * _F4 <= room and whole <= budget:
        _pipelined(a[0], b[0], c[0])
        if batch > 1:  # every batch item is the same product
            c[1:] = c[0]
        return
    if max(m * k, k * n, m * n) * _F4 <= room and whole <= budget:
        # Whole matrices, as many at a time as fit; a shared operand goes up once, and if both are shared every
        # batch item is the same product, computed once and copied into each.
        shared = ((m * k if a_shared else 0) + (k * n if b_shared else 0)) * _F4
        per_item = ((0 if a_shared else m * k) + (0 if b_shared else k * n) + m * n) * _F4
        group = _pieces(batch, per_item, min(budget - shared, MAX_STAGING_BYTES))
        group = batch if a_shared and b_shared else min(group, _pieces(batch, max(m * k, k * n, m * n) * _F4,
                                                                       MAX_STAGING_BYTES))
        da = _put(a[:1]) if a_shared else None
        db = _put(b[:1]) if b_shared else None
        for start in range(0, batch, group):
            stop = min(batch, start + group)
            ga = da if a_shared else _put(a[start:stop])
            gb = db if b_shared else _put(b[start:stop])
            gc = _gemm.empty((1 if a_shared and b_shared else stop - start, m, n))
            _dispatch.matmul(ga, gb, out=gc)
            _get(gc, c[start:stop])
        return
    # One matrix is too large: C in blocks of `rows` x `cols`, each from a row block of A and a column block of B.
    cols = _pieces(n, k * _F4, room // 2)
    rows = _pieces(m, max(k, cols) * _F4, min(room, (budget - k * cols * _F4) // 2))
    if k * cols * _F4 > room or (rows * k + k * cols + rows * cols) * _F4 > budget:
        raise OutOfMemoryError(f"a {m}x{k} @ {k}x{n} float32 product does not fit in pieces of the {budget >> 20} "
                               "MiB of GPU memory fastmm can use now: free GPU memory, or let NumPy compute it")
    for i in range(batch):
        ai, bi, ci = a[0 if a_shared else i], b[0 if b_shared else i], c[i]
        for j in range(0, n, cols):
            gb = _put(bi[:, j:j + cols])
            for r in range(0, m, rows):
                ga = _put(ai[r:r + rows])
                gc = _gemm.empty((ga.shape[0], gb.shape[1]))
                _dispatch.matmul(ga, gb, out=gc)
                _get(gc, ci[r:r + rows, j:j + cols])
