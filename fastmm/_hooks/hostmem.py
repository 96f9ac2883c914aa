"""Host memory for products of NumPy arrays: NumPy's large buffers from a pool that fastmm page-locks for the GPU.

A product offloaded from plain NumPy (`accelerate_numpy`) copies its operands to the GPU and its result back. The GPU
copies page-locked (pinned) memory directly at the link's speed, but ordinary memory only through a staging copy on
the host, which at 2048^3 costs more than the product (docs/numpy-hook.md, section 'Measurements behind the
defaults'). So while the hook is on, NumPy allocates its large buffers (1 MiB and up) through fastmm's allocator
(fastmm/_hooks/hostalloc.c, NumPy's NEP 49 handler API, per thread and context like NumPy's own setting): blocks of
their own mapping, page-locked the first time a product takes one to the GPU, and pooled when freed, still
page-locked, for the next array of about that size.
`pinned` tells the staging layer which host views it may copy directly.

Leaves the policy to `accelerate_numpy` (which installs and removes the handler) and the copies to `_staged`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path

import numpy as np

from .._errors import warn_once

__all__ = ["compile_c", "install_allocator", "restore_allocator", "allocator_active", "pinned", "pool_pinned",
           "allocator_stats", "HANDLER_NAME", "block", "fingerprint", "track", "generation", "touch", "untrack",
           "untrack_all", "guard", "candidate_address", "tracking_stats"]

HANDLER_NAME = "fastmm_pinned"
_CAPSULE_NAME = b"mem_handler"  # the name NumPy requires of a handler's capsule (kept alive: the capsule points at it)
_SET_HANDLER = 304  # PyDataMem_SetHandler's slot in NumPy's multiarray C-API table (numpy/__multiarray_api.h, >= 1.22)
_SET = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)
# A cap on the pool of freed blocks (page-locked ones included): the larger of 256 MiB and 1/16 of the host's memory,
# at most 4 GiB. Above it the oldest freed blocks are unlocked and unmapped.
_POOL_MIN, _POOL_MAX, _POOL_SHARE = 256 << 20, 4 << 30, 16
_CU_MEMORYTYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory (any allocator's)


def _c_compiler() -> str | None:
    import sysconfig

    for name in (os.environ.get("CC"), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def compile_c(source: str, what: str) -> ctypes.CDLL | None:
    """Build fastmm's C file `source` into a shared library in a private temporary directory and load it; None (with
    a warning that names `what` will do without it) when there is no C compiler or it fails. A few tens of ms."""
    with tempfile.TemporaryDirectory(prefix="fastmm-c-") as tmp:
        lib = Path(tmp, f"lib{Path(source).stem}.so")
        with _built_lock:
            if source not in _built:
                _built[source] = _build(source, what, Path(tmp))
        if _built[source] is None:
            return None
        # Each load from a file of its own: a library with statics of its own (dlopen of one path shares them).
        lib.write_bytes(_built[source])
        return ctypes.CDLL(str(lib))  # the mapping outlives the file


_built: dict = {}  # source -> the shared library's bytes (None: it cannot be built here), built once a process
_built_lock = threading.Lock()


def _build(source: str, what: str, tmp: Path) -> bytes | None:
    cc = _c_compiler()
    if cc is None:
        warn_once(f"cc-{source}", f"no C compiler found (set CC): {what}", stacklevel=6)
        return None
    src, lib = tmp / source, tmp / "build.so"
    src.write_text(resources.files(__package__).joinpath(source).read_text())
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-lpthread"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        warn_once(f"cc-{source}", f"{cc} could not build fastmm/{source}: {what} ({proc.stderr.strip()[:500]})",
                  stacklevel=6)
        return None
    return lib.read_bytes()


class _Allocator:
    """The compiled allocator, its capsule for NumPy, and whether the driver can page-lock its blocks."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.fastmm_hostalloc_handler.restype = ctypes.c_void_p
        lib.fastmm_hostalloc_pin.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.fastmm_hostalloc_pin.restype = ctypes.c_int
        lib.fastmm_hostalloc_limit.argtypes = [ctypes.c_size_t]
        lib.fastmm_hostalloc_stats.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        for name in ("track", "generation"):
            fn = getattr(lib, f"fastmm_hostalloc_{name}")
            fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_uint64
        lib.fastmm_hostalloc_touch.argtypes = [ctypes.c_void_p]
        lib.fastmm_hostalloc_untrack.argtypes = [ctypes.c_void_p]
        lib.fastmm_hostalloc_block.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.fastmm_hostalloc_fingerprint.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.fastmm_hostalloc_fingerprint.restype = ctypes.c_uint64
        lib.fastmm_hostalloc_track_stats.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = new(lib.fastmm_hostalloc_handler(), _CAPSULE_NAME, None)
        lib.fastmm_hostalloc_limit(_pool_limit())
        self.driver = None  # None: not tried yet; then True or False
        atexit.register(lib.fastmm_hostalloc_shutdown)
        os.register_at_fork(after_in_child=lib.fastmm_hostalloc_forget)

    def bind_driver(self) -> bool:
        """Give the allocator the CUDA driver's entry points (on the first product that wants a block page-locked)."""
        if self.driver is None:
            try:
                cuda = ctypes.CDLL("libcuda.so.1")
                entries = [cuda.cuMemHostRegister_v2, cuda.cuMemHostUnregister, cuda.cuCtxGetCurrent,
                           cuda.cuCtxPushCurrent_v2, cuda.cuCtxPopCurrent_v2]
            except (OSError, AttributeError):
                self.driver = False
            else:
                self.lib.fastmm_hostalloc_driver(*(ctypes.cast(f, ctypes.c_void_p) for f in entries))
                self.driver = True
        return self.driver


