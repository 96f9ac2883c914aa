"""Tensor-core precision modes on the GPU: "high" (3xTF32) at FP32 accuracy against cuBLAS SGEMM over several value
distributions, "medium" (one TF32 pass) against cuBLAS's own TF32 path, NumPy's non-finite pattern in every mode,
and the modes reaching the kernels through every way of setting them. (Layouts, ragged edges, batches and views of
every tensor-core configuration are in test_gpu_kernels.py, which runs every kernel in CONFIGS.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastmm
from fastmm.kernels.passes import AUXILIARY

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

MODES = ("highest", "high", "medium")
# The wgmma kernels (Hopper), forced so that small shapes reach them too: (kernel, the precision it computes in).
WGMMA = (("tf32x3wg_128x128x32_s3", "high"), ("tf32wg_128x256x32_s4", "medium"))


def _hopper() -> bool:
    return cp.cuda.Device().compute_capability == "90"


def _run(a, b, mode):
    """a @ b in a precision mode, or on a forced wgmma kernel (skipped where the GPU is not a Hopper)."""
    for kernel, precision in WGMMA:
        if mode == kernel:
            if not _hopper():
                pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
            return fastmm.matmul(a, b, kernel=kernel, precision=precision)
    return fastmm.matmul(a, b, precision=mode)


def _error(c, ref64) -> float:
    c = cp.asnumpy(c).astype(np.float64)
    return float(np.linalg.norm(c - ref64) / np.linalg.norm(ref64))


def _cublas(a, b, tf32=False):
    from fastmm._tools.bench import cublas_compute_tf32

    if not tf32:
        return cp.matmul(a, b)
    with cublas_compute_tf32():
        return cp.matmul(a, b)


def _values(rng, kind, shape):
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "uniform":
        return rng.random(shape)
    if kind == "wide":  # magnitudes from 1e-10 to 1e10
        return rng.standard_normal(shape) * 10.0 ** rng.uniform(-10, 10, shape)
    if kind == "cancelling":  # large terms of both signs whose sum is small
        x = rng.standard_normal(shape)
        return x + 1e3 * np.sign(rng.standard_normal(shape))
    raise ValueError(kind)


CASES = [("normal", 1024, 1024, 1024), ("uniform", 1024, 1024, 1024), ("wide", 512, 512, 512),
         ("cancelling", 512, 512, 2048), ("normal", 2048, 2048, 64), ("normal", 1000, 999, 1001),
         ("normal", 4096, 4096, 4096)]


@pytest.mark.parametrize("kind,m,n,k", CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}" for c in CASES])
@pytest.mark.parametrize("mode", ["high", WGMMA[0][0]])
def test_high_is_as_accurate_as_cublas_sgemm(kind, m, n, k, mode, rng):
    a = _values(rng, kind, (m, k)).astype(np.float32)
    b = _values(rng, kind, (k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    da, db = cp.asarray(a), cp.asarray(b)
    sgemm = _error(_cublas(da, db), ref)
    high = _error(_run(da, db, mode), ref)
    print(f"{kind} {m}x{n}x{k}: {mode} {high:.2e}, cuBLAS SGEMM {sgemm:.2e}")
    # 3xTF32 rounds each product to about 2^-22 (the small parts are TF32 too, and a_small * b_small is dropped)
    # where FP32 rounds to 2^-24: on sums of many comparable products FP32's accumulation dominates and "high" is
    # at or below SGEMM (the normal and uniform cases here), but where a few products dominate the sum
    # (magnitudes over 20 decades, large terms that cancel, short K) the products' rounding shows, up to twice
    # SGEMM's error. The tensor cores' truncating accumulation, chained over K, was 10-30x SGEMM's.
    dominated = kind in ("wide", "cancelling") or k < 256
    assert high <= max(sgemm, 1e-7) * (2.0 if dominated else 1.0), (high, sgemm)


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (777, 555, 333)], ids=str)
@pytest.mark.parametrize("mode", ["medium", WGMMA[1][0]])
def test_medium_is_as_accurate_as_cublas_tf32(m, n, k, mode, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    da, db = cp.asarray(a), cp.asarray(b)
    tf32 = _error(_cublas(da, db, tf32=True), ref)
    medium = _error(_run(da, db, mode), ref)
    print(f"{m}x{n}x{k}: medium {medium:.2e}, cuBLAS TF32 {tf32:.2e}")
    assert 1e-5 < medium <= 1.5 * tf32, (medium, tf32)  # really one TF32 pass, and no worse than cuBLAS's


def _pattern(x):
    x = np.asarray(x)
    return np.isnan(x), np.isposinf(x), np.isneginf(x)


@pytest.mark.parametrize("mode", MODES + tuple(k for k, _ in WGMMA))
def test_non_finite_inputs_give_numpys_pattern(mode, rng):
    """Where NumPy's result is NaN or +-inf, ours is, and nowhere else. Every case is independent of the order of
    summation (single products that overflow, infinities, NaNs), so any two correct GEMMs agree on it."""
    m, n, k = 70, 70, 90
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b[::7] = np.round(b[::7])           # values exact in TF32, whose small part is 0 (the inf * 0 trap)
    b[3, 5] = 0.0
    a[1, 3] = np.inf                    # row 1: inf against b's row 3 (0 in column 5: NaN) and an exact row 7
    a[1, 7] = np.inf
    a[2, 10] = -np.inf
    a[4, 20] = np.nan
    b[30, 40] = np.inf
    b[31, 41] = np.nan
    b[0] = np.where(np.arange(n) % 2, 0.5, 4.0) * np.sign(rng.standard_normal(n))
    a[6, 0] = 3e38                      # huge: x 0.5 is finite, x 4 overflows to inf in one product
    a[8, 0] = np.finfo(np.float32).max  # would round up to inf in TF32: must stay finite (x 0.5)
    a[9] = 1e-40                        # subnormals
    b[:, 50] = 1e-39
    with np.errstate(all="ignore"):
        want = a @ b
    got = cp.asnumpy(_run(cp.asarray(a), cp.asarray(b), mode))
    for w, g, what in zip(_pattern(want), _pattern(got), ("NaN", "+inf", "-inf")):
        assert np.array_equal(w, g), f"{mode}: {what} differs at {np.argwhere(w != g)[:5].tolist()}"


def test_every_way_of_setting_the_mode_reaches_the_kernels(rng, launches):
    # 1024^3: on Hopper, the size from which "high" runs 3xTF32 (below it the FP32 table is as accurate and faster).
    a = fastmm.asarray(rng.standard_normal((1024, 1024)).astype(np.float32))
    a @ a
    fastmm.matmul(a, a, precision="high")
    with fastmm.matmul_precision("medium"):
        np.matmul(a, a)
    fastmm.set_float32_matmul_precision("high")
    try:
        np.dot(a, a)
    finally:
        fastmm.set_float32_matmul_precision("highest")
    a @ a
    passes = {config.name for config in AUXILIARY}  # (the split pass; around a mapped product, its guard's)
    modes = [fastmm._plan.tiles.get_config(name).precision for name in launches if name not in passes]
    assert modes == ["highest", "high", "medium", "high", "highest"], launches


@pytest.mark.parametrize("mode", MODES + tuple(k for k, _ in WGMMA))
def test_rounding_to_tf32_never_changes_what_a_product_does(mode):
    """The cases where rounding an operand to TF32 could: inf times a value that rounds to 0 (below 2^-137, or a
    subnormal the tensor cores might flush), a NaN whose payload lies in the low 13 bits (truncation would make it
    inf), a product far past FLT_MAX whose small parts have the opposite sign (the cross terms overflow too), and
    an all-positive product that overflows everywhere."""
    nan_low = np.array([0x7F800001], np.uint32).view(np.float32)[0]
    a = np.zeros((8, 16), np.float32)
    b = np.zeros((16, 8), np.float32)
    a[0, 0], b[0, 0] = np.inf, 1e-42     # (0, 0): inf; (0, 1): inf * 0 = NaN
    a[6, 6], b[6, 6] = np.inf, 1e-40     # (6, 6): inf
    a[2, 2], b[2, 2] = nan_low, 2.0
    a[3, 3], b[3, 3] = np.float32(2.0**127 * (1 + 2.0**-11)), np.float32(2.0**20)
    a[4:6] = 1e25 * (1 + np.arange(32, dtype=np.float32).reshape(2, 16) / 64)
    b[:, 4:6] = 1e25
    with np.errstate(all="ignore"):
        want = a @ b
    got = cp.asnumpy(_run(cp.asarray(a), cp.asarray(b), mode))
    for w, g, what in zip(_pattern(want), _pattern(got), ("NaN", "+inf", "-inf")):
        assert np.array_equal(w, g), f"{mode}: {what} differs at {np.argwhere(w != g)[:8].tolist()}"


@pytest.mark.parametrize("where", ["a", "b", "both"])
def test_wgmma_tiles_with_an_infinity_run_fp32_and_the_rest_stays_3xtf32(where, rng):
    """3xTF32 on wgmma: a block tile whose rows of A or columns of B hold an infinity runs FP32 FMAs (the split
    pass flags it); its finite results keep FP32-level accuracy, and every other tile is untouched."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    m, n, k = 520, 300, 700
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b[100] = np.round(b[100])  # exact in TF32: inf against these would be NaN on 3xTF32's cross terms
    if where in ("a", "both"):
        a[300, 100] = np.inf    # block row 2 (rows 256-383) on the FMA path
    if where in ("b", "both"):
        b[5, 200] = -np.inf     # block column 1 (columns 128-255)
    with np.errstate(all="ignore"):
        want = a.astype(np.float64) @ b.astype(np.float64)
    got = cp.asnumpy(fastmm.matmul(cp.asarray(a), cp.asarray(b), kernel=WGMMA[0][0], precision="high"))
    for w, g, what in zip(_pattern(want), _pattern(got), ("NaN", "+inf", "-inf")):
        assert np.array_equal(w, g), f"{what} differs at {np.argwhere(w != g)[:5].tolist()}"
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite]) / np.abs(want[finite]).max()
    assert err.max() < 2e-6, err.max()


