"""Kernels compiled on a thread of fastmm's own, for callers that have a better answer than waiting for nvcc.

nvcc takes about a second a binary, once per machine (then the disk cache answers in milliseconds). A caller that can
always compute a product another way (the NumPy hook: NumPy's loop; the CuPy hook: cuBLAS) runs its products inside
`in_background()`: a product whose binary is neither loaded nor cached raises `KernelCompiling` at once, before any
launch, and nvcc builds the binary here meanwhile; the product goes the other way, and a later one of its kind finds
the binary ready. Everyone else (fastmm.matmul and the array type) compiles in the call, as before.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from contextlib import contextmanager

from .. import _plan
from .._plan import Device
from ..kernels import build
from ..kernels.configs import KernelConfig, Variant

__all__ = ["KernelCompiling", "in_background", "binary", "compile_ahead", "wait", "status", "finished"]

_log = logging.getLogger("fastmm")


class KernelCompiling(Exception):  # noqa: N818 - not an error: the caller's cue to compute the product its own way
    """The product needs a binary that nvcc is building on fastmm's compile thread."""


_tls = threading.local()
_lock = threading.Condition()
# (binary, arch), config, variant, arch: asked for by products, in their order; then those queued ahead of need
_waiting: list[tuple[tuple[str, str], KernelConfig, Variant, str]] = []
_ahead: list[tuple[tuple[str, str], KernelConfig, Variant, str]] = []
_busy: set[tuple[str, str]] = set()  # (binary, arch) waiting or being compiled
_ready: dict[tuple[str, str], object] = {}  # (binary, arch) -> its Compiled, or the exception its compile raised
_current: tuple[str, str] | None = None  # the one nvcc is compiling now
_thread: threading.Thread | None = None
_compiled = _failed = 0
_generation = 0  # binaries finished, and forks (a child drops what was queued): see finished()


@contextmanager
def in_background():
    """Within: a binary that is not compiled yet is compiled on fastmm's thread, and the product raises
    `KernelCompiling` instead of waiting for it (on the calling thread only). ``$FASTMM_HOOK_COMPILE=wait`` turns
    that off: the hooks' products then wait for nvcc as fastmm.matmul's do (a benchmark's or a test's first product
    on the GPU whatever the cache holds)."""
    before = getattr(_tls, "on", False)
    _tls.on = os.environ.get("FASTMM_HOOK_COMPILE", "background") != "wait"
    try:
        yield
    finally:
        _tls.on = before


def binary(config: KernelConfig, variant: Variant, arch: str) -> build.Compiled:
    """The binary of `config` and `variant` for `arch`: compiled in the call, or (inside `in_background`) from the
    disk cache or the compile thread, raising `KernelCompiling` while nvcc is still at it. A compile that failed
    raises its error on every later call in this process (as a compile in the call would, without running nvcc
    again); where no thread can be started, the call compiles."""
    key = (config.binary_name(variant), arch)
    if not getattr(_tls, "on", False):
        with _compile_lock(key):  # (threads that need the same binary: one nvcc, the others then read the cache)
            return build.compile_cubin(config, variant, arch)
    with _lock:
        done = _ready.get(key)
        if done is not None and not isinstance(done, BaseException):
            del _ready[key]  # (loaded once per device: the disk cache answers the next device)
    if isinstance(done, BaseException):
        raise done
    if done is not None:
        return done
    found = build.cached_cubin(config, variant, arch)
    if found is not None:
        return found
    if not _ask(key, config, variant, arch) and key not in _busy:
        return build.compile_cubin(config, variant, arch)  # no compile thread to be had: compiled here
    raise KernelCompiling(f"fastmm is compiling {key[0]} for {arch}")


_compiling_here: dict[tuple[str, str], threading.Lock] = {}


def _compile_lock(key) -> threading.Lock:
    with _lock:
        return _compiling_here.setdefault(key, threading.Lock())


