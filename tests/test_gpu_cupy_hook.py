"""accelerate_cupy() on the GPU: products of plain CuPy float32 arrays on fastmm's kernels through every rebound
name, on cuBLAS without the hook, left to cuBLAS where the plan says it is ahead, from threads and streams, from
an array-API library, and falling back to CuPy when fastmm fails."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import fastmm

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def _off_afterwards():
    fastmm.restore_cupy()
    yield
    fastmm.restore_cupy()


def _close(got, want64, bound=1e-5, kind=cp.ndarray):
    """Within SGEMM accuracy of a float64 reference; of type `kind` (a plain cupy.ndarray, as CuPy returns, unless
    the operands were fastmm arrays)."""
    assert type(got) is kind and got.dtype == np.float32, (type(got), got.dtype)
    want64 = cp.asarray(want64)
    assert got.shape == want64.shape, (got.shape, want64.shape)
    err = float(cp.linalg.norm(got.astype(cp.float64) - want64) / cp.linalg.norm(want64))
    assert err < bound, err


def _f32(rng, *shape):
    return cp.asarray(rng.standard_normal(shape).astype(np.float32))


def _d(x):
    return x.astype(cp.float64)


# (label, call on float32 CuPy arrays a (M, K), b (K, N), its float64 reference from a and b in float64)
M, K, N = 256, 192, 320
AB = lambda a, b: a @ b  # noqa: E731
CALLS = [
    ("cupy.matmul", lambda a, b: cp.matmul(a, b), AB),
    ("cupy.linalg.matmul", lambda a, b: cp.linalg.matmul(a, b), AB),
    ("cupy.matmul out=", lambda a, b: cp.matmul(a, b, out=cp.full((M, N), cp.nan, cp.float32)), AB),
    ("cupy.matmul transposed views", lambda a, b: cp.matmul(b.T, a.T), lambda a, b: (a @ b).T),
    ("cupy.matmul batched", lambda a, b: cp.matmul(cp.stack([a, a * 2]), b), lambda a, b: cp.stack([a @ b, 2 * a @ b])),
    ("cupy.dot", lambda a, b: cp.dot(a, b), AB),
    ("cupy.dot out", lambda a, b: cp.dot(a, b, cp.full((M, N), cp.nan, cp.float32)), AB),
    ("cupy.dot vector", lambda a, b: cp.dot(a, b[:, 0].copy()), lambda a, b: a @ b[:, 0]),
    ("cupy.inner", lambda a, b: cp.inner(a, b.T), AB),
    ("cupy.vdot", lambda a, b: cp.vdot(a, b[:, :M].T), lambda a, b: cp.sum(a * b[:, :M].T)),
    ("cupy.tensordot", lambda a, b: cp.tensordot(a, b, axes=1), AB),
    ("cupy.tensordot pairs", lambda a, b: cp.tensordot(a, b, axes=([1], [0])), AB),
    ("cupy.einsum", lambda a, b: cp.einsum("ij,jk->ik", a, b), AB),
    ("cupy.einsum sublists", lambda a, b: cp.einsum(a, [0, 1], b, [1, 2], [0, 2]), AB),
    ("@", lambda a, b: a @ b, AB),
    ("ndarray.dot", lambda a, b: a.dot(b), AB),
    ("ndarray.dot out", lambda a, b: a.dot(b, cp.full((M, N), cp.nan, cp.float32)), AB),
]


@pytest.mark.parametrize("label,call,ref", CALLS, ids=[c[0] for c in CALLS])
def test_each_entry_point_runs_fastmm_under_the_hook_and_cublas_without(label, call, ref, rng, launches):
    a, b = _f32(rng, M, K), _f32(rng, K, N)
    want = ref(_d(a), _d(b))
    plain = call(a, b)
    assert launches == [], f"{label} ran fastmm's kernels without the hook"
    with fastmm.accelerate_cupy():
        got = call(a, b)
    assert launches, f"{label} did not reach fastmm's kernels under the hook"
    _close(got, want)
    _close(plain, want)


def test_in_place_operator_rebinds_as_in_cupy(rng, launches):
    a, b = _f32(rng, M, K), _f32(rng, K, K)
    x, want = a, _d(a) @ _d(b)
    with fastmm.accelerate_cupy():
        x @= b
    assert launches and x is not a  # CuPy: x = x @ b, a new array
    _close(x, want)


def test_other_dtypes_and_forms_stay_cupys_bit_for_bit(rng, launches):
    d = cp.asarray(rng.standard_normal((300, 300)))
    h = d.astype(cp.float16)
    a = d.astype(cp.float32)
    want = [d @ d, cp.matmul(h, h), cp.dot(a, d), cp.matmul(a, a, axes=[(-2, -1), (-2, -1), (-2, -1)])]
    with fastmm.accelerate_cupy():
        got = [d @ d, cp.matmul(h, h), cp.dot(a, d), cp.matmul(a, a, axes=[(-2, -1), (-2, -1), (-2, -1)])]
    assert launches == []
    assert all(type(g) is cp.ndarray and bool(cp.array_equal(g, w)) for g, w in zip(got, want))


@pytest.mark.parametrize("shape", [(768, 256, 768), (2501, 2501, 2501), (4096, 8192, 24), (7021, 3, 3497)], ids=str)
def test_shapes_where_cublas_is_ahead_are_left_to_cupy(shape, rng, launches):
    m, k, n = shape
    a, b = _f32(rng, m, k), _f32(rng, k, n)
    assert "leave this product to cuBLAS" in fastmm.explain(a, b)
    before = fastmm.cupy_hook_status()["left_to_cupy"]
    want = cp.matmul(a, b)  # cuBLAS, no hook
    with fastmm.accelerate_cupy():
        got = a @ b
        assert fastmm.cupy_hook_status()["left_to_cupy"] == before + 1
    assert launches == []
    assert bool(cp.array_equal(got, want))  # the same cuBLAS call: the same bits
    fastmm.asarray(a) @ fastmm.asarray(b)
    assert launches  # fastmm arrays still run fastmm's kernels: the user chose them


def test_outer_products_run_on_fastmm_under_the_hook(rng, launches):
    """x @ y.T of 3-D points (K = 3), C's rows 16-byte aligned: the outer-products kernel, ahead of cuBLAS."""
    x, y = _f32(rng, 10000, 3), _f32(rng, 8192, 3)
    assert "leave this product to cuBLAS" not in fastmm.explain(x, y.T)
    with fastmm.accelerate_cupy():
        got = x @ y.T
    assert launches and all(name.startswith("naive_32x8_4x4") for name in launches), launches
    _close(got, _d(x) @ _d(y).T)


