"""float32 products by Ozaki scheme II on the GPU (kernel="ozaki": the scaling, residue and reconstruction passes
around the INT8 wgmma products) against float64: ragged shapes, every layout of A, B and C, NaN and infinities as
IEEE arithmetic gives them, the error at most cuBLAS SGEMM's on the same data, and the reference's own result
(fastmm/_plan/ozaki.py), which the passes follow. Hopper only."""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastmm
from fastmm._plan import ozaki
from fastmm.kernels.configs import INT8_WG

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

SHAPES = [(1, 1, 1), (5, 7, 3), (64, 64, 64), (129, 257, 129), (300, 200, 1000), (1000, 999, 1001), (127, 1, 4000),
          (1, 300, 255), (513, 769, 2049)]


@pytest.fixture(autouse=True)
def _hopper():
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("Ozaki scheme II runs on the INT8 wgmma kernels: Hopper (sm_90) only")


def _ozaki(a, b, out=None):
    return fastmm.matmul(a, b, out=out, kernel="ozaki")


def _rel(c, ref):
    return float(np.linalg.norm(cp.asnumpy(c).astype(np.float64) - ref) / np.linalg.norm(ref))


def _as_the_reference(got, a, b):
    """The passes follow the reference (fastmm/_plan/ozaki.py) but for one float32 rounding and the reconstruction's
    double arithmetic, within 2^-47 of the moduli's product: far inside 2^-40 of |A| @ |B| at each element."""
    want = ozaki.matmul_reference(a, b)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    excess = np.abs(got - want) - (2**-22 * np.abs(want) + 2**-40 * scale)
    assert (excess <= 0).all(), f"{int((excess > 0).sum())} elements off the reference, worst by {excess.max():.3g}"


def _sgemm(a, b):
    assert not os.environ.get("CUPY_TF32"), "cupy.matmul must be SGEMM here"
    return cp.matmul(a, b)


