"""fastmm's allocator for NumPy's buffers (accelerate_numpy's page-locked pool), without a GPU: which arrays it
serves, that they hold what NumPy expects (zeros, resized contents), the pool's reuse and limit, page-locking with a
stand-in driver (once per block, undone on eviction, never retried after a failure, never after exit or in a forked
child), and that installing it is a setting of one thread's context that restore_numpy undoes."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fastmm
from fastmm._hooks import hostmem as _hostmem

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name

pytestmark = pytest.mark.skipif(_hostmem._c_compiler() is None, reason="fastmm's allocator needs a C compiler")
MiB = 1 << 20


@pytest.fixture
def pool():
    previous = _hostmem.install_allocator()
    assert previous is not None
    yield
    _hostmem.restore_allocator(previous)
    gc.collect()


def test_large_arrays_come_from_the_pool_and_small_ones_from_malloc(pool):
    big, small = np.ones((1024, 1024), np.float32), np.ones(1000, np.float32)
    assert get_handler_name(big) == "fastmm_pinned" == get_handler_name(small)
    assert big.ctypes.data % 4096 == 0  # a block of its own mapping
    before = _hostmem.allocator_stats()
    del big
    after = _hostmem.allocator_stats()
    assert after["pooled_blocks"] == before["pooled_blocks"] + 1 and after["pooled_bytes"] >= 4 * MiB
    again = np.empty((1024, 1024), np.float32)  # the same size: the pooled block, reused
    assert _hostmem.allocator_stats()["reused"] == after["reused"] + 1
    again[...] = 7
    zeros = np.zeros((1024, 1024), np.float32)  # calloc: a fresh mapping or a reused block cleared
    del again
    zeros2 = np.zeros((1024, 1024), np.float32)  # the block that held 7s
    assert not zeros.any() and not zeros2.any()


def test_resizing_keeps_the_contents(pool):
    x = np.arange(300_000, dtype=np.float64)  # 2.4 MB: from the pool
    x.resize(600_000, refcheck=False)  # grows past its block: moved, contents kept, the rest zeros
    assert np.array_equal(x[:300_000], np.arange(300_000)) and not x[300_000:].any()
    x.resize(300_001, refcheck=False)  # shrinks in place
    assert np.array_equal(x[:300_000], np.arange(300_000))
    x.resize(10, refcheck=False)  # under the pool's size: moved to malloc
    assert np.array_equal(x, np.arange(10))
    y = np.arange(10, dtype=np.float64)  # malloc's ...
    y.resize(400_000, refcheck=False)  # ... grown by malloc, freed by malloc (the large size notwithstanding)
    assert np.array_equal(y[:10], np.arange(10))
    del x, y


def test_a_setting_of_the_thread_that_restore_undoes():
    seen = {}
    with fastmm.accelerate_numpy(pinned=True):
        other = threading.Thread(target=lambda: seen.update(name=get_handler_name()))
        other.start(), other.join()
        assert get_handler_name() == "fastmm_pinned" and fastmm.numpy_hook_status()["pinned_allocator"]
        kept = np.ones((1024, 1024), np.float32)
    assert seen["name"] != "fastmm_pinned"  # another thread's context keeps NumPy's allocator
    assert get_handler_name() != "fastmm_pinned"  # the block's end put the previous one back
    assert get_handler_name(kept) == "fastmm_pinned" and kept.sum() == 1024 * 1024  # still valid, freed to the pool
    fastmm.accelerate_numpy()
    assert get_handler_name() == "fastmm_pinned"
    with fastmm.accelerate_numpy():
        pass
    assert get_handler_name() == "fastmm_pinned"  # the block found fastmm's there: leaves it
    fastmm.restore_numpy()
    assert get_handler_name() == "default_allocator"
    fastmm.accelerate_numpy(pinned=False)
    assert get_handler_name() == "default_allocator"
    fastmm.restore_numpy()


def test_threads_allocate_and_free_at_once():
    errors = []

    def work(seed):
        try:
            with fastmm.accelerate_numpy(pinned=True):
                rng = np.random.default_rng(seed)
                for i in range(40):
                    n = int(rng.integers(1, 5)) * 256
                    x = np.full((n, 1024), float(i), np.float32)
                    assert get_handler_name(x) == "fastmm_pinned" and (x == i).all()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    stats = _hostmem.allocator_stats()
    assert stats["reused"] > 0 and stats["pooled_bytes"] <= _hostmem._pool_limit()


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


STAND_IN_DRIVER = """
    import ctypes, gc, os, numpy as np
    from fastmm._hooks import hostmem as _hostmem
    calls = []
    REG = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
    ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    OUT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
    fail = set()
    def register(p, n, flags):
        calls.append(("register", p, n, flags))
        return 1 if p in fail else 0
    def get(out):
        out[0] = 0xC0FFEE
        return 0
    def push(ctx):
        calls.append(("push", ctx))
        return 0
    def pop(out):
        calls.append(("pop",))
        return 0
    fns = [REG(register), ONE(lambda p: calls.append(("unregister", p)) or 0), OUT(get), ONE(push), OUT(pop)]
    prev = _hostmem.install_allocator()
    alloc = _hostmem._allocator
    alloc.lib.fastmm_hostalloc_driver(*(ctypes.cast(f, ctypes.c_void_p) for f in fns))
    alloc.driver = True
