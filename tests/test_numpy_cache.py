"""Operands kept on the GPU between products (the NumPy hook's cache), without a GPU: a stand-in device keeps its
copies in host memory, so a stale copy would give a wrong product. Every way NumPy (or C, or another thread) can
write into an operand between two products must give NumPy's result on the new data; an unchanged operand goes up
once; the cache stays within its bytes; restore_numpy leaves no page read-only. What could kill the interpreter
(the SIGSEGV handler against real crashes, faulthandler, fork) runs in a child process. The fast path for a kept
operand times small ones runs the hook's own GPU product against test_numpy_hook.py's stand-in CuPy."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fastmm
from fastmm._hooks import fastpath as _fastpath
from fastmm._hooks import hostmem as _hostmem
from fastmm._hooks import numpy_hook as hook
from fastmm._hooks import resident as _resident
from test_numpy_hook import EVERYTHING, StandInDevice, _without_hook, gpu, use_lazy_gpu  # noqa: F401 - gpu: a fixture

pytestmark = pytest.mark.skipif(_hostmem._c_compiler() is None, reason="the cache tracks fastmm's allocator's blocks")
MiB = 1 << 20


def _ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _check(got, a, b):
    np.testing.assert_allclose(got, _ref(a, b), rtol=1e-5, atol=1e-4)


def _cached(gpu, a, b):
    """a @ b twice: the second time `a` is kept on the (stand-in) device and the product read from there."""
    for _ in range(2):
        _check(a @ b, a, b)
    stats = fastmm.numpy_hook_status()["cache"]
    assert gpu.device.uploads == [a.nbytes] and stats["hits"] >= 1, (gpu.device.uploads, stats)


def test_an_unchanged_operand_goes_up_once(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 1024)).astype(np.float32)  # 2 MiB: a block of fastmm's pool
        b = rng.standard_normal((1024, 8)).astype(np.float32)
        for _ in range(6):
            _check(a @ b, a, b)
        stats = fastmm.numpy_hook_status()["cache"]
    assert gpu.device.uploads == [a.nbytes]  # the first product uploaded it as any operand; then kept
    assert stats["uploads"] == 1 and stats["hits"] == 5 and stats["saved_upload_bytes"] == 5 * a.nbytes
    assert stats["entries"] == 1 and stats["bytes"] == a.nbytes


def test_a_product_left_to_numpy_while_its_kernel_compiles_serves_no_hit(gpu, rng, monkeypatch):
    from fastmm._runtime import compiling

    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 1024)).astype(np.float32)
        b = rng.standard_normal((1024, 8)).astype(np.float32)
        _cached(gpu, a, b)
        hits = fastmm.numpy_hook_status()["cache"]["hits"]

        def still_compiling(a, b, c):
            raise compiling.KernelCompiling("fastmm is compiling fewcol_n16_nn_v4 for sm_90")

        monkeypatch.setattr(hook._state, "product", still_compiling)
        _check(a @ b, a, b)
        assert fastmm.numpy_hook_status()["cache"]["hits"] == hits


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_kept_complex_operand_is_read_back_as_its_dtype(gpu, rng, dtype):
    """The copy's views take the product's dtype, not one its itemsize suggests (complex64 is 8 bytes, as float64):
    the kept operand, a transposed view and an offset one of it, each against the product on the new data."""
    def draw(shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)

    with fastmm.accelerate_numpy(EVERYTHING):
        a, b = draw((512, 512)), draw((512, 8))  # a: 2 or 4 MiB, a block of fastmm's pool
        for x, y in ((a, b), (a.T, b), (a[:, 3:], b[3:])) * 3:
            want = x.astype(np.complex128) @ y.astype(np.complex128)
            np.testing.assert_allclose(x @ y, want, rtol=1e-5 if dtype == np.complex64 else 1e-12)
        stats = fastmm.numpy_hook_status()["cache"]
    assert gpu.device.uploads[0] == a.nbytes and stats["hits"] >= 6, (gpu.device.uploads, stats)


def _thread_write(a):
    t = threading.Thread(target=lambda: a.__setitem__((1, 2), 42.0))
    t.start()
    t.join()


def _memmove(a):
    src = np.arange(4, dtype=np.float32) + 100
    ctypes.memmove(a.ctypes.data + 4096 * 3 + 8, src.ctypes.data, src.nbytes)


def _from_buffer(a):
    (ctypes.c_float * a.size).from_buffer(a)[a.size // 2] = -7.0


WRITES = {
    "slice": lambda a, s: a.__setitem__((slice(5, 9), slice(0, 3)), 7.0),
    "ufunc out=": lambda a, s: np.add(a, 1.0, out=a),
    "in-place ufunc": lambda a, s: a.__imul__(2.0),
    "a view's write": lambda a, s: a.T.__setitem__((3, 4), 1.0),
    "reshape view": lambda a, s: a.reshape(-1).__setitem__(17, 3.0),
    "copyto": lambda a, s: np.copyto(a, s[:a.shape[0], :a.shape[1]] * 0 + 0.5),
    "fill": lambda a, s: a.fill(2.0),
    "a @= b": lambda a, s: a.__imatmul__(s),
    "matmul out=": lambda a, s: np.matmul(s[:a.shape[0], :a.shape[0]], s[:a.shape[0], :a.shape[1]], out=a),
    "another thread": lambda a, s: _thread_write(a),
    "ctypes.memmove": lambda a, s: _memmove(a),
    "from_buffer": lambda a, s: _from_buffer(a),
}


@pytest.mark.parametrize("how", list(WRITES), ids=str)
def test_a_written_operand_is_never_read_stale(gpu, rng, how):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        s = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 16)).astype(np.float32)
        _cached(gpu, a, b)
        before = a.copy()
        WRITES[how](a, s)
        assert not np.array_equal(a, before)
        _check(a @ b, a, b)
        _check(a.T @ s[:, :16], a.T, s[:, :16])
        assert fastmm.numpy_hook_status()["cache"]["invalidated_by_writes"] >= 1


def test_resize_in_place_and_moved(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((600, 512)).astype(np.float32)
        b = rng.standard_normal((512, 16)).astype(np.float32)
        _cached(gpu, a, b)
        a.resize((590, 512), refcheck=False)  # shrinks in its block: untracked, then written without a fault
        a[0, 0] = 123.0
        _check(a @ b, a, b)
        a.resize((1200, 512), refcheck=False)  # grows out of its block: moved
        a[-1] = 1.0
        _check(a @ b, a, b)


def test_a_block_freed_and_reused_by_another_array(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 16)).astype(np.float32)
        _cached(gpu, a, b)
        address = a.ctypes.data
        del a
        other = np.full((512, 512), 3.0, np.float32)  # the pool's block of the same size: the same address
        assert other.ctypes.data == address
        _check(other @ b, other, b)


def test_views_of_a_kept_operand_are_served_from_its_copy(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        x = rng.standard_normal((1024, 512)).astype(np.float32)  # the data of gradient descent
        w = rng.standard_normal((512, 10)).astype(np.float32)
        g = rng.standard_normal((1024, 10)).astype(np.float32)
        _cached(gpu, x, w)
        _check(x.T @ g, x.T, g)
        _check(x[:, :100] @ w[:100], x[:, :100], w[:100])
        _check(x[::-1] @ w, x[::-1], w)  # negative strides
        _check(x[100:300] @ w, x[100:300], w)
        _check(x[::2, ::2] @ w[::2], x[::2, ::2], w[::2])  # no unit-stride axis: uploaded (gathered) as before
        assert fastmm.numpy_hook_status()["cache"]["hits"] == 5
    assert gpu.device.uploads == [x.nbytes] and gpu.calls[-1][0] == (1, 512, 256)
    assert fastmm.numpy_hook_status()["cache"] is None  # the hook off: no copies, no read-only pages


def test_a_buffer_rewritten_every_step_is_never_made_read_only(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        w = np.empty((512, 512), np.float32)
        x = rng.standard_normal((64, 512)).astype(np.float32)
        before = _hostmem.tracking_stats()["protections"]
        for step in range(5):
            w[...] = rng.standard_normal(w.shape)  # new contents each step (as readinto would)
            _check(x @ w, x, w)
        assert _hostmem.tracking_stats()["protections"] == before and gpu.device.uploads == []


def test_the_cache_stays_within_its_bytes(gpu, rng):
    cap = 3 * MiB
    with fastmm.accelerate_numpy(EVERYTHING, cache_bytes=cap):
        b = rng.standard_normal((512, 8)).astype(np.float32)
        arrays = [rng.standard_normal((512, 512)).astype(np.float32) for _ in range(5)]  # 1 MiB each
        for _ in range(3):
            for a in arrays:
                _check(a @ b, a, b)
                assert fastmm.numpy_hook_status()["cache"]["bytes"] <= cap
        stats = fastmm.numpy_hook_status()["cache"]
    assert stats["evicted"] > 0 and stats["bytes_cap"] == cap


def test_cache_bytes_zero_turns_it_off(gpu, rng, monkeypatch):
    for turn_off in (lambda: fastmm.accelerate_numpy(EVERYTHING, cache_bytes=0),
                     lambda: monkeypatch.setenv("FASTMM_NUMPY_CACHE", "0") or fastmm.accelerate_numpy(EVERYTHING)):
        turn_off()
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 8)).astype(np.float32)
        for _ in range(3):
            _check(a @ b, a, b)
        assert fastmm.numpy_hook_status()["cache"] is None and gpu.device.uploads == []
        fastmm.restore_numpy()
    monkeypatch.setenv("FASTMM_NUMPY_CACHE", "512M")
    assert _resident.cap_bytes(None) == 512 * MiB and _resident.cap_bytes(7) == 7
    monkeypatch.setenv("FASTMM_NUMPY_CACHE", "1.5GB")
    assert _resident.cap_bytes(None) == 3 << 29
    monkeypatch.setenv("FASTMM_NUMPY_CACHE", "lots")
    with pytest.raises(ValueError, match="FASTMM_NUMPY_CACHE"):
        fastmm.accelerate_numpy(EVERYTHING)
    for wrong in ("inf", "nan", "-1G", "1e400"):  # never an OverflowError, never a silent 0
        monkeypatch.setenv("FASTMM_NUMPY_CACHE", wrong)
        with pytest.raises(ValueError, match=f"not '{wrong}'"):
            _resident.cap_bytes(None)
    with pytest.raises(ValueError, match="cache_bytes"):
        fastmm.accelerate_numpy(EVERYTHING, cache_bytes=-1)


def test_restore_numpy_leaves_no_page_read_only(gpu, rng):
    fastmm.accelerate_numpy(EVERYTHING)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal((512, 8)).astype(np.float32)
    _cached(gpu, a, b)
    assert _hostmem.tracking_stats()["tracked_blocks"] >= 1
    fastmm.restore_numpy()
    faults = _hostmem.tracking_stats()["write_faults"]
    a[...] = 1.0
    assert _hostmem.tracking_stats() == {**_hostmem.tracking_stats(), "tracked_blocks": 0, "write_faults": faults}
    assert fastmm.numpy_hook_status()["cache"] is None


def test_rent_or_buy_keeps_an_operand_once_its_uploads_would_have_paid(gpu, rng):
    # NumPy 8 ms a product; through the GPU 42 ms with A uploaded, 0.3 ms with A there: kept after 42 ms lost.
    model = hook.HostModel(host=1e9, link=1e8, gpu=1e15, overhead=0.0)
    with fastmm.accelerate_numpy(model):
        a = rng.standard_normal((1024, 1024)).astype(np.float32)
        b = rng.standard_normal((1024, 4)).astype(np.float32)
        placed = []
        for _ in range(8):
            calls = len(gpu.calls)
            _check(a @ b, a, b)
            placed.append(len(gpu.calls) > calls)
    assert placed == [False] * 5 + [True] * 3, placed  # 6 x 8 ms lost >= 42 ms: the sixth product buys
    assert gpu.device.uploads == [a.nbytes]


def test_a_kept_operand_takes_products_below_the_threshold(gpu, rng):
    # A matrix-vector product: far below the square-product threshold, but its 16 MiB operand, once on the GPU,
    # makes it faster there; the C loop asks fastmm because A lies in a block of fastmm's allocator.
    model = hook.HostModel(host=1e12, link=1e8, gpu=1e15, overhead=10e-6, memory=1e9)
    with fastmm.accelerate_numpy(model):
        a = rng.standard_normal((2048, 2048)).astype(np.float32)
        v = rng.standard_normal(2048).astype(np.float32)
        assert 2 * a.size < model.min_flops()
        for _ in range(12):
            np.testing.assert_allclose(a @ v, _ref(a, v), rtol=1e-4, atol=1e-3)
        assert gpu.calls and gpu.device.uploads == [a.nbytes]
        small = np.ones((64, 64), np.float32)
        small @ small
    assert len(gpu.calls) < 12 and fastmm.numpy_hook_status()["by_dtype"]["float32"]["kept_on_cpu"][
        "below_threshold"] >= 1


def test_readinto_a_kept_buffer_fails_with_efault_and_an_unkept_one_works(gpu, rng, tmp_path):
    # The kernel cannot take a write fault on the program's behalf: read(2) into a read-only page fails (the docs
    # say so, and how to turn the cache off). A buffer refilled every step is never made read-only (see above).
    data = tmp_path / "x.bin"
    data.write_bytes(np.full((512, 512), 5.0, np.float32).tobytes())
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 8)).astype(np.float32)
        _cached(gpu, a, b)
        with open(data, "rb", buffering=0) as f, pytest.raises(OSError) as raised:
            f.readinto(a)
        assert raised.value.errno == errno.EFAULT
        a[0, 0] = 1.0  # a write from user space makes it writable again
        with open(data, "rb", buffering=0) as f:
            assert f.readinto(a) == a.nbytes
        _check(a @ b, a, b)


def test_a_write_the_page_protection_does_not_see_is_caught_by_the_sample(gpu, rng):
    # A GPU or a network card writing into page-locked memory (DMA) bypasses the page protection: stood in for here by
    # making the block writable behind fastmm's back. Each use of a copy compares a sample of the bytes, so a write that
    # replaces the buffer is seen.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 8)).astype(np.float32)
        _cached(gpu, a, b)
        generation = _hostmem.generation(a.ctypes.data)
        length = -(-a.nbytes // 4096) * 4096
        assert libc.mprotect(a.ctypes.data, length, 3) == 0  # PROT_READ | PROT_WRITE, unknown to fastmm
        a[...] = rng.standard_normal(a.shape).astype(np.float32)
        assert libc.mprotect(a.ctypes.data, length, 1) == 0  # PROT_READ again
        assert _hostmem.generation(a.ctypes.data) == generation  # no fault: the page protection saw nothing
        _check(a @ b, a, b)
        assert fastmm.numpy_hook_status()["cache"]["invalidated_by_writes"] >= 1


def _child(code: str, faulthandler_first: bool = False) -> subprocess.CompletedProcess:
    code = f"FAULTHANDLER_FIRST = {faulthandler_first}\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


KEPT = """
    import ctypes, faulthandler, os, sys
    if FAULTHANDLER_FIRST:
        faulthandler.enable()
    import numpy as np
    from fastmm._hooks import hostmem as _hostmem
    _hostmem.install_allocator()
    a = np.ones((512, 512), np.float32)
    assert _hostmem.track(a.ctypes.data)  # read-only, and the handler installed
