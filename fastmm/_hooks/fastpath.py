"""The fast path of the NumPy hook: an operand kept on the GPU times small ones, on the calling thread's own stream.

A matrix-vector product on a kept matrix (power iteration's ``v = a @ v``) takes a few hundred microseconds on the
GPU, and the general path (`staged.matmul_host`) spends longer than that around it: a free-memory query, a plan,
pointer queries, staging slots, four new events, and a sleeping wait that wakes late. Such a product needs none of
it: its host operands and result are small enough for one copy each way, which the calling thread makes through a
pinned buffer of its own, on a stream of its own, and it waits by spinning (docs/numpy-hook.md, section
'Operands that stay on the GPU'). Anything else goes the general way.

Leaves the decision (a copy is current, the product goes to the GPU) to `resident` and `numpy_hook`.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from .._dispatch import products as _dispatch
from .._runtime import arrays as _arrays
from . import hostmem as _hostmem
from .staged import _on_host

__all__ = ["matmul", "release", "MAX_BYTES"]

# A single product whose operands in host memory and result each take at most this many bytes (a staging slot's
# worth): the general path copies such an operand in one piece by the calling thread too, so little overlap of
# copies and kernels is given up, against its machinery's 300 us (docs/numpy-hook.md, section 'Measurements behind
# the defaults').
MAX_BYTES = 4 << 20
# A wait spins on its event for up to this long, then sleeps: a sleeping wait wakes about 60 us after the GPU is
# done, a quarter of a kept matrix times a vector; past a millisecond that no longer matters, and the core is the
# program's (docs/numpy-hook.md, section 'Measurements behind the defaults').
_SPIN_SECONDS = 1e-3
_ALIGN = 256  # each operand's place in the pinned buffer (the GPU copies from aligned addresses fastest)
_MIN_BUFFER = 64 << 10  # the smallest buffer taken: vectors of a few shapes then share it without regrowing

_local = threading.local()
_states: weakref.WeakSet = weakref.WeakSet()  # every thread's, for `release`
_states_lock = threading.Lock()
# Per device, the states of threads that have ended, for the next new thread: threads that come and go (a server's
# per request, a pool's) would otherwise each leave a stream whose blocks CuPy's memory pool keeps for good.
_idle: dict[int, list] = {}


class _Sentinel:
    """Kept only in a thread's local storage, which Python clears when the thread ends: its finalizer retires the
    thread's states."""

    __slots__ = ("__weakref__",)


class _Thread:
    """A thread's own on one device: a stream (its products queue behind no other thread's work, and wait for
    none), one event that each product records again, and a pinned buffer for the host operands and the result,
    grown as needed; the buffer as (array, address), read at once (`release` may drop it from another thread)."""

    __slots__ = ("stream", "done", "pinned", "pending", "__weakref__")

    def __init__(self, cp):
        self.stream = cp.cuda.Stream(non_blocking=True)
        # Queried while spinning; its synchronize() sleeps (cudaEventBlockingSync) once the spin is over.
        self.done = cp.cuda.Event(block=True, disable_timing=True)
        self.pinned = None
        self.pending = False  # work queued on the stream that no wait has seen finish (an interrupt in the handler)

    def buffer(self, nbytes: int):
        pinned = self.pinned
        if pinned is None or pinned[0].size < nbytes:
            self.pinned = pinned = None  # the smaller one freed first
            # Powers of two: operands that grow a little each product (a block Krylov method's V[:, :j]) take a new
            # buffer a handful of times, not every time.
            buf = _page_locked(max(_MIN_BUFFER, 1 << (nbytes - 1).bit_length()))
            self.pinned = pinned = (buf, _address(buf))
        return pinned


def _page_locked(nbytes: int) -> np.ndarray:
    """nbytes of page-locked memory of its own, freed (unlocked) with the array: not from CuPy's pinned-memory pool,
    which keeps every block it gave out page-locked for a later request of that exact size."""
    cuda = _arrays.cupy().cuda
    return np.frombuffer(cuda.PinnedMemoryPointer(cuda.PinnedMemory(nbytes), 0), np.uint8, nbytes)


def _thread(cp, device: int) -> _Thread:
    mine = getattr(_local, "devices", None)
    if mine is None:
        mine = _local.devices = {}
        _local.sentinel = _Sentinel()
    me = mine.get(device)
    if me is None:
        with _states_lock:
            idle = _idle.get(device)
            me = idle.pop() if idle else None
        me = mine[device] = me or _Thread(cp)
        with _states_lock:
            _states.add(me)
        weakref.finalize(_local.sentinel, _retire, device, me)
    return me