"""


def test_page_locking_once_per_block_undone_on_eviction():
    p = _child(STAND_IN_DRIVER + """
    a = np.ones((1024, 1024), np.float32)
    base = a.ctypes.data
    assert _hostmem.pinned(a[10:20]) and _hostmem.pinned(a)  # a view inside the block: the whole block, once
    assert calls == [("register", base, 4 << 20, 1)], calls
    assert not _hostmem.pinned(np.ones(1000, np.float32))  # malloc's: not fastmm's to lock (and no CuPy here)
    b = np.ones((2048, 1024), np.float32)
    fail.add(b.ctypes.data)
    assert not _hostmem.pinned(b) and not _hostmem.pinned(b)  # failed once: not tried again
    assert [c[0] for c in calls] == ["register", "register"]
    del a
    assert _hostmem.allocator_stats()["pooled_blocks"] >= 1 and len(calls) == 2  # pooled: still locked
    c = np.empty((1024, 1024), np.float32)
    assert c.ctypes.data == base and _hostmem.pinned(c) and len(calls) == 2  # reused, already locked
    del c
    alloc.lib.fastmm_hostalloc_limit(0)  # evicted: unlocked in its context, then unmapped
    assert ("unregister", base) in calls and ("push", 0xC0FFEE) in calls and calls[-1] == ("pop",), calls
    alloc.lib.fastmm_hostalloc_limit(1 << 30)
    d = np.ones((1024, 1024), np.float32)
    assert _hostmem.pinned(d)
    n = len(calls)
    if os.fork() == 0:  # a forked child: the parent's locking does not carry over, and no driver call is made
        del d; e = np.ones((1024, 1024), np.float32)
        ok = not _hostmem.pinned(e) and len(calls) == n
        alloc.lib.fastmm_hostalloc_limit(0)
        os._exit(0 if ok and len(calls) == n else 3)
    _, status = os.wait()
    assert status == 0, status
    keep = d  # alive at exit: left locked (no driver call after exit's hook)
    print("ok")
    """)
    assert p.returncode == 0 and p.stdout.strip() == "ok" and p.stderr == "", p.stderr


def test_exit_with_pooled_and_live_blocks_is_clean():
    p = _child(STAND_IN_DRIVER + """
    xs = [np.ones((512, 1024), np.float32) for _ in range(6)]
    assert all(_hostmem.pinned(x) for x in xs)
    del xs[:3]
    import atexit
    atexit.register(lambda: print("exiting"))
    """)
    assert p.returncode == 0 and p.stdout.strip() == "exiting" and p.stderr == "", p.stderr


def test_a_c_source_is_built_once_and_each_load_has_statics_of_its_own(monkeypatch):
    """The NumPy hook's loop, one per dtype: one compile a process, each load from a file of its own (dlopen of one
    path would share the statics, and one dtype's threshold would be another's)."""
    import ctypes

    _hostmem.compile_c("hostloop.c", "test")  # built here, or by an earlier test
    monkeypatch.setattr(_hostmem.subprocess, "run", lambda *a, **k: pytest.fail("compiled a second time"))
    first, second = (_hostmem.compile_c("hostloop.c", "test") for _ in range(2))
    address = [ctypes.cast(lib.fastmm_below_threshold, ctypes.c_void_p).value for lib in (first, second)]
    assert address[0] != address[1]
    # A product below the first loop's threshold counts in its statics alone.
    loop_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ssize_t),
                              ctypes.POINTER(ctypes.c_ssize_t), ctypes.c_void_p)
    offload_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_ssize_t),
                                 ctypes.POINTER(ctypes.c_ssize_t))
    numpy_loop, offload = loop_t(lambda *args: None), offload_t(lambda *args: 0)
    for lib in (first, second):
        lib.fastmm_below_threshold.restype = ctypes.c_longlong
        lib.fastmm_set_numpy_loop.argtypes = [ctypes.c_void_p]
        lib.fastmm_configure.argtypes = [ctypes.c_void_p, ctypes.c_double]
        lib.fastmm_set_numpy_loop(ctypes.cast(numpy_loop, ctypes.c_void_p))
    first.fastmm_configure(ctypes.cast(offload, ctypes.c_void_p), 1e300)
    dims, steps = (ctypes.c_ssize_t * 4)(1, 2, 2, 2), (ctypes.c_ssize_t * 9)()
    first.fastmm_matmul_loop((ctypes.c_void_p * 3)(), dims, steps, None)
    assert (first.fastmm_below_threshold(), second.fastmm_below_threshold()) == (1, 0)