"""


@pytest.mark.parametrize("faulthandler_first", [True, False], ids=["faulthandler-first", "faulthandler-after"])
def test_a_real_crash_still_crashes_with_faulthandlers_traceback(faulthandler_first):
    p = _child(KEPT + """
    if not faulthandler.is_enabled():
        faulthandler.enable()  # after fastmm's handler: fastmm's goes on top again
    a[1, 1] = 2.0  # a tracked write: no crash, no traceback
    assert _hostmem.track(a.ctypes.data)
    faulthandler.disable()
    faulthandler.enable()
    a[2, 2] = 3.0
    print("alive", flush=True)
    ctypes.string_at(0)
""", faulthandler_first)
    assert p.returncode == -11, (p.returncode, p.stdout, p.stderr)
    assert "alive" in p.stdout and p.stderr.count("Fatal Python error: Segmentation fault") == 1, p.stderr


@pytest.mark.parametrize("crash", ["ctypes.string_at(0)", "os.kill(os.getpid(), 11)"])
def test_a_real_crash_without_faulthandler_dies_of_sigsegv(crash):
    p = _child(KEPT + f"""
    a[1, 1] = 2.0
    print("alive", flush=True)
    {crash}
""")
    assert p.returncode == -11 and "alive" in p.stdout, (p.returncode, p.stderr)


# A runtime that cures its own segfaults (a JVM's safepoint polls and null checks fault at the same address again and
# again): its handler, installed before fastmm's, must get every one of them, not only the first.
CURING_HANDLER = r"""
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
static char *guard;
static volatile int cured;
static void on_fault(int sig, siginfo_t *info, void *context)
{
    if ((char *)info->si_addr >= guard && (char *)info->si_addr < guard + 4096) {
        mprotect(guard, 4096, PROT_READ | PROT_WRITE);
        cured++;
        return;
    }
    signal(SIGSEGV, SIG_DFL);
}
int install(void)
{
    struct sigaction sa;
    guard = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, 0);
}
int touch(void)
{
    mprotect(guard, 4096, PROT_READ);
    guard[0]++;
    return cured;
}
"""


def test_a_runtime_that_cures_its_own_faults_gets_every_one(tmp_path):
    import shutil

    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in runtime's handler")
    src, lib = tmp_path / "curing.c", tmp_path / "libcuring.so"
    src.write_text(CURING_HANDLER)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    p = _child(f"""
    import ctypes
    runtime = ctypes.CDLL({str(lib)!r})
    assert runtime.install() == 0  # the runtime's handler first, then fastmm's on top of it