# Products most NumPy programs make (A @ v, v @ A, A.T @ v; square products in three layouts, two sizes): their
# binaries are compiled ahead on a machine whose cache lacks them, behind any binary a product asks for.
AHEAD = ((4096, 1, 4096, False, False), (1, 4096, 4096, False, False), (4096, 1, 4096, True, False),
         (4096, 4096, 4096, False, False), (4096, 4096, 4096, True, False), (4096, 4096, 4096, False, True),
         (1024, 1024, 1024, False, False))


def compile_ahead(device: Device) -> int:
    """Queue the binaries that `AHEAD`'s products take on `device` (in the current precision mode) and that the disk
    cache lacks; how many were queued. The NumPy hook's warm-up calls it: a new machine's first program then finds
    the common binaries compiled instead of leaving its first products to NumPy while nvcc runs."""
    queued = 0
    if not build.cache_writable():  # (compiled ahead for nothing in every process: the products' own suffice)
        return queued
    for m, n, k, a_t, b_t in AHEAD:
        problem = _plan.Problem(m, n, k, a_t=a_t, b_t=b_t)
        config = _plan.choose(problem, device).config
        variant = problem.variant_for(config)
        if build.cached_cubin(config, variant, device.arch) is None:
            queued += _ask((config.binary_name(variant), device.arch), config, variant, device.arch, ahead=True)
    return queued


def _ask(key, config, variant, arch, ahead: bool = False) -> bool:
    """Queue `key` for the compile thread (started on first use); whether it was queued now. False where it waits
    already, or where no thread could be started (the caller then compiles, or leaves it)."""
    global _thread
    with _lock:
        if key in _busy:
            if not ahead and any(key == item[0] for item in _ahead):  # needed now: to the front
                _ahead[:] = [item for item in _ahead if item[0] != key]
                _waiting.append((key, config, variant, arch))
            return False
        if _thread is None:
            thread = threading.Thread(target=_work, name="fastmm-nvcc", daemon=True)
            try:
                thread.start()
            except RuntimeError as e:  # ("can't start new thread": a process at its limit) nothing is queued
                _log.debug("fastmm's compile thread did not start: %s", e)
                return False
            _thread = thread
        _busy.add(key)
        (_ahead if ahead else _waiting).append((key, config, variant, arch))
        _lock.notify()
    return True


def _work() -> None:
    global _compiled, _failed, _current, _generation
    while True:
        with _lock:
            while not _waiting and not _ahead:
                _lock.wait()
            key, config, variant, arch = (_waiting or _ahead).pop(0)
            _current = key
        try:
            result = build.compile_cubin(config, variant, arch, low_priority=True)  # (the program's threads first)
            _compiled += 1
        except BaseException as e:  # noqa: BLE001 - handed to the product that asks next, which reports it
            result = e
            _failed += 1
            _log.debug("fastmm's compile thread: %s failed: %s", key[0], e)
        with _lock:
            _ready[key] = result
            _busy.discard(key)
            _current = None
            _generation += 1
            _lock.notify_all()


def wait(timeout: float | None = None) -> bool:
    """Wait until the compile thread has nothing left to do; whether it finished within `timeout` seconds."""
    with _lock:
        return _lock.wait_for(lambda: not _busy, timeout)


def finished() -> int:
    """A count that changes whenever a product declined for its kernel may find it ready, or must ask again: each
    binary the compile thread finishes (compiled or failed), and a fork (the child drops what was queued)."""
    return _generation


def status() -> dict:
    """What the compile thread did in this process: binaries compiled, compiles failed, binaries still waiting."""
    with _lock:
        return {"compiled": _compiled, "failed": _failed, "pending": len(_busy)}


def _at_exit() -> None:
    # A compile in progress finishes (nvcc's temporary files are removed, the cache entry is whole); those not
    # started are dropped: the next process compiles them when it needs them.
    with _lock:
        _busy.difference_update(key for key, *_ in _waiting + _ahead)
        _waiting.clear()
        _ahead.clear()
        _lock.wait_for(lambda: _current is None, 10)


def _after_fork() -> None:  # a forked child has no compile thread: it starts its own when it needs one
    global _thread, _lock, _current, _generation
    _generation += 1
    _thread, _lock, _current = None, threading.Condition(), None
    _compiling_here.clear()
    _waiting.clear()
    _ahead.clear()
    _busy.clear()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork)