@pytest.mark.parametrize("shape", [(8192, 8192, 1), (4096, 4096, 16), (8, 4096, 4096)], ids=str)
def test_few_column_shapes_run_on_fastmm_under_the_hook(shape, rng, launches):
    """Matrix-vector and few-column products: the few-column kernel is level with cuBLAS or ahead, so the hook
    runs them on fastmm's kernels (they were left to cuBLAS while it trailed)."""
    m, k, n = shape
    a, b = _f32(rng, m, k), _f32(rng, k, n)
    assert "leave this product to cuBLAS" not in fastmm.explain(a, b)
    with fastmm.accelerate_cupy():
        got = a @ b
    assert launches and all(name.startswith("fewcol") or name == "slicesum" for name in launches), launches
    _close(got, _d(a) @ _d(b))


def test_a_fastmm_failure_falls_back_to_cupy_once_warned(monkeypatch, rng):
    from fastmm._runtime import gemm as _gemm

    def fail(*args, **kwargs):
        raise fastmm.LaunchError("stand-in: the driver refused the launch")

    monkeypatch.setattr(_gemm, "gemm", fail)
    monkeypatch.setattr(_gemm, "replays", {})
    monkeypatch.setattr(fastmm._errors, "_warned", set())
    a, b = _f32(rng, M, K), _f32(rng, K, N)
    want = cp.matmul(a, b)
    with fastmm.accelerate_cupy(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [a @ b, cp.matmul(a, b), cp.dot(a, b)]
    assert all(bool(cp.array_equal(g, want)) for g in got)
    assert len([w for w in seen if issubclass(w.category, fastmm.PerformanceWarning)]) == 1
    assert fastmm.cupy_hook_status()["declined_after_failure"] >= 3


def test_cupys_own_errors_for_calls_cupy_refuses(rng):
    a, b = _f32(rng, 4, 5), _f32(rng, 6, 7)
    errors = []
    for hooked in (False, True):
        with fastmm.accelerate_cupy() if hooked else _nothing():
            for call in (lambda: a @ b, lambda: cp.matmul(a, b), lambda: cp.dot(a, b), lambda: cp.tensordot(a, b, 1)):
                with pytest.raises(ValueError) as e:
                    call()
                errors.append((type(e.value), str(e.value)))
    assert errors[:4] == errors[4:]  # the same exceptions, with CuPy's words, hook or not


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_threads_and_non_blocking_streams(rng, launches):
    xs = [_f32(rng, 512, 512) for _ in range(8)]
    want = [_d(x) @ _d(x).T for x in xs]

    def work(i):
        with cp.cuda.Stream(non_blocking=True) as s:
            c = xs[i] @ xs[i].T
            s.synchronize()
        return c

    with fastmm.accelerate_cupy():
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(work, range(8)))
    for g, w in zip(got, want):
        _close(g, w)
    assert len(launches) >= 8