def test_wgmma_products_longer_than_one_split_launch_run_in_pieces(rng, monkeypatch):
    """A forced wgmma kernel on more rows of A, or of B^T, than one launch of the split pass covers runs piece by
    piece (the grid's limit lowered to 12 blocks of 32 rows: a 1000 x 700 product takes pieces of 384 rows and of
    384 columns for 3xTF32, 256 for one pass)."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    from fastmm._runtime import presplit as _presplit

    monkeypatch.setattr(_presplit, "MAX_GRID_Y", 12)
    a = rng.standard_normal((1000, 300)).astype(np.float32)
    b = rng.standard_normal((300, 700)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    for name, mode in WGMMA:
        out = cp.full((1000, 700), np.nan, np.float32)
        fastmm.matmul(cp.asarray(a), cp.asarray(b), out=out, kernel=name, precision=mode)
        assert _error(out, want) < (1e-6 if mode == "high" else 1e-3), name


def test_wgmma_products_replay_on_new_operands_and_views(rng):
    """A replayed 3xTF32 product (split passes and product recorded once) on fresh operands, and on views at an
    offset (the split pass reads any strides; C written through its own)."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    with fastmm.matmul_precision("high"):
        for trial in range(3):
            a = fastmm.asarray(rng.standard_normal((1030, 1100)).astype(np.float32))
            b = fastmm.asarray(rng.standard_normal((1100, 1030)).astype(np.float32))
            c = a[1:, 3:] @ b[3:, :-1].T.T  # offsets: rows not 16-byte aligned
            want = cp.asnumpy(a[1:, 3:]).astype(np.float64) @ cp.asnumpy(b[3:, :-1]).astype(np.float64)
            assert _error(c, want) < 1e-6
            assert "tf32x3wg" in fastmm.explain(a[1:, 3:], b[3:, :-1], precision="high")


