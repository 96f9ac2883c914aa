"""accelerate_cupy() without a GPU: what it rebinds in the real CuPy, what reaches fastmm, fallbacks, threads.

CuPy imports without a GPU, and a ``cupy.ndarray`` can be made over an address that is never read (CuPy's
``UnownedMemory``), so these tests hand real CuPy arrays to the real (rebound) CuPy names. Stand-ins take the place
of fastmm's dispatch functions and of CuPy's originals, recording what reached them: which calls fastmm takes,
which it leaves to CuPy, what a failure or the plan's "cuBLAS is ahead" does, and that uninstalling leaves CuPy's
namespaces exactly as they were. The kernels themselves are tested under the hook in test_gpu_cupy_hook.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

cupy = pytest.importorskip("cupy", reason="the CuPy hook rebinds CuPy's names: needs CuPy installed (no GPU needed)")

import fastmm  # noqa: E402
from fastmm._hooks import cupy_hook as hook  # noqa: E402
from fastmm import _plan
from fastmm._dispatch import products as _dispatch  # noqa: E402

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
# fastmm's array type loaded now, before any stand-in replaces a dispatch function it binds at import.
FASTMM_ARRAY = fastmm.ndarray
FUNCTIONS = ("matmul", "dot", "inner", "vdot", "tensordot", "einsum")


def array(shape, dtype=F32, device=0):
    """A real cupy.ndarray over memory nobody reads: enough for the hook, which only looks at types and dtypes."""
    nbytes = max(1, int(np.prod(shape))) * np.dtype(dtype).itemsize
    mem = cupy.cuda.memory.UnownedMemory(0x100000, nbytes, None, device_id=device)
    return cupy.ndarray(shape, dtype, memptr=cupy.cuda.memory.MemoryPointer(mem, 0))


def snapshot():
    """Everything the hook may touch, by identity."""
    return ({k: v for k, v in vars(cupy).items()}, {k: v for k, v in vars(cupy.linalg).items()},
            dict(cupy.ndarray.__dict__))


def same(before, after) -> bool:
    return all(b.keys() == a.keys() and all(b[k] is a[k] for k in b) for b, a in zip(before, after))


class Calls(list):
    """Stand-ins that record (who, name, args) and return a marker."""

    def stand_in(self, who, name, result=None, raises=None):
        def f(*args, **kwargs):
            self.append((who, name, args, kwargs))
            if raises is not None:
                raise raises
            return result if result is not None else (who, name)
        f.__name__ = name
        return f


@pytest.fixture
def calls(monkeypatch):
    """CuPy's originals and fastmm's dispatch replaced by recorders; device 0 current; the hook off afterwards."""
    fastmm.restore_cupy()
    rec = Calls()
    for name in FUNCTIONS:
        monkeypatch.setattr(cupy, name, rec.stand_in("cupy", name))
        monkeypatch.setattr(_dispatch, name, rec.stand_in("fastmm", name))
    monkeypatch.setattr(cupy.linalg, "matmul", cupy.matmul)
    if hasattr(cupy.linalg, "tensordot"):
        monkeypatch.setattr(cupy.linalg, "tensordot", cupy.tensordot)
    monkeypatch.setattr(cupy.ndarray, "__matmul__", rec.stand_in("cupy", "__matmul__"))
    monkeypatch.setattr(cupy.ndarray, "dot", rec.stand_in("cupy", "ndarray.dot"))
    monkeypatch.setattr(hook._state, "device", lambda: 0)
    yield rec
    fastmm.restore_cupy()


def who(rec):
    return [(w, n) for w, n, _, _ in rec]


def test_install_and_restore_leave_cupy_exactly_as_it_was():
    fastmm.restore_cupy()
    before = snapshot()
    fastmm.accelerate_cupy()
    fastmm.accelerate_cupy()  # idempotent
    status = fastmm.cupy_hook_status()
    assert status["active"]
    assert {"cupy.matmul", "cupy.linalg.matmul", "cupy.dot", "cupy.inner", "cupy.vdot", "cupy.tensordot",
            "cupy.einsum", "cupy.ndarray.__matmul__", "cupy.ndarray.dot"} <= set(status["covers"])
    assert cupy.matmul is not before[0]["matmul"] and (cupy.linalg.matmul is cupy.matmul) == \
        (before[1]["matmul"] is before[0]["matmul"])
    assert cupy.matmul.__wrapped__ is before[0]["matmul"]  # introspection finds CuPy's function and its docstring
    assert cupy.matmul.__doc__ == before[0]["matmul"].__doc__
    assert "__matmul__" in cupy.ndarray.__dict__  # set on CuPy's Python class, over its compiled base
    fastmm.restore_cupy()
    fastmm.restore_cupy()  # idempotent
    assert same(before, snapshot())
    assert "__matmul__" not in cupy.ndarray.__dict__  # inherited from the compiled base again, as before
    assert not fastmm.cupy_hook_status()["active"]


def test_blocks_keep_the_hook_on_until_the_last_one_exits():
    fastmm.restore_cupy()
    before = snapshot()
    with fastmm.accelerate_cupy():
        with fastmm.accelerate_cupy():
            pass
        assert fastmm.cupy_hook_status()["active"]  # the outer block is still open
    assert same(before, snapshot())
    fastmm.accelerate_cupy()  # on for good: a block does not turn it off
    with fastmm.accelerate_cupy():
        pass
    assert fastmm.cupy_hook_status()["active"]
    fastmm.restore_cupy()
    assert same(before, snapshot())
    assert repr(fastmm.accelerate_cupy()) == "<fastmm CuPy hook: on>"
    fastmm.restore_cupy()


def test_overlapping_blocks_in_threads():
    """Blocks that open and close in any order: on while any is open, CuPy exactly as it was after the last."""
    fastmm.restore_cupy()
    before = snapshot()
    inside, release = threading.Barrier(4), threading.Event()
    seen = []

    def block(i):
        with fastmm.accelerate_cupy():
            inside.wait()
            release.wait() if i else None  # thread 0 leaves first; the others must still see the hook on
            seen.append(fastmm.cupy_hook_status()["active"])

    threads = [threading.Thread(target=block, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    threads[0].join()
    assert fastmm.cupy_hook_status()["active"]
    release.set()
    for t in threads:
        t.join()
    assert seen == [True] * 4
    assert same(before, snapshot())


def test_threads_install_and_restore_while_others_multiply(calls):
    stop = threading.Event()
    errors = []
    a = array((8, 8))

    def work():
        while not stop.is_set():
            try:
                assert cupy.matmul(a, a) in (("fastmm", "matmul"), ("cupy", "matmul"))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers:
        t.start()
    for _ in range(200):
        fastmm.accelerate_cupy()
        fastmm.restore_cupy()
    stop.set()
    for t in workers:
        t.join()
    assert not errors
    assert not fastmm.cupy_hook_status()["active"]
    assert cupy.matmul.__name__ == "matmul" and not hasattr(cupy.matmul, "__wrapped__")


FLOAT32_CALLS = [  # (call, the fastmm function that must receive it)
    (lambda a, b: cupy.matmul(a, b), "matmul"),
    (lambda a, b: cupy.linalg.matmul(a, b), "matmul"),
    (lambda a, b: cupy.matmul(a, b, out=array((8, 8))), "matmul"),
    (lambda a, b: cupy.dot(a, b), "dot"),
    (lambda a, b: cupy.dot(a, b, array((8, 8))), "dot"),
    (lambda a, b: cupy.inner(a, b), "inner"),
    (lambda a, b: cupy.vdot(a, b), "vdot"),
    (lambda a, b: cupy.tensordot(a, b), "tensordot"),
    (lambda a, b: cupy.tensordot(a, b, axes=1), "tensordot"),
    (lambda a, b: cupy.tensordot(a, b, 1), "tensordot"),
    (lambda a, b: cupy.einsum("ij,jk->ik", a, b), "einsum"),
    (lambda a, b: cupy.einsum("ij,jk", a, b, optimize=True), "einsum"),
    (lambda a, b: cupy.einsum(a, [0, 1], b, [1, 2], [0, 2]), "einsum"),
    (lambda a, b: a @ b, "matmul"),
    (lambda a, b: a.dot(b), "dot"),
    (lambda a, b: a.dot(b, out=array((8, 8))), "dot"),
]


@pytest.mark.parametrize("call,name", FLOAT32_CALLS, ids=range(len(FLOAT32_CALLS)))
def test_float32_products_reach_fastmm(calls, call, name):
    a, b = array((8, 8)), array((8, 8))
    with fastmm.accelerate_cupy():
        assert call(a, b) == ("fastmm", name)
    assert who(calls) == [("fastmm", name)]
    assert call(a, b) != ("fastmm", name)  # and CuPy's own after the block


def test_an_in_place_product_is_a_new_array_as_in_cupy(calls):
    """CuPy has no ``__imatmul__``: ``x @= y`` is ``x = x @ y``, and stays so (through the rebound ``@``)."""
    a, b = array((8, 8)), array((8, 8))
    with fastmm.accelerate_cupy():
        x = a
        x @= b
    assert x == ("fastmm", "matmul") and who(calls) == [("fastmm", "matmul")]
    assert "__imatmul__" not in cupy.ndarray.__dict__


CUPYS_CALLS = [  # (why CuPy keeps it, call on float32 a, b and float64 d, CuPy's original that must receive it)
    ("float64", lambda a, b, d: cupy.matmul(d, d), "matmul"),
    ("mixed dtypes", lambda a, b, d: cupy.dot(a, d), "dot"),
    ("gufunc keywords", lambda a, b, d: cupy.matmul(a, b, axes=[(0, 1), (0, 1), (0, 1)]), "matmul"),
    ("a float64 out", lambda a, b, d: cupy.matmul(a, b, out=d), "matmul"),
    ("three operands", lambda a, b, d: cupy.einsum("ij,jk,kl", a, b, a), "einsum"),
    ("einsum keywords", lambda a, b, d: cupy.einsum("ij,jk", a, b, dtype=F32), "einsum"),
    ("a host operand", lambda a, b, d: cupy.tensordot(a, np.ones((8, 8), np.float32)), "tensordot"),
    ("a Python scalar", lambda a, b, d: a @ 2.0, "__matmul__"),
    ("another device", lambda a, b, d: cupy.inner(a, array((8, 8), device=1)), "inner"),
    ("float64 method", lambda a, b, d: d.dot(d), "ndarray.dot"),
    ("float64 operator", lambda a, b, d: d @ d, "__matmul__"),
]


@pytest.mark.parametrize("why,call,name", CUPYS_CALLS, ids=[c[0] for c in CUPYS_CALLS])
def test_everything_else_stays_cupys(calls, why, call, name):
    a, b, d = array((8, 8)), array((8, 8)), array((8, 8), F64)
    with fastmm.accelerate_cupy():
        assert call(a, b, d) == ("cupy", name), why
    assert who(calls) == [("cupy", name)]


def test_a_fastmm_failure_is_cupys_product_with_one_warning(calls, monkeypatch):
    monkeypatch.setattr(_dispatch, "matmul", calls.stand_in("fastmm", "matmul", raises=RuntimeError("no nvcc")))
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    a = array((8, 8))
    before = fastmm.cupy_hook_status()["declined_after_failure"]
    with fastmm.accelerate_cupy(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cupy.matmul(a, a) == ("cupy", "matmul") and a @ a == ("cupy", "__matmul__")
    assert who(calls) == [("fastmm", "matmul"), ("cupy", "matmul"), ("fastmm", "matmul"), ("cupy", "__matmul__")]
    warned = [w for w in seen if issubclass(w.category, fastmm.PerformanceWarning)]
    assert len(warned) == 1 and "RuntimeError: no nvcc" in str(warned[0].message)
    assert fastmm.cupy_hook_status()["declined_after_failure"] == before + 2


def test_a_call_cupy_refuses_too_raises_cupys_own_error(calls, monkeypatch):
    mine, cupys = ValueError("fastmm's words"), ValueError("CuPy's words")
    monkeypatch.setattr(_dispatch, "dot", calls.stand_in("fastmm", "dot", raises=mine))
    monkeypatch.setattr(cupy, "dot", calls.stand_in("cupy", "dot", raises=cupys))
    a = array((8, 8))
    with fastmm.accelerate_cupy(), warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning: nothing fell back
        with pytest.raises(ValueError) as e:
            cupy.dot(a, a)
    assert e.value is cupys and e.value.__context__ is None  # raised by CuPy, not inside fastmm's handler


def test_interrupts_are_not_swallowed(calls, monkeypatch):
    monkeypatch.setattr(_dispatch, "matmul", calls.stand_in("fastmm", "matmul", raises=KeyboardInterrupt()))
    a = array((8, 8))
    with fastmm.accelerate_cupy(), pytest.raises(KeyboardInterrupt):
        a @ a
    assert who(calls) == [("fastmm", "matmul")]


def test_where_cublas_is_ahead_cupy_computes_without_a_warning(calls, monkeypatch):
    seen = []

    def ahead(*args, **kwargs):
        seen.append(_plan.yielding_to_cublas())
        raise _plan.CublasAhead("partial wave")

    monkeypatch.setattr(_dispatch, "matmul", ahead)
    a = array((8, 8))
    before = fastmm.cupy_hook_status()["left_to_cupy"]
    with fastmm.accelerate_cupy(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert a @ a == ("cupy", "__matmul__")
    assert seen == [True] and not _plan.yielding_to_cublas()  # only inside the hook's call
    assert fastmm.cupy_hook_status()["left_to_cupy"] == before + 1


def test_each_decision_is_logged_at_debug(calls, monkeypatch, caplog):
    """On the `fastmm` logger, as the NumPy hook's: the product, and where it ran and why."""
    a = array((8, 16))
    with fastmm.accelerate_cupy(), caplog.at_level(logging.DEBUG, logger="fastmm"):
        cupy.matmul(a, array((16, 4)))
        monkeypatch.setattr(_dispatch, "matmul", calls.stand_in("fastmm", "matmul",
                                                                 raises=_plan.CublasAhead("partial wave")))
        a @ array((16, 4))
        monkeypatch.setattr(_dispatch, "dot", calls.stand_in("fastmm", "dot", raises=TypeError("no")))
        cupy.dot(a, array((16, 2)))
        cupy.matmul(array((8, 8), F64), array((8, 8), F64))  # not the hook's: nothing to log
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("cupy hook:")] == [
        "cupy hook: matmul of 8x16, 16x4 on fastmm's kernels",
        "cupy hook: __matmul__ of 8x16, 16x4 left to CuPy (cuBLAS is ahead: partial wave)",
        "cupy hook: dot of 8x16, 16x2 left to CuPy (a call form fastmm does not take)",
    ]


