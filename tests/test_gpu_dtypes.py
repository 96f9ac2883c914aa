"""Drop-in for every dtype and every NumPy form of the matrix-product family, with NumPy as the oracle (GPU).

Each product runs on fastmm arrays and on NumPy arrays of the same values; results must have NumPy's dtype and
shape, be fastmm arrays, and agree in value; errors must be of the exception type NumPy raises. float32 products
must still reach fastmm's own kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]
IDS = [np.dtype(d).name for d in DTYPES]


def operand(rng, shape, dtype):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind in "iu":
        return rng.integers(0 if kind == "u" else -5, 6, shape).astype(dtype)
    x = rng.uniform(-1, 1, shape)
    if kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x.astype(dtype)


def tol(dtype):
    return {"e": 2e-2, "f": 1e-5, "c": 1e-5}.get(np.dtype(dtype).kind, 0) if np.dtype(dtype) != np.float16 else 2e-2


def same(got, want, dtype=None):
    import fastmm

    want = np.asarray(want)
    assert isinstance(got, fastmm.ndarray), type(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    t = tol(want.dtype if dtype is None else dtype)
    host = cp.asnumpy(got)
    if want.dtype.kind in "fc":
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(host, want, rtol=t, atol=t * scale)
    else:
        np.testing.assert_array_equal(host, want)


def raises_like_numpy(np_call, fm_call):
    try:
        np_call()
    except Exception as e:  # noqa: BLE001 - NumPy is the oracle for the exception type
        expected = e
    else:
        raise AssertionError("NumPy did not raise")
    family = next(t for t in (TypeError, ValueError, IndexError) if isinstance(expected, t))
    with pytest.raises(family) as info:
        fm_call()
    return expected, info.value


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_every_product_of_every_dtype(dtype, rng, launches):
    import fastmm

    a, b = operand(rng, (6, 5), dtype), operand(rng, (5, 4), dtype)
    a3, b3 = operand(rng, (2, 6, 5), dtype), operand(rng, (3, 5, 4), dtype)
    v = operand(rng, (5,), dtype)
    fa, fb, fa3, fb3, fv = map(fastmm.asarray, (a, b, a3, b3, v))
    same(fa @ fb, a @ b)
    same(np.matmul(fa3[:, None], fb3), np.matmul(a3[:, None], b3))
    same(fa.dot(fb), a.dot(b))
    same(np.dot(fa, fb), np.dot(a, b))
    same(np.dot(fa3, fb3), np.dot(a3, b3))        # N-D dot
    same(np.dot(fa3, fv), np.dot(a3, v))
    same(np.dot(fv, fv), np.dot(v, v))
    same(np.inner(fa, fa), np.inner(a, a))
    same(np.vdot(fa, fa), np.vdot(a, a))
    same(np.tensordot(fa3, fb3, axes=([2], [1])), np.tensordot(a3, b3, axes=([2], [1])))
    same(np.einsum("ij,jk->ik", fa, fb), np.einsum("ij,jk->ik", a, b))
    same(np.einsum(fa, [0, 1], fb, [1, 2], [0, 2]), np.einsum(a, [0, 1], b, [1, 2], [0, 2]))
    same(np.linalg.matmul(fa, fb), np.linalg.matmul(a, b))
    if hasattr(np, "matvec"):
        same(np.matvec(fa, fv), np.matvec(a, v))
        same(np.vecmat(fv, fb), np.vecmat(v, b))
        same(np.vecdot(fa, fa), np.vecdot(a, a))
    # Transposed and sliced operands.
    same(fa.T @ fa, a.T @ a)
    same(fa[::2] @ fb[:, 1:], a[::2] @ b[:, 1:])
    same(np.dot(fa[:, ::-1], fb[::-1]), np.dot(a[:, ::-1], b[::-1]))
    if np.dtype(dtype) == np.float32:
        assert len(launches) >= 15  # float32 stays on fastmm's kernels
    else:
        assert launches == []


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_out_for_every_dtype(dtype, rng):
    import fastmm

    a, b = operand(rng, (6, 5), dtype), operand(rng, (5, 4), dtype)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    res = (a @ b).dtype
    out = fastmm.asarray(np.zeros((6, 4), res))
    assert np.matmul(fa, fb, out=out) is out
    same(out, a @ b)
    out = fastmm.asarray(np.zeros((6, 4), res))
    assert np.dot(fa, fb, out=out) is out
    same(out, np.dot(a, b))
    plain_out = cp.zeros((6, 4), res)  # np.dot's out may come positionally, and a plain CuPy out stays CuPy's
    assert np.dot(fa, fb, plain_out) is plain_out and type(plain_out) is cp.ndarray
    same(plain_out.view(fastmm.ndarray), np.dot(a, b))
    out3 = fastmm.asarray(np.zeros((2, 6, 4), res))
    a3 = operand(rng, (2, 6, 5), dtype)
    assert np.dot(fastmm.asarray(a3), fb, out=out3) is out3
    same(out3, np.dot(a3, b))
    wide = fastmm.asarray(np.zeros((6, 4), np.complex128))
    np.matmul(fa, fb, out=wide)
    same(wide, (a @ b).astype(np.complex128))
    host = np.zeros((6, 4), res)
    assert np.matmul(fa, fb, out=host) is host
    # A wrong out: NumPy's exception, and the out untouched.
    bad = fastmm.asarray(np.full((6, 5), 7, res))
    raises_like_numpy(lambda: np.matmul(a, b, out=np.full((6, 5), 7, res)), lambda: np.matmul(fa, fb, out=bad))
    raises_like_numpy(lambda: np.dot(a, b, out=np.full((6, 5), 7, res)), lambda: np.dot(fa, fb, out=bad))
    assert (cp.asnumpy(bad) == np.full((6, 5), 7, res)).all()


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.complex64], ids=str)
def test_shape_errors_are_numpys(dtype, rng):
    import fastmm

    a, b = operand(rng, (3, 4), dtype), operand(rng, (5, 6), dtype)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    for name in ("matmul", "dot", "inner", "vdot", "tensordot"):
        np_f, fm_f = getattr(np, name), getattr(np, name)
        want, got = raises_like_numpy(lambda: np_f(a, b), lambda: fm_f(fa, fb))
    raises_like_numpy(lambda: a @ b, lambda: fa @ fb)
    raises_like_numpy(lambda: np.einsum("ij,jk->ik", a, b), lambda: np.einsum("ij,jk->ik", fa, fb))
    raises_like_numpy(lambda: np.einsum("ij,jk->ik", a), lambda: np.einsum("ij,jk->ik", fa))
    raises_like_numpy(lambda: np.einsum(a, [0, 1], b), lambda: np.einsum(fa, [0, 1], fb))
    raises_like_numpy(lambda: np.einsum(a, [0, 99], b, [99, 1]), lambda: np.einsum(fa, [0, 99], fb, [99, 1]))


def test_zero_d_and_void_operands_raise_numpys_type(rng):
    import fastmm

    a = operand(rng, (3, 3), np.float32)
    fa = fastmm.asarray(a)
    for other in (np.float32(2), np.array(2.0, np.float32), 3, np.void(b"abcd"), np.zeros((3, 3), "V4"),
                  np.zeros((3, 3), "U1")):
        raises_like_numpy(lambda: np.matmul(a, other), lambda: np.matmul(fa, other))
        raises_like_numpy(lambda: np.matmul(other, a), lambda: np.matmul(other, fa))
        raises_like_numpy(lambda: a @ other, lambda: fa @ other)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64], ids=str)
def test_matmul_axes_and_axis(dtype, rng, launches):
    import fastmm

    a, b = operand(rng, (3, 2, 4), dtype), operand(rng, (4, 5, 2), dtype)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    axes = [(0, 2), (0, 1), (2, 0)]  # a's (m, k) at axes 0 and 2, b's (k, n) at 0 and 1, C's (m, n) at 2 and 0
    same(np.matmul(fa, fb, axes=axes), np.matmul(a, b, axes=axes))
    out = fastmm.asarray(np.zeros(np.matmul(a, b, axes=axes).shape, dtype))
    assert np.matmul(fa, fb, axes=axes, out=out) is out
    same(out, np.matmul(a, b, axes=axes))
    same(np.matmul(fa, fb, axes=[(-3, -1), (-3, -2), (-1, -3)]), np.matmul(a, b, axes=[(-3, -1), (-3, -2), (-1, -3)]))
    if hasattr(np, "vecdot"):
        same(np.vecdot(fa, fa, axis=1), np.vecdot(a, a, axis=1))
        same(np.vecdot(fa, fa, axis=0, keepdims=True), np.vecdot(a, a, axis=0, keepdims=True))
    for bad in ([(0, 1), (1, 2)], [(0, 0), (0, 1), (0, 1)], [(0, 5), (0, 1), (0, 1)], ((0, 1),) * 3, [1, (0, 1), (0, 1)]):
        raises_like_numpy(lambda: np.matmul(a, b, axes=bad), lambda: np.matmul(fa, fb, axes=bad))
    raises_like_numpy(lambda: np.matmul(a, b, axis=0), lambda: np.matmul(fa, fb, axis=0))
    raises_like_numpy(lambda: np.matmul(a, b, keepdims=True), lambda: np.matmul(fa, fb, keepdims=True))
    if np.dtype(dtype) == np.float32:
        assert launches, "float32 products with axes= run on fastmm's kernels"


def test_einsum_sublist_form_on_fastmm_kernels(rng, launches):
    import fastmm

    a, b = operand(rng, (2, 6, 5), np.float32), operand(rng, (2, 5, 4), np.float32)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    same(np.einsum(fa, [0, 1, 2], fb, [0, 2, 3], [0, 1, 3]), np.einsum(a, [0, 1, 2], b, [0, 2, 3], [0, 1, 3]))
    same(np.einsum(fa, [Ellipsis, 1, 2], fb, [Ellipsis, 2, 3], [Ellipsis, 1, 3]),
         np.einsum(a, [Ellipsis, 1, 2], b, [Ellipsis, 2, 3], [Ellipsis, 1, 3]))
    same(fastmm.einsum(fa, [0, 1, 2], b, [0, 2, 3], [0, 1, 3]), np.einsum(a, [0, 1, 2], b, [0, 2, 3], [0, 1, 3]))
    assert len(launches) >= 2


class Deferring:
    """An operand that asks NumPy's operators to let it go first."""

    __array_priority__ = 1e6

    def __matmul__(self, other):
        return "Deferring.__matmul__"

    def __rmatmul__(self, other):
        return "Deferring.__rmatmul__"

    def __imatmul__(self, other):
        return NotImplemented