def _pool_limit() -> int:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    return max(_POOL_MIN, min(_POOL_MAX, total // _POOL_SHARE))


_lock = threading.Lock()
_allocator: _Allocator | None = None
_tried = False
_default = None  # the handler NumPy had before fastmm's first install (its default): what restore puts back


def _get() -> _Allocator | None:
    global _allocator, _tried
    with _lock:
        if not _tried:
            _tried = True
            lib = compile_c("hostalloc.c", "fastmm's NumPy hook stages every product through page-locked buffers, "
                            "as for arrays it did not allocate (2048^3 takes about 3x as long)")
            _allocator = _Allocator(lib) if lib is not None else None
        return _allocator


def _set_handler(capsule):
    """NumPy's PyDataMem_SetHandler for the current context: puts `capsule` there, returns the previous one."""
    try:
        from numpy._core import _multiarray_umath as multiarray
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as multiarray
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = ctypes.cast(get(multiarray._ARRAY_API, None), ctypes.POINTER(ctypes.c_void_p))
    return _SET(table[_SET_HANDLER])(capsule)


def _current_name() -> str:
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name
    return get_handler_name()


def allocator_active() -> bool:
    """Whether NumPy allocates this context's new large arrays through fastmm's pool."""
    return _current_name() == HANDLER_NAME


def install_allocator():
    """NumPy's new arrays in this thread (its context) allocated through fastmm's pool. Returns the handler it
    replaced (for `restore_allocator`), or None where there is nothing to install (no C compiler)."""
    global _default
    allocator = _get()
    if allocator is None:
        return None
    previous = _set_handler(allocator.capsule)
    with _lock:
        if _default is None and not _is_ours(previous):
            _default = previous
    return previous


def _is_ours(capsule) -> bool:
    return _allocator is not None and capsule is _allocator.capsule


def restore_allocator(previous=None) -> None:
    """Put `previous` (or NumPy's default, when None) back as this context's handler, if fastmm's is there now;
    arrays allocated meanwhile keep fastmm's allocator until NumPy frees them."""
    if not allocator_active():
        return
    handler = previous if previous is not None else _default
    if handler is not None:
        _set_handler(handler)


def pool_pinned(x: np.ndarray) -> bool:
    """Whether the C-contiguous host array `x` lies in a block of fastmm's pool, page-locked now (once per block, if
    it is not yet): a lookup in the pool's table, no driver query (memory of other allocators answers False)."""
    allocator = _allocator
    return (allocator is not None and x.nbytes > 0 and allocator.bind_driver()
            and bool(allocator.lib.fastmm_hostalloc_pin(x.__array_interface__["data"][0], x.nbytes)))


def pinned(x: np.ndarray) -> bool:
    """Whether the GPU can copy the C-contiguous host array `x` directly: it lies in a block of fastmm's pool (then
    page-locked now, once per block, if it is not yet) or in page-locked memory of another allocator."""
    ptr, nbytes = x.__array_interface__["data"][0], x.nbytes
    if nbytes == 0:
        return False
    if pool_pinned(x):
        return True
    from .._runtime import arrays as _arrays

    try:
        runtime = _arrays.cupy().cuda.runtime
        return all(runtime.pointerGetAttributes(p).type == _CU_MEMORYTYPE_HOST for p in (ptr, ptr + nbytes - 1))
    except Exception:  # noqa: BLE001 - no CuPy, no driver, or memory the driver does not know: staged copies
        return False


def allocator_stats() -> dict:
    """The pool's state: blocks held by arrays, blocks pooled, pooled bytes, bytes page-locked so far, reuses and
    mappings made (zeros before the first install)."""
    out = (ctypes.c_size_t * 6)()
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_stats(out)
    keys = ("live_blocks", "pooled_blocks", "pooled_bytes", "pinned_bytes", "reused", "mapped")
    return dict(zip(keys, (int(v) for v in out)))


# --------------------------------------------------------------------------------------------------------
# Write tracking: which blocks changed since the GPU copied them (hostalloc.c, section 'Write tracking')
# --------------------------------------------------------------------------------------------------------

def block(ptr: int) -> tuple[int, int, int] | None:
    """The live block of fastmm's allocator that holds address `ptr`: (base, bytes the array asked for, serial: new
    each time an array takes the block), or None where no such block holds it."""
    allocator = _allocator
    if allocator is None:
        return None
    out = (ctypes.c_uint64 * 3)()
    return (int(out[0]), int(out[1]), int(out[2])) if allocator.lib.fastmm_hostalloc_block(ptr, out) else None


def fingerprint(ptr: int, nbytes: int) -> int:
    """A sample of the `nbytes` bytes at `ptr` (64 bytes from each of 64 places; a microsecond): equal samples say the
    bytes probably did not change."""
    return int(_allocator.lib.fastmm_hostalloc_fingerprint(ptr, nbytes)) if _allocator is not None and nbytes else 0


def track(ptr: int) -> int:
    """Make the block holding `ptr` read-only and track writes into it; its generation, or 0 where it cannot be
    (not a live block of fastmm's, every slot taken, written meanwhile). Page-lock it first where it is to be."""
    if _allocator is None:
        return 0
    _follow_faulthandler()
    return int(_allocator.lib.fastmm_hostalloc_track(ptr))


def guard() -> None:
    """fastmm's SIGSEGV handler on top again if another was installed since (a sigaction query, under a us)."""
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_guard()


_following = False


def _follow_faulthandler() -> None:
    """faulthandler.enable() and .disable() followed by `guard`. Without it, a write into a tracked block after a
    later faulthandler.enable() would reach faulthandler's handler first, which reports a fatal error and kills the
    process; and disable() would put back the handler from before fastmm's, leaving tracked writes unhandled."""
    global _following
    with _lock:
        if _following:
            return
        _following = True
    import faulthandler
    import functools

    for name in ("enable", "disable"):
        original = getattr(faulthandler, name)

        @functools.wraps(original)
        def followed(*args, _original=original, **kwargs):
            try:
                return _original(*args, **kwargs)
            finally:
                guard()

        setattr(faulthandler, name, followed)


def generation(ptr: int) -> int:
    """The generation of the tracked block holding `ptr` (new at every write into it), or 0 where none does."""
    return int(_allocator.lib.fastmm_hostalloc_generation(ptr)) if _allocator is not None else 0


def touch(ptr: int) -> None:
    """The tracked block holding `ptr` was written by DMA (fastmm's own download), which no fault reports."""
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_touch(ptr)


def untrack(ptr: int) -> None:
    """The tracked block holding `ptr` writable again and untracked."""
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_untrack(ptr)


def untrack_all() -> None:
    """Every tracked block writable again and untracked."""
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_untrack_all()


def candidate_address() -> int | None:
    """The address of hostalloc.c's check "this pointer lies in a block of ours" (nanoseconds), for the C loop; None
    where the allocator cannot be built."""
    allocator = _get()
    if allocator is None:
        return None
    return ctypes.cast(allocator.lib.fastmm_hostalloc_candidate, ctypes.c_void_p).value


def tracking_stats() -> dict:
    """Blocks tracked now, write faults seen, and blocks made read-only (both since the first install)."""
    out = (ctypes.c_size_t * 3)()
    if _allocator is not None:
        _allocator.lib.fastmm_hostalloc_track_stats(out)
    return dict(zip(("tracked_blocks", "write_faults", "protections"), (int(v) for v in out)))