def test_array_api_compat_reaches_the_hook(calls):
    compat = pytest.importorskip("array_api_compat", reason="array_api_compat is not installed")
    xp = compat.array_namespace(array((8, 8)))
    a = array((8, 8))
    with fastmm.accelerate_cupy():  # (vecdot, written with @, needs a GPU for its conj: the GPU tests cover it)
        got = [xp.matmul(a, a), xp.linalg.matmul(a, a), xp.tensordot(a, a, axes=1)]
    assert got == [("fastmm", "matmul"), ("fastmm", "matmul"), ("fastmm", "tensordot")]


def test_status_and_info_say_what_is_on():
    fastmm.restore_cupy()
    assert fastmm.cupy_hook_status() | {"fastmm": 0, "left_to_cupy": 0, "declined_after_failure": 0} == {
        "active": False, "covers": [], "fastmm": 0, "left_to_cupy": 0, "declined_after_failure": 0}
    p = subprocess.run([sys.executable, "-m", "fastmm", "info"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "cupy hook   off" in p.stdout, p.stdout + p.stderr


def test_a_process_that_exits_with_the_hook_on_exits_cleanly():
    code = textwrap.dedent("""
        import cupy, fastmm
        fastmm.accelerate_cupy()
        assert cupy.matmul.__wrapped__ is not None
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_matmul_takes_out_by_keyword_only_as_cupy_does(calls):
    a = array((8, 8))
    with fastmm.accelerate_cupy():
        assert cupy.matmul(a, a, a) == ("cupy", "matmul")  # CuPy's own answer (it raises TypeError itself)
        assert cupy.dot(a, a, array((8, 8))) == ("fastmm", "dot")


def test_subclasses_keep_what_cupy_does_with_them(calls):
    class Mine(cupy.ndarray):
        pass

    a = array((8, 8)).view(Mine)
    with fastmm.accelerate_cupy():
        assert cupy.matmul(a, a) == ("cupy", "matmul")
        assert cupy.dot(a, a) == ("cupy", "dot")


def test_cupys_fallback_does_not_come_back_to_fastmm(calls, monkeypatch):
    """CuPy's own dot calls the (rebound) dot method: inside a fallback that goes straight to CuPy."""
    a = array((8, 8))
    inner = []

    def cupys_dot(x, y, out=None):
        inner.append(x.dot(y))  # what CuPy's cupy.dot does
        return ("cupy", "dot")

    monkeypatch.setattr(cupy, "dot", cupys_dot)
    monkeypatch.setattr(_dispatch, "dot", calls.stand_in("fastmm", "dot", raises=RuntimeError("broken")))
    with fastmm.accelerate_cupy(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cupy.dot(a, a) == ("cupy", "dot")
    assert inner == [("cupy", "ndarray.dot")] and who(calls) == [("fastmm", "dot"), ("cupy", "ndarray.dot")]


def test_restore_leaves_a_later_rebinding_alone_and_stale_references_go_to_cupy(calls):
    fastmm.accelerate_cupy()
    hooked = cupy.matmul
    theirs = lambda *args, **kwargs: "theirs"  # noqa: E731 - another package's hook, installed after ours
    cupy.inner = theirs
    fastmm.restore_cupy()
    try:
        assert cupy.inner is theirs
        a = array((8, 8))
        assert hooked(a, a) == ("cupy", "matmul")  # a reference kept from while the hook was on
    finally:
        del cupy.inner  # the `calls` fixture puts CuPy's own back


def test_a_failed_install_raises_its_own_error_and_leaves_cupy_as_it_was(monkeypatch):
    fastmm.restore_cupy()
    before = snapshot()
    real = hook._replacement
    made = []

    def failing(original, pick, ours):
        if len(made) == 5:
            raise KeyboardInterrupt
        made.append(1)
        return real(original, pick, ours)

    monkeypatch.setattr(hook, "_replacement", failing)
    with pytest.raises(KeyboardInterrupt):
        fastmm.accelerate_cupy()
    assert same(before, snapshot()) and hook._state.saved == {} and not fastmm.cupy_hook_status()["active"]


def test_fastmm_arrays_reach_fastmm_through_cupys_names_too(calls):
    """`cupy.matmul` on fastmm arrays (array_api_compat's `xp.matmul` on them) runs fastmm's kernels under the hook;
    another library's subclass keeps CuPy's (above)."""
    a = array((8, 8)).view(FASTMM_ARRAY)
    with fastmm.accelerate_cupy():
        assert cupy.matmul(a, a) == ("fastmm", "matmul")
        assert cupy.tensordot(a, array((8, 8)), axes=1) == ("fastmm", "tensordot")
        assert cupy.matmul(a, array((8, 8), F64)) == ("cupy", "matmul")  # not float32: CuPy's
    compat = pytest.importorskip("array_api_compat", reason="array_api_compat is not installed")
    with fastmm.accelerate_cupy():
        assert compat.array_namespace(a).matmul(a, a) == ("fastmm", "matmul")


def test_an_out_given_with_fastmm_operands_is_returned_itself(calls, monkeypatch):
    a = array((8, 8)).view(FASTMM_ARRAY)
    out = array((8, 8))  # a plain CuPy array
    monkeypatch.setattr(_dispatch, "matmul", lambda x, y, out=None: out)
    with fastmm.accelerate_cupy():
        assert cupy.matmul(a, a, out=out) is out
