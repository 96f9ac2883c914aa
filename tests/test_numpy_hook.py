"""accelerate_numpy() without a GPU: NumPy's loop replaced and restored, what reaches fastmm, fallbacks, threads.

A stand-in "GPU" (a float64 NumPy product written into NumPy's output buffer, recording what it was handed) takes
the place of the staged GPU product, so these tests check the plumbing on any machine: which products NumPy's loop
hands over, with which shapes and strides, that everything else stays NumPy's bit for bit, that a failure or an
interrupt never loses a result, and that uninstalling puts NumPy's own loop back. `_staged`'s splitting into
pieces runs against a stand-in CuPy. The GPU itself is tested in test_gpu_numpy_hook.py.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings

import numpy as np
import pytest

import fastmm
from fastmm._hooks import fastpath as _fastpath
from fastmm._hooks import numpy_hook as hook
from fastmm._hooks import numpy_loop
from fastmm._hooks import staged as _staged

EVERYTHING = hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0)  # predicts the GPU faster for any product
NOTHING = hook.HostModel(host=1e18, link=1.0, gpu=1.0, overhead=1.0)


class StandInGPU:
    """Computes in float64 (so its results differ from NumPy's float32 loop) and records each call."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, a, b, c):
        with self.lock:
            self.calls.append((a.shape, b.shape, c.shape, a.strides, b.strides, c.strides))
        a, b = getattr(a, "dev", a), getattr(b, "dev", b)  # an operand kept on the stand-in device: its copy
        wide = np.complex128 if np.iscomplexobj(c) else np.float64
        c[...] = np.matmul(a.astype(wide), b.astype(wide))


class StandInDevice:
    """The cache's device: copies in host memory (a stale copy gives a wrong product), each upload recorded."""

    def __init__(self, free=1 << 30):
        self.uploads, self.free = [], free

    def free_bytes(self):
        return self.free

    def prepare(self, host):
        pass

    def upload(self, host):
        self.uploads.append(host.nbytes)
        return host.copy()

    def view(self, dev, offset, shape, strides, dtype):
        return np.ndarray(shape, dtype, buffer=dev, offset=offset, strides=strides)


@pytest.fixture
def gpu(monkeypatch):
    fake = StandInGPU()
    fake.device = StandInDevice()
    monkeypatch.setattr(hook._state, "product", fake)
    monkeypatch.setattr(hook._state, "device", fake.device)
    yield fake
    fastmm.restore_numpy()


def _current_loop() -> int:
    """np.matmul's float32 loop address now (swapped for fastmm's loop, which computes the same, and back)."""
    if hook._state.shim is None:
        fastmm.accelerate_numpy(NOTHING)
        fastmm.restore_numpy()
    now = hook._replace_loop(hook._state.shim.address)
    hook._replace_loop(now)
    return now


def _ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def test_install_and_restore_put_numpys_loop_back_exactly(gpu):
    before = _current_loop()
    assert before == hook._state.shim.numpy_loop  # what the first install found in the slot
    fastmm.accelerate_numpy(EVERYTHING)
    fastmm.accelerate_numpy(EVERYTHING)  # idempotent
    assert _current_loop() == hook._state.shim.address != before
    assert fastmm.numpy_hook_status()["active"]
    fastmm.restore_numpy()
    fastmm.restore_numpy()  # idempotent
    assert _current_loop() == before
    assert not fastmm.numpy_hook_status()["active"]
    with fastmm.accelerate_numpy(EVERYTHING):  # the context manager restores what it found
        assert _current_loop() == hook._state.shim.address
    assert _current_loop() == before
    fastmm.accelerate_numpy(EVERYTHING)
    with fastmm.accelerate_numpy(EVERYTHING):
        pass
    assert _current_loop() == hook._state.shim.address  # it was on before the block: still on


CASES = [  # (a shape, b shape, what the loop sees as batch, m, k, n)
    ((300, 200), (200, 100), (1, 300, 200, 100)),
    ((4, 30, 20), (20, 10), (4, 30, 20, 10)),               # b broadcast over the batch: batch stride 0
    ((30, 20), (4, 20, 10), (4, 30, 20, 10)),
    ((2, 1, 30, 20), (3, 20, 10), (3, 30, 20, 10)),          # NumPy loops over the outer axis itself
    ((20,), (20, 10), (1, 1, 20, 10)),                       # 1-D operands become a row / a column
    ((30, 20), (20,), (1, 30, 20, 1)),
]


@pytest.mark.parametrize("ashape,bshape,seen", CASES, ids=str)
def test_every_form_reaches_fastmm_with_numpys_shapes(gpu, ashape, bshape, seen, rng):
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    with fastmm.accelerate_numpy(EVERYTHING):
        got = a @ b
        also = np.matmul(a, b)
    assert got.dtype == np.float32 and got.shape == np.matmul(a, b).shape
    np.testing.assert_allclose(got, _ref(a, b), rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(got, also)
    (sa, sb, sc, *_), = {call[:3] + (0,) for call in gpu.calls}
    assert (sa[0], sa[1], sa[2], sb[2]) == seen


def test_strided_transposed_out_and_inplace_operands(gpu, rng):
    a = rng.standard_normal((64, 80)).astype(np.float32)
    b = rng.standard_normal((90, 64)).astype(np.float32)
    out = np.full((100, 80), np.nan, np.float32).T[:, :90]  # a non-contiguous out
    with fastmm.accelerate_numpy(EVERYTHING):
        r = np.matmul(a.T[::2], b.T)
        np.matmul(a.T, b.T, out=out)
        x = rng.standard_normal((50, 50)).astype(np.float32)
        x0 = x.copy()
        x @= x  # NumPy makes the temporary; the loop sees separate buffers
    np.testing.assert_allclose(r, _ref(a.T[::2], b.T), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(out, _ref(a.T, b.T), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(x, _ref(x0, x0), rtol=1e-6, atol=1e-5)
    strides = [c[3:] for c in gpu.calls]
    assert any(s[0][1:] == (4, 320) for s in strides), strides  # a.T reached fastmm as it is, with its strides


def test_other_dtypes_and_small_products_stay_numpys_bit_for_bit(gpu, rng):
    with fastmm.accelerate_numpy(NOTHING):
        a = rng.standard_normal((64, 64)).astype(np.float32)
        assert np.array_equal(a @ a, _without_hook(lambda: a @ a))
    with fastmm.accelerate_numpy(EVERYTHING):
        for dt in (np.float16, np.int32, np.int64):  # (float64 and the complex dtypes have loops of their own)
            x = (rng.standard_normal((40, 40)) * 4).astype(dt)
            assert np.array_equal(x @ x, _without_hook(lambda: x @ x)), dt
        y = rng.standard_normal((40, 40)).astype(np.float32)
        for func in (np.dot, np.inner, np.tensordot, lambda p, q: np.einsum("ij,jk", p, q)):
            assert np.array_equal(func(y, y), _without_hook(lambda: func(y, y)))  # BLAS, not the matmul loop
    assert gpu.calls == []


def _without_hook(f):
    active = fastmm.numpy_hook_status()["active"]
    fastmm.restore_numpy()
    try:
        return f()
    finally:
        if active:
            fastmm.accelerate_numpy(hook._state.model)


def test_threshold_is_the_models(gpu):
    model = hook.HostModel(host=1e12, link=25e9, gpu=50e12, overhead=100e-6)
    side = round((model.min_flops() / 2) ** (1 / 3))
    assert model.offloads(1, side, side, side) and not model.offloads(1, side - 2, side - 2, side - 2)
    assert not model.offloads(1, 8192, 8192, 1)  # a matrix-vector product: the link, not FLOPs, decides
    assert f"{side}^3" in model.threshold_text()
    with fastmm.accelerate_numpy(model):
        s = np.ones((side - 8, side - 8), np.float32)
        s @ s
        big = np.ones((side + 8, side + 8), np.float32)
        big @ big
    assert [c[0][1] for c in gpu.calls] == [side + 8]


def test_a_failure_gives_numpys_result_and_one_warning(gpu, monkeypatch, rng):
    def broken(a, b, c):
        c[...] = 7.0  # a partial write before failing must not survive
        raise fastmm.OutOfMemoryError("stand-in: out of GPU memory")

    monkeypatch.setattr(hook._state, "product", broken)
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    a = rng.standard_normal((70, 70)).astype(np.float32)
    want = a @ a
    with fastmm.accelerate_numpy(EVERYTHING), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [a @ a for _ in range(3)]
    assert all(np.array_equal(g, want) for g in got)
    msgs = [str(w.message) for w in seen if issubclass(w.category, fastmm.PerformanceWarning)]
    assert len(msgs) == 1 and "OutOfMemoryError" in msgs[0] and "NumPy computed it" in msgs[0]


def test_warnings_as_errors_do_not_break_numpys_call(gpu, monkeypatch, rng):
    monkeypatch.setattr(hook._state, "product", lambda a, b, c: 1 / 0)
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    a = rng.standard_normal((70, 70)).astype(np.float32)
    with fastmm.accelerate_numpy(EVERYTHING), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(a @ a, _without_hook(lambda: a @ a))


def _interrupted(a, b, c):
    c[...] = 0.0
    raise KeyboardInterrupt


def test_an_interrupt_keeps_the_result_whole_and_reaches_the_program(gpu, monkeypatch, rng):
    # np.matmul itself raises it (no waiting for a signal check): NumPy's loop computed the whole product first.
    if hook._state.shim is None:
        fastmm.accelerate_numpy(NOTHING)
        fastmm.restore_numpy()
    if hook._state.shim.kind != "C":
        pytest.skip("this machine cannot build fastmm/_hooks/hostloop.c, and the ctypes loop simulates the interrupt "
                    "instead (tested in test_the_ctypes_loop_passes_an_interrupt_on)")
    monkeypatch.setattr(hook._state, "product", _interrupted)
    a = rng.standard_normal((70, 70)).astype(np.float32)
    want = _without_hook(lambda: a @ a)
    out = np.empty_like(a)
    with fastmm.accelerate_numpy(EVERYTHING):
        with pytest.raises(KeyboardInterrupt):
            np.matmul(a, a, out=out)
        assert np.array_equal(out, want)
        # Several loop calls in one np.matmul (a batch NumPy cannot walk as one): the first interrupt stops
        # fastmm's part for the rest, every matrix is still NumPy's, and one KeyboardInterrupt comes out.
        x = rng.standard_normal((3, 4, 70, 70)).astype(np.float32)[:, ::2]
        out = np.empty((3, 2, 70, 70), np.float32)
        with pytest.raises(KeyboardInterrupt):
            np.matmul(x, a, out=out)
        assert np.array_equal(out, _without_hook(lambda: x @ a))
        # And from a thread of the program's own, on that thread.
        seen = []

        def work():
            try:
                a @ a
            except KeyboardInterrupt:
                seen.append("raised")

        t = threading.Thread(target=work)
        t.start()
        t.join()
        assert seen == ["raised"]


def test_the_ctypes_loop_keeps_the_result_whole(monkeypatch, rng):
    """Where no C compiler builds the loop, a ctypes callback cannot leave an exception for NumPy to raise: the
    interrupt is re-sent as a signal, which reaches the main thread at a later check (other threads can delay it;
    docs/numpy-hook.md). The result is NumPy's, whole. In a child process: the signal may arrive at any later time."""
    code = textwrap.dedent("""
        import time, numpy as np, fastmm
        from fastmm._hooks import numpy_hook as hook
        def interrupted(a, b, c):
            c[...] = 0.0
            raise KeyboardInterrupt
        from fastmm._hooks import numpy_loop
        numpy_loop.compile_c_loop = lambda: None  # as on a machine without a C compiler
        hook._state.product = interrupted
        a = np.random.default_rng(1).standard_normal((70, 70)).astype(np.float32)
        want = a @ a
        out = np.empty_like(a)
        fastmm.accelerate_numpy(hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0))
        assert hook._state.shim.kind == "ctypes"
        try:
            np.matmul(a, a, out=out)
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass
        print("whole" if np.array_equal(out, want) else "torn")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "whole", p.stdout + p.stderr


def test_threads_multiply_while_another_installs_and_restores(gpu, rng):
    a = rng.standard_normal((96, 96)).astype(np.float32)
    want, exact = _ref(a, a), _without_hook(lambda: a @ a)
    errors = []
    stop = threading.Event()

    def work():
        try:
            while not stop.is_set():
                c = a @ a
                # Either path, never anything else: the GPU's (float64 here) or NumPy's bit-identical one.
                if not (np.array_equal(c, exact) or np.allclose(c, want, rtol=1e-6, atol=1e-5)):
                    errors.append("wrong result")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for _ in range(100):
        fastmm.accelerate_numpy(EVERYTHING)
        time.sleep(0.002)
        fastmm.restore_numpy()
        time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert gpu.calls  # some products did go through the hook


def test_without_a_c_compiler_the_ctypes_loop_does_the_same(monkeypatch, rng):
    """A fresh process (the C loop, once built, is kept for the process's life) with no compiler on PATH."""
    code = textwrap.dedent("""
        import os, warnings, numpy as np, fastmm
        from fastmm._hooks import numpy_hook as hook
        calls = []
        def fake(a, b, c):
            calls.append(a.shape)
            c[...] = a.astype(np.float64) @ b.astype(np.float64)
        hook._state.product = fake
        a = np.random.default_rng(1).standard_normal((70, 70)).astype(np.float32)
        want = a @ a
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fastmm.accelerate_numpy(hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0))
        assert fastmm.numpy_hook_status()["loop"] == "ctypes", fastmm.numpy_hook_status()
        assert any("no C compiler" in str(w.message) for w in seen)
        c = a @ a
        assert calls == [(1, 70, 70)] and np.allclose(c, want, rtol=1e-5, atol=1e-4)
        small = np.ones((3, 3), np.float32)
        assert np.array_equal(small @ small, np.full((3, 3), 3, np.float32)) and len(calls) == 2
        fastmm.restore_numpy()
        assert np.array_equal(a @ a, want) and len(calls) == 2
        print("ok")
    """)
    env = {"PATH": "/nonexistent", "CC": "", "HOME": "/tmp", "PYTHONPATH": ":".join(sys.path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_the_hook_starts_the_gpu_on_a_thread_of_its_own_once_per_device(monkeypatch):
    """With a GPU present, turning the hook on starts the current device's CUDA context in the background (the first
    offloaded product then finds it made), once per device and process; warm_up=False and a process without a GPU
    start nothing."""
    from fastmm._runtime import cuda as _cuda

    started, device = [], [3]
    monkeypatch.setattr(_cuda, "_warmed", set())
    monkeypatch.setattr(_cuda, "warm_up", lambda d: started.append((d, threading.current_thread().name)))
    runtime = types.SimpleNamespace(getDevice=lambda: device[0])
    monkeypatch.setattr(_cuda, "_driver", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(hook, "_why_no_gpu", lambda: "no GPU in this test")
    try:
        fastmm.accelerate_numpy()
        assert not _cuda._warmed and not started
        monkeypatch.setattr(hook, "_why_no_gpu", lambda: None)
        fastmm.accelerate_numpy(warm_up=False)
        assert not _cuda._warmed
        for _ in range(3):
            fastmm.accelerate_numpy()
        device[0] = 5
        with fastmm.accelerate_numpy():
            pass
        for thread in threading.enumerate():
            if thread.name == "fastmm-warm-up":
                thread.join(5)
        assert sorted(started) == [(3, "fastmm-warm-up"), (5, "fastmm-warm-up")]
    finally:
        fastmm.restore_numpy()


def test_a_warm_up_that_fails_leaves_the_error_to_the_products(monkeypatch, caplog):
    import logging

    from fastmm._runtime import cuda as _cuda

    def broken(device_id):
        raise RuntimeError("cudaErrorDevicesUnavailable")

    monkeypatch.setattr(_cuda, "_context", broken)
    with caplog.at_level(logging.DEBUG, logger="fastmm"):
        _cuda.warm_up(0)  # no exception
    assert "warm-up of CUDA device 0 failed: cudaErrorDevicesUnavailable" in caplog.text


def test_a_process_that_ends_during_the_warm_up_exits_cleanly():
    """A program that turns the hook on and ends at once: the warm-up thread (here a slow stand-in for the driver) is
    waited for before Python finalises, and the process exits 0."""
    code = textwrap.dedent("""
        import time
        import fastmm
        from fastmm._hooks import numpy_hook
        from fastmm._runtime import cuda
        done = []
        cuda.warm_up = lambda d: (time.sleep(0.5), done.append(d))
        cuda._driver = lambda: type("D", (), {"cuda": type("C", (), {"runtime": type("R", (), {
            "getDevice": staticmethod(lambda: 0)})})})
        numpy_hook._why_no_gpu = lambda: None
        import atexit
        atexit.register(lambda: print("warmed", done, flush=True))  # (runs after the hook's own, registered later)
        fastmm.accelerate_numpy()
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "warmed [0]" in p.stdout, p.stdout + p.stderr


def test_a_process_with_the_hook_on_exits_cleanly():
    code = textwrap.dedent("""
        import threading, numpy as np, fastmm
        from fastmm._hooks import numpy_hook as hook
        import warnings
        def down(a, b, c):
            raise RuntimeError("stand-in: the GPU is down")
        hook._state.product = down
        warnings.simplefilter("ignore")
        fastmm.accelerate_numpy(hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0))
        a = np.ones((64, 64), np.float32)
        ts = [threading.Thread(target=lambda: a @ a) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert (a @ a)[0, 0] == 64
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr


# --------------------------------------------------------------------------------------------------------
# _staged: the pieces of a product, and the staging threads against a stand-in GPU that runs its work late
# --------------------------------------------------------------------------------------------------------

_POISON = {"f": np.nan, "u": 0xCD, "i": -1}  # what new stand-in device memory holds


class _LazyGPU:
    """A stand-in CuPy whose streams run queued work only when an event recorded after it (or the stream) is
    synchronized, or when another stream that waits on such an event runs: each copy reads its source then, so a
    pinned slot refilled too early, a result read too early or a missing wait gives wrong numbers here, as on a
    GPU. One lock orders everything (the staging threads call in from several threads)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.local = threading.local()
        self.products = []
        self.null = _LazyStream(self)
        gpu = self

        class Array(np.ndarray):
            device = types.SimpleNamespace(id=0)
            data = property(lambda self: _LazyMemory(gpu, self))  # (NumPy's own memoryview is not CuPy's)

            def set(self, host, stream=None):
                def upload():
                    self[...] = host
                gpu.queue(stream, upload, blocking=stream is None)

            def get(self, out, stream=None, blocking=True):
                def download():
                    out[...] = self
                gpu.queue(stream, download, blocking)
                return out

        self.cupy = types.SimpleNamespace(
            cuda=types.SimpleNamespace(
                alloc_pinned_memory=lambda n: bytearray(n), PinnedMemory=lambda n: bytearray(n),
                PinnedMemoryPointer=lambda mem, offset: memoryview(mem)[offset:],
                Event=lambda block=False, disable_timing=False: _LazyEvent(),
                Stream=lambda non_blocking=False: _LazyStream(self), get_current_stream=self.current,
                Device=lambda i=0: _NoContext(),
                runtime=types.SimpleNamespace(memGetInfo=lambda: (1 << 30, 1 << 30), getDevice=lambda: 0),
                memory=types.SimpleNamespace(OutOfMemoryError=MemoryError)),
            empty=lambda shape, dtype: np.full(shape, _POISON[np.dtype(dtype).kind], dtype).view(Array), ndarray=Array)

    def current(self):
        stack = getattr(self.local, "streams", None)
        return stack[-1] if stack else self.null

    def queue(self, stream, work, blocking=False):
        stream = stream or self.current()
        with self.lock:
            stream.work.append(work)
        if blocking:
            stream.synchronize()

    def matmul(self, a, b, out=None):
        self.products.append((a.shape, b.shape))
        if out is None:
            shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
            out = self.cupy.empty(shape, np.result_type(a.dtype, b.dtype))

        def compute():
            out[...] = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
        self.queue(None, compute)
        return out


class _LazyMemory:
    """A stand-in device array's memory (host memory here), as CuPy's MemoryPointer: its address, and copies to and
    from page-locked host memory queued on a stream (which read their source when the stream runs them)."""

    def __init__(self, gpu, array):
        self.gpu, self.array, self.ptr = gpu, array, array.__array_interface__["data"][0]

    def copy_from_host_async(self, src, nbytes, stream):
        self.gpu.queue(stream, lambda: ctypes.memmove(self.ptr, src, nbytes))

    def copy_to_host_async(self, dst, nbytes, stream):
        self.gpu.queue(stream, lambda: ctypes.memmove(dst, self.ptr, nbytes))


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _LazyStream:
    def __init__(self, gpu):
        self.gpu, self.work, self.done = gpu, [], 0

    def run_until(self, index):
        with self.gpu.lock:
            while self.done < index:
                work = self.work[self.done]
                self.done += 1
                work()

    def synchronize(self):
        self.run_until(len(self.work))

    def wait_event(self, event):
        stream, index = event.stream, event.index
        self.gpu.queue(self, lambda: stream.run_until(index))

    def __enter__(self):
        stack = getattr(self.gpu.local, "streams", None)
        if stack is None:
            stack = self.gpu.local.streams = []
        stack.append(self)
        return self

    def __exit__(self, *exc):
        self.gpu.local.streams.pop()
        return False


class _LazyEvent:
    def __init__(self):
        self.stream, self.index, self.queries = None, 0, 0

    def record(self, stream=None):
        with self.gpu_lock(stream):
            self.stream = stream
            self.index = len(stream.work)
            self.queries = 0

    @property
    def done(self):
        """The GPU gets there later: the first query after a record says not yet, the next runs the work."""
        self.queries += 1
        if self.queries > 1:
            self.synchronize()
        return self.queries > 1

    @staticmethod
    def gpu_lock(stream):
        return stream.gpu.lock

    def synchronize(self):
        self.stream.run_until(self.index)


def use_lazy_gpu(monkeypatch, inline: bool, small_pieces: bool = True) -> _LazyGPU:
    """The stand-in GPU in place of CuPy and the kernels, for `_staged` (with the copies on the staging threads, or
    those of small products in the calling thread; in many small pieces, so that every slot is reused) and for the
    fast path."""
    gpu = _LazyGPU()
    monkeypatch.setattr(_staged, "_INLINE_BYTES", 1 << 40 if inline else 0)
    monkeypatch.setattr(_staged._arrays, "_cp", gpu.cupy)
    # (Set before the thread-locals: undone after them, it takes the states their end retires, which are the
    # stand-in's.)
    monkeypatch.setattr(_fastpath, "_idle", {})
    for module in (_staged, _fastpath):
        monkeypatch.setattr(module, "_dispatch", types.SimpleNamespace(matmul=gpu.matmul))
        monkeypatch.setattr(module, "_local", threading.local())
    monkeypatch.setattr(_staged, "_pool", None)  # staging threads whose thread-local state is the stand-in's
    monkeypatch.setattr(_staged, "_WORKERS", 3)
    if small_pieces:
        monkeypatch.setattr(_staged, "_CHUNK_BYTES", 1 << 12)
        monkeypatch.setattr(_staged, "_MIN_CHUNK_BYTES", 1 << 10)
        monkeypatch.setattr(_staged, "_BLOCK_BYTES", 1 << 12)
        monkeypatch.setattr(_staged, "_BLOCK_ROWS", 8)
    return gpu


@pytest.fixture(params=["threads", "inline"])
def lazy_gpu(monkeypatch, request):
    gpu = use_lazy_gpu(monkeypatch, request.param == "inline")
    yield gpu
    if _staged._pool is not None:
        _staged._pool.shutdown()


@pytest.mark.parametrize("batch,m,k,n,budget,a_shared,b_shared", [
    (1, 50, 40, 30, 1 << 20, True, True),     # a single product: B up once, A and C in blocks of rows
    (1, 97, 50, 7, 1 << 20, True, True),      # a ragged last block
    (9, 50, 40, 30, 100_000, False, False),   # groups of whole matrices
    (9, 50, 40, 30, 100_000, True, False),    # a uploaded once
    (9, 50, 40, 30, 100_000, False, True),    # b uploaded once
    (9, 50, 40, 30, 100_000, True, True),     # every batch item the same product: computed once
    (1, 300, 40, 200, 120_000, True, True),   # one matrix too large: blocks of rows and columns
    (3, 300, 400, 20, 200_000, False, True),
])
def test_staged_pieces_cover_the_product(lazy_gpu, batch, m, k, n, budget, a_shared, b_shared, rng):
    a = rng.standard_normal((1 if a_shared else batch, m, k)).astype(np.float32)
    b = rng.standard_normal((1 if b_shared else batch, k, n)).astype(np.float32)
    a3, b3 = np.broadcast_to(a, (batch, m, k)), np.broadcast_to(b, (batch, k, n))
    c = np.full((batch, m, n), np.nan, np.float32)
    _staged.matmul_host(a3, b3, c, budget=budget)
    np.testing.assert_allclose(c, _ref(a3, b3), rtol=1e-6, atol=1e-5)
    assert len(lazy_gpu.products) >= (1 if batch > 1 and a_shared and b_shared else 2)
    if batch > 1 and a_shared and b_shared:  # one product's blocks of rows, computed once for the whole batch
        assert sum(a_shape[0] for a_shape, _ in lazy_gpu.products) == m


@pytest.mark.parametrize("which", ["a", "b", "both"])
@pytest.mark.parametrize("batch,m,k,n,budget", [(1, 97, 50, 7, 1 << 20), (1, 300, 40, 200, 120_000),
                                                (9, 50, 40, 30, 100_000)])
def test_operands_already_on_the_gpu_are_read_where_they_are(lazy_gpu, which, batch, m, k, n, budget, rng):
    a = rng.standard_normal((batch, k, m)).astype(np.float32).transpose(0, 2, 1)  # a view with its strides
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    dev_a, dev_b = (lazy_gpu.cupy.empty(x.shape, x.dtype) for x in (a, b))
    dev_a[...], dev_b[...] = a, b
    uploads = []
    up = _staged._upload
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_staged, "_upload", lambda host, jobs, pool: uploads.append(host) or up(host, jobs, pool))
        _staged.matmul_host(dev_a if which != "b" else a, dev_b if which != "a" else b, c, budget=budget)
    np.testing.assert_allclose(c, _ref(a, b), rtol=1e-6, atol=1e-5)
    kept = {"a": [a], "b": [b], "both": [a, b]}[which]
    assert not any(np.shares_memory(host, x) for host in uploads for x in kept)  # read on the GPU, never uploaded
    assert (uploads == []) == (which == "both")


@pytest.mark.parametrize("batch,m,k,n,budget", [(1, 97, 50, 7, 1 << 20), (1, 300, 40, 200, 120_000),
                                                (9, 50, 40, 30, 100_000)])
def test_transposed_operands_go_up_as_their_rows_lie(lazy_gpu, batch, m, k, n, budget, rng):
    """``x.T`` of a C-ordered array goes up as x's rows (whole rows read, no gather of columns) and is read
    transposed on the GPU: every upload the staging makes reads rows with unit stride, and the product is right."""
    base = rng.standard_normal((batch, k, m)).astype(np.float32)
    a = base.transpose(0, 2, 1)
    b = rng.standard_normal((batch, n, k)).astype(np.float32).transpose(0, 2, 1)
    c = np.full((batch, m, n), np.nan, np.float32)
    uploads = []
    up = _staged._upload
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_staged, "_upload", lambda host, jobs, pool: uploads.append(host) or up(host, jobs, pool))
        _staged.matmul_host(a, b, c, budget=budget)
    np.testing.assert_allclose(c, _ref(a, b), rtol=1e-6, atol=1e-5)
    rows = [x for x in uploads if min(x.shape[-2:]) > 1]  # (a block of one row of A is one column of `base`)
    assert rows and all(x.strides[-1] == 4 for x in rows), [(x.shape, x.strides) for x in rows if x.strides[-1] != 4]
    assert any(np.shares_memory(x, base) for x in uploads)


@pytest.mark.parametrize("batch,m,k,n,budget", [(1, 50, 40, 30, 1 << 20), (9, 50, 40, 30, 100_000),
                                                (1, 300, 40, 200, 120_000), (3, 300, 400, 20, 200_000),
                                                (1, 4000, 3000, 2000, 48 << 20), (2, 4000, 3000, 2000, 48 << 20)])
@pytest.mark.parametrize("direct", [False, True])
def test_the_pieces_cover_c_once_and_fit_the_budget_in_flight(batch, m, k, n, budget, direct):
    a = np.zeros((batch, m, k), np.float32)
    b = np.zeros((batch, k, n), np.float32)
    c = np.zeros((batch, m, n), np.float32)
    pieces = _staged.plan(a, b, c, budget, direct)
    for pa, pb, pc in pieces:
        pc += 1  # a view of C: every element is written by exactly one piece
    assert (c == 1).all()
    flight = _staged._DIRECT_IN_FLIGHT if direct and batch == 1 else _staged._IN_FLIGHT

    def nbytes(x):
        return 4 * (x.host if isinstance(x, _staged._Shared) else x).size
    for i in range(len(pieces)):  # the pieces in flight at once, and the shared operands they read
        window = pieces[i:i + flight]
        shared = {id(x): nbytes(x) for p in window for x in p[:2] if isinstance(x, _staged._Shared)}
        own = sum(nbytes(x) for p in window for x in p if not isinstance(x, _staged._Shared))
        assert own + sum(shared.values()) <= budget


def test_page_locked_single_products_go_in_at_least_four_blocks_of_whole_tiles():
    for m, rows in ((2048, 512), (4096, 1024), (8192, 1024), (1000, 256), (300, 128)):
        a = np.zeros((1, m, m), np.float32)
        pieces = _staged.plan(a, a, a, 80 << 30, direct=True)
        assert {p[0].shape[0] for p in pieces[:-1]} == {rows} and len(pieces) == -(-m // rows)
        assert len(_staged.plan(a, a, a, 80 << 30)) <= -(-m * m * 4 // _staged._BLOCK_BYTES)  # staged: 32 MiB blocks


def test_staged_refuses_what_cannot_fit(lazy_gpu):
    a = np.ones((1, 4, 100_000), np.float32)
    b = np.ones((1, 100_000, 4), np.float32)
    with pytest.raises(fastmm.OutOfMemoryError, match="does not fit"):
        _staged.matmul_host(a, b, np.empty((1, 4, 4), np.float32), budget=100_000)


@pytest.mark.parametrize("shape,view", [((3, 150, 100), lambda x: x), ((1, 300, 100), lambda x: x[:, ::-1]),
                                        ((2, 200, 150), lambda x: x.swapaxes(-1, -2)),
                                        ((5, 3000, 7), lambda x: x[:, ::2])],
                         ids=["c", "reversed-rows", "transposed", "every-other-row"])  # (same ids in every xdist worker)
def test_staging_threads_copy_any_layout_exactly(lazy_gpu, shape, view, rng):
    src = view(rng.standard_normal(shape).astype(np.float32))
    dev = _staged.to_device(src)
    assert np.array_equal(np.asarray(dev), src)
    dst = np.full(src.shape, np.nan, np.float32).swapaxes(-1, -2).copy().swapaxes(-1, -2)  # a strided output
    _staged.to_region(dev, dst)
    assert np.array_equal(dst, src)


def test_a_download_takes_the_staging_threads_only_once_its_kernels_are_done(lazy_gpu, monkeypatch, rng):
    """A download (fastmm.dask's to_host) waits for the kernels queued before it in the calling thread: on the staging
    threads its pieces held them all while the GPU drained its queue, and uploads waited behind them."""
    src = rng.standard_normal((40, 30)).astype(np.float32)
    dev = _staged.to_device(src)
    lazy_gpu.matmul(dev, _staged.to_device(np.eye(30, dtype=np.float32)), out=dev)  # a kernel queued before it
    at_handover, real = [], _staged._download

    def download(host, dev_, after, jobs, pool):
        at_handover.append(after.stream.done >= after.index)
        return real(host, dev_, after, jobs, pool)

    monkeypatch.setattr(_staged, "_download", download)
    dst = np.full(src.shape, np.nan, np.float32)
    _staged.to_region(dev, dst)
    assert at_handover == [True] and np.array_equal(dst, src)


def test_a_failed_piece_leaves_no_staging_copy_running(lazy_gpu, rng, monkeypatch):
    """A failure (or an interrupt) mid-product: when matmul_host raises, no staging thread still writes C."""
    calls = []

    def fail_third(a, b, out):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        lazy_gpu.matmul(a, b, out)

    monkeypatch.setattr(_staged, "_dispatch", types.SimpleNamespace(matmul=fail_third))
    a = rng.standard_normal((1, 200, 64)).astype(np.float32)
    b = rng.standard_normal((1, 64, 64)).astype(np.float32)
    c = np.full((1, 200, 64), np.nan, np.float32)
    with pytest.raises(KeyboardInterrupt):
        _staged.matmul_host(a, b, c)
    snapshot = c.copy()
    time.sleep(0.2)
    assert np.array_equal(c, snapshot, equal_nan=True)
    c2 = np.full_like(c, np.nan)
    monkeypatch.setattr(_staged, "_dispatch", types.SimpleNamespace(matmul=lazy_gpu.matmul))
    _staged.matmul_host(a, b, c2)  # the next product still works
    np.testing.assert_allclose(c2, _ref(a, b), rtol=1e-6, atol=1e-5)


def test_uploads_wait_for_work_queued_on_memory_the_pool_hands_out_again(lazy_gpu, monkeypatch):
    """CuPy's pool gives a new array memory freed on the allocating stream while that stream's queued work may still
    read it; the staging copies run on streams of their own, so they must wait for that work first. (They did not:
    a Dask graph's chunk uploads overwrote the operands of products still queued on a busy GPU.)"""
    gpu = lazy_gpu
    recycled = gpu.cupy.empty((4, 4), np.float32)
    recycled[...] = 1.0  # the previous owner's data, which a queued kernel still reads
    seen = np.zeros((4, 4), np.float32)

    def queued_kernel():
        seen[...] = recycled
    gpu.queue(None, queued_kernel)
    monkeypatch.setattr(gpu.cupy, "empty", lambda shape, dtype: recycled)  # the pool hands the same memory out
    dev = _staged.to_device(np.full((4, 4), 7.0, np.float32))
    gpu.null.synchronize()
    assert (seen == 1.0).all(), "the upload overwrote memory before the work queued on it had read it"
    assert (dev == 7.0).all()


def test_large_products_are_staged_by_the_staging_threads(lazy_gpu, rng, monkeypatch):
    """The threads' path is the one taken (not the calling thread's) when the product is over _INLINE_BYTES."""
    names = set()
    real = _staged._up

    def up(dst, src, allocated):
        names.add(threading.current_thread().name.split("_")[0])
        return real(dst, src, allocated)

    monkeypatch.setattr(_staged, "_up", up)
    a = rng.standard_normal((1, 200, 64)).astype(np.float32)
    c = np.full((1, 200, 200), np.nan, np.float32)
    _staged.matmul_host(a, a.swapaxes(1, 2), c)
    np.testing.assert_allclose(c, _ref(a, a.swapaxes(1, 2)), rtol=1e-6, atol=1e-5)
    inline = _staged._INLINE_BYTES > 0
    assert names == ({threading.current_thread().name.split("_")[0]} if inline else {"fastmm-staging"})


def test_a_product_during_interpreter_exit_is_staged_by_its_own_thread(lazy_gpu, rng, monkeypatch):
    """At exit Python shuts the staging threads' pool while a program thread may still multiply: the calling
    thread copies instead, with no warning and the right result."""
    monkeypatch.setattr(_staged, "_INLINE_BYTES", 0)
    pool = _staged._executor()
    pool.shutdown()
    a = rng.standard_normal((1, 60, 50)).astype(np.float32)
    c = np.full((1, 60, 60), np.nan, np.float32)
    _staged.matmul_host(a, a.swapaxes(1, 2), c)
    np.testing.assert_allclose(c, _ref(a, a.swapaxes(1, 2)), rtol=1e-6, atol=1e-5)


def test_status_counts_what_the_hook_took_and_kept_and_why(gpu):
    """numpy_hook_status()["by_dtype"]: per dtype, the products the GPU took and those NumPy kept, by reason."""
    model = hook.HostModel(host=1e11, link=1e9, gpu=1e14, overhead=0.0)  # a slow link: square products from ~600^3
    fastmm.accelerate_numpy(model)

    def counts():
        f32 = fastmm.numpy_hook_status()["by_dtype"]["float32"]
        return (f32["on_gpu"], f32["kept_on_cpu"]["below_threshold"], f32["kept_on_cpu"]["host_predicted_faster"],
                f32["kept_on_cpu"]["after_failure"])

    before = counts()
    small = np.ones((8, 8), np.float32)
    small @ small                                                   # too little work: the loop keeps it
    np.ones((4096, 4096), np.float32) @ np.ones((4096, 16), np.float32)  # enough work, but 64 MiB over a slow link
    big = np.ones((700, 700), np.float32)
    big @ big                                                       # the GPU's
    np.ones((700, 700)) @ np.ones((700, 700))                       # float64: its own lane's, not counted here
    after = counts()
    assert [x - y for x, y in zip(after, before)] == [1, 1, 1, 0], (before, after)
    assert "float32, float64, complex64 and complex128 products only" in \
        fastmm.numpy_hook_status()["by_dtype"]["other dtypes"]


@pytest.mark.parametrize("loop", ["C", "ctypes"])
def test_status_says_where_the_products_time_went(gpu, loop, monkeypatch):
    """by_dtype's seconds: on fastmm's path, in NumPy's loop (the share of a program's time in products is read from
    here, with a model that offloads nothing), and in fastmm's part for products it declined."""
    if loop == "ctypes":
        monkeypatch.setattr(numpy_loop, "compile_c_loop", lambda: None)
        monkeypatch.setattr(hook._state, "shim", None)
    fastmm.accelerate_numpy(NOTHING)
    assert fastmm.numpy_hook_status()["loop"] == loop

    def seconds():
        return dict(fastmm.numpy_hook_status()["by_dtype"]["float32"]["seconds"])

    a = np.ones((600, 600), np.float32)
    before = seconds()
    for _ in range(3):
        a @ a                                           # NumPy's loop: the model offloads nothing
    kept = seconds()
    assert kept["kept_on_cpu"] - before["kept_on_cpu"] > 0 and kept["on_gpu"] == before["on_gpu"]
    fastmm.accelerate_numpy(EVERYTHING)
    a @ a                                               # the stand-in GPU's
    taken = seconds()
    assert taken["on_gpu"] > kept["on_gpu"] and taken["kept_on_cpu"] == kept["kept_on_cpu"]
    fastmm.restore_numpy()


def test_float64_products_take_their_own_loop(gpu, rng):
    """NumPy's default dtype: float64 products reach the GPU through a loop of their own (cuBLAS's DGEMM there),
    with their own model (eight bytes an element); small ones, and everything with float64=False, stay NumPy's bit
    for bit; restore_numpy puts both of NumPy's loops back."""
    def loops():  # NumPy's table now, read by swapping a loop in and back
        probe = hook._state.lanes["float64"].ensure_shim().address
        now = [hook._replace_loop(probe, t) for t in (hook._NPY_FLOAT, hook._NPY_DOUBLE)]
        for t, loop in zip((hook._NPY_FLOAT, hook._NPY_DOUBLE), now):
            hook._replace_loop(loop, t)
        return now

    before = loops()
    a = rng.standard_normal((300, 200))
    b = rng.standard_normal((200, 100))
    with fastmm.accelerate_numpy(EVERYTHING):
        c = a @ b
        assert gpu.calls and gpu.calls[-1][:3] == ((1, 300, 200), (1, 200, 100), (1, 300, 100))
        assert np.allclose(c, a @ b.astype(np.float64)) and c.dtype == np.float64
        f64 = fastmm.numpy_hook_status()["by_dtype"]["float64"]
        assert f64["on_gpu"] >= 1 and f64["seconds"]["on_gpu"] > 0
        assert hook._state.lanes["float64"].model.itemsize == 8
    gpu.calls.clear()
    with fastmm.accelerate_numpy(EVERYTHING, float64=False):
        assert np.array_equal(a @ b, _without_hook(lambda: a @ b))
        assert gpu.calls == []
    fastmm.restore_numpy()
    assert loops() == before


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_products_take_their_own_loops(gpu, rng, dtype):
    """complex64 goes with float32 (cuBLAS's CGEMM), complex128 with float64 (ZGEMM): loops of their own, models of
    their own (elements twice their real dtype's, a quarter of its rate); small products stay NumPy's bit for bit,
    and float64=False keeps complex128 on NumPy; restore_numpy puts NumPy's loop back."""
    name = np.dtype(dtype).name
    lane = hook._state.lanes[name]

    def loop():  # NumPy's complex loop now, read by swapping a loop in and back
        now = hook._replace_loop(lane.ensure_shim().address, lane.type_num)
        hook._replace_loop(now, lane.type_num)
        return now

    before = loop()
    a = (rng.standard_normal((300, 200)) + 1j * rng.standard_normal((300, 200))).astype(dtype)
    b = (rng.standard_normal((200, 100)) + 1j * rng.standard_normal((200, 100))).astype(dtype)
    with fastmm.accelerate_numpy(EVERYTHING):
        c = a @ b[:, ::2]                                              # b strided: the loop gets its strides
        assert gpu.calls and gpu.calls[-1][:3] == ((1, 300, 200), (1, 200, 50), (1, 300, 50))
        assert c.dtype == dtype
        want = a.astype(np.complex128) @ b[:, ::2].astype(np.complex128)
        np.testing.assert_allclose(c, want, rtol=1e-6 if dtype == np.complex64 else 1e-12)  # (the stand-in's rounding)
        status = fastmm.numpy_hook_status()["by_dtype"][name]
        assert status["on_gpu"] >= 1 and status["taken"]
        real = hook._state.lanes["float32" if dtype == np.complex64 else "float64"].model
        assert lane.model.itemsize == 2 * real.itemsize and lane.model.host == real.host / 4
    gpu.calls.clear()
    with fastmm.accelerate_numpy(NOTHING):
        small = a[:8, :8]
        assert np.array_equal(small @ small, _without_hook(lambda: small @ small)) and gpu.calls == []
    with fastmm.accelerate_numpy(EVERYTHING, float64=False):
        c = a @ b
        assert (gpu.calls == []) == (dtype == np.complex128)
        assert fastmm.numpy_hook_status()["by_dtype"][name]["taken"] == (dtype == np.complex64)
    fastmm.restore_numpy()
    assert loop() == before


def test_the_complex_models_count_four_real_multiply_adds_a_complex_one():
    model = hook.HostModel(host=1.4e12, link=14e9, gpu=50e12, overhead=500e-6)
    c64 = hook.complex_model(model)
    assert (c64.host, c64.gpu, c64.itemsize, c64.link, c64.overhead) == (0.35e12, 12.5e12, 8, 14e9, 500e-6)
    # A product of the same sides has four times the real FLOPs for twice the bytes: offloaded from smaller sides on.
    assert c64.min_flops() < model.min_flops()
    c128 = hook.complex_model(hook.float64_model(model, (9, 0)))
    assert c128.itemsize == 16 and c128.host == model.host / 8


def test_float64_stays_numpys_where_the_gpus_fp64_is_slow():
    """Full-rate FP64 (P100, V100, A100, H100/H200, B200): float64's model from float32's; elsewhere none."""
    model = hook.HostModel(host=1.4e12, link=14e9, gpu=50e12, overhead=500e-6)
    f64 = hook.float64_model(model, (9, 0))
    assert f64.itemsize == 8 and f64.host == 0.7e12 and f64.gpu == 25e12
    assert f64.gpu_seconds(1, 4096, 4096, 4096) > model.gpu_seconds(1, 4096, 4096, 4096)  # twice the bytes
    for consumer in ((8, 6), (8, 9), (12, 0), None):
        assert hook.float64_model(model, consumer) is None


def test_numpy_computes_while_the_kernel_compiles(gpu, monkeypatch, rng):
    """A product whose kernel nvcc is still building is NumPy's (bit-identical, no warning), counted by the status:
    the hook never waits for a compile (fastmm/_runtime/compiling.py)."""
    from fastmm._runtime import compiling

    def still_compiling(a, b, c):
        raise compiling.KernelCompiling("fastmm is compiling fewcol_n1_nn_v4 for sm_90")

    monkeypatch.setattr(hook._state, "product", still_compiling)
    a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 100)).astype(np.float32)
    want = a @ b
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastmm.accelerate_numpy(EVERYTHING)
        before = fastmm.numpy_hook_status()["by_dtype"]["float32"]["kept_on_cpu"]
        got = a @ b
        after = fastmm.numpy_hook_status()["by_dtype"]["float32"]["kept_on_cpu"]
    assert np.array_equal(got, want)
    assert after["kernel_compiling"] == before["kernel_compiling"] + 1
    assert after["after_failure"] == before["after_failure"]



def test_a_kind_of_product_waiting_for_its_kernel_declines_at_once(gpu, monkeypatch, rng):
    """While nvcc builds a product's kernel, the next products of that kind (shape, strides, alignment) are NumPy's
    without another try at the GPU (no cache decision, no copy): until the compile thread finishes a binary, or a new
    accelerate_numpy() starts over. Other kinds still try."""
    from fastmm._runtime import compiling

    tries = []

    def still_compiling(a, b, c):
        tries.append(a.shape)
        raise compiling.KernelCompiling("fastmm is compiling fewcol_n16_nn_v4 for sm_90")

    generation = [7]
    monkeypatch.setattr(compiling, "finished", lambda: generation[0])
    monkeypatch.setattr(hook._state, "product", still_compiling)
    a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 100)).astype(np.float32)
    want = a @ b
    with fastmm.accelerate_numpy(EVERYTHING):
        before = fastmm.numpy_hook_status()["by_dtype"]["float32"]["kept_on_cpu"]["kernel_compiling"]
        for _ in range(3):
            assert np.array_equal(a @ b, want)
        after = fastmm.numpy_hook_status()["by_dtype"]["float32"]["kept_on_cpu"]["kernel_compiling"]
        assert len(tries) == 1 and after == before + 3
        a[:, :150] @ b[:150]  # another kind: tries
        assert len(tries) == 2
        generation[0] += 1  # a binary finished: each kind tries once more
        a @ b
        a @ b
        assert len(tries) == 3
    with fastmm.accelerate_numpy(EVERYTHING):
        a @ b
        assert len(tries) == 4
