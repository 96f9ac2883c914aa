"""The dispatch layer never hands a fastmm array to a CuPy routine (no GPU needed).

A fastmm array is a ``cupy.ndarray`` whose product methods are fastmm's, and CuPy's ``dot(a, b)`` is
``a.dot(b)``: handed a fastmm array, CuPy calls fastmm back, which used to call CuPy again until Python's
recursion limit (every non-float32 ``x.dot(y)``). Here CuPy is replaced by a stand-in built on NumPy that behaves
the same way (its ``dot`` calls the method of its first argument) and refuses fastmm-typed arguments, and the
non-float32 paths of every product are checked against NumPy.
"""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from fastmm._dispatch import products as _dispatch
from fastmm._runtime import arrays as _arrays
from fastmm._runtime import gemm as _gemm


class FakeCupyArray(np.ndarray):
    """Stands in for cupy.ndarray: a device array with `.data.ptr`/`.data.device_id` and `.get()`."""

    def __new__(cls, shape, dtype, memptr, strides):
        """CuPy's constructor over existing memory (`memptr` as `data` gives it)."""
        return np.lib.stride_tricks.as_strided(memptr.array, shape, strides).view(cls)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0], device_id=0, array=np.asarray(self))

    def get(self):
        return np.asarray(self)


class FakeFastmmArray(FakeCupyArray):
    """Stands in for fastmm.ndarray: its product methods are the dispatch layer's, as fastmm's are."""

    def dot(self, b, out=None):
        return _dispatch.dot(self, b, out=out)

    def __matmul__(self, other):
        return _dispatch.matmul(self, other)


def _strict(func, calls_method=None):
    """A CuPy routine: refuses fastmm arrays (they would call fastmm back) and returns stand-in CuPy arrays."""

    def routine(*args, **kwargs):
        flat = [x for a in args for x in (a if isinstance(a, (list, tuple)) else [a])]
        flat += list(kwargs.values())
        bad = [type(x).__name__ for x in flat if isinstance(x, FakeFastmmArray)]
        assert not bad, f"CuPy's {func.__name__} was handed fastmm arrays: {bad}"
        if calls_method:  # CuPy's dot(a, b, out) is a.dot(b, out)
            return getattr(args[0], calls_method)(*args[1:], **kwargs)
        plain = [np.asarray(x) if isinstance(x, np.ndarray) else x for x in args]
        return np.asarray(func(*plain, **kwargs)).view(FakeCupyArray)

    routine.__name__ = func.__name__
    return routine


def _fake_cupy():
    cp = types.SimpleNamespace()
    cp.ndarray = FakeCupyArray
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0, CUDARuntimeError=RuntimeError),
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    cp.asarray = lambda x, dtype=None: np.array(x, dtype=dtype).view(FakeCupyArray)
    cp.empty = lambda shape, dtype: np.full(shape, np.nan, dtype).view(FakeCupyArray)
    cp.zeros = lambda shape, dtype: np.zeros(shape, dtype).view(FakeCupyArray)
    for name in ("matmul", "multiply", "inner", "vdot", "tensordot", "einsum", "moveaxis", "asfortranarray"):
        setattr(cp, name, _strict(getattr(np, name)))
    cp.dot = _strict(np.dot, calls_method="dot")
    return cp


def _cupy_dot(self, b, out=None):
    """The stand-in CuPy's own arrays compute dot with NumPy, as CuPy's do with cuBLAS, and word a shape
    mismatch as CuPy does."""
    if self.ndim and b.ndim and self.shape[-1] != b.shape[0 if b.ndim == 1 else -2]:
        raise ValueError("Axis dimension mismatch")
    return np.asarray(np.dot(np.asarray(self), np.asarray(b))).view(FakeCupyArray)


FakeCupyArray.dot = _cupy_dot


@pytest.fixture
def fake_cupy(monkeypatch):
    monkeypatch.setattr(_arrays, "_cp", _fake_cupy())
    # A recursion would take ~15,000 frames and seconds; a low limit turns it into a fast failure.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    yield
    sys.setrecursionlimit(old)


DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float64,
          np.complex64, np.complex128]


def _operand(rng, shape, dtype):
    x = rng.integers(-3, 4, shape) if np.dtype(dtype).kind in "iub" else rng.uniform(-1, 1, shape)
    if np.dtype(dtype).kind == "u":
        x = np.abs(x)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return np.asarray(x).astype(dtype)


def _fastmm(x):
    return np.asarray(x).view(FakeFastmmArray)


def _check(got, want):
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_non_float32_products_reach_cupy_on_plain_arrays(fake_cupy, dtype, rng):
    a, b = _operand(rng, (3, 4), dtype), _operand(rng, (4, 5), dtype)
    a3, b3 = _operand(rng, (2, 3, 4), dtype), _operand(rng, (2, 4, 5), dtype)
    fa, fb, fa3, fb3 = map(_fastmm, (a, b, a3, b3))
    _check(fa.dot(fb), np.dot(a, b))                 # the method: CuPy's dot calls it back
    _check(_dispatch.dot(fa, fb), np.dot(a, b))
    _check(_dispatch.dot(fa3, fb3), np.dot(a3, b3))  # N-D dot
    _check(_dispatch.matmul(fa3, fb3), np.matmul(a3, b3))
    _check(_dispatch.inner(fa, fa), np.inner(a, a))
    _check(_dispatch.vdot(fa, fa), np.asarray(np.vdot(a, a)))
    _check(_dispatch.tensordot(fa3, fb3, axes=([0, 2], [0, 1])), np.tensordot(a3, b3, axes=([0, 2], [0, 1])))
    _check(_dispatch.einsum("bij,bjk->bik", fa3, fb3), np.einsum("bij,bjk->bik", a3, b3))
    _check(_dispatch.einsum(fa, [0, 1], fb, [1, 2], [0, 2]), np.einsum(a, [0, 1], b, [1, 2], [0, 2]))
    _check(_dispatch.dot(fa, 2), np.dot(a, 2))       # a scalar operand: np.multiply
    if hasattr(np, "vecdot"):
        _check(_dispatch.vecdot(fa, fa), np.vecdot(a, a))
        _check(_dispatch.matvec(fa, _fastmm(b[:, 0])), np.matvec(a, b[:, 0]))
        _check(_dispatch.vecmat(_fastmm(a[:, 0]), fa), np.vecmat(a[:, 0], a))