""" + KEPT + """
    cured = [runtime.touch() for _ in range(3)]  # the same address each time
    a[1, 1] = 2.0  # and fastmm's own faults still fastmm's
    print("cured", cured, flush=True)
""")
    assert p.returncode == 0 and "cured [1, 2, 3]" in p.stdout, (p.returncode, p.stdout, p.stderr)


def test_a_forked_child_writes_its_copy_freely():
    p = _child(KEPT + """
    generation = _hostmem.generation(a.ctypes.data)
    pid = os.fork()
    if pid == 0:
        a[...] = 7.0  # nothing tracked in the child: no faults
        os._exit(0 if _hostmem.tracking_stats()["tracked_blocks"] == 0 and (a == 7).all() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert (a == 1).all() and _hostmem.generation(a.ctypes.data) == generation  # the parent's copy still current
    a[0, 0] = 2.0
    assert _hostmem.generation(a.ctypes.data) != generation
    print("ok")
""")
    assert p.returncode == 0 and "ok" in p.stdout, (p.returncode, p.stderr)


def test_a_process_exits_cleanly_with_blocks_kept():
    p = _child(KEPT + """
    import atexit
    atexit.register(lambda: print("exit", flush=True))
    b = np.ones((512, 512), np.float32)
    _hostmem.track(b.ctypes.data)
""")
    assert p.returncode == 0 and "exit" in p.stdout, (p.returncode, p.stderr)


def test_a_block_unmapped_from_the_pool_leaves_the_table(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 8)).astype(np.float32)
        _cached(gpu, a, b)
        address = a.ctypes.data
        del a
        lib = _hostmem._allocator.lib
        lib.fastmm_hostalloc_limit(0)  # every pooled block unmapped: its slot must not outlive the mapping
        try:
            assert _hostmem.generation(address) == 0 and _hostmem.tracking_stats()["tracked_blocks"] == 0
            fresh = np.ones((512, 512), np.float32)
            fresh[...] = 2.0
            _check(fresh @ b, fresh, b)
        finally:
            lib.fastmm_hostalloc_limit(_hostmem._pool_limit())


def test_a_failed_copy_leaves_its_block_writable_and_untracked(gpu, rng, monkeypatch):
    # The upload fails (out of GPU memory, say): NumPy computes the product, and the block that was made read-only for
    # the copy is not left tracked with no copy of it (every later write would fault for nothing, and its slot be lost).
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    fails = []

    def upload(host):
        fails.append(host.nbytes)
        raise MemoryError("out of device memory (stand-in)")

    monkeypatch.setattr(gpu.device, "upload", upload)
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        b = rng.standard_normal((512, 8)).astype(np.float32)
        with pytest.warns(fastmm.PerformanceWarning, match="MemoryError"):
            for _ in range(2):
                _check(a @ b, a, b)
        assert fails == [a.nbytes]
        assert _hostmem.generation(a.ctypes.data) == 0 and _hostmem.tracking_stats()["tracked_blocks"] == 0
        faults = _hostmem.tracking_stats()["write_faults"]
        a[0, 0] = 1.0
        assert _hostmem.tracking_stats()["write_faults"] == faults


def test_a_stale_copy_of_another_range_of_the_block_does_not_undo_a_new_copy(gpu, rng):
    # x[:256] kept, then x written (that copy stale), then x[256:] kept: dropping the stale copy of the same block must
    # not untrack the block just made read-only for the new one (the new upload would be thrown away).
    with fastmm.accelerate_numpy(EVERYTHING):
        x = rng.standard_normal((1024, 512)).astype(np.float32)
        w = rng.standard_normal((512, 8)).astype(np.float32)
        top, bottom = x[:256], x[256:]
        for _ in range(2):
            _check(top @ w, top, w)
        assert gpu.device.uploads == [top.nbytes]
        x[0, 0] = 5.0
        for _ in range(3):
            _check(bottom @ w, bottom, w)
        stats = fastmm.numpy_hook_status()["cache"]
    assert gpu.device.uploads == [top.nbytes, bottom.nbytes], gpu.device.uploads
    assert stats["uploads"] == 2 and stats["hits"] >= 2, stats


def test_a_product_that_took_the_cache_before_restore_numpy_keeps_nothing(gpu, rng):
    # A thread inside the loop holds the cache when another calls restore_numpy: its copies must not make a block
    # read-only after every block was made writable (nothing would untrack it again).
    fastmm.accelerate_numpy(EVERYTHING)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    b = rng.standard_normal((512, 8)).astype(np.float32)
    cache = hook._state.cache
    fastmm.restore_numpy()
    operands = ((a.ctypes.data, (1, 512, 512), (0, 2048, 4), 1), (b.ctypes.data, (1, 512, 8), (0, 32, 4), 1))
    for _ in range(3):
        cache.decide(EVERYTHING, 1, 512, 512, 8, operands, "float32")
    assert gpu.device.uploads == [] and _hostmem.tracking_stats()["tracked_blocks"] == 0


def test_a_smaller_cap_given_later_drops_copies_down_to_it(gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING, cache_bytes=8 * MiB):
        b = rng.standard_normal((512, 8)).astype(np.float32)
        arrays = [rng.standard_normal((512, 512)).astype(np.float32) for _ in range(4)]  # 1 MiB each
        for a in arrays:
            _cached(gpu, a, b) if a is arrays[0] else [_check(a @ b, a, b) for _ in range(2)]
        assert fastmm.numpy_hook_status()["cache"]["bytes"] == 4 * MiB
        with fastmm.accelerate_numpy(EVERYTHING, cache_bytes=2 * MiB):
            stats = fastmm.numpy_hook_status()["cache"]
            assert stats["bytes"] <= 2 * MiB and stats["bytes_cap"] == 2 * MiB, stats
            assert _hostmem.tracking_stats()["tracked_blocks"] == stats["entries"]


# --------------------------------------------------------------------------------------------------------
# The fast path (fastmm/_hooks/fastpath.py): a kept operand times small ones, on the hook's own GPU product, against
# the stand-in CuPy whose streams run late (a buffer refilled or read too early gives wrong numbers, as on a GPU)
# --------------------------------------------------------------------------------------------------------

class LazyDevice(StandInDevice):
    """The cache's device on the stand-in CuPy: its copies and their views are the stand-in's device arrays."""

    def __init__(self, gpu):
        super().__init__()
        self.gpu = gpu

    def upload(self, host):
        self.uploads.append(host.nbytes)
        dev = self.gpu.cupy.empty(host.shape, host.dtype)
        dev[...] = host
        return dev

    def view(self, dev, offset, shape, strides, dtype):
        return super().view(dev, offset, shape, strides, dtype).view(type(dev))


@pytest.fixture
def fast_gpu(monkeypatch):
    """The hook's own GPU product (the fast path, and the general one for the rest) on the stand-in CuPy."""
    gpu = use_lazy_gpu(monkeypatch, inline=True, small_pieces=False)
    gpu.device = LazyDevice(gpu)
    monkeypatch.setattr(hook._state, "device", gpu.device)
    monkeypatch.setattr(hook, "_why_no_gpu", lambda: None)
    monkeypatch.setattr(hook, "compute_capability", lambda: (9, 0))  # float64 products taken too
    yield gpu
    fastmm.restore_numpy()


def _fast_hits():
    return fastmm.numpy_hook_status()["cache"]["fast_hits"]


def kept_then_fast(x, y, out=None, products=3, check=None):
    """x @ y (into `out`) `products` times, each checked against float64's (`check(got, x, y)`, by default element by
    element): the second buys the kept operand (at the latest), and every product from then on is served from its
    copy by the fast path. (The GPU tests run it too.)"""
    fast = []
    for _ in range(products):
        before = _fast_hits()
        got = np.matmul(x, y) if out is None else np.matmul(x, y, out=out)
        (check or _check)(got, x, y)
        fast.append(_fast_hits() - before)
    assert fast[1:] == [1] * (products - 1), (fast, fastmm.numpy_hook_status()["cache"])


def fast_into_a_strided_out(rng, check=None):
    """A kept A times a small V into every other column of a buffer: the columns between are left as they were."""
    a = rng.standard_normal((1024, 768)).astype(np.float32)
    v = rng.standard_normal((768, 4)).astype(np.float32)
    buf = np.full((1024, 8), 5.0, np.float32)
    kept_then_fast(a, v, out=buf[:, ::2], check=check)
    assert (buf[:, 1::2] == 5.0).all()
    return a


LAYOUTS = {  # (kept operand from A, small operand from the rng): A is 1024x768, in fastmm's pool
    "A @ v": lambda a, r: (a, r.standard_normal(768)),
    "A @ V, few columns": lambda a, r: (a, r.standard_normal((768, 8))),
    "v @ A": lambda a, r: (r.standard_normal(1024), a),
    "U @ A, few rows": lambda a, r: (r.standard_normal((4, 1024)), a),
    "A.T @ v": lambda a, r: (a.T, r.standard_normal(1024)),
    "A[::-1] @ v": lambda a, r: (a[::-1], r.standard_normal(768)),
    "a slice of A @ v": lambda a, r: (a[100:900, 200:700], r.standard_normal(500)),
    "Fortran A @ v": lambda a, r: (np.asfortranarray(a), r.standard_normal(768)),
    "A @ a strided v": lambda a, r: (a, r.standard_normal(3 * 768)[::3]),
    "A @ a Fortran V": lambda a, r: (a, np.asfortranarray(r.standard_normal((768, 16)))),
    "V.T @ A.T, a transposed few-row": lambda a, r: (r.standard_normal((768, 6)).T, a.T),
    "A.T @ A, both kept": lambda a, r: (a[:, :500].T, a[:, :500]),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=str)
def test_a_kept_operand_times_a_small_one_takes_the_fast_path_in_every_layout(fast_gpu, rng, layout, dtype):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(dtype)
        x, y = (z.astype(dtype, copy=False) for z in LAYOUTS[layout](a, rng))
        kept_then_fast(x, y)
        assert len(fast_gpu.device.uploads) == 1  # (the bytes the view spans)


def test_the_fast_path_writes_a_strided_out_and_leaves_the_rest(fast_gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        fast_into_a_strided_out(rng)


def test_page_locked_small_operands_go_by_dma(fast_gpu, rng, monkeypatch):
    # Blocks of fastmm's pool are page-locked (here: said to be): the GPU copies them directly, with no pinned buffer.
    monkeypatch.setattr(_hostmem, "pool_pinned", lambda x: _hostmem.block(x.__array_interface__["data"][0]) is not None)
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(np.float32)
        w = rng.standard_normal((768, 512)).astype(np.float32)  # 1.5 MiB, and a 2 MiB result: both in the pool
        out = np.empty((1024, 512), np.float32)
        kept_then_fast(a, w, out=out)
        assert _fastpath._local.devices[0].pinned is None


def test_operands_that_grow_a_little_each_product_take_a_new_buffer_a_handful_of_times(fast_gpu, rng, monkeypatch):
    """A kept A times V[:, :j] for j = 1 .. 199 (a block Krylov method's growing basis): buffers in powers of two, each
    of its own (page-locked memory from CuPy's pool would stay locked for good at every size it was ever given)."""
    sizes = []
    real = _fastpath._page_locked
    monkeypatch.setattr(_fastpath, "_page_locked", lambda n: sizes.append(n) or real(n))
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(np.float32)
        v = rng.standard_normal((768, 200)).astype(np.float32)
        a @ v[:, :1]
        before = _fast_hits()
        for j in range(1, 200):
            _check(a @ v[:, :j], a, v[:, :j])
        assert _fast_hits() - before == 199
    assert len(sizes) <= 6 and all(n & (n - 1) == 0 for n in sizes), sizes


@pytest.mark.parametrize("too_large", ["operand", "result"])
def test_larger_operands_or_results_take_the_general_path(fast_gpu, rng, monkeypatch, too_large):
    monkeypatch.setattr(_fastpath, "MAX_BYTES", 64 << 10)
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((256, 4096)).astype(np.float32)
        x, y = (a, rng.standard_normal((4096, 8))) if too_large == "operand" else (a.T, rng.standard_normal((256, 8)))
        y = y.astype(np.float32)  # 128 KiB, or a 128 KiB result
        hits = fastmm.numpy_hook_status()["cache"]["hits"]
        for _ in range(3):
            _check(x @ y, x, y)
        assert fastmm.numpy_hook_status()["cache"]["hits"] == hits + 2 and _fast_hits() == 0
        assert fast_gpu.device.uploads == [a.nbytes]


@pytest.mark.parametrize("how", list(WRITES), ids=str)
def test_a_written_operand_is_never_read_stale_on_the_fast_path(fast_gpu, rng, how):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 512)).astype(np.float32)
        s = rng.standard_normal((512, 512)).astype(np.float32)
        v = rng.standard_normal(512).astype(np.float32)
        kept_then_fast(a, v)
        before = a.copy()
        WRITES[how](a, s)
        assert not np.array_equal(a, before)
        _check(a @ v, a, v)
        assert fastmm.numpy_hook_status()["cache"]["invalidated_by_writes"] >= 1


