"""A product of host (NumPy) arrays computed on the GPU, float32 or another dtype the NumPy hook takes: the operands staged
through pinned memory by a few staging threads, in pieces, while the GPU multiplies the pieces before.

Used by `accelerate_numpy` (fastmm/_hooks/numpy_hook.py), whose loop hands over NumPy's own operand and output
buffers, and by fastmm.dask for host chunks. The GPU copies page-locked (pinned) memory several times faster than
ordinary memory, and only several cores together fill pinned buffers at the link's speed (docs/numpy-hook.md,
section 'Measurements behind the defaults'). So: four staging threads, each with two small pinned slots that it
fills in turn (a host copy into one while the GPU reads the other), every operand cut into pieces that the threads
copy side by side, and the product itself cut into pieces (blocks of rows of A and C, or groups of batch items)
so that uploads, kernels and downloads of consecutive pieces overlap. A piece that does not fit in GPU memory is
cut further (blocks of rows and columns), so any product that NumPy can hold can be computed.
"""

from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as _wait_all

import numpy as np

from .._dispatch import products as _dispatch
from .._runtime import arrays as _arrays
from . import hostmem as _hostmem
from .._errors import OutOfMemoryError

__all__ = ["matmul_host", "to_device", "to_host", "to_region", "MAX_STAGING_BYTES"]

# The most GPU memory one piece of a product takes (its operands and result), and the largest host block that
# fastmm.dask stages: pieces stay modest however much memory is free.
MAX_STAGING_BYTES = 256 << 20
# One staging copy moves at most this much (a pinned slot's size): small enough that the threads share a 16 MiB
# operand, large enough for the link's speed (docs/numpy-hook.md, section 'Measurements behind the defaults').
_CHUNK_BYTES = 4 << 20
_MIN_CHUNK_BYTES = 256 << 10
# Four staging threads (at most half the cores): more threads copy faster alone, but are slower end to end while
# the GPU copies too (docs/numpy-hook.md, section 'Measurements behind the defaults').
_WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity")
                      else (os.cpu_count() or 1) // 2))
# A single product's A and C are cut into blocks of rows of about this many bytes (the wider of the two): the
# first block's kernel starts once B and that block are up, and each block's result goes down while the next
# computes. Blocks are whole 128-row tiles, so each block's kernel runs the tiles the whole product would; smaller
# blocks mean more waits (docs/numpy-hook.md, section 'Measurements behind the defaults').
_BLOCK_BYTES = 32 << 20
_BLOCK_ROWS = 128
# ... but where A and C are page-locked (no staging pass on the host), in at least this many blocks: the GPU's copies
# of one block then overlap the kernel of another (docs/numpy-hook.md, section 'Measurements behind the defaults').
_DIRECT_BLOCKS = 4
# ... all of whose copies up are queued at once (nothing to wait for on the host), and whose kernels take two streams
# in turn: a block's kernel (128 tiles of 128x64 at 2048^3, a third of the SMs' room) overlaps the next one's.
_DIRECT_IN_FLIGHT = _DIRECT_BLOCKS + 1
_DIRECT_LANES = 2
# Pieces in flight at once: one uploading, one computing, one downloading (each holds its own GPU memory).
_IN_FLIGHT = 3

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="fastmm-staging")
        return _pool


# --------------------------------------------------------------------------------------------------------
# Staging threads: copies between host views and contiguous device views, through two pinned slots per thread
# --------------------------------------------------------------------------------------------------------

class _Stager:
    """A staging thread's own: a non-blocking stream per device, and two pinned slots used in turn, each with the
    event after the last GPU copy that reads or writes it (the slot is not refilled before that copy is done)."""

    def __init__(self):
        self.streams: dict = {}
        self.slots: list = [None, None]
        self.events: list = [None, None]
        self.turn = 0

    def stream(self, device_id: int, direction: str):
        # One stream per direction: an upload queued after a download would wait for that download's kernel.
        s = self.streams.get((device_id, direction))
        if s is None:
            s = self.streams[(device_id, direction)] = _arrays.cupy().cuda.Stream(non_blocking=True)
        return s

    def slot(self, shape, dtype) -> tuple[int, np.ndarray]:
        i, self.turn = self.turn, self.turn ^ 1
        if self.events[i] is not None:
            self.events[i].synchronize()
            self.events[i] = None
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = self.slots[i]
        if buf is None or buf.size < nbytes:
            mem = _arrays.cupy().cuda.alloc_pinned_memory(max(nbytes, _CHUNK_BYTES))
            buf = self.slots[i] = np.frombuffer(mem, np.uint8)  # the array's base keeps the pinned memory alive
        return i, buf[:nbytes].view(dtype).reshape(shape)


