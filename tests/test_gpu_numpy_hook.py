"""accelerate_numpy() on the GPU: plain NumPy float32 products computed by fastmm's kernels, in every form NumPy
accepts, from threads, in pieces, and falling back to NumPy's loop when the GPU path fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

import fastmm
from fastmm._hooks import fastpath as _fastpath
from fastmm._hooks import numpy_hook as hook
from fastmm._hooks import staged as _staged

pytestmark = pytest.mark.gpu

EVERYTHING = hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0)


@pytest.fixture(autouse=True)
def _off_afterwards():
    yield
    fastmm.restore_numpy()


def _ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _close(got, a, b):
    ref = _ref(a, b)
    assert got.dtype == np.float32 and got.shape == ref.shape
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err


@pytest.mark.parametrize("ashape,bshape", [
    ((513, 257), (257, 129)), ((7, 64, 96), (96, 80)), ((64, 96), (5, 96, 80)), ((3, 1, 40, 50), (4, 50, 30)),
    ((300,), (300, 200)), ((200, 300), (300,)),
], ids=str)
def test_products_of_plain_numpy_arrays_run_on_fastmm(ashape, bshape, rng, launches):
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    with fastmm.accelerate_numpy(EVERYTHING):
        got = a @ b
    assert launches, "no fastmm kernel ran"
    _close(got, a, b)
    assert type(got) is np.ndarray


def test_transposed_strided_out_and_inplace(rng, launches):
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((250, 300)).astype(np.float32)
    out = np.full((250, 260), np.nan, np.float32)[:, 10:210]
    with fastmm.accelerate_numpy(EVERYTHING):
        np.matmul(b[:, ::-1][:, ::1], a, out=out)
        x = rng.standard_normal((128, 128)).astype(np.float32)
        x0 = x.copy()
        x @= x
        t = a.T @ b.T
    _close(out, b[:, ::-1], a)
    _close(x, x0, x0)
    _close(t, a.T, b.T)
    assert launches


def test_below_the_threshold_and_other_dtypes_are_numpys_bit_for_bit(rng, launches):
    model = hook.HostModel(host=1e12, link=25e9, gpu=50e12, overhead=100e-6)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    d = rng.standard_normal((300, 300))
    want_a, want_d = a @ a, d @ d
    with fastmm.accelerate_numpy(model):
        assert np.array_equal(a @ a, want_a)
        assert np.array_equal(d @ d, want_d)
    assert launches == []


def test_threads_share_the_hook(rng, launches):
    a = rng.standard_normal((8, 256, 256)).astype(np.float32)
    errors = []

    def work(i):
        try:
            for _ in range(5):
                _close(a[i] @ a[(i + 1) % 8], a[i], a[(i + 1) % 8])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    with fastmm.accelerate_numpy(EVERYTHING):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and len(launches) >= 40


@pytest.mark.parametrize("batch,m,k,n,budget", [(6, 200, 300, 100, 600_000), (1, 1000, 300, 700, 1_500_000)])
def test_pieces_on_the_gpu(batch, m, k, n, budget, rng):
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    _staged.matmul_host(a, b, c, budget=budget)
    _close(c, a, b)


def test_a_gpu_failure_falls_back_to_numpy(monkeypatch, rng):
    from fastmm._dispatch import products as _dispatch

    def fail(*args, **kwargs):
        raise fastmm.LaunchError("stand-in: the driver refused the launch")

    monkeypatch.setattr(_dispatch, "matmul", fail)
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    a = rng.standard_normal((200, 200)).astype(np.float32)
    want = a @ a
    with fastmm.accelerate_numpy(EVERYTHING), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert np.array_equal(a @ a, want) and np.array_equal(a @ a, want)
    assert len([w for w in seen if issubclass(w.category, fastmm.PerformanceWarning)]) == 1


def test_a_process_using_the_hook_from_threads_exits_cleanly():
    code = textwrap.dedent("""
        import threading, numpy as np, fastmm
        from fastmm._hooks import numpy_hook as hook
        fastmm.accelerate_numpy(hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0))
        a = np.ones((256, 256), np.float32)
        res = []
        ts = [threading.Thread(target=lambda: res.append((a @ a)[0, 0])) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert res == [256.0] * 4 and fastmm.numpy_hook_status()["offloaded"] == 4, (res, fastmm.numpy_hook_status())
        big = np.ones((2048, 2048), np.float32)  # over the calling thread's share: the staging threads copy it
        assert (big @ big)[5, 7] == 2048.0
        threading.Thread(target=lambda: res.append((big @ big)[0, 0])).start()  # left running at exit
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == "", p.stderr


@pytest.mark.parametrize("m,k,n", [(2048, 2048, 2048), (3001, 1500, 700)], ids=str)
def test_pipelined_staging_on_the_gpu(m, k, n, rng, monkeypatch):
    """A single large product goes through the pipeline (row blocks, copied by the staging threads through their
    pinned slots), called on a non-blocking stream as well as the default one."""
    import cupy as cp

    monkeypatch.setattr(_staged, "_BLOCK_BYTES", 1 << 20)  # many blocks, so that every slot is reused
    a = rng.standard_normal((1, m, k)).astype(np.float32)
    b = rng.standard_normal((1, k, n)).astype(np.float32)
    for stream in (None, cp.cuda.Stream(non_blocking=True)):
        c = np.full((1, m, n), np.nan, np.float32)
        if stream is None:
            _staged.matmul_host(a, b, c)
        else:
            with stream:
                _staged.matmul_host(a, b, c)
        _close(c, a, b)


def test_arrays_made_under_the_hook_go_to_the_gpu_directly(rng, monkeypatch):
    """Arrays NumPy makes while the hook is on come from fastmm's pool: page-locked on their first product, then
    copied by the GPU directly, operands and result (no staging copy), reused when freed; an ordinary operand or
    out= still goes through the staging threads, in the same product."""
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name

    staged = []
    real_up, real_down = _staged._up, _staged._down
    monkeypatch.setattr(_staged, "_up", lambda *args: staged.append("up") or real_up(*args))
    monkeypatch.setattr(_staged, "_down", lambda *args: staged.append("down") or real_down(*args))
    # NumPy's own memory, past the fast path's small operands (a kept copy of A times a few MiB skips the staging)
    outside = rng.standard_normal((700, 2000)).astype(np.float32)
    assert outside.nbytes > _fastpath.MAX_BYTES
    with fastmm.accelerate_numpy(EVERYTHING):
        for _ in range(3):
            a = rng.standard_normal((1100, 700)).astype(np.float32)
            b = rng.standard_normal((700, 900)).astype(np.float32)
            c = a @ b
            assert get_handler_name(a) == get_handler_name(c) == "fastmm_pinned"
            _close(c, a, b)
        assert staged == []
        pool = fastmm.numpy_hook_status()["pool"]
        assert pool["pinned_bytes"] >= a.nbytes + b.nbytes + c.nbytes and pool["reused"] > 0
        _close(a @ outside, a, outside)
        assert "up" in staged and "down" not in staged  # B staged; A and the result direct
        staged.clear()
        wide = rng.standard_normal((700, 2000)).astype(np.float32)  # the pool's: copied up directly
        out = np.full((1100, 4000), np.nan, np.float32)[:, ::2]  # the pool's, but not contiguous (and past 4 MiB): staged
        np.matmul(a, wide, out=out)
        _close(out, a, wide)
        assert staged and set(staged) == {"down"}
    # A 2048^3 product of pool arrays: four blocks of rows, each copied up, multiplied and copied down directly.
    with fastmm.accelerate_numpy(EVERYTHING):
        a = rng.standard_normal((2048, 2048)).astype(np.float32)
        b = rng.standard_normal((2048, 2048)).astype(np.float32)
        for stream in (None, _cupy().cuda.Stream(non_blocking=True)):
            staged.clear()
            if stream is None:
                c = a @ b
            else:
                with stream:
                    c = a @ b
            _close(c, a, b)
            assert staged == []


def test_page_locked_memory_of_another_allocator_is_copied_directly(rng, monkeypatch):
    import cupyx

    staged = []
    real_up = _staged._up
    monkeypatch.setattr(_staged, "_up", lambda *args: staged.append("up") or real_up(*args))
    a, b = cupyx.empty_pinned((600, 500), np.float32), cupyx.empty_pinned((500, 400), np.float32)
    a[...] = rng.standard_normal(a.shape)
    b[...] = rng.standard_normal(b.shape)
    with fastmm.accelerate_numpy(EVERYTHING, pinned=False):
        c = a @ b
    _close(c, a, b)
    assert staged == []


def _cupy():
    import cupy

    return cupy


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("form", ["single", "batch", "broadcast", "fortran", "strided", "out", "large"])
def test_float64_and_complex_products_run_on_cublas_through_their_own_loops(form, dtype, rng):
    """NumPy's default dtype, and the complex ones: each dtype's loop stages operands (8 or 16-byte elements) and
    cuBLAS's DGEMM, CGEMM or ZGEMM computes them, to the dtype's accuracy; float64 and complex128 only on GPUs with
    full-rate FP64 (elsewhere they stay NumPy's)."""
    if dtype != np.complex64 and hook.float64_model(EVERYTHING, hook.compute_capability()) is None:
        pytest.skip(f"this GPU's FP64 is not full rate (compute capability {hook.compute_capability()}): float64 "
                    "and complex128 products stay NumPy's")
    shapes = {"batch": ((5, 130, 70), (5, 70, 90)), "broadcast": ((6, 64, 48), (48, 80)),
              "large": ((3000, 2000), (2000, 2500))}.get(form, ((300, 200), (200, 100)))

    def draw(shape):
        x = rng.standard_normal(shape)
        return (x + 1j * rng.standard_normal(shape) if np.dtype(dtype).kind == "c" else x).astype(dtype)

    a, b = draw(shapes[0]), draw(shapes[1])
    if form == "fortran":
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    elif form == "strided":
        a, b = draw((600, 403))[::2, 3::2], draw((400, 100))[::2]
    want = np.matmul(a, b)  # NumPy's, before the hook
    name = np.dtype(dtype).name
    fastmm.accelerate_numpy(EVERYTHING)
    before = fastmm.numpy_hook_status()["by_dtype"][name]["on_gpu"]
    if form == "out":
        got = np.full(want.shape, np.nan, dtype)
        np.matmul(a, b, out=got)
    else:
        got = a @ b
    assert got.dtype == dtype and got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < (1e-5 if dtype == np.complex64 else 1e-13)
    assert fastmm.numpy_hook_status()["by_dtype"][name]["on_gpu"] == before + 1


def test_the_warm_up_starts_the_device_and_a_forked_child_still_gets_right_results():
    """accelerate_numpy() starts the device's CUDA context on a thread of its own; a child forked after that cannot
    use the GPU, and its products must still come out right (NumPy's, with a warning), in a child process."""
    code = textwrap.dedent("""
        import os, threading, warnings
        import numpy as np
        import fastmm
        from fastmm._runtime import cuda
        fastmm.accelerate_numpy(fastmm.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0))
        for thread in threading.enumerate():
            if thread.name == "fastmm-warm-up":
                thread.join(30)
        assert cuda._primary, "the warm-up made no context"
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((512, 512), np.float32), rng.standard_normal((512, 512), np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        pid = os.fork()
        if pid == 0:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ok = np.allclose(a @ b, want, rtol=1e-4, atol=1e-3)
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the forked child: status {status}"
        assert np.allclose(a @ b, want, rtol=1e-4, atol=1e-3)
        assert fastmm.numpy_hook_status()["by_dtype"]["float32"]["on_gpu"] >= 1
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_on_a_new_machine_numpy_computes_while_nvcc_builds_the_kernel(tmp_path):
    """With an empty kernel cache, the first product of a kind is NumPy's while nvcc builds its kernel on fastmm's
    thread (the program never waits for a compile); once built, the same product runs on the GPU. The warm-up queues
    the common binaries ahead, and they land in the cache. In a child process: a cache of its own."""
    code = textwrap.dedent("""
        import numpy as np, fastmm
        from fastmm._hooks import numpy_hook as hook
        from fastmm._runtime import compiling
        from fastmm.kernels import build
        everything = hook.HostModel(host=1e6, link=1e18, gpu=1e18, overhead=0.0)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((1000, 3000)).astype(np.float32)
        b = rng.standard_normal((3000, 37)).astype(np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        def err(c):
            return np.linalg.norm(c - want) / np.linalg.norm(want)
        def counts():
            f32 = fastmm.numpy_hook_status()["by_dtype"]["float32"]
            return f32["on_gpu"], f32["kept_on_cpu"]["kernel_compiling"]
        with fastmm.accelerate_numpy(everything, warm_up=False):
            first = a @ b
            assert counts() == (0, 1), counts()
            assert compiling.wait(300)
            for _ in range(4):  # each binary it needs (a kernel, then perhaps a pass) is built in turn
                again = a @ b
                if counts()[0]:
                    break
                assert compiling.wait(300)
            assert counts()[0] == 1, counts()
        assert err(first) < 1e-5 and err(again) < 1e-5
        fastmm.accelerate_numpy(warm_up=True)
        import threading
        for thread in threading.enumerate():  # the warm-up has queued the binaries it compiles ahead
            if thread.name == "fastmm-warm-up":
                thread.join(120)
        assert compiling.wait(300)
        fastmm.restore_numpy()
        print("ahead", compiling.status())
    """)
    env = {**__import__("os").environ, "FASTMM_CACHE_DIR": str(tmp_path), "FASTMM_HOOK_COMPILE": "background"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ahead" in p.stdout, p.stdout
    # The warm-up's binaries, and those of the product: all whole in the cache.
    assert len(list((tmp_path / "kernels").glob("*.entry"))) >= 5