def _mapped(monkeypatch):
    """Count the tensor maps encoded (one per product run with A read through its map)."""
    from fastmm._runtime import tensor_map

    calls = []
    encode = tensor_map.encode
    monkeypatch.setattr(tensor_map, "encode", lambda *args: (calls.append(args), encode(*args))[1])
    return calls


# layout: (A's K-major map, A's map along M (A_RS), B's map) encoded per product. A @ B with B's rows along N runs
# as C^T = B^T A^T: B^T along M (registers), A^T's rows along K (B's map), C written transposed.
MAPPED = {"c": (0, 1, 1), "ragged": (0, 1, 1), "a_t": (0, 1, 0), "offset": (0, 0, 0), "replayed": (0, 1, 1),
          "b_t": (1, 0, 1), "a_t-b_t": (0, 1, 1)}


@pytest.mark.parametrize("layout", list(MAPPED))
def test_medium_reads_k_major_operands_through_tensor_maps(layout, rng, monkeypatch):
    """One TF32 pass on the wgmma kernel: a K-major A (or a B given as B^T row-major) with 16-byte aligned rows is
    read in place through its tensor map (rounded to TF32 by the copy, zeros past the edges), an A along M through
    one into registers; A @ B with B along N runs as C^T = B^T A^T; any other operand goes through the split pass.
    Every mix as accurate as cuBLAS's TF32 path, and a replay encodes the maps of new operands."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    m, n, k = (1000, 900, 1000) if layout == "ragged" else (1024, 768, 1536)
    calls = _mapped(monkeypatch)
    trials = 2 if layout == "replayed" else 1
    for trial in range(trials):
        # (k + 4 floats a row: 16-byte aligned rows for every k here; the offset view's start is not aligned)
        a = rng.standard_normal((k, m) if layout.startswith("a_t") else (m + 1, k + 4)).astype(np.float32)
        b = rng.standard_normal((n, k + 4) if layout.endswith("b_t") else (k, n)).astype(np.float32)
        da, db = cp.asarray(a), cp.asarray(b)
        da = da.T if layout.startswith("a_t") else da[1:, 3:k + 3] if layout == "offset" else da[:m, :k]
        db = db[:, :k].T if layout.endswith("b_t") else db
        ref = cp.asnumpy(da).astype(np.float64) @ cp.asnumpy(db).astype(np.float64)
        out = cp.full((m, n), np.nan, np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error", fastmm.PerformanceWarning)  # (maps the driver refused: split instead)
            fastmm.matmul(da, db, out=out, precision="medium")
        tf32 = _error(_cublas(cp.ascontiguousarray(da), cp.ascontiguousarray(db), tf32=True), ref)
        medium = _error(out, ref)
        assert 1e-5 < medium <= 1.5 * tf32, (layout, medium, tf32)
    want_a, want_r, want_b = MAPPED[layout]
    boxes = [call[-2] for call in calls]  # (box rows: 128 for A's map, 32 (of K) for A's along M, 256 for B^T's)
    assert [boxes.count(rows) for rows in (128, 32, 256)] == [trials * want_a, trials * want_r, trials * want_b], (
        layout, boxes)
    assert "tf32wg" in fastmm.explain(da, db, precision="medium")


def test_the_tensor_maps_copy_rounds_to_tf32_rather_than_truncating(rng, monkeypatch):
    """On non-negative data, truncating A to TF32 would make every product smaller: a mean relative error about
    -2^-11 ln 2 (-3.4e-4) beyond the split pass's (which rounds; the tensor cores' own accumulation adds a bias of
    its own to both). The same data through the split pass (a view whose rows no map can read) and the map."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    calls = _mapped(monkeypatch)
    a = rng.random((1024, 2049)).astype(np.float32)
    b = rng.random((2048, 1024)).astype(np.float32)
    ref = a[:, :2048].astype(np.float64) @ b.astype(np.float64)
    bias = {}
    for path, da in (("split", cp.asarray(a)[:, :2048]), ("map", cp.ascontiguousarray(cp.asarray(a)[:, :2048]))):
        got = cp.asnumpy(fastmm.matmul(da, cp.asarray(b), precision="medium")).astype(np.float64)
        bias[path] = float(np.mean((got - ref) / ref))
    assert len(calls) == 2 and abs(bias["map"] - bias["split"]) < 1e-4, (calls, bias)  # (C^T = B^T A^T: two maps)