def test_threads_take_the_fast_path_at_once_each_on_its_own_stream(fast_gpu, rng):
    errors, streams = [], []

    def work(seed):
        try:
            r = np.random.default_rng(seed)
            a = r.standard_normal((512, 640)).astype(np.float32)
            for _ in range(30):
                v = r.standard_normal(640).astype(np.float32)
                np.testing.assert_allclose(a @ v, _ref(a, v), rtol=1e-5, atol=1e-4)
            streams.append(_fastpath._local.devices[0].stream)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    with fastmm.accelerate_numpy(EVERYTHING):
        # (NumPy's allocator is a setting of each thread: each puts fastmm's in place for its arrays.)
        threads = [threading.Thread(target=lambda s=s: (_hostmem.install_allocator(), work(s))) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len({id(s) for s in streams}) == 4
        assert _fast_hits() >= 4 * 28, fastmm.numpy_hook_status()["cache"]


def test_threads_that_come_and_go_hand_their_streams_on(fast_gpu, rng, monkeypatch):
    """Forty threads one after another, each taking the fast path (a server's thread per request): each new thread
    takes the stream, event and buffer of one that ended, so one set serves them all; two at once, at most two."""
    monkeypatch.setattr(_fastpath, "_idle", {})
    made, real = [], _fastpath._Thread
    monkeypatch.setattr(_fastpath, "_Thread", lambda cp: made.append(1) or real(cp))
    errors = []

    def request(seed, a):
        try:
            _hostmem.install_allocator()
            v = np.random.default_rng(seed).standard_normal(640).astype(np.float32)
            np.testing.assert_allclose(a @ v, _ref(a, v), rtol=1e-5, atol=1e-4)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((512, 640)).astype(np.float32)
        kept_then_fast(a, rng.standard_normal(640).astype(np.float32))
        hits, made[:] = _fast_hits(), []
        for seed in range(40):
            t = threading.Thread(target=request, args=(seed, a))
            t.start()
            t.join()
            del t
        assert errors == [] and _fast_hits() - hits == 40
        assert len(made) == 1, len(made)
        pair = [threading.Thread(target=request, args=(s, a)) for s in (1, 2)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        assert errors == [] and len(made) <= 2


def test_an_interrupt_in_the_fast_paths_wait_keeps_the_result_whole_and_the_path_usable(fast_gpu, rng, monkeypatch):
    if hook._state.shim is None or hook._state.shim.kind != "C":
        fastmm.accelerate_numpy(EVERYTHING)
        if hook._state.shim.kind != "C":
            pytest.skip("the ctypes loop simulates the interrupt (test_numpy_hook.py tests it)")
    real, interrupts = _fastpath._wait, []

    def wait(event):
        if not interrupts:
            interrupts.append(1)
            raise KeyboardInterrupt  # Ctrl-C while the GPU computes
        real(event)

    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(np.float32)
        v = rng.standard_normal(768).astype(np.float32)
        want = _without_hook(lambda: a @ v)  # (the hook off a moment: no copy kept)
        kept_then_fast(a, v)
        monkeypatch.setattr(_fastpath, "_wait", wait)
        out = np.full(1024, np.nan, np.float32)
        with pytest.raises(KeyboardInterrupt):
            np.matmul(a, v, out=out)
        assert np.array_equal(out, want)  # NumPy's loop computed all of it
        stream = _fastpath._local.devices[0].stream
        assert stream.done == len(stream.work)  # nothing of the interrupted product left queued
        kept_then_fast(a, v, products=2)


def test_a_failure_on_the_fast_path_gives_numpys_result(fast_gpu, rng, monkeypatch):
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(np.float32)
        v = rng.standard_normal(768).astype(np.float32)
        want = _without_hook(lambda: a @ v)
        kept_then_fast(a, v)

        def out_of_memory(*args):
            raise fastmm.OutOfMemoryError("stand-in: out of GPU memory")

        with monkeypatch.context() as m:
            m.setattr(_fastpath._arrays, "empty", out_of_memory)
            with pytest.warns(fastmm.PerformanceWarning, match="OutOfMemoryError"):
                np.testing.assert_array_equal(a @ v, want)
        kept_then_fast(a, v, products=2)  # the copy still kept: both products on the fast path


def test_turning_the_hook_off_frees_the_fast_paths_buffers(fast_gpu, rng):
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((1024, 768)).astype(np.float32)
        v = rng.standard_normal(768).astype(np.float32)
        kept_then_fast(a, v)
        me = _fastpath._local.devices[0]
        assert me.pinned is not None
    assert me.pinned is None
    with fastmm.accelerate_numpy(EVERYTHING):
        kept_then_fast(a, v)  # (its block was made writable again: kept anew)
    assert me.pinned is None


def test_a_wait_spins_then_sleeps(monkeypatch):
    """Queries while the spin lasts, then a sleeping wait. The spin's length is set here (a loaded machine's
    scheduler may hold a yielding thread past a millisecond), so that what is tested is the order, not the clock."""
    class Event:
        def __init__(self, ready_after):
            self.queries, self.ready_after, self.slept = 0, ready_after, False

        @property
        def done(self):
            self.queries += 1
            return self.queries > self.ready_after

        def synchronize(self):
            self.slept = True

    soon, late = Event(3), Event(10**9)
    monkeypatch.setattr(_fastpath, "_SPIN_SECONDS", 60.0)
    _fastpath._wait(soon)
    monkeypatch.setattr(_fastpath, "_SPIN_SECONDS", 1e-3)
    _fastpath._wait(late)
    assert soon.queries == 4 and not soon.slept  # done within the spin: no sleeping wait
    assert late.slept  # past _SPIN_SECONDS: asleep until it is done
