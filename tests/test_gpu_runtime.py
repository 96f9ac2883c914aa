"""Fault suite for the GPU runtime (fastmm/_runtime/cuda.py): threads, streams, devices, the kernel cache, faults.

Every scenario runs in a child process, because what is under test includes how that process ends: its
exit status must be 0 and its stderr empty (a runtime that mishandles contexts or modules aborts at exit or
prints clean-up warnings there; a thread's uncaught exception also lands on stderr). Results are checked in
the child against float64 NumPy (relative Frobenius error below 1e-5), with `out=` arrays poisoned with NaN.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

PRELUDE = '''
import sys, threading, warnings
import numpy as np
import cupy
import fastmm

F32 = np.float32


def host(rng, rows, cols):
    return rng.uniform(-1, 1, (rows, cols)).astype(F32)


def rel_err(c, a, b):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = cupy.asnumpy(c).astype(np.float64)
    if not np.isfinite(c).all():
        return float("inf")  # NaN left in a poisoned output: an element was not written
    return float(np.linalg.norm(c - ref) / (np.linalg.norm(ref) or 1.0))


def check(c, a, b, what="product"):
    e = rel_err(c, a, b)
    assert e < 1e-5, f"{what}: relative error {e:.3g}"


def nan_out(m, n):
    return fastmm.asarray(cupy.full((m, n), cupy.nan, cupy.float32))
'''

DONE = "CHILD DONE"


def run_child(code: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code) + f"\nprint({DONE!r})\n"],
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def describe(p: subprocess.CompletedProcess) -> str:
    return f"exit status {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"


def assert_clean(p: subprocess.CompletedProcess) -> None:
    """Ran to the end, exited with status 0, and wrote nothing to stderr."""
    assert p.returncode == 0 and p.stderr == "" and DONE in p.stdout, describe(p)


# --------------------------------------------------------------------------------------------------------
# Threads and streams
# --------------------------------------------------------------------------------------------------------

def test_eight_threads_on_their_own_streams_match_cublas():
    p = run_child('''
    SHAPES = [(64, 64, 64), (200, 136, 72), (512, 384, 256), (1, 300, 17), (777, 129, 300)]
    errors = []
    start = threading.Barrier(8)

    def worker(t):
        try:
            rng = np.random.default_rng(t)
            s = cupy.cuda.Stream(non_blocking=True)
            w = cupy.asarray(host(rng, 2048, 2048))
            start.wait()
            with s:
                for it in range(10):
                    m, n, k = SHAPES[(t + it) % len(SHAPES)]
                    a, b = host(rng, m, k), host(rng, k, n)
                    # The operand is written on s right behind a long cuBLAS product and the results are read on
                    # s right after, with no synchronisation: a product not ordered on s reads or leaves garbage.
                    cupy.matmul(w, w)
                    ca = cupy.asarray(a) * 2
                    cb = cupy.asarray(b)
                    fa, fb = fastmm.asarray(ca), fastmm.asarray(cb)
                    out = nan_out(m, n)
                    c = np.matmul(fa, fb)
                    np.matmul(fa, fb, out=out)
                    ref = cupy.matmul(ca, cb)
                    c_after, out_after = c + 0, out + 0
                    s.synchronize()
                    check(c_after, 2 * a, b, f"thread {t} {m}x{n}x{k} fastmm")
                    check(out_after, 2 * a, b, f"thread {t} {m}x{n}x{k} fastmm out=")
                    check(ref, 2 * a, b, f"thread {t} {m}x{n}x{k} cupy.matmul")
                    assert float(cupy.abs(c_after - ref).max()) <= 1e-4 * float(cupy.abs(ref).max()) + 1e-6
        except BaseException as e:
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    ''')
    assert_clean(p)


def test_thousand_short_lived_threads():
    p = run_child('''
    rng = np.random.default_rng(1)
    a, b = host(rng, 64, 64), host(rng, 64, 64)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    errors = []

    def one(i):
        try:
            if i % 2:  # half of them on a stream of their own, which the kernel is launched on
                with cupy.cuda.Stream(non_blocking=True):
                    out = nan_out(64, 64)
                    np.matmul(fa, fb, out=out)
                    check(out, a, b, f"thread {i} (own stream, out=)")
            else:
                check(fa @ fb, a, b, f"thread {i}")
        except BaseException as e:
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    for batch in range(40):  # 1,000 threads, 25 alive at a time
        threads = [threading.Thread(target=one, args=(25 * batch + j,)) for j in range(25)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors[:5]
    check(fa @ fb, a, b, "main thread after 1,000 threads")
    ''')
    assert_clean(p)


def test_thread_pool():
    p = run_child('''
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(2)
    shapes = [(64 + 13 * i, 48 + 7 * i, 32 + 29 * i) for i in range(48)]
    hosts = [(host(rng, m, k), host(rng, k, n)) for m, n, k in shapes]
    devs = [(fastmm.asarray(a), fastmm.asarray(b)) for a, b in hosts]

    def product(i):
        fa, fb = devs[i]
        if i % 3 == 0:
            out = nan_out(fa.shape[0], fb.shape[1])
            np.matmul(fa, fb, out=out)
            return cupy.asnumpy(out)
        return cupy.asnumpy(fa @ fb)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(product, range(len(devs))))
        results += list(pool.map(product, reversed(range(len(devs)))))
    n = len(devs)
    for i, r in enumerate(results):
        j = i if i < n else 2 * n - 1 - i
        check(r, *hosts[j], f"pool item {j}")
    ''')
    assert_clean(p)


def test_first_product_in_a_thread_then_main_and_an_untouched_thread():
    # The first use of CUDA in the process (context retained, kernels loaded) happens in a thread that then
    # ends; the main thread and a thread that never called CUDA or CuPy multiply afterwards; exit is clean.
    p = run_child('''
    rng = np.random.default_rng(3)
    a, b = host(rng, 300, 200), host(rng, 200, 100)
    box = {}

    def first():
        fa, fb = fastmm.asarray(a), fastmm.asarray(b)
        box["c"] = cupy.asnumpy(fa @ fb)
        box["ops"] = (fa, fb)

    t = threading.Thread(target=first)
    t.start()
    t.join()
    check(box["c"], a, b, "first product, in a thread")
    fa, fb = box["ops"]
    check(fa @ fb, a, b, "main thread, after the loading thread ended")

    def untouched():
        box["c2"] = fa @ fb  # the thread's first CUDA call of any kind
        box["c2_host"] = cupy.asnumpy(box["c2"])

    t = threading.Thread(target=untouched)
    t.start()
    t.join()
    check(box["c2_host"], a, b, "thread that never touched CUDA")
    ''')
    assert_clean(p)


def test_products_in_the_main_thread_only_exit_cleanly():
    p = run_child('''
    rng = np.random.default_rng(4)
    for m, n, k in [(64, 64, 64), (1000, 1000, 1000), (5, 4097, 3)]:
        a, b = host(rng, m, k), host(rng, k, n)
        check(fastmm.asarray(a) @ fastmm.asarray(b), a, b, f"{m}x{n}x{k}")
    ''')
    assert_clean(p)


# --------------------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------------------

def _device_count() -> int:
    try:
        return cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        return 0


@pytest.mark.skipif(_device_count() < 2, reason="needs two GPUs (operands on devices 0 and 1); this machine has "
                                               f"{_device_count()}")
def test_operands_on_two_devices_follow_cupy():
    p = run_child('''
    rng = np.random.default_rng(5)
    a, b = host(rng, 96, 80), host(rng, 80, 72)
    with cupy.cuda.Device(0):
        ca0, cb0 = cupy.asarray(a), cupy.asarray(b)
        fa0, fb0 = fastmm.asarray(a), fastmm.asarray(b)
    with cupy.cuda.Device(1):
        ca1, cb1 = cupy.asarray(a), cupy.asarray(b)
        fa1, fb1 = fastmm.asarray(a), fastmm.asarray(b)

    def outcome(f):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CuPy may warn when it enables peer access; not under test
            try:
                return "ok", f()
            except Exception as e:
                return "raised", e

    def builtin_base(e):
        return next(t for t in type(e).__mro__ if t.__module__ == "builtins")

    # The control is CuPy's own rule for arrays on another device, as its elementwise kernels apply it
    # (cupy.add on same-shaped arrays): a ValueError in CuPy's words where peer access cannot be had, else
    # peer access enabled and the result computed. Not cupy.matmul: it does not check devices, and on an H200
    # pair its cuBLAS call read the other device's memory with an illegal address, a fault that breaks the
    # device's context for the rest of the process.
    cases = [  # (current device, what, CuPy's rule on the same devices, fastmm's calls)
        (0, "a on 0, b on 1", lambda: cupy.add(ca0, ca1), [lambda: np.matmul(fa0, fb1), lambda: fa0 @ fb1]),
        (1, "a on 0, b on 1", lambda: cupy.add(ca0, ca1), [lambda: np.matmul(fa0, fb1), lambda: fa0 @ fb1]),
        (0, "both on 1", lambda: cupy.add(ca1, ca1), [lambda: np.matmul(fa1, fb1), lambda: fa1 @ fb1]),
        (1, "both on 1", lambda: cupy.add(ca1, ca1), [lambda: np.matmul(fa1, fb1), lambda: fa1 @ fb1]),
    ]
    for current, what, cupy_rule, fastmm_calls in cases:
        with cupy.cuda.Device(current):
            kind, ref = outcome(cupy_rule)
            for call in fastmm_calls:
                got_kind, got = outcome(call)
                label = f"{what}, current device {current}"
                print(f"{label}: CuPy {kind} {str(ref)[:150] if kind == 'raised' else ''}| fastmm {got_kind} "
                      f"{str(got)[:150] if got_kind == 'raised' else ''}")
                if kind == "raised":  # the same rule: an error of the same builtin kind, in the same words
                    assert got_kind == "raised", f"{label}: CuPy raised {ref!r}, fastmm returned a result"
                    assert isinstance(got, builtin_base(ref)), f"{label}: CuPy raised {ref!r}, fastmm {got!r}"
                    assert str(got) == str(ref), f"{label}: CuPy says {str(ref)!r}, fastmm {str(got)!r}"
                else:  # peer access (or one device): the product, on the current device, as CuPy's result is
                    assert got_kind == "ok", f"{label}: CuPy computed it, fastmm raised {got!r}"
                    assert got.device.id == ref.device.id == current, \
                        f"{label}: result on device {got.device.id}, CuPy's on {ref.device.id}"
                    check(got, a, b, label)
    assert outcome(cases[3][2])[0] == "ok", "CuPy refused a product with everything on the current device 1"

    # Both devices still work, from the main thread and from threads that pick their device.
    with cupy.cuda.Device(1):
        check(fa1 @ fb1, a, b, "device 1 after the mixed-device errors")
    check(fa0 @ fb0, a, b, "device 0 after the mixed-device errors")
    errors = []

    def on(dev):
        try:
            cupy.cuda.Device(dev).use()
            x, y = (fa1, fb1) if dev else (fa0, fb0)
            with cupy.cuda.Stream(non_blocking=True):
                check(x @ y, a, b, f"thread on device {dev}")
        except BaseException as e:
            errors.append(f"device {dev}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=on, args=(i % 2,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    ''')
    assert_clean(p)


def test_products_on_device_1_are_right_when_two_exist():
    if _device_count() < 2:
        pytest.skip(f"needs two GPUs; this machine has {_device_count()}")
    p = run_child('''
    rng = np.random.default_rng(6)
    a, b = host(rng, 700, 500), host(rng, 500, 300)
    with cupy.cuda.Device(1):
        fa, fb = fastmm.asarray(a), fastmm.asarray(b)
        c = fa @ fb
        assert c.device.id == 1
        check(c, a, b, "device 1")
        out = nan_out(700, 300)
        np.matmul(fa, fb, out=out)
        check(out, a, b, "device 1, out=")
    ''')
    assert_clean(p)


# --------------------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------------------

def test_out_of_memory_then_a_normal_product():
    p = run_child('''
    # A result that cannot fit: 2**18 x 2**18 float32 is 256 GiB.
    tall = fastmm.asarray(np.ones((2 ** 18, 1), F32))
    wide = fastmm.asarray(np.ones((1, 2 ** 18), F32))
    try:
        tall @ wide
    except fastmm.OutOfMemoryError as e:
        print("huge result:", str(e)[:200])
    else:
        raise AssertionError("a 256 GiB result did not raise fastmm.OutOfMemoryError")

    rng = np.random.default_rng(7)
    a, b = host(rng, 256, 256), host(rng, 256, 256)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    out = nan_out(256, 256)
    # No room for one more byte: the memory pool capped at what it holds. (Filling the whole device instead made the
    # test depend on what GPU tests beside it freed, and made theirs fail.)
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=pool.total_bytes())
    try:
        fa @ fb
    except fastmm.OutOfMemoryError as e:
        print("full device:", str(e)[:200])
    else:
        raise AssertionError("a product with no memory left did not raise fastmm.OutOfMemoryError")
    # A kernel not loaded yet, into an existing output: loading it may need memory there is no longer.
    try:
        with fastmm.use_kernel("smem_16"):
            np.matmul(fa, fb, out=out)
        check(out, a, b, "smem_16 loaded with no memory left")
        print("kernel load with no memory left: fitted")
    except fastmm.OutOfMemoryError as e:
        print("kernel load with no memory left:", str(e)[:200])
    pool.set_limit(size=0)  # no limit
    check(fa @ fb, a, b, "after freeing")
    out[...] = cupy.nan
    with fastmm.use_kernel("smem_16"):
        np.matmul(fa, fb, out=out)
    check(out, a, b, "smem_16 after freeing")
    ''')
    assert_clean(p)


def test_failed_launch_raises_and_the_next_product_works():
    p = run_child('''
    from fastmm._runtime import cuda as _cuda

    rng = np.random.default_rng(8)
    a, b = host(rng, 200, 100), host(rng, 100, 150)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    real = _cuda.Launch._launch
    armed = [True]

    def once_invalid(self, pa, pb, pc, stream):
        if armed and armed.pop():
            # A block of 4096 threads is over every GPU's limit: the driver refuses the launch.
            cupy.cuda.driver.launchKernel(self.fn, *self.chunks[0][:3], 4096, 1, 1, 0, stream, 0,
                                          _cuda._arg_buffer().address)
        return real(self, pa, pb, pc, stream)

    _cuda.Launch._launch = once_invalid
    try:
        fa @ fb
    except fastmm.LaunchError as e:
        assert isinstance(e, RuntimeError) and "still usable" in str(e), e
        print("launch:", e)
    else:
        raise AssertionError("an invalid launch did not raise fastmm.LaunchError")
    check(fa @ fb, a, b, "same product after the failed launch")
    with cupy.cuda.Stream(non_blocking=True):
        check(fa @ fb, a, b, "on a stream after the failed launch")
    ''')
    assert_clean(p)


# After a sticky fault CuPy's own modules fail to unload at exit and CuPy reports it on stderr (a process that
# never imports fastmm prints the same): these lines, and only these, are allowed after one.
CUPY_CLEANUP_NOISE = ("Traceback (most recent call last):", 'File "cupy_backends/', "cupy_backends.cuda.api.",
                      "Exception ignored in: 'cupy.", "Error in sys.excepthook:", "Original exception was:")


def test_sticky_fault_is_a_device_fault_error():
    # An illegal address breaks the context for the rest of the process (CUDA cannot recover it); fastmm must
    # say so with its own error, and the process must still exit normally, with nothing from fastmm
    # on stderr.
    p = run_child('''
    from fastmm._runtime import cuda as _cuda
    from fastmm.kernels.configs import Naive, Variant

    rng = np.random.default_rng(9)
    a, b = host(rng, 64, 64), host(rng, 64, 64)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    out = fastmm.asarray(np.full((64, 64), np.nan, F32))  # uploaded: no CuPy kernel, so no CuPy module to unload
    np.matmul(fa, fb, out=out)
    check(out, a, b, "before the fault")
    bad = _cuda.Launch(Naive(), Variant(), 0, m=64, n=64, k=64, a_sm=64, a_sk=1, b_sk=64, b_sn=1, c_sm=64, c_sn=1,
                       batch=1, batch_inner=1, batch_strides=(0,) * 6)
    bad(16, 16, 16)  # unmapped addresses
    try:
        cupy.cuda.Device().synchronize()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        print("sync:", e)
    try:
        np.matmul(fa, fb, out=out)
    except fastmm.DeviceFaultError as e:
        assert isinstance(e, RuntimeError) and "Restart the Python process" in str(e), e
        print("next product:", e)
    else:
        raise AssertionError("a product after an illegal address did not raise fastmm.DeviceFaultError")
    ''')
    assert p.returncode == 0 and DONE in p.stdout, describe(p)
    foreign = [line for line in p.stderr.splitlines()
               if line.strip() and not any(n in line for n in CUPY_CLEANUP_NOISE)]
    assert not foreign, describe(p)


# --------------------------------------------------------------------------------------------------------
# Kernel cache
# --------------------------------------------------------------------------------------------------------

NAIVE_PRODUCT = '''
rng = np.random.default_rng(10)
a, b = host(rng, 100, 70), host(rng, 70, 90)
fa, fb = fastmm.asarray(a), fastmm.asarray(b)
with fastmm.use_kernel("naive_32x8"):
    c = fa @ fb
check(c, a, b, "naive_32x8")
'''


def _gpu_arch() -> str:
    major, minor = cp.cuda.Device(0).compute_capability[:-1], cp.cuda.Device(0).compute_capability[-1]
    return f"sm_{major}{minor}"


def _other_arch_cubin():
    from fastmm.kernels import build
    from fastmm.kernels.configs import Naive, Variant

    other = "sm_80" if _gpu_arch() != "sm_80" else "sm_90"
    return build.compile_cubin(Naive(), Variant(), other, use_cache=False)


def _damage_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _damage_garbage(path):
    path.write_bytes(os.urandom(path.stat().st_size))


def _damage_other_arch(path):
    # A whole, digest-checked cubin that the driver refuses: made for another GPU (as from another machine).
    from fastmm.kernels import build

    other = _other_arch_cubin()
    build._write_entry(path, other.log, other.cubin)


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_garbage, _damage_other_arch],
                         ids=["truncated", "garbage", "valid cubin for another GPU"])
def test_damaged_cache_entry_is_recompiled(tmp_path, damage):
    from fastmm.kernels import build
    from fastmm.kernels.configs import Naive, Variant

    env = {"FASTMM_CACHE_DIR": str(tmp_path)}
    assert_clean(run_child(NAIVE_PRODUCT, env))
    entries = list((tmp_path / "kernels").glob("*.entry"))
    assert [e.name for e in entries] == [build.cache_path(Naive(), Variant(), _gpu_arch()).name] and \
        entries[0].parent == tmp_path / "kernels", entries
    damage(entries[0])
    damaged = entries[0].read_bytes()
    assert_clean(run_child(NAIVE_PRODUCT, env))
    repaired = build._read_entry(entries[0])
    assert repaired is not None and entries[0].read_bytes() != damaged, "the damaged entry was not replaced"
    assert_clean(run_child(NAIVE_PRODUCT, env))  # and the repaired entry loads


def test_unwritable_cache_costs_only_a_warning(tmp_path):
    blocker = tmp_path / "not-a-directory"  # a path below a regular file cannot be created, even by root
    blocker.write_text("")
    p = run_child(NAIVE_PRODUCT + "\nwith fastmm.use_kernel('smem_16'):\n    check(fa @ fb, a, b, 'smem_16')\n",
                  {"FASTMM_CACHE_DIR": str(blocker / "cache")})
    assert p.returncode == 0 and DONE in p.stdout, describe(p)
    assert p.stderr.count("PerformanceWarning") == 1 and "could not write its kernel cache" in p.stderr, describe(p)
    assert "Traceback" not in p.stderr, describe(p)


def test_kernel_that_never_loads_is_a_clear_error(tmp_path):
    foreign = tmp_path / "foreign.cubin"
    foreign.write_bytes(_other_arch_cubin().cubin)
    p = run_child(f'''
    import dataclasses
    from fastmm.kernels import build

    real = build.compile_cubin
    foreign = open({str(foreign)!r}, "rb").read()

    def foreign_compile(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), cubin=foreign)

    build.compile_cubin = foreign_compile
    rng = np.random.default_rng(11)
    a, b = host(rng, 100, 70), host(rng, 70, 90)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    try:
        with fastmm.use_kernel("naive_32x8"):
            fa @ fb
    except fastmm.KernelLoadError as e:
        assert isinstance(e, RuntimeError) and "even freshly compiled" in str(e), e
        print("load:", e)
    else:
        raise AssertionError("a kernel the driver refuses did not raise fastmm.KernelLoadError")
    build.compile_cubin = real
    with fastmm.use_kernel("naive_32x8"):
        check(fa @ fb, a, b, "naive_32x8 once nvcc is right again")
    ''', {"FASTMM_CACHE_DIR": str(tmp_path)})
    assert_clean(p)


def test_fastmm_kernels_off_runs_cupys_product(tmp_path):
    """Under $FASTMM_KERNELS=off float32 products (matmul, dot, out=, a batch) are CuPy's (cuBLAS), bit for bit on
    matrices, and no fastmm kernel is launched."""
    import os
    import subprocess
    import sys

    code = """
import cupy as cp, numpy as np, fastmm
from fastmm._runtime import cuda as _cuda
launches = []
real = _cuda.Launch
class Counting(real):
    def __init__(self, *a, **k):
        launches.append(a[0].name)
        super().__init__(*a, **k)
_cuda.Launch = Counting
rng = cp.random.default_rng(0)
a, b = rng.standard_normal((300, 517), dtype=cp.float32), rng.standard_normal((517, 129), dtype=cp.float32)
fa, fb = fastmm.asarray(a), fastmm.asarray(b)
want = cp.matmul(a, b)
assert bool((np.matmul(fa, fb) == want).all())
assert bool((np.dot(fa, fb) == cp.dot(a, b)).all())
out = fastmm.asarray(cp.full((300, 129), cp.nan, cp.float32))
np.matmul(fa, fb, out=out)
assert bool((out == want).all())
x = rng.standard_normal((4, 64, 33), dtype=cp.float32)
assert bool(cp.allclose(np.matmul(fastmm.asarray(x), fb[:33]), cp.matmul(x, b[:33]), rtol=1e-5, atol=1e-5))
assert launches == [], launches
print("ok")
"""
    env = dict(os.environ, FASTMM_KERNELS="off")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