@pytest.mark.parametrize("mapped", ["a", "b", "r", "swapped"])
def test_tensor_maps_keep_numpys_non_finite_pattern(mapped):
    """The cases where rounding to TF32 could change what a product does, in the operand a tensor map reads: inf
    times a value below TF32's smallest step (the split pass keeps it nonzero), a NaN whose payload lies only in
    the low 13 bits, and a value within half a TF32 step of FLT_MAX (finite in float32, infinite once rounded).
    Through A's K-major map, B^T's, A's along M (registers), and A @ B run as C^T = B^T A^T."""
    if not _hopper():
        pytest.skip("the wgmma kernels run on Hopper (sm_90) only")
    m = n = k = 1024
    nan_low = np.array([0x7F800001], np.uint32).view(np.float32)[0]
    near_max = np.array([0x7F7FF800], np.uint32).view(np.float32)[0]
    x = np.zeros((m, k), np.float32)  # the operand the map reads: A, or B^T
    y = np.zeros((k, n), np.float32)  # the other one, as B (k x n) or A^T
    x[0, 0], y[0, 0] = 1e-42, np.inf     # inf * (a value that would round to 0)
    x[2, 2], y[2, 2] = nan_low, 2.0
    x[3, 3], y[3, 3] = near_max, 0.5     # finite: 1.7e38
    # NaNs whose payload fills the high bits: a rounding that carries into the exponent and sign would make them 0
    x[4, 4], y[4, 4] = np.array([0x7FFFFFFF], np.uint32).view(np.float32)[0], 1.0
    x[5, 5], y[5, 5] = np.array([0xFFFFF000], np.uint32).view(np.float32)[0], 1.0
    k_major = lambda v: cp.ascontiguousarray(cp.asarray(v).T).T  # noqa: E731 - (k x n) given as its transpose
    if mapped == "a":  # A = x (C-ordered: its map), B = y given as B^T (its map)
        a, b, da, db, maps = x, y, cp.asarray(x), k_major(y), "ab"
    elif mapped == "b":  # A = y^T (along M: registers), B = x^T (given as B^T: its map)
        a, b, da, db, maps = y.T, x.T, cp.asarray(y).T, cp.asarray(x).T, "rb"
    elif mapped == "r":  # A = x along M (registers), B = y given as B^T
        a, b, da, db, maps = x, y, cp.ascontiguousarray(cp.asarray(x).T).T, k_major(y), "rb"
    else:  # A = x (C-ordered), B = y (along N): C^T = y^T x^T, x through the swapped product's B map
        a, b, da, db, maps = x, y, cp.asarray(x), cp.asarray(y), "rb"
    with np.errstate(all="ignore"):
        want = a.astype(np.float64) @ b.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastmm.PerformanceWarning)  # (maps the driver refused: split instead)
        got = cp.asnumpy(fastmm.matmul(da, db, precision="medium"))
    assert "_map" + maps + "\n" in fastmm.explain(da, db, precision="medium")
    for w, g, what in zip(_pattern(want), _pattern(got), ("NaN", "+inf", "-inf")):
        assert np.array_equal(w, g), f"{mapped}: {what} differs at {np.argwhere(w != g)[:8].tolist()}"