def _in_order(a, b):
    """float32 A @ B summed over k in order, one fused multiply-add a step: SGEMM's order (docs/kernels/ozaki.md)."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for i in range(a.shape[1]):  # a float32 product is exact in float64, so one rounding a step, as with an FMA
        acc = (acc + a[:, i:i + 1].astype(np.float64) * b[i:i + 1].astype(np.float64)).astype(np.float32)
    return acc


def _sgemm_error(a, b, ref):
    """The error Ozaki-II is held to: cuBLAS SGEMM's on the same data. Where M or N is 1, cuBLAS runs a matrix-vector
    kernel whose reduction tree is several times more accurate than SGEMM's in-order sum (a 127 x 1 x 4000 product
    sometimes under the 1e-7 that 8 moduli keep there), so the yardstick is the in-order sum."""
    if 1 in (a.shape[0], b.shape[1]):
        return _rel(_in_order(a, b), ref)
    return _rel(_sgemm(cp.asarray(a), cp.asarray(b)), ref)


@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_ragged_shapes_match_the_reference_and_beat_sgemm(m, n, k, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = cp.asnumpy(_ozaki(cp.asarray(a), cp.asarray(b)))
    _as_the_reference(got, a, b)
    assert _rel(got, ref) <= max(_sgemm_error(a, b, ref), 2**-24)


def _layouts(x, how):
    if how == "c":
        return cp.asarray(x)
    if how == "f":
        return cp.asfortranarray(cp.asarray(x))
    if how == "t":
        return cp.asarray(np.ascontiguousarray(x.T)).T
    if how == "offset":  # a view one element into a wider array: rows not 16-byte aligned
        wide = cp.zeros((x.shape[0], x.shape[1] + 3), np.float32)
        wide[:, 1:1 + x.shape[1]] = cp.asarray(x)
        return wide[:, 1:1 + x.shape[1]]
    if how == "strided":
        wide = cp.zeros((x.shape[0], 2 * x.shape[1]), np.float32)
        wide[:, ::2] = cp.asarray(x)
        return wide[:, ::2]
    raise ValueError(how)


@pytest.mark.parametrize("a_how", ["c", "f", "t", "offset", "strided"])
@pytest.mark.parametrize("b_how", ["c", "f", "offset"])
def test_every_layout_of_a_and_b(a_how, b_how, rng):
    m, n, k = 259, 133, 300
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = cp.asnumpy(_ozaki(_layouts(a, a_how), _layouts(b, b_how)))
    _as_the_reference(got, a, b)


@pytest.mark.parametrize("c_how", ["f", "offset", "view"])
def test_every_layout_of_c(c_how, rng):
    m, n, k = 200, 130, 257
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if c_how == "f":
        out = cp.zeros((m, n), np.float32, order="F")
    elif c_how == "offset":
        out = cp.zeros((m, n + 5), np.float32)[:, 1:1 + n]
    else:
        big = cp.full((m + 2, n + 4), 7.0, np.float32)
        out = big[1:1 + m, 2:2 + n]
    _ozaki(cp.asarray(a), cp.asarray(b), out=out)
    _as_the_reference(cp.asnumpy(out), a, b)
    if c_how == "view":
        rest = cp.asnumpy(big).copy()
        rest[1:1 + m, 2:2 + n] = 7.0
        assert (rest == 7.0).all(), "wrote outside C"


def test_a_batch_runs_item_by_item(rng):
    a = rng.standard_normal((3, 70, 90)).astype(np.float32)
    b = rng.standard_normal((3, 90, 50)).astype(np.float32)
    got = cp.asnumpy(_ozaki(cp.asarray(a), cp.asarray(b)))
    for i in range(3):
        _as_the_reference(got[i], a[i], b[i])


def test_nan_and_infinities_come_out_as_ieee_arithmetic_gives_them(rng):
    a = rng.standard_normal((300, 260)).astype(np.float32)
    b = rng.standard_normal((260, 140)).astype(np.float32)
    a[2, 3], a[150, 0], b[7, 4], b[100, 139] = np.nan, np.inf, -np.inf, np.inf
    with np.errstate(invalid="ignore"):
        want = a @ b
    got = cp.asnumpy(_ozaki(cp.asarray(a), cp.asarray(b)))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    assert np.array_equal(np.signbit(got[np.isinf(got)]), np.signbit(want[np.isinf(want)]))
    finite = np.isfinite(want)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["normal", "uniform", "signs", "wide-rows"])
def test_error_at_most_sgemms(kind, rng):
    m = n = 1024
    k = 4096
    if kind == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    elif kind == "uniform":
        a, b = rng.uniform(0, 1, (m, k)), rng.uniform(0, 1, (k, n))
    elif kind == "signs":
        a, b = rng.uniform(0, 1, (m, k)), rng.uniform(0, 1, (k, n)) * rng.choice([-1, 1], (k, n))
    else:
        a = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-60, 60, (m, 1)))
        b = rng.standard_normal((k, n)) * np.exp2(rng.uniform(-60, 60, (1, n)))
    a, b = a.astype(np.float32), b.astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    da, db = cp.asarray(a), cp.asarray(b)
    got, sgemm = cp.asnumpy(_ozaki(da, db)).astype(np.float64), cp.asnumpy(_sgemm(da, db)).astype(np.float64)
    rows = np.linalg.norm(ref, axis=1)
    assert (np.linalg.norm(got - ref, axis=1) / rows).max() <= (np.linalg.norm(sgemm - ref, axis=1) / rows).max()
    assert _rel(got, ref) <= _rel(sgemm, ref)


def test_high_takes_ozaki_above_the_threshold_only():
    assert "ozaki-ii" in fastmm.explain((16384, 16384), (16384, 16384), precision="high")
    assert "ozaki-ii" not in fastmm.explain((4096, 4096), (4096, 4096), precision="high")


def test_long_k_takes_3xtf32_with_a_warning(rng):
    k = ozaki.MAX_EXACT_K + 1
    a = rng.standard_normal((2, k)).astype(np.float32)
    b = rng.standard_normal((k, 3)).astype(np.float32)
    with pytest.warns(fastmm.PerformanceWarning, match="Ozaki scheme II cannot take"):
        got = cp.asnumpy(_ozaki(cp.asarray(a), cp.asarray(b)))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel(got, ref) < 2e-5  # K = 131072 summed in float32: sqrt(K) * 2^-24 = 2.2e-5


def test_products_past_the_workspace_budget_run_in_chunks_of_columns(rng, monkeypatch):
    """A workspace budget of a few block tiles' products: the sequence runs over chunks of C's columns (the INT8
    products, then the reconstruction, per chunk), as a product past 2 GiB of residue products does (16384 x 32768)."""
    from fastmm._runtime import ozaki as runtime_ozaki

    real = runtime_ozaki._ozaki.workspace
    chunks = []

    def small(m, n, k, n_moduli, bm, bn, budget=None):
        w = real(m, n, k, n_moduli, bm, bn, budget=n_moduli * m * 2 * bn)  # two block tiles of columns a chunk
        chunks.append(-(-n // w.chunk))
        return w

    monkeypatch.setattr(runtime_ozaki._ozaki, "workspace", small)
    m, n, k = 300, 1300, 400  # 1300 columns: chunks of 512, 512 and 276
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = cp.full((m, n + 3), np.nan, np.float32)[:, 1:1 + n]  # unaligned rows: C's chunks start anywhere
    _ozaki(cp.asarray(a), cp.asarray(b), out=out)
    assert chunks == [3]
    _as_the_reference(cp.asnumpy(out), a, b)


@pytest.mark.parametrize("config", [c for c in INT8_WG if c.residues], ids=lambda c: c.name)
def test_every_residue_configuration_gives_the_references_result(config, rng):
    """Ozaki scheme II's sequence on each INT8 configuration that writes residues (the planned one, the persistent
    one, the cluster pairs): the reference's result."""
    from fastmm._runtime.ozaki import ozaki_product

    m, n, k = 1400, 2100, 700  # 11 x 9 block tiles (an odd number of rows of them: a cluster pair half past M)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = cp.full((m, n), np.nan, np.float32)
    bad_a, bad_b = ozaki_product(cp.asarray(a), cp.asarray(b), c, cp.cuda.runtime.getDevice(), config)
    assert bad_a.size == 0 and bad_b.size == 0
    _as_the_reference(cp.asnumpy(c), a, b)