def _stager() -> _Stager:
    me = getattr(_local, "stager", None)
    if me is None:
        me = _local.stager = _Stager()
    return me


def _event():
    # A thread that waits on it sleeps (cudaEventBlockingSync) instead of spinning on a core the copies need.
    return _arrays.cupy().cuda.Event(block=True, disable_timing=True)


def _up(dst, src, allocated):
    """(A staging thread.) ``dst[...] = src``: the host view `src` into a pinned slot, then to the contiguous device
    view `dst` on this thread's stream, once the event `allocated` (recorded on the stream that allocated `dst`) is
    done. Returns the event after that copy (the slot is reused after it)."""
    cp = _arrays.cupy()
    me = _stager()
    device = dst.device.id
    with cp.cuda.Device(device):
        stream = me.stream(device, "up")
        # CuPy's pool hands out memory freed on the allocating stream at once, ordered after that stream's queued
        # work (which may still read the memory's previous owner); this stream is not ordered after it, so it waits
        # (docs/history.md, section 'Staged uploads and split-K's sum (2026-11-23)').
        stream.wait_event(allocated)
        i, pin = me.slot(src.shape, src.dtype)
        np.copyto(pin, src)
        dst.set(pin, stream=stream)
        event = me.events[i] = _event()
        event.record(stream)
        return event


def _down(dst, src, after) -> None:
    """(A staging thread.) ``dst[...] = src`` for a contiguous device view `src`, once the event `after` (the
    kernel that writes it) is done: into a pinned slot, then into the host view `dst` (NumPy broadcasting)."""
    cp = _arrays.cupy()
    me = _stager()
    device = src.device.id
    with cp.cuda.Device(device):
        stream = me.stream(device, "down")
        stream.wait_event(after)
        i, pin = me.slot(src.shape, src.dtype)
        src.get(out=pin, stream=stream, blocking=False)
        event = me.events[i] = _event()
        event.record(stream)
        event.synchronize()
        np.copyto(dst, pin)


def _direct_copy(device: int, direction: str, after, copy):
    """One asynchronous GPU copy between a page-locked, C-contiguous host view and a device array (see _direct):
    `copy(stream)` queued on this thread's `direction` stream of `device` once the event `after` is done. Returns the
    event after it (the host view is read or written once it is done)."""
    with _arrays.cupy().cuda.Device(device):
        stream = _stager().stream(device, direction)
        stream.wait_event(after)
        copy(stream)
        event = _event()
        event.record(stream)
        return event


def _up_direct(dst, src, allocated):
    """``dst[...] = src`` for a page-locked host view `src`, once `allocated` is done."""
    return _direct_copy(dst.device.id, "up", allocated, lambda stream: dst.set(src, stream=stream))


def _down_direct(dst, src, after):
    """``dst[...] = src`` into a page-locked host view `dst`, once `after` (the kernel writing `src`) is done."""
    return _direct_copy(src.device.id, "down", after, lambda stream: src.get(out=dst, stream=stream, blocking=False))


def _direct(host) -> bool:
    """The GPU copies `host` directly: C-contiguous and page-locked (fastmm's pool, see _hostmem, or another's)."""
    return host.flags.c_contiguous and _hostmem.pinned(host)


def _finish(future) -> None:
    """Wait for a download: a staged one is done with its future; a direct one once its event is."""
    event = future.result()
    if event is not None:
        event.synchronize()