def _retire(device: int, me: _Thread) -> None:
    """A thread has ended: its state (stream, event, buffer) waits for the next new thread on `device`."""
    if me.pending:  # (interrupted twice: its copies were never waited for)
        try:
            me.stream.synchronize()
            me.pending = False
        except Exception:  # noqa: BLE001 - a broken context: the state is dropped, not handed on
            return
    with _states_lock:
        _idle.setdefault(device, []).append(me)


def release() -> None:
    """Every thread's pinned buffer freed (the hook went off); a product running meanwhile keeps its own until it
    returns, and the next one takes a new buffer. Streams and events go with their threads."""
    with _states_lock:
        for me in list(_states):
            me.pinned = None
        _idle.clear()  # the ended threads' states go (their streams with them)


def _address(x) -> int:
    return x.__array_interface__["data"][0]


def _wait(event) -> None:
    """Until the GPU has passed `event`: spinning for up to _SPIN_SECONDS (a query costs a microsecond, and a
    KeyboardInterrupt reaches the thread meanwhile), then asleep."""
    if event.done:
        return
    deadline = time.perf_counter() + _SPIN_SECONDS
    while not event.done:
        if time.perf_counter() > deadline:
            event.synchronize()
            return
        time.sleep(0)  # the GIL to other threads between queries (the query itself keeps it): theirs launch meanwhile


def matmul(a, b, c) -> bool:
    """``c[...] = a @ b`` for a single product (batch 1) of 3-D host arrays or device arrays on the current device,
    whose host operands and result each take at most MAX_BYTES: True once done; False, having done nothing, for
    any other product (`staged.matmul_host` computes those).

    A host operand goes into the thread's pinned buffer (any strides; a C-contiguous one that lies page-locked in
    fastmm's pool is copied by the GPU directly), up into memory of CuPy's pool taken on the thread's stream (no
    other stream's work still uses it), through the kernel, and the result back the same way. No free-memory
    query, plan, driver pointer query or new event. Raises as `staged.matmul_host` does; after a failure or an
    interrupt nothing of the product is left running, and `c` may be partly written.
    """
    cp = _arrays.cupy()
    if (a.shape[0] != 1 or b.shape[0] != 1 or 0 in a.shape or 0 in b.shape or c.nbytes > MAX_BYTES
            or a.dtype != c.dtype or b.dtype != c.dtype):
        return False
    device = cp.cuda.runtime.getDevice()
    operands = []  # (array, on the host, copied by the GPU directly, offset in the pinned buffer)
    end = 0
    for x in (a, b):
        host = _on_host(x)
        if host and x.nbytes > MAX_BYTES or not host and x.device.id != device:
            return False
        direct = host and x.flags.c_contiguous and _hostmem.pool_pinned(x)
        operands.append((x, host, direct, end))
        if host and not direct:
            end += -(-x.nbytes // _ALIGN) * _ALIGN
    direct_c = c.flags.c_contiguous and _hostmem.pool_pinned(c)
    me = _thread(cp, device)
    stream = me.stream
    if me.pending:  # a product interrupted twice left its copies unwaited for: done before the buffer is refilled
        stream.synchronize()
        me.pending = False
    try:
        need = end + (0 if direct_c else c.nbytes)
        pin, base = me.buffer(need) if need else (None, 0)
        me.pending = True
        with stream:  # the kernel, and the memory of the copies up and of the result, on it
            devs = []
            for x, host, direct, off in operands:
                if not host:
                    devs.append(x)
                    continue
                if not direct:
                    np.copyto(np.ndarray(x.shape, x.dtype, pin, off), x)
                dev = _arrays.empty(x.shape, x.dtype)
                dev.data.copy_from_host_async(_address(x) if direct else base + off, x.nbytes, stream)
                devs.append(dev)
            dc = _dispatch.matmul(*devs)
            if not dc.flags.c_contiguous:  # (a new result is C-ordered; the copy down relies on it)
                dc = cp.ascontiguousarray(dc)
            dc.data.copy_to_host_async(_address(c) if direct_c else base + end, c.nbytes, stream)
            me.done.record(stream)
        _wait(me.done)
        me.pending = False
        if not direct_c:
            np.copyto(c, np.ndarray(c.shape, c.dtype, pin, end))
    except BaseException:
        # An interrupt in the wait, or a failure: the GPU done with the buffer before the next product refills it.
        try:
            stream.synchronize()
            me.pending = False
        except Exception:  # noqa: BLE001 - a broken context: a new stream and buffer next time
            _local.devices.pop(device, None)
        raise
    return True