def test_array_api_namespace_reaches_fastmm(rng, launches):
    compat = pytest.importorskip("array_api_compat", reason="array_api_compat is not installed")
    a, b = _f32(rng, M, K), _f32(rng, K, N)
    xp = compat.array_namespace(a)
    with fastmm.accelerate_cupy():
        got = [xp.matmul(a, b), xp.linalg.matmul(a, b), xp.tensordot(a, b, axes=1), a @ b]
        v = xp.vecdot(a, a[::-1])
    assert len(launches) >= 5
    for g in got:
        _close(g, _d(a) @ _d(b))
    _close(v, cp.sum(_d(a) * _d(a[::-1]), axis=-1))


def test_array_api_namespace_on_fastmm_arrays_reaches_fastmm(rng, launches):
    """array_api_compat resolves a fastmm array to CuPy's namespace: under the hook its products run fastmm's
    kernels, and give fastmm arrays, as np.matmul on them does."""
    compat = pytest.importorskip("array_api_compat", reason="array_api_compat is not installed")
    a, b = fastmm.asarray(_f32(rng, M, K)), fastmm.asarray(_f32(rng, K, N))
    xp = compat.array_namespace(a)
    with fastmm.accelerate_cupy():
        got = [xp.matmul(a, b), xp.tensordot(a, b, axes=1), cp.matmul(a, b)]
    assert len(launches) >= 3
    for g in got:
        _close(g, _d(a) @ _d(b), kind=fastmm.ndarray)


def test_scikit_learn_array_api_products_run_on_fastmm():
    """In a child process (SciPy's array-API mode must be set before SciPy is imported): scikit-learn's pairwise
    kernels on float32 CuPy data, with and without the hook, counting fastmm's launches. rbf_kernel makes no
    float32 product (scikit-learn computes float32 euclidean distances on float64 copies): it stays CuPy's."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed")
    pytest.importorskip("array_api_compat", reason="array_api_compat is not installed")
    code = textwrap.dedent("""
        import json, cupy as cp, sklearn, fastmm
        from fastmm._runtime import cuda as _cuda
        from sklearn.metrics.pairwise import cosine_similarity, linear_kernel, rbf_kernel
        n = []
        real = _cuda.Launch.__call__
        def spy(self, *a):
            n.append(1)
            return real(self, *a)
        _cuda.Launch.__call__ = spy
        rng = cp.random.default_rng(0)
        X = rng.standard_normal((4096, 512), dtype=cp.float32)
        Y = rng.standard_normal((2048, 512), dtype=cp.float32)
        out = {}
        with sklearn.config_context(array_api_dispatch=True):
            for name, f in (("rbf", lambda: rbf_kernel(X, Y)), ("cos", lambda: cosine_similarity(X, Y)),
                            ("linear", lambda: linear_kernel(X, Y))):
                n.clear(); plain = f(); out[name + "_plain_launches"] = len(n)
                n.clear()
                with fastmm.accelerate_cupy():
                    hooked = f()
                out[name + "_hook_launches"] = len(n)
                out[name + "_type"] = type(hooked).__name__
                out[name + "_err"] = float(cp.linalg.norm(hooked - plain) / cp.linalg.norm(plain))
        print(json.dumps(out))
    """)
    env = dict(os.environ, SCIPY_ARRAY_API="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for name in ("rbf", "cos", "linear"):
        assert out[name + "_plain_launches"] == 0, out
        assert (out[name + "_hook_launches"] >= 1) == (name != "rbf"), out
        assert out[name + "_type"] == "ndarray" and out[name + "_err"] < 1e-5, out


def test_a_process_using_the_hook_from_threads_exits_cleanly():
    code = textwrap.dedent("""
        import concurrent.futures, cupy as cp, fastmm
        fastmm.accelerate_cupy()
        a = cp.ones((256, 256), cp.float32)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            res = list(pool.map(lambda i: float((a @ a)[0, 0]), range(8)))
        assert res == [256.0] * 8 and fastmm.cupy_hook_status()["fastmm"] == 8, (res, fastmm.cupy_hook_status())
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == "", p.stderr