def _numpy_gemm(monkeypatch) -> list:
    """fastmm's kernels replaced by NumPy (c[...] = a @ b in float64); the operand dtypes of each call recorded.

    The products are marked as not replayable, and the replay table is a fresh one: a stand-in product must not
    be replayed by a later test with the same signature."""
    seen = []

    def gemm(a, b, c, kernel=None, record=None):
        seen.append((a.dtype, b.dtype))
        c[...] = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
        if record is not None:
            record.append(None)

    monkeypatch.setattr(_gemm, "gemm", gemm)
    monkeypatch.setattr(_gemm, "replays", {})
    return seen


@pytest.mark.parametrize("name,ashape,bshape", [
    ("matmul", (3, 4), (4, 5)), ("matmul", (4,), (4, 5)), ("matmul", (3, 4), (4,)), ("matmul", (4,), (4,)),
    ("matmul", (2, 1, 3, 4), (5, 4, 2)), ("matvec", (2, 3, 4), (4,)), ("vecmat", (4,), (2, 4, 5)),
    ("vecdot", (2, 3, 4), (3, 4)),
], ids=str)
@pytest.mark.parametrize("with_out", [False, True], ids=["", "out"])
def test_float32_products_reach_the_kernels_as_one_batched_matmul(fake_cupy, monkeypatch, name, ashape, bshape,
                                                                    with_out, rng):
    """1-D promotion and the views of the result that the kernels write through: NumPy's result."""
    if not hasattr(np, name):
        pytest.skip(f"NumPy {np.__version__} has no {name} to compare with")
    seen = _numpy_gemm(monkeypatch)
    a, b = _operand(rng, ashape, np.float32), _operand(rng, bshape, np.float32)
    want = getattr(np, name)(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    out = _fastmm(np.full(want.shape, np.nan, np.float32)) if with_out else None
    got = getattr(_dispatch, name)(_fastmm(a), _fastmm(b), out=out)
    assert out is None or got is out
    _check(got, want)
    assert seen == [(np.dtype(np.float32), np.dtype(np.float32))]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.bool_, np.float64], ids=str)
def test_empty_contractions_and_mixed_dtypes_of_dot(fake_cupy, dtype, rng, monkeypatch):
    """Zero-length contracted axes give zeros (no kernel); N-D dot of a float32 with another dtype is a float32
    product whose operands reach the kernels as float32."""
    seen = _numpy_gemm(monkeypatch)
    f32 = np.dtype(np.float32)
    for ashape, bshape in (((2, 3, 0), (3, 0, 2)), ((2, 0), (0, 3))):
        a, b = _operand(rng, ashape, dtype), _operand(rng, bshape, f32)
        _check(_dispatch.dot(_fastmm(a), _fastmm(b)), np.dot(a, b))
    _check(_dispatch.tensordot(_fastmm(np.ones((2, 0), dtype)), _fastmm(np.ones((0, 3), dtype)), axes=1),
           np.tensordot(np.ones((2, 0), dtype), np.ones((0, 3), dtype), axes=1))
    _check(_dispatch.inner(_fastmm(np.ones((2, 0), dtype)), _fastmm(np.ones((3, 0), dtype))),
           np.inner(np.ones((2, 0), dtype), np.ones((3, 0), dtype)))
    a3, b3 = _operand(rng, (2, 3, 4), dtype), _operand(rng, (3, 4, 2), f32)
    _check(_dispatch.dot(_fastmm(a3), _fastmm(b3)), np.dot(a3, b3))
    if np.result_type(dtype, f32) == f32:
        assert seen and all(d == (f32, f32) for d in seen)


def test_dot_out_errors_are_numpys(fake_cupy):
    a, b = np.ones((2, 3)), np.ones((3, 4))
    for out in (np.ones((2, 4, 1)), np.ones((4, 2)), np.ones((2, 4), np.float32)):
        want = _outcome(lambda: np.dot(a, b, out=out))
        got = _outcome(lambda: _dispatch.dot(_fastmm(a), _fastmm(b), out=_fastmm(out)))
        assert got[0] == want[0] == "raised" and got[1:] == want[1:], (got, want)


def test_out_is_written_and_returned(fake_cupy, rng):
    a, b = _operand(rng, (3, 4), np.float64), _operand(rng, (4, 5), np.float64)
    out = _fastmm(np.full((3, 5), np.nan))
    assert _dispatch.dot(_fastmm(a), _fastmm(b), out=out) is out
    np.testing.assert_allclose(np.asarray(out), a @ b)
    out = _fastmm(np.full((3, 5), np.nan, np.complex128))
    assert _dispatch.matmul(_fastmm(a), _fastmm(b), out=out) is out
    np.testing.assert_allclose(np.asarray(out), a @ b)


def test_plain_view_shares_memory_and_base():
    x = _fastmm(np.arange(6.0).reshape(2, 3))
    cp = _fake_cupy()
    _arrays._cp, saved = cp, _arrays._cp
    try:
        p = _dispatch.plain(x)
    finally:
        _arrays._cp = saved
    assert type(p) is FakeCupyArray and p.base is x
    p[0, 0] = 42
    assert x[0, 0] == 42


def _outcome(call):
    """('ok', result) or ('raised', exception type family, message) of one call."""
    try:
        return "ok", call()
    except Exception as e:  # noqa: BLE001 - comparing what NumPy raises with what fastmm raises
        family = next(t for t in (np.exceptions.AxisError, TypeError, ValueError, IndexError, Exception)
                      if isinstance(e, t))
        return "raised", family, str(e)