class OptOut:
    __array_ufunc__ = None

    def __rmatmul__(self, other):
        return "OptOut.__rmatmul__"


class OptOutNoReflected:
    __array_ufunc__ = None


def test_operator_deferral_follows_numpy(rng):
    import fastmm

    a = operand(rng, (3, 3), np.float32)
    for x in (a, fastmm.asarray(a)):  # NumPy's own ndarray is the control
        for other in (Deferring(), OptOut()):
            assert x @ other == f"{type(other).__name__}.__rmatmul__"
        y = x.copy()
        y @= Deferring()  # in-place: priority defers, the other's __rmatmul__ answers
        assert y == "Deferring.__rmatmul__"
        with pytest.raises(TypeError):
            x @ OptOutNoReflected()
        with pytest.raises(TypeError):
            OptOutNoReflected() @ x
        z = x.copy()
        with pytest.raises(TypeError):
            z @= OptOutNoReflected()
    # ndarray @ fastmm: NumPy's operator hands the product to fastmm (it defines __array_ufunc__).
    fa = fastmm.asarray(a)
    assert isinstance(a @ fa, fastmm.ndarray)


def test_views_behave_as_cupys(rng):
    import fastmm

    a = operand(rng, (4, 4), np.float32)
    for x in (cp.asarray(a), fastmm.asarray(a)):  # CuPy is the control
        owner = x
        assert owner.base is None
        for view in (np.einsum("ii->i", x), np.einsum("ji", x), np.diagonal(x), x.diagonal(), x[1:], x.T,
                     x.reshape(2, 8), np.transpose(x), x[:, ::2]):
            assert view.base is owner, (type(x), view)
            assert np.shares_memory(view, owner)
            assert type(view) is type(x)
        d = np.einsum("ii->i", x)
        d[...] = 7  # writes through the view
        assert float(x[2, 2]) == 7
        r = x @ x
        assert r.base is None and not np.shares_memory(r, x)
        v = r[1:].T
        assert v.base is r
    assert isinstance(fastmm.asarray(a).view(cp.ndarray), cp.ndarray)
    assert type(fastmm.asarray(a).view(cp.ndarray)) is cp.ndarray


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_results_are_new_fastmm_arrays_and_operands_keep_their_type(dtype, rng):
    """A product's result is retyped in place (no second object): it must be a fastmm array that owns its memory
    (as NumPy's and CuPy's results do; CuPy's einsum of other dtypes than float32 returns a view of its own
    intermediate, and so does fastmm's, which is CuPy's), and no operand, plain CuPy or fastmm, may change type or
    be handed back."""
    import fastmm

    a, v = operand(rng, (5, 5), dtype), operand(rng, (5,), dtype)
    fa, ca, fv, cv = fastmm.asarray(a), cp.asarray(a), fastmm.asarray(v), cp.asarray(v)
    products = [lambda: fa.dot(fa), lambda: fa @ ca, lambda: ca @ fa, lambda: np.matmul(fa, ca), lambda: np.dot(ca, fa),
                lambda: fv.dot(fv), lambda: fa.dot(fv), lambda: np.inner(fa, cv), lambda: np.vdot(fv, cv),
                lambda: np.tensordot(fa, ca, 1), lambda: np.einsum("ij,jk->ik", fa, ca), lambda: fastmm.matmul(fa, ca),
                lambda: fastmm.dot(ca, ca), lambda: fastmm.inner(ca, ca), lambda: np.matvec(fa, cv)]
    for i, product in enumerate(products):
        r = product()
        assert type(r) is fastmm.ndarray
        assert r.base is None or i == 10 and dtype != np.float32, i
        # (CuPy's shares_memory fails on 0-d complex arrays: a 0-d result is checked by identity alone.)
        assert all(r is not x and (r.ndim == 0 or not np.shares_memory(r, x)) for x in (fa, ca, fv, cv)), i
        assert (type(fa), type(ca), type(fv), type(cv)) == (fastmm.ndarray, cp.ndarray, fastmm.ndarray, cp.ndarray)
    same(fa.dot(fv), a.dot(v))
    same(fv.dot(fv), v.dot(v))
    # astype, which CuPy's products call on every operand: no copy when none is asked for, CuPy's copies otherwise.
    assert fa.astype(fa.dtype, copy=False) is fa
    t = fa.T[::2]
    assert type(t.astype(dtype, order="C", copy=None)) is fastmm.ndarray
    assert t.astype(dtype, order="C", copy=None).flags.c_contiguous and not np.shares_memory(t.astype(dtype), t)
    assert type(fa.astype(np.complex128)) is fastmm.ndarray
    ct = ca.T[::2]  # a copy is needed: whatever CuPy does (newer CuPys raise), fastmm does
    try:
        want = ct.astype(dtype, order="C", copy=False)
    except ValueError:
        with pytest.raises(ValueError):
            t.astype(dtype, order="C", copy=False)
    else:
        got = t.astype(dtype, order="C", copy=False)
        assert type(got) is fastmm.ndarray and np.shares_memory(got, t) == np.shares_memory(want, ct)


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.bool_, np.float32, np.float64], ids=str)
def test_mixed_dtype_nd_dot_and_empty_contractions(dtype, rng):
    import fastmm

    a3, b3 = operand(rng, (2, 3, 4), dtype), operand(rng, (3, 4, 2), np.float32)
    same(np.dot(fastmm.asarray(a3), fastmm.asarray(b3)), np.dot(a3, b3), np.float32)
    for x, y in (((2, 3, 0), (3, 0, 2)), ((2, 0), (0, 3))):
        a, b = operand(rng, x, dtype), operand(rng, y, np.float32)
        same(np.dot(fastmm.asarray(a), fastmm.asarray(b)), np.dot(a, b))
    z1, z2 = np.ones((2, 0), dtype), np.ones((3, 0), dtype)
    same(np.inner(fastmm.asarray(z1), fastmm.asarray(z2)), np.inner(z1, z2))
    same(np.tensordot(fastmm.asarray(z1), fastmm.asarray(z2.T), axes=1), np.tensordot(z1, z2.T, axes=1))