def _split(dev, host, chunk: int) -> list:
    """(device view, host view) pairs that cover `dev` (C-contiguous, host's shape), each a contiguous range of
    `dev` of at most about `chunk` bytes (a whole row at least, when `host` is not contiguous)."""
    if host.flags.c_contiguous or host.ndim <= 1:
        flat_dev, flat_host = dev.reshape(-1), host.reshape(-1)
        step = max(1, chunk // host.itemsize)
        return [(flat_dev[i:i + step], flat_host[i:i + step]) for i in range(0, host.size, step)]
    item = int(np.prod(host.shape[1:])) * host.itemsize
    if item > chunk and host.ndim > 2:  # items larger than a chunk: each cut on its own
        return [pair for i in range(host.shape[0]) for pair in _split(dev[i], host[i], chunk)]
    step = max(1, chunk // max(item, 1))
    return [(dev[i:i + step], host[i:i + step]) for i in range(0, host.shape[0], step)]


class _Inline:
    """Runs a staging copy at once in the calling thread (a future already done): for small products, where
    handing pieces to the staging threads and waking them cost more than the copies."""

    @staticmethod
    def submit(fn, *args):
        future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - kept in the future, raised by its result(), as from a thread
            future.set_exception(e)
        return future


# Products of up to this many bytes (operands and result) are staged by the calling thread alone: handing pieces to
# the threads costs more than such copies (docs/numpy-hook.md, section 'Measurements behind the defaults').
_INLINE_BYTES = 12 << 20


def _stagers(nbytes: int):
    return _Inline if nbytes <= _INLINE_BYTES else _executor()


def _chunk_bytes(nbytes: int, pool) -> int:
    """Piece size for a copy of `nbytes` by `pool`: shared among the staging threads, within a slot."""
    if pool is _Inline:
        return _CHUNK_BYTES
    return max(_MIN_CHUNK_BYTES, min(_CHUNK_BYTES, -(-nbytes // _WORKERS)))


def _submit(pool, fn, *args):
    try:
        return pool.submit(fn, *args)
    except RuntimeError:
        # The interpreter is exiting (Python has shut the staging threads' pool while a thread of the program
        # still multiplies): the calling thread copies instead.
        return _Inline.submit(fn, *args)


def _upload(host, jobs: list, pool):
    """A new device array equal to `host`, being copied up by `pool`'s staging threads: (array, futures of the
    events that end its pieces' copies). The futures are appended to `jobs` too."""
    dev = _arrays.empty(host.shape, host.dtype)
    allocated = _event()
    allocated.record(_arrays.cupy().cuda.get_current_stream())
    if _direct(host):
        futures = [_Inline.submit(_up_direct, dev, host, allocated)]
    else:
        futures = [_submit(pool, _up, d, h, allocated) for d, h in _split(dev, host, _chunk_bytes(host.nbytes, pool))]
    jobs.extend(futures)
    return dev, futures


def _download(host, dev, after, jobs: list, pool) -> list:
    """Futures of `pool`'s copies of the device array `dev` into `host`, once `after` is done (see _finish)."""
    if _direct(host):
        futures = [_Inline.submit(_down_direct, host, dev, after)]
    else:
        futures = [_submit(pool, _down, h, d, after) for d, h in _split(dev, host, _chunk_bytes(dev.nbytes, pool))]
    jobs.extend(futures)
    return futures


def _settle(jobs: list) -> None:
    """After a failure or an interrupt: every staging copy of this call done or cancelled, and the GPU copies they
    queued finished, before the caller goes on (nothing may still write NumPy's buffers or read freed memory)."""
    for job in jobs:
        job.cancel()
    _wait_all(jobs)
    for job in jobs:
        if job.done() and not job.cancelled() and job.exception() is None and job.result() is not None:
            try:
                job.result().synchronize()
            except Exception:  # noqa: BLE001 - a broken context: the original error is the one to report
                pass


def to_device(host: np.ndarray):
    """A contiguous device copy of the host array `host` (any strides), through the staging threads (directly where it
    is page-locked); done when this returns."""
    jobs: list = []
    try:
        dev, futures = _upload(host, jobs, _stagers(host.nbytes))
        for f in futures:
            f.result().synchronize()
    except BaseException:
        _settle(jobs)
        raise
    return dev


def stages(x) -> bool:
    """Whether a copy of `x` (a host or device array) goes through the staging threads: float32, within
    MAX_STAGING_BYTES (pinned memory is the whole machine's: bounded)."""
    return x.dtype == np.float32 and 0 < x.nbytes <= MAX_STAGING_BYTES


def comes_down(dev) -> bool:
    """Whether `to_host` and `to_region` copy the device array `dev` through the staging threads: it stages, is
    C-contiguous and on the current device."""
    return stages(dev) and dev.flags.c_contiguous and dev.device.id == _arrays.cupy().cuda.runtime.getDevice()


def to_host(dev) -> np.ndarray:
    """A new host copy of the device array `dev`, after the work queued on the current stream: through the staging
    threads where `comes_down`, else CuPy's copy."""
    cp = _arrays.cupy()
    if comes_down(dev):
        host = np.empty(dev.shape, dev.dtype)
        to_region(dev, host)
        return host
    return cp.asnumpy(dev)


def to_region(dev, host: np.ndarray) -> None:
    """``host[...] = dev`` (NumPy broadcasting, any strides), after the work queued on the current stream: `dev`
    C-contiguous, on the current device, and within what `stages`."""
    cp = _arrays.cupy()
    after = _event()
    after.record(cp.cuda.get_current_stream())
    # Waited for here, not on the staging threads: there each piece held its thread until the GPU had drained
    # everything queued before it, and the uploads that the next products needed waited behind them (an out-of-core
    # product's GPU then idled; docs/dask.md, section 'One GPU, out of core').
    after.synchronize()
    jobs: list = []
    try:
        for f in _download(host, dev, after, jobs, _stagers(dev.nbytes)):
            _finish(f)
    except BaseException:
        _settle(jobs)
        raise


# --------------------------------------------------------------------------------------------------------
# The product in pieces
# --------------------------------------------------------------------------------------------------------

class _Shared:
    """An operand that several pieces read (B of a single product, a broadcast operand, a block of columns of B):
    uploaded at its first use, and kept on the GPU while pieces that read it remain."""

    __slots__ = ("host", "dev", "futures")

    def __init__(self, host):
        self.host, self.dev, self.futures = host, None, None


def _on_host(x) -> bool:
    return isinstance(x, np.ndarray) and not isinstance(x, _arrays.cupy().ndarray)


def _operand(x, jobs, pool):
    """(device array, futures of the copies that bring it up): an operand already on the GPU is used as it is."""
    host = x.host if isinstance(x, _Shared) else x
    if not _on_host(host):
        return host, []
    if not isinstance(x, _Shared):
        return _upload_as_laid_out(x, jobs, pool)
    if x.dev is None:
        x.dev, x.futures = _upload_as_laid_out(x.host, jobs, pool)
    return x.dev, x.futures


def _upload_as_laid_out(host, jobs, pool):
    """`_upload`, a transposed operand kept transposed: a view whose columns are contiguous (``x.T`` of a C-ordered
    array) goes up as the swap of its last two axes, whose rows the copies read whole (directly where page-locked),
    and the kernels read it through the swapped device view. Copied as it stood, each row of it was a gather of a
    column: a fresh 8192^2 ``g.T @ g`` took 7 times as long as ``g @ g`` (docs/numpy-hook.md)."""
    if host.ndim >= 2 and not host.flags.c_contiguous and host.strides[-2] == host.itemsize and host.shape[-2] > 1:
        dev, futures = _upload(host.swapaxes(-1, -2), jobs, pool)
        return dev.swapaxes(-1, -2), futures
    return _upload(host, jobs, pool)


def _compute_stream(lane: int = 0):
    """This thread's non-blocking stream number `lane` on the current device, on which the pieces' kernels run."""
    cp = _arrays.cupy()
    device = cp.cuda.runtime.getDevice()
    streams = getattr(_local, "compute", None)
    if streams is None:
        streams = _local.compute = {}
    s = streams.get((device, lane))
    if s is None:
        s = streams[(device, lane)] = cp.cuda.Stream(non_blocking=True)
    return s


def _run(pieces, pool, in_flight: int = _IN_FLIGHT, ahead: int = 1, lanes: int = 1) -> None:
    """``c[...] = a @ b`` for each piece (a, b, c) in turn, a and b host views or _Shared, c a host view.

    Up to `ahead` later pieces' operands are being copied up while piece i's kernel runs and earlier results go
    down; at most `in_flight` pieces hold GPU memory at once. The kernels take `lanes` streams in turn. A _Shared
    operand is let go after the last of a run of consecutive pieces that read it.
    """
    pieces = list(pieces)
    computes = [_compute_stream(lane) for lane in range(lanes)]
    jobs: list = []
    started = collections.deque()  # pieces whose operands are being copied up: (piece, (a, futures), (b, futures))
    finishing = collections.deque()  # pieces computed or computing: (futures of their downloads, arrays kept)
    queued = 0  # pieces started so far

    def top_up():
        nonlocal queued
        while queued < len(pieces) and len(started) < ahead and len(started) + len(finishing) < in_flight:
            piece = pieces[queued]
            started.append((piece, _operand(piece[0], jobs, pool), _operand(piece[1], jobs, pool)))
            queued += 1

    try:
        with computes[0]:  # the operands' memory is allocated on it (their uploads wait for its queued work)
            top_up()
            for i in range(len(pieces)):
                piece, (da, fa), (db, fb) = started.popleft()
                top_up()
                nxt = pieces[i + 1] if i + 1 < len(pieces) else None
                for x in piece[:2]:
                    if isinstance(x, _Shared) and (nxt is None or all(x is not y for y in nxt[:2])):
                        x.dev = x.futures = None  # (the arrays stay alive in `finishing` until done)
                stream = computes[i % lanes]
                with stream:
                    for f in (*fa, *fb):
                        stream.wait_event(f.result())
                    c = piece[2]
                    dc = _arrays.empty(c.shape, c.dtype)
                    _dispatch.matmul(da, db, out=dc)
                    done = _event()
                    done.record(stream)
                finishing.append((_download(c, dc, done, jobs, pool), (da, db, dc)))
                while finishing and len(finishing) + len(started) >= in_flight:
                    for f in finishing.popleft()[0]:
                        _finish(f)
                top_up()
            while finishing:
                for f in finishing.popleft()[0]:
                    _finish(f)
    except BaseException:
        _settle(jobs)
        for stream in computes:
            try:
                stream.synchronize()
            except Exception:  # noqa: BLE001 - a broken context: the original error is the one to report
                pass
        raise


def _pieces(length: int, per_unit: int, room: int) -> int:
    """How many units of `per_unit` bytes fit in `room` bytes (at least 1; the caller checks that one fits)."""
    return max(1, min(length, room // max(per_unit, 1)))


def _row_block(m: int, k: int, n: int, room: int, item: int = 4) -> int:
    """Rows per block of a single product: about _BLOCK_BYTES of A's or C's rows, in whole tiles, and the block's
    rows of A and C within `room` bytes (`item` bytes an element)."""
    rows = min(_pieces(m, (k + n) * item, room), _pieces(m, max(k, n) * item, _BLOCK_BYTES))
    if rows < m and rows >= _BLOCK_ROWS:
        rows -= rows % _BLOCK_ROWS
    return rows


def plan(a: np.ndarray, b: np.ndarray, c: np.ndarray, budget: int, direct: bool = False) -> list:
    """The pieces of ``c[...] = a @ b`` (3-D host arrays, batch first): (a, b, c) views, a and b maybe _Shared.

    `budget` bounds the GPU memory of the pieces in flight at once; raises OutOfMemoryError if none fits. `direct`:
    A and C are page-locked (a single product then goes in at least _DIRECT_BLOCKS blocks of rows).
    """
    batch, m, k = a.shape
    n = b.shape[2]
    item = a.itemsize
    a_shared = batch == 1 or a.strides[0] == 0
    b_shared = batch == 1 or b.strides[0] == 0
    room = min(budget, MAX_STAGING_BYTES * _IN_FLIGHT)  # bytes of the pieces in flight, device memory
    if batch == 1:  # a single product: B stays up, A and C go in blocks of rows
        flight = _DIRECT_IN_FLIGHT if direct else _IN_FLIGHT
        # An operand already on the GPU takes no memory of the pieces: only C's blocks (and B's upload) count.
        ka, kn = (k if _on_host(a) else 0), (k * n if _on_host(b) else 0)
        if kn * item <= room // 2 and (kn + flight * min(m, _BLOCK_ROWS) * (ka + n)) * item <= room:
            rows = _row_block(m, ka, n, (room - kn * item) // flight, item)
            if direct:
                rows = min(rows, max(_BLOCK_ROWS, -(-m // (_DIRECT_BLOCKS * _BLOCK_ROWS)) * _BLOCK_ROWS))
            shared_b = _Shared(b[0])
            return [(a[0, r:r + rows], shared_b, c[0, r:r + rows]) for r in range(0, m, rows)]
    elif max(m * k, k * n, m * n) * item * _IN_FLIGHT <= room:
        # Groups of whole matrices; a broadcast operand goes up once.
        shared = ((m * k if a_shared else 0) + (k * n if b_shared else 0)) * item
        per_item = ((0 if a_shared else m * k) + (0 if b_shared else k * n) + m * n) * item
        if shared + per_item * _IN_FLIGHT <= room:
            group = _pieces(batch, per_item, (room - shared) // _IN_FLIGHT)
            sa, sb = _Shared(a[:1]) if a_shared else None, _Shared(b[:1]) if b_shared else None
            return [(sa or a[s:s + group], sb or b[s:s + group], c[s:s + group]) for s in range(0, batch, group)]
    # One matrix is too large: C in blocks of rows x cols, each from a row block of A and a column block of B
    # (kept up while its blocks of rows are computed; the next column block goes up while the last of these runs).
    cols = _pieces(n, k * item, room // 4)
    rows = _pieces(m, max(k, cols) * item, (room - 2 * k * cols * item) // (2 * _IN_FLIGHT))
    if (2 * k * cols + _IN_FLIGHT * (rows * k + rows * cols)) * item > room:
        raise OutOfMemoryError(f"a {m}x{k} @ {k}x{n} {a.dtype} product does not fit in pieces of the {budget >> 20} "
                               "MiB of GPU memory fastmm can use now: free GPU memory, or let NumPy compute it")
    out = []
    for i in range(batch):
        ai, bi, ci = a[0 if a_shared else i], b[0 if b_shared else i], c[i]
        for j in range(0, n, cols):
            bj = _Shared(bi[:, j:j + cols])
            out += [(ai[r:r + rows], bj, ci[r:r + rows, j:j + cols]) for r in range(0, m, rows)]
    return out


def matmul_host(a: np.ndarray, b: np.ndarray, c: np.ndarray, budget: int | None = None) -> None:
    """``c[...] = a @ b`` on the GPU, for host arrays a (batch, m, k), b (batch, k, n), c (batch, m, n) of one dtype,
    float32 (fastmm's kernels) or float64, complex64, complex128 (CuPy's, cuBLAS). `a` or `b` may be a device array
    already (an operand that stays on the GPU): it is read where it is.

    An operand with batch stride 0 (NumPy's broadcasting) is uploaded once. `budget` bounds the GPU memory the
    pieces in flight use (default: half of what is free). Raises fastmm's errors (no GPU, out of memory, a driver
    fault); on failure `c` may be partly written, and the caller computes it again.
    """
    if budget is None:
        budget = _arrays.cupy().cuda.runtime.memGetInfo()[0] // 2
    if a.shape[0] > 1 and a.strides[0] == 0 and b.strides[0] == 0:
        # Both operands broadcast: every batch item is the same product, computed once.
        matmul_host(a[:1], b[:1], c[:1], budget)
        np.copyto(c[1:], c[:1])
        return
    def once(x):  # the elements that go up: a broadcast operand once, one on the GPU not at all
        return 0 if not _on_host(x) else x.size // x.shape[0] if x.strides[0] == 0 else x.size

    direct = a.shape[0] == 1 and (not _on_host(a) or _direct(a[0])) and _direct(c[0])
    pool = _stagers((once(a) + once(b) + c.size) * c.itemsize)
    if direct:
        _run(plan(a, b, c, budget, direct), pool, _DIRECT_IN_FLIGHT, _DIRECT_BLOCKS, _DIRECT_LANES)
    else:
        _run(plan(a, b, c, budget), pool)