_A, _B, _V = (2, 3, 4), (2, 4, 5), (4,)
GUFUNC_CASES = [
    ("matmul", _A, _B, {}),
    ("matmul", _A, _B, {"axes": [(1, 2), (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [(-2, -1), (-2, -1), (-2, -1)]}),
    ("matmul", (3, 2, 4), (4, 2, 5), {"axes": [(0, 2), (0, 1), (2, 0)]}),
    ("matmul", _A, _B, {"axes": [(0, 1), (1, 2), (0, 1)]}),
    ("matmul", _A, _B, {"axes": [(1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [(1, 2)] * 4}),
    ("matmul", _A, _B, {"axes": [(1,), (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [(1, 5), (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [(1, 1), (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [1, (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": [None, (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axes": ((1, 2), (1, 2), (1, 2))}),
    ("matmul", _A, _B, {"axes": [(1.0, 2), (1, 2), (1, 2)]}),
    ("matmul", _A, _B, {"axis": 1}),
    ("matmul", _A, _B, {"keepdims": True}),
    ("matmul", _A, _B, {"axes": [(1, 2)] * 3, "axis": 1}),
    ("matmul", _V, _V, {"axes": [0, 0, ()]}),
    ("matmul", _V, _V, {"axes": [0, 0]}),
    ("matmul", _V, _V, {"axes": [0, 0, 0]}),
    ("matmul", _V, (4, 3), {"axes": [0, (1, 0), 0]}),
    ("matmul", (), _B, {}),
    ("matmul", _A, (3, 5), {}),
    ("matmul", (2, 3, 4), (3, 4, 5), {}),
    ("matmul", _A, _B, {"order": "F"}),
    ("matmul", _A, _B, {"order": "X"}),
    ("matmul", _A, _B, {"casting": "foo"}),
    ("matmul", _A, _B, {"where": True}),
    ("matmul", _A, _B, {"dtype": np.float32, "signature": "ff->f"}),
    ("matmul", _A, _B, {"dtype": np.int32}),
    ("matmul", _A, _B, {"dtype": np.complex128}),
    ("matmul", _A, _B, {"signature": (None, None, np.complex128)}),
    ("matvec", (2, 3, 4), _V, {}),
    ("matvec", (2, 3, 4), _V, {"axes": [(0, 2), 0, 0]}),
    ("matvec", (2, 3, 4), _V, {"axis": 1}),
    ("matvec", (2, 3, 4), _V, {"keepdims": True}),
    ("matvec", (2, 3, 4), (3,), {}),
    ("vecmat", (3,), (2, 3, 4), {}),
    ("vecmat", (3,), (2, 3, 4), {"keepdims": True}),
    ("vecdot", _A, _A, {}),
    ("vecdot", _A, _A, {"axis": 1}),
    ("vecdot", _A, _A, {"axis": 0, "keepdims": True}),
    ("vecdot", _A, _A, {"axes": [1, 1]}),
    ("vecdot", _A, _A, {"axes": [(1,), (1,), ()]}),
    ("vecdot", _A, _A, {"axes": [1, 1, 0]}),
    ("vecdot", _A, _A, {"axes": [1, 1, (0,)]}),
    ("vecdot", _A, (2, 3, 5), {}),
    ("vecdot", _A, (5, 3, 4), {}),
    ("matvec", _A, (5, 4), {}),
    ("vecmat", (5, 3), _A, {}),
    ("vecdot", _A, _A, {"axes": [(-1,), (-1,), (-1,)], "keepdims": True}),
    ("vecdot", _A, _A, {"axes": [0, 0, 0], "keepdims": True}),
    ("vecdot", _A, _A, {"axes": [1, 1], "keepdims": True}),
    ("vecdot", _A, _A, {"keepdims": "true"}),
    ("vecdot", _A, _A, {"keepdims": False}),
    ("matmul", _A, _B, {"keepdims": False}),
    ("matmul", _A, (2, 5, 4), {"keepdims": False}),
]


@pytest.mark.parametrize("name,ashape,bshape,kwargs", GUFUNC_CASES, ids=lambda v: str(v).replace(" ", ""))
def test_gufunc_keywords_match_numpy(fake_cupy, name, ashape, bshape, kwargs, rng):
    """axes=, axis=, keepdims=, order=, dtype=, signature= on the CuPy path: NumPy's results and errors."""
    if not hasattr(np, name):
        pytest.skip(f"NumPy {np.__version__} has no {name} to compare with")
    a, b = _operand(rng, ashape, np.float64), _operand(rng, bshape, np.float64)
    want = _outcome(lambda: getattr(np, name)(a, b, **kwargs))
    got = _outcome(lambda: getattr(_dispatch, name)(_fastmm(a), _fastmm(b), **kwargs))
    if want[0] == "raised":
        assert got[0] == "raised", f"NumPy raised {want[1].__name__}: {want[2]}; fastmm returned"
        assert got[1] is want[1] and got[2] == want[2]
        return
    assert got[0] == "ok", f"NumPy returned; fastmm raised {got[1].__name__}: {got[2]}"
    _check(got[1], np.asarray(want[1]))
    if kwargs.get("order") == "F":
        assert np.asarray(got[1]).flags.f_contiguous


@pytest.mark.parametrize("ins", [
    (0, [0, 1], 1, [1, 2], [0, 2]),
    (0, [0, 1], 1, [1, 2]),
    (2, [Ellipsis, 1, 2], 3, [Ellipsis, 2, 3], [Ellipsis, 1, 3]),
    (0, [0, 0], [0]),
    (0, [0, 60], 1, [60, 2]),
    (0, [0, 1], 1),
    (0, [0, "x"], 1, [1, 2]),
    (0, [0, 1], 1, [1, 2], [0, 5]),
], ids=str)
def test_einsum_sublist_form_matches_numpy(fake_cupy, ins, rng):
    arrays = [_operand(rng, (3, 3), np.float64), _operand(rng, (3, 3), np.float64),
              _operand(rng, (2, 3, 3), np.float64), _operand(rng, (2, 3, 3), np.float64)]
    np_args = [arrays[x] if isinstance(x, int) else x for x in ins]
    fm_args = [_fastmm(arrays[x]) if isinstance(x, int) else x for x in ins]
    want = _outcome(lambda: np.einsum(*np_args))
    got = _outcome(lambda: _dispatch.einsum(*fm_args))
    if want[0] == "raised":
        assert got[0] == "raised" and got[1] is want[1], (want, got)
        return
    assert got[0] == "ok", got
    _check(got[1], np.asarray(want[1]))


@pytest.mark.parametrize("a,b", [("f4", "f8"), ("i1", "u1"), ("?", "?"), ("f2", "f4"), ("i8", "f4"), ("c8", "f8"),
                                 ("u8", "i8"), ("f4", "c8")])
@pytest.mark.parametrize("kw", [{}, {"dtype": "f4"}, {"dtype": "f4", "casting": "unsafe"}, {"signature": "dd->d"},
                                {"dtype": "i4"}])
@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # NumPy's own, for the unsafe cast
def test_dtype_resolution_matches_numpy(a, b, kw):
    from fastmm._dispatch.numpy_rules import ufunc_dtypes

    x, y = np.ones((2, 2), a), np.ones((2, 2), b)
    want = _outcome(lambda: np.matmul(x, y, **kw).dtype)
    got = _outcome(lambda: ufunc_dtypes(np.matmul, (x.dtype, y.dtype), None, kw.get("dtype"), kw.get("signature"),
                                        kw.get("casting", "same_kind"))[2])
    assert got[0] == want[0]
    if want[0] == "ok":
        assert got[1] == want[1]
    else:
        assert issubclass(got[1], want[1]) and got[2] == want[2]


class _RuntimeError(Exception):
    pass


@pytest.mark.parametrize("can, enable_error, expect", [
    (0, None, "unavailable"),
    (1, None, "warned"),
    (1, "cudaErrorPeerAccessAlreadyEnabled: peer access is already enabled", "warned"),
    (1, "cudaErrorIllegalAddress: an illegal memory access was encountered", "fastmm error"),
])
def test_operand_on_another_device_follows_cupys_rule(fake_cupy, monkeypatch, can, enable_error, expect):
    """CuPy's rule (its elementwise kernels'): peer access enabled with a warning, CuPy's ValueError where the
    devices cannot be peers, and a fastmm error (never a raw one) where enabling fails."""
    import fastmm
    from fastmm._runtime import cuda as _cuda

    def enable(peer):
        if enable_error:
            raise _RuntimeError(enable_error)

    rt = _arrays._cp.cuda.runtime
    rt.CUDARuntimeError = _RuntimeError
    rt.deviceCanAccessPeer = lambda device, peer: can
    rt._deviceEnsurePeerAccess = enable
    monkeypatch.setattr(_dispatch, "_peers", {})
    monkeypatch.setattr(_cuda, "_sticky_status", lambda device_id: None)  # a healthy context
    x = _fastmm(np.ones((2, 2)))
    monkeypatch.setattr(FakeCupyArray, "data", property(lambda self: types.SimpleNamespace(ptr=0, device_id=1)))
    words = "The device where the array resides (1) is different from the current device (0)."
    if expect == "unavailable":
        with pytest.raises(ValueError, match=re.escape(words + " Peer access is unavailable between these devices.")):
            _dispatch.current_device(x)
    elif expect == "warned":
        with pytest.warns(fastmm.PerformanceWarning, match=re.escape(words + " Peer access has been activated")):
            assert _dispatch.current_device(x) == 0
        assert _dispatch.current_device(x) == 0  # once: no second warning, no second enable
    else:
        with pytest.raises(fastmm.CUDAError, match="enabling peer access to device 1"):
            _dispatch.current_device(x)
        assert _dispatch._peers == {}  # not remembered: a later product asks again


@pytest.mark.parametrize("dtype", DTYPES + [np.float32], ids=str)
@pytest.mark.parametrize("ashape,bshape", [((3, 4), (5, 6)), ((4,), (3,)), ((2, 3, 4), (2, 5, 6)), ((3, 4), (3,))])
def test_shape_mismatch_is_numpys_error(fake_cupy, dtype, ashape, bshape, rng):
    """Every dtype's dot and matmul, the short CuPy paths included, raise NumPy's ValueError in NumPy's words."""
    a, b = _operand(rng, ashape, dtype), _operand(rng, bshape, dtype)
    for numpy_func, calls in ((np.dot, (lambda: _dispatch.dot(_fastmm(a), _fastmm(b)),
                                        lambda: _fastmm(a).dot(_fastmm(b)))),
                              (np.matmul, (lambda: _dispatch.matmul(_fastmm(a), _fastmm(b)),
                                           lambda: _fastmm(a) @ _fastmm(b)))):
        want = _outcome(lambda: numpy_func(a, b))
        assert want[0] == "raised"
        for call in calls:
            got = _outcome(call)
            assert got[0] == "raised" and got[1] is want[1] and got[2] == want[2], (numpy_func.__name__, got)


class _Names(list):
    """Kernel names, in launch order; `.args`: (name, variant, launch arguments) of each Launch made; `.ptrs`: the
    pointers of each launch."""


@pytest.fixture
def launched(fake_cupy, monkeypatch):
    """The runtime replaced by a stand-in that records the name of each kernel launched (an assumed H100)."""
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    names = _Names()

    class Launch:
        def __init__(self, config, variant, device_id, **args):
            self.name = config.name
            launched_args.append((config.name, variant.suffix, args))

        def __call__(self, *ptrs):
            names.append(self.name)
            names.ptrs.append(ptrs)

    launched_args = names.args = []
    names.ptrs = []

    class MappedLaunch(Launch):  # (fastmm/_runtime/tensor_map.py: the same, with operands' tensor maps)
        def __init__(self, config, variant, device_id, *, maps, **args):
            super().__init__(config, variant, device_id, **args)

    from fastmm._runtime import tensor_map as _tensor_map

    monkeypatch.setattr(_cuda, "device", lambda device_id: _plan.Device())
    monkeypatch.setattr(_cuda, "Launch", Launch)
    monkeypatch.setattr(_tensor_map, "MappedLaunch", MappedLaunch)
    monkeypatch.setattr(_tensor_map, "GuardLaunch", Launch)
    monkeypatch.setattr(_gemm, "replays", {})
    return names


def test_yielding_to_cublas_raises_before_any_launch_and_never_replays_across(launched):
    """Under the CuPy hook's `yield_to_cublas`, a shape where the plan measured cuBLAS ahead raises CublasAhead
    before anything is launched; the same shape outside runs fastmm's kernel, and its replay is not reused inside."""
    from fastmm import _plan

    a, b = _fastmm(np.zeros((768, 256), np.float32)), _fastmm(np.zeros((256, 768), np.float32))
    _dispatch.matmul(a, b)
    _dispatch.matmul(a, b)  # a replay
    assert launched == [_plan.tiles.WT128x64_SUMS] * 2
    with _plan.yield_to_cublas():
        with pytest.raises(_plan.CublasAhead, match="partial wave"):
            _dispatch.matmul(a, b)
        small = _fastmm(np.zeros((64, 64), np.float32))
        _dispatch.matmul(small, small)  # not a class where cuBLAS is ahead: fastmm's kernel
    assert launched == [_plan.tiles.WT128x64_SUMS] * 2 + [_plan.tiles.NAIVE_F64_DOT]
    assert not _plan.yielding_to_cublas()


def test_yielding_to_cublas_checks_every_part_of_a_product_before_its_first_launch(launched):
    """2049x513x16383 with A's rows not 16-byte aligned runs on aligned copies, whose product peels its last row; that
    interior is a class cuBLAS is ahead of. Under `yield_to_cublas` the product raises before the copies are made (it
    raised after them, their work wasted, until 2026-11-29)."""
    from fastmm import _plan

    a = _fastmm(np.zeros((2049, 16383), np.float32))
    b = _fastmm(np.zeros((16383, 516), np.float32))[:, :513]  # rows of 516 floats: aligned
    with _plan.yield_to_cublas():
        with pytest.raises(_plan.CublasAhead, match="its aligned copies: its interior: few tiles on a long K"):
            _dispatch.matmul(a, b)
    assert launched == []
    assert _plan.choose(_plan.Problem(2049, 513, 16383, a_aligned=False)).pad  # outside: the copies first


@pytest.mark.parametrize("shape_a,shape_b,first", [
    ((2048, 2048), (2048, 2052), "warptile_"),  # the last 4 columns peeled: the interior, then the edge
    ((4097, 1025), (1025, 4096), "repitch"),    # aligned copies (K padded), whose product peels its last row
])
def test_the_parts_of_a_product_follow_the_plan_inside_use_kernel(launched, shape_a, shape_b, first):
    """matmul(kernel="auto") inside `use_kernel(...)`: the parts the runtime plans on their own (a peeled product's
    interior and edges, the product of aligned copies) run on the kernels the plan (and explain) names, not on the
    block's kernel (which they ran until 2026-11-29)."""
    from fastmm import _plan

    a = _fastmm(np.zeros(shape_a, np.float32))
    b = _fastmm(np.zeros(shape_b, np.float32))
    (m, k), n = shape_a, shape_b[1]
    aligned = k % 4 == 0 and n % 4 == 0
    assert _plan.choose(_plan.Problem(m, n, k, aligned=aligned)).rule == ("ragged-edge" if aligned else "aligned-copy")
    _dispatch.matmul(a, b)
    planned = list(launched)
    assert planned[0].startswith(first) and planned[-1].startswith("fewcol_"), planned
    launched.clear()
    with _plan.use_kernel("naive"):
        _dispatch.matmul(a, b, kernel="auto")
        assert launched == planned
        del launched[:]
        _dispatch.matmul(a, b)  # the block's kernel, on the whole product
    assert len(launched) == 1 and launched[0].startswith("naive"), launched


def test_precision_modes_choose_kernels_and_never_share_replays(launched):
    from fastmm import _plan

    a = _fastmm(np.zeros((2048, 2048), np.float32))
    for mode in ("highest", "high", "medium", "high", "highest"):  # the second time of each: a replay
        with _plan.matmul_precision(mode):
            _dispatch.matmul(a, a)
    # The wgmma kernels' split passes: two per 3xTF32 product, none for "medium" (A @ A with A's rows along K and
    # along N: C^T = A^T A^T, both operands through tensor maps; its guard follows, with no launch to zero its flags)
    passes = ("split", "repitch", "nonfinitefix")
    products = [n for n in launched if n not in passes]
    assert [_plan.tiles.get_config(n).precision for n in products] == ["highest", "high", "medium", "high", "highest"]
    assert launched.count("split") == 4 and products[1].startswith("tf32x3wg_") and "repitch" not in launched
    medium = launched.index(products[2])
    assert products[2].endswith("_maprb") and launched[medium - 1: medium + 2] == [products[1], products[2],
                                                                                   "nonfinitefix"]
    # The product flags its tiles with a mark (a_sb1) that its guard looks for (b_sb0): nonzero, the product's own
    marks = [(args["batch_strides"][1], guard["batch_strides"][2]) for (name, _, args), (g, _, guard)
             in zip(launched.args, launched.args[1:]) if name.endswith("_maprb") and g == "nonfinitefix"]
    assert len(marks) == 1 and marks[0][0] == marks[0][1] != 0
    a2 = _fastmm(np.zeros((2048, 1024), np.float32))
    with _plan.matmul_precision("medium"):
        _dispatch.matmul(a, a2)  # another product: another mark
    assert launched.args[-2][2]["batch_strides"][1] not in (0, marks[0][0])


def test_the_precision_keyword_sets_the_mode_for_one_call(monkeypatch):
    pytest.importorskip("cupy", reason="fastmm.linalg imports the array type, which needs CuPy (no GPU needed)")
    import fastmm.linalg
    from fastmm import _plan

    seen = []
    for name in ("matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot"):
        monkeypatch.setattr(_dispatch, name, lambda *a, **k: seen.append(_plan.get_float32_matmul_precision()))
    fastmm.linalg.matmul(1, 2, precision="high")
    fastmm.linalg.dot(1, 2, precision="medium")
    fastmm.linalg.tensordot(1, 2, 1, precision="high")
    fastmm.linalg.einsum("i,i", 1, 2, precision="medium")
    fastmm.linalg.vdot(1, 2)
    assert seen == ["high", "medium", "high", "medium", "highest"]
    with pytest.raises(ValueError, match="valid values"):
        fastmm.linalg.matmul(1, 2, precision="low")


def test_few_rows_run_the_few_column_kernel_on_the_transposed_product(launched):
    """v @ W and a few rows of A @ W: the kernel gets W^T as its A, A^T as its B, and writes C through both
    strides (C^T's row stride is 1, its column stride C's row stride)."""
    a = _fastmm(np.zeros((8, 512), np.float32))
    w = _fastmm(np.zeros((512, 1024), np.float32))
    out = _fastmm(np.zeros((8, 1040), np.float32))[:, :1024]  # C's rows 1040 apart
    _dispatch.matmul(a, w, out=out)
    (name, variant, args), = launched.args
    assert name == "fewcol_n8" and variant == "tt_v4"  # W^T's columns are 16-byte aligned: copied 16 bytes at a time
    assert (args["m"], args["n"], args["k"]) == (1024, 8, 512)
    assert (args["a_sm"], args["a_sk"], args["b_sk"], args["b_sn"]) == (1, 1024, 1, 512)
    assert (args["c_sm"], args["c_sn"]) == (1, 1040)


def test_matvec_splits_k_over_a_cluster_in_one_launch(launched):
    """2048 rows are 64 blocks: K split over clusters of two blocks, summed in the cluster (no workspace, no sum)."""
    a = _fastmm(np.zeros((2048, 16384), np.float32))
    v = _fastmm(np.zeros(16384, np.float32))
    _dispatch.matmul(a, v)
    ((name, variant, args),) = launched.args
    assert (name, variant, args["k"], args["batch"]) == ("fewcol_n1_c2", "nn_v4", 16384, 1)
    assert launched == ["fewcol_n1_c2"]


def test_matvec_splits_k_into_a_batch_of_slices(launched, monkeypatch):
    """On a GPU without thread-block clusters (before Hopper), slices of K are a batch summed by the slice sum."""
    from fastmm import _plan

    monkeypatch.setattr(_plan.few, "_clusters", lambda device: False)
    monkeypatch.setattr(_plan.tuned, "_memo", {})  # plans made with clusters must not answer (nor outlive the test)
    strided = lambda x, shape, strides: np.lib.stride_tricks.as_strided(x, shape, strides).view(FakeCupyArray)  # noqa
    monkeypatch.setattr(_arrays._cp, "lib", types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=strided)),
                        raising=False)
    a = _fastmm(np.zeros((2816, 4096), np.float32))  # 88 blocks of 32 rows: 3 slices are one wave of 264
    v = _fastmm(np.zeros(4096, np.float32))
    _dispatch.matmul(a, v)
    (name, variant, args), (_, _, tail), (total, _, sums) = launched.args
    assert name == "fewcol_n1" and variant == "nn_v4"  # v's unit stride along k does not make A unaligned
    # Three slices of K in whole 16-deep steps, 1360 deep, as one batch, and the 16 left over as a shallow launch of
    # their own, then fastmm's ordered sum of the four (slices x 2816 x 1) into the result.
    assert (args["batch"], args["k"], tail["batch"], tail["k"]) == (3, 1360, 1, 16)
    assert total == "slicesum" and (sums["k"], sums["m"], sums["n"], sums["a_sk"]) == (4, 2816, 1, 2816)
    assert launched == ["fewcol_n1", "fewcol_n1", "slicesum"]


def test_split_k_on_the_64x64_tiles_cuts_k_evenly_into_a_padded_workspace(launched, monkeypatch):
    """399 x 137 x 11639 (the split-k rule, 12 slices on the 64x64 tile): 12 slices ceil(k / 12) = 970 deep as one
    batch, the last ending at K (969 deep: the kernel's k_total), into a workspace whose rows are padded to 140 floats
    for 16-byte stores; then the ordered sum of its 12 slices' first 137 columns. No launch for what K leaves over
    (in whole 16-deep steps: 12 of 960 and 119 left)."""
    strided = lambda x, shape, strides: np.lib.stride_tricks.as_strided(x, shape, strides).view(FakeCupyArray)  # noqa
    monkeypatch.setattr(_arrays._cp, "lib", types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=strided)),
                        raising=False)
    a = _fastmm(np.zeros((399, 11639), np.float32))
    b = _fastmm(np.zeros((11639, 137), np.float32))
    _dispatch.matmul(a, b)
    (name, _, args), (total, _, sums) = launched.args
    assert name == "warptile_64x64x16_32x32_8x4_s4_tsum4" and launched == [name, "slicesum"]
    assert (args["batch"], args["k"], args["k_total"]) == (12, 970, 11639)
    assert (args["batch_inner"], args["batch_strides"][:4]) == (12, (0, 970, 0, 970 * 137))  # slice z from z * 970
    assert args["c_sm"] == 140 and args["n"] == 137
    assert total == "slicesum" and (sums["k"], sums["m"], sums["n"], sums["a_sm"], sums["a_sk"]) == (12, 399, 137, 140,
                                                                                                      399 * 140)
    assert sums.get("k_total", 0) == 0


def test_split_k_on_a_small_batch_runs_every_items_slices_in_one_launch(launched, monkeypatch):
    """2 x 95 x 150 x 10191 (split-k-idle on a batch of two: five 128x32 tiles an item): both items' 39 slices 262 deep
    as one launch of 78 batch items, the slices its inner axis (the last of each item ending at K, 235 deep: k_total),
    then both items' ordered sums as one launch, each into its own slice of C."""
    strided = lambda x, shape, strides: np.lib.stride_tricks.as_strided(x, shape, strides).view(FakeCupyArray)  # noqa
    monkeypatch.setattr(_arrays._cp, "lib", types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=strided)),
                        raising=False)
    a = _fastmm(np.zeros((2, 95, 10191), np.float32))
    b = _fastmm(np.zeros((2, 10191, 150), np.float32))
    c = _dispatch.matmul(a, b)
    assert c.shape == (2, 95, 150)
    tile = "warptile_128x32x16_32x32_8x4_s4_tsum4"
    assert launched == [tile, "slicesum"]
    (_, _, args), (_, _, sums) = launched.args
    assert (args["batch"], args["batch_inner"], args["k"], args["k_total"]) == (78, 39, 262, 10191)
    # Batch strides (A, B, C: outer = items, inner = slices): A's and B's own items, the slices 262 deep along K; the
    # workspace's items 39 slices of 95 rows padded to 152 floats apart.
    assert args["batch_strides"] == (95 * 10191, 262, 10191 * 150, 262 * 150, 39 * 95 * 152, 95 * 152)
    assert (sums["k"], sums["m"], sums["n"], sums["a_sm"], sums["batch"]) == (39, 95, 150, 152, 2)
    assert (sums["batch_inner"], sums["batch_strides"]) == (2, (0, 39 * 95 * 152, 0, 0, 0, 95 * 150))
    assert launched.ptrs[1][2] == c.data.ptr  # the sums write C, from its first item on
    # A broadcast A (one matrix against B's four items): its slices read the same A for every item.
    launched.clear(), launched.args.clear(), launched.ptrs.clear()
    _dispatch.matmul(_fastmm(np.zeros((70, 10604), np.float32)), _fastmm(np.zeros((4, 10604, 27), np.float32)))
    (_, _, args), (_, _, sums) = launched.args
    assert launched[1] == "slicesum" and args["batch"] == 4 * args["batch_inner"] and sums["batch"] == 4
    assert args["batch_strides"][0] == 0  # A's items: stride 0
    # Slices that divide K (2 x 95 x 150 x 8029, A transposed: 31 slices 259 deep) whose items and slices merge into
    # one batch axis (A's and B's items lie 31 slices apart along K): still one launch, no k_total (it ran item by
    # item, 7x slower than whole on 16 x 18 x 207 x 1362 in 2 slices).
    launched.clear(), launched.args.clear(), launched.ptrs.clear()
    a_t = _fastmm(np.zeros((2, 8029, 95), np.float32)).swapaxes(-1, -2)
    _dispatch.matmul(a_t, _fastmm(np.zeros((2, 8029, 150), np.float32)))
    (_, _, args), (_, _, sums) = launched.args
    assert launched == [tile, "slicesum"]
    assert (args["batch"], args["k"], args.get("k_total", 0), sums["batch"]) == (62, 259, 0, 2)
    # Batch axes that do not collapse to one (A's two axes swapped): each item split on its own, in turn.
    launched.clear(), launched.args.clear(), launched.ptrs.clear()
    a = _fastmm(np.zeros((3, 2, 95, 10191), np.float32)).transpose(1, 0, 2, 3)
    _dispatch.matmul(a, _fastmm(np.zeros((2, 3, 10191, 150), np.float32)))
    assert launched == [tile, "slicesum"] * 6 and {args["batch"] for _, _, args in launched.args} == {17, 1}
    # ... on a K under 1024 an item (here 340), where three launches an item cost more than splitting saves: the
    # batch unsplit, in one launch.
    launched.clear(), launched.args.clear(), launched.ptrs.clear()
    a = _fastmm(np.zeros((3, 2, 95, 2040), np.float32)).transpose(1, 0, 2, 3)
    _dispatch.matmul(a, _fastmm(np.zeros((2, 3, 2040, 150), np.float32)))
    assert launched == [tile] and launched.args[0][2]["batch"] == 6 and launched.args[0][2]["k"] == 2040
    # ... without allocating the slices' workspace, which it does not use (out of memory there failed a product that
    # needs none); a batch that splits allocates it, once.
    from fastmm._runtime import gemm as _gemm

    allocated, real_empty = [], _gemm.empty
    monkeypatch.setattr(_gemm, "empty", lambda shape: allocated.append(shape) or real_empty(shape))
    a = _fastmm(np.zeros((3, 2, 95, 2056), np.float32)).transpose(1, 0, 2, 3)
    _dispatch.matmul(a, _fastmm(np.zeros((2, 3, 2056, 150), np.float32)))
    assert allocated == []
    _dispatch.matmul(_fastmm(np.zeros((2, 95, 10191), np.float32)), _fastmm(np.zeros((2, 10191, 150), np.float32)))
    assert allocated == [(2, 39, 95, 152)]


def test_einsum_with_dtype_none_is_still_one_product(fake_cupy, monkeypatch, rng):
    """Dask calls every chunk's einsum with dtype=None: that must not send it to CuPy's einsum."""
    seen = _numpy_gemm(monkeypatch)
    a, b = _operand(rng, (3, 4), np.float32), _operand(rng, (4, 5), np.float32)
    for dtype in (None, np.float32):
        got = _dispatch.einsum("ij,jk->ik", _fastmm(a), _fastmm(b), dtype=dtype)
        _check(got, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    assert len(seen) == 2


def test_few_row_products_replay_with_their_operands_swapped(launched):
    """A second v @ W of the same signature replays the transposed launch: W's pointer as the kernel's A."""
    a = _fastmm(np.zeros((8, 512), np.float32))
    w = _fastmm(np.zeros((512, 1024), np.float32))
    _dispatch.matmul(a, w)
    a2 = _fastmm(np.zeros((8, 512), np.float32))
    w2 = _fastmm(np.zeros((512, 1024), np.float32))
    _dispatch.matmul(a2, w2)
    assert len(launched.args) == 1  # the second product made no new Launch: a replay
    first, second = launched.ptrs
    assert first[:2] == (w.data.ptr, a.data.ptr) and second[:2] == (w2.data.ptr, a2.data.ptr)


def test_unaligned_operands_are_copied_aligned_then_multiplied(launched, monkeypatch):
    """The aligned-copy rule (lowered here to small products): A and B, whose rows are not 16-byte aligned, are each
    copied by repitch into rows padded to 16 bytes, K padded with zeros to whole 16-deep K-tiles, and the product
    runs on the copies with 16-byte loads; an A whose rows are aligned is not copied where K needs no padding. Where
    the copies do not fit in memory, the product runs on 4-byte copies."""
    from fastmm import _errors, _plan

    monkeypatch.setattr(_plan.table, "_PAD_MIN_MACS", 1 << 20)
    monkeypatch.setattr(_plan.tuned, "_memo", {})
    a = _fastmm(np.zeros((301, 303), np.float32))
    b = _fastmm(np.zeros((303, 305), np.float32))
    _dispatch.matmul(a, b)
    (copy_a, _, args_a), (copy_b, _, args_b), (zeros_b, _, args_z), (product, variant, args) = launched.args
    assert (copy_a, copy_b, zeros_b) == ("repitch",) * 3 and variant.endswith("_v4")
    # A's rows (K) read 303 long, written 304 (the last a zero); B's 303 rows copied, then one row of zeros (K = 0
    # read) written after them; the product on K = 304.
    assert [args_a[x] for x in ("m", "n", "k", "a_sm", "c_sm")] == [301, 304, 303, 303, 304]
    assert [args_b[x] for x in ("m", "n", "k", "a_sm", "c_sm")] == [303, 308, 305, 305, 308]
    assert [args_z[x] for x in ("m", "n", "k", "c_sm")] == [1, 308, 0, 308]
    assert (args["m"], args["n"], args["k"]) == (301, 305, 304)
    assert launched.ptrs[0][0] == a.data.ptr and launched.ptrs[1][0] == b.data.ptr
    assert launched.ptrs[2][2] == launched.ptrs[1][2] + 4 * 303 * 308  # the zeros right after B's rows

    launched.clear(), launched.args.clear()
    aligned_a = _fastmm(np.zeros((301, 304), np.float32))
    _dispatch.matmul(aligned_a, _fastmm(np.zeros((304, 305), np.float32)))
    assert launched[0] == "repitch" and len(launched) == 2 and launched.args[0][2]["m"] == 304  # B alone

    launched.clear(), launched.args.clear()
    aligned_a = _fastmm(np.zeros((301, 300), np.float32))  # aligned rows, but K = 300 is padded: both copied
    _dispatch.matmul(aligned_a, _fastmm(np.zeros((300, 305), np.float32)))
    assert launched[:2] == ["repitch", "repitch"] and launched.args[0][2]["n"] == 304 and launched.args[-1][2]["k"] == 304

    launched.clear(), launched.args.clear()
    real_empty = _gemm.empty

    def no_room(shape, dtype=np.float32):
        if shape[-1] % 4 == 0 and shape not in ((301, 305),):  # a copy's buffer (the result has 305 columns)
            raise _errors.OutOfMemoryError("out of GPU memory (stand-in)")
        return real_empty(shape, dtype)

    monkeypatch.setattr(_gemm, "empty", no_room)
    monkeypatch.setattr(_gemm, "replays", {})
    _dispatch.matmul(_fastmm(np.zeros((301, 303), np.float32)), _fastmm(np.zeros((303, 305), np.float32)))
    assert len(launched) == 1 and launched.args[0][1].endswith("_v1")  # no copies: the product on 4-byte copies


def test_the_copies_product_and_its_pieces_sum_k_in_runs(launched, monkeypatch):
    """The product on aligned copies is planned as such (the runtime passes `runs` down explicitly, to the pieces of a
    peeled or split plan too): on 128x64 tiles with K >= 1024, the configuration that sums K in runs of 512 (the twin
    whose loop takes the blocks across C's edges as well)."""
    from fastmm import _plan

    monkeypatch.setattr(_plan.table, "_PAD_MIN_MACS", 1 << 20)
    monkeypatch.setattr(_plan.tuned, "_memo", {})
    a = _fastmm(np.zeros((1000, 1031), np.float32))
    b = _fastmm(np.zeros((1031, 1001), np.float32))  # B's rows unaligned (A's alone: copied 4 bytes at a time anyway)
    _dispatch.matmul(a, b)
    products = [name for name in launched if name != "repitch"]
    assert products == ["warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"], launched  # (its edge blocks in runs too)
    launched.clear()
    _dispatch.matmul(_fastmm(np.zeros((1000, 1040), np.float32)), _fastmm(np.zeros((1040, 1000), np.float32)))
    assert launched == ["warptile_128x64x16_32x64_8x8_s4_sub8"]  # aligned: no copies, one running sum


def test_only_the_operands_the_tiles_copy_16_bytes_at_a_time_need_aligned_rows(launched):
    """The tiles copy a row-major A and a transposed B 4 bytes at a time, transposing, so their rows' alignment does
    not matter: a K that is not a multiple of 4 keeps a row-major B's 16-byte copies (v4). A transposed A is copied
    16 bytes at a time and needs its own; the register tiles load both operands 16 bytes at a time and need both."""
    from fastmm import _plan

    a = _fastmm(np.zeros((300, 301), np.float32))
    b = _fastmm(np.zeros((301, 300), np.float32))
    _dispatch.matmul(a, b)
    ((name, variant, _),) = launched.args
    assert name.startswith("warptile") and variant == "nn_v4", (name, variant)
    launched.args.clear()
    at = _fastmm(np.zeros((301, 301), np.float32))[:, :300].T  # A^T with rows of 301 floats: unaligned, copied so
    _dispatch.matmul(at, b)
    assert [variant for _, variant, _ in launched.args] == ["tn_v1"], launched.args
    launched.args.clear()
    with _plan.use_kernel("regtile_128x128x8_8x8"):
        _dispatch.matmul(a, b)
    assert [variant for _, variant, _ in launched.args] == ["nn_v1"], launched.args
