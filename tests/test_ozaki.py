"""Ozaki scheme II's arithmetic (fastmm/_plan/ozaki.py), checked against float64 on the CPU: exact integer
products, the Chinese remainder reconstruction, the accuracy the moduli buy, and non-finite inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastmm._plan import ozaki


def _rel(c, ref):
    return float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))


def _sgemm_error(a, b, ref):
    return _rel(np.matmul(a, b), ref)  # NumPy's float32 BLAS: what SGEMM's error looks like


def test_the_moduli_are_pairwise_coprime_and_fit_int8():
    assert all(math.gcd(p, q) == 1 for i, p in enumerate(ozaki.MODULI) for q in ozaki.MODULI[i + 1:])
    for m in ozaki.MODULI:
        r = ozaki.symmetric_residues(np.arange(-3 * m, 3 * m), m)
        assert r.dtype == np.int8 and r.min() >= -128 and r.max() <= 127
        assert np.all((r.astype(np.int64) - np.arange(-3 * m, 3 * m)) % m == 0)


def _largest(moduli):
    """The most |a' . b'| can reach under `moduli`: each 2-norm below 2^side_bits, plus what rounding adds to it."""
    h_a, h_b = ozaki.side_bits(moduli)
    r = math.sqrt(ozaki.MAX_EXACT_K) / 2
    return (2**h_a + r) * (2**h_b + r)


@pytest.mark.parametrize("k", [1, 100, 4096, 4097, 8192, 65536, ozaki.MAX_EXACT_K, ozaki.MAX_EXACT_K + 1])
def test_the_norms_keep_every_sum_below_half_the_moduli_product(k):
    moduli = ozaki.choose_moduli(k)
    assert 2 * _largest(moduli) < math.prod(moduli)  # Cauchy-Schwarz: |a' . b'| <= ||a'|| ||b'||
    assert len(moduli) == (8 if k <= 4096 else 7)  # FP32 accuracy in at most eight INT8 products
    assert max(ozaki.side_bits(moduli)) <= 30  # A' and B' in int32


@pytest.mark.parametrize("count", range(3, 10))
def test_the_side_bits_are_the_most_the_bound_allows(count):
    moduli = ozaki.choose_moduli(1, count)
    h_a, h_b = ozaki.side_bits(moduli)
    assert h_b - h_a in (0, 1) and 2 * _largest(moduli) < math.prod(moduli)
    r = math.sqrt(ozaki.MAX_EXACT_K) / 2
    assert h_b == 30 or 2 * (2**h_b + r) * (2 ** (h_a + 1) + r) >= math.prod(moduli)  # one bit more would not hold


def test_the_moduli_count_is_checked():
    for count in (1, 2, 10):
        with pytest.raises(ValueError, match="3 to 9 moduli"):
            ozaki.choose_moduli(100, count)


def test_scaling_puts_each_rows_norm_just_below_the_bits(rng):
    x = np.array([[3.0, -0.5, 0.0], [0.0, 0.0, 0.0], [1e-30, 2e-30, -4e-30]], np.float32)
    x = np.concatenate([x, rng.standard_normal((5, 3)).astype(np.float32)])
    ints, shift = ozaki.scaled_integers(x, 26, axis=1)
    norms = np.linalg.norm(ints.astype(np.float64), axis=1)
    assert np.all(ints[1] == 0) and shift[1, 0] == 0
    live = np.arange(len(x)) != 1
    assert np.all(norms[live] <= 2**26 + np.sqrt(3) / 2) and np.all(norms[live] > 2**24)
    back = np.ldexp(ints.astype(np.float64), -shift)  # each value to within half a unit of its row's scale
    assert np.all(np.abs(back - x) <= 2.0**-27 * 2 * np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True))
    cols, cshift = ozaki.scaled_integers(x.T.copy(), 26, axis=0)
    assert np.array_equal(cols, ints.T) and np.array_equal(cshift, shift.T)


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (33, 1000, 17), (128, 4096, 96), (5, 3, 7)])
def test_normal_data_is_at_least_as_accurate_as_sgemm(m, k, n, rng):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel(ozaki.matmul_reference(a, b), ref) <= max(_sgemm_error(a, b, ref), 2**-24)


def test_positive_data_and_random_signs(rng):
    a = rng.uniform(0, 1, (96, 2048)).astype(np.float32)
    b = rng.uniform(0, 1, (2048, 80)).astype(np.float32) * rng.choice([-1, 1], (2048, 80)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel(ozaki.matmul_reference(a, b), ref) <= max(_sgemm_error(a, b, ref), 2**-24)


def test_rows_and_columns_whose_magnitudes_span_two_to_the_sixty(rng):
    a = rng.standard_normal((64, 512)) * np.exp2(rng.uniform(-60, 60, (64, 1)))
    b = rng.standard_normal((512, 48)) * np.exp2(rng.uniform(-60, 60, (1, 48)))
    a, b = a.astype(np.float32), b.astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = ozaki.matmul_reference(a, b)
    rowwise = np.linalg.norm(c - ref, axis=1) / np.linalg.norm(ref, axis=1)  # every row, however small
    sgemm = np.linalg.norm(np.matmul(a, b) - ref, axis=1) / np.linalg.norm(ref, axis=1)
    # (Measured over 30 seeds: the worst row at 0.32x SGEMM's worst, the median row at 0.19x.)
    assert rowwise.max() <= sgemm.max() and np.median(rowwise) <= np.median(sgemm)


def _fma_in_order(a, b):
    """float32 A @ B summed over k in order, one fused multiply-add a step (to within a double rounding): the order of
    cuBLAS's SGEMM, whose measured error it matches (docs/kernels/ozaki.md, "How many moduli")."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for j in range(a.shape[1]):
        acc = (acc + np.outer(a64[:, j], b64[j])).astype(np.float32)
    return acc


def _kind(kind, m, k, n, rng):
    if kind == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    elif kind == "random signs":
        a, b = rng.uniform(0, 1, (m, k)), rng.uniform(0, 1, (k, n)) * rng.choice([-1, 1], (k, n))
    elif kind == "uniform":
        a, b = rng.uniform(0, 1, (m, k)), rng.uniform(0, 1, (k, n))
    else:  # rows of A and columns of B scaled by 2^-60 .. 2^60
        a = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-60, 60, (m, 1)))
        b = rng.standard_normal((k, n)) * np.exp2(rng.uniform(-60, 60, (1, n)))
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("k", [1024, 4096, 8192, 16384])
@pytest.mark.parametrize("kind", ["normal", "random signs", "uniform", "rows spanning 2^+-60"])
def test_the_moduli_keep_the_error_at_half_sgemms(kind, k, rng):
    a, b = _kind(kind, 32, k, 24, rng)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    products = ozaki.matmul_reference(a, b), _fma_in_order(a, b)
    # Each element's error against |A| @ |B| (what a sum's rounding is bounded by): Ozaki's worst at most half the
    # in-order sum's worst (measured <= 0.35x over about 1,000 fresh seeds).
    ozaki_elements, sgemm_elements = (np.abs(c.astype(np.float64) - ref) / scale for c in products[:2])
    assert ozaki_elements.max() <= 0.5 * sgemm_elements.max()
    # The median row at most half the in-order sum's (measured <= 0.41x). Where rows of C mix columns scaled 2^+-60
    # apart, a row's error is its largest element's, whose cancellation makes the ratio a lottery: at most the
    # in-order sum's (measured <= 0.79x). Not against NumPy's float32 BLAS, whose blocked sums are 3-10x more
    # accurate than cuBLAS's SGEMM: 7 moduli are 0.3-2x its error from K = 4096.
    ozaki_rows, sgemm_rows = (np.linalg.norm(c.astype(np.float64) - ref, axis=1) / np.linalg.norm(ref, axis=1)
                              for c in products[:2])
    assert np.median(ozaki_rows) <= (1.0 if kind.startswith("rows") else 0.5) * np.median(sgemm_rows)


def test_rows_with_one_large_value_beat_scaling_by_the_largest(rng):
    """One value 256x the rest in every row of A and column of B: the norm bound (GEMMul8's fast mode) loses fewer
    bits to it than scaling each row by its largest value to the same bound (K * 2^2bits < P / 2) would."""
    k = 4096
    a, b = rng.standard_normal((32, k)), rng.standard_normal((k, 24))
    a[np.arange(32), rng.integers(0, k, 32)] *= 256
    b[rng.integers(0, k, 24), np.arange(24)] *= 256
    a, b = a.astype(np.float32), b.astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    moduli = ozaki.choose_moduli(k)
    bits = (math.prod(moduli).bit_length() - 2 - math.ceil(math.log2(k))) // 2
    by_largest = []
    for x, axis in ((a64, 1), (b64, 0)):
        _, e = np.frexp(np.abs(x).max(axis=axis, keepdims=True))
        by_largest.append((np.rint(np.ldexp(x, bits - e)), bits - e))
    (ai, ea), (bi, eb) = by_largest
    largest = np.ldexp(ai @ bi, -(ea + eb))
    assert _rel(ozaki.matmul_reference(a, b), ref) <= 0.5 * _rel(largest, ref)


def test_nan_and_infinities_come_out_as_ieee_arithmetic_gives_them(rng):
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 6)).astype(np.float32)
    a[2, 3], a[5, 0], b[7, 4] = np.nan, np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        c, want = ozaki.matmul_reference(a, b), np.matmul(a, b)
    assert np.array_equal(np.isnan(c), np.isnan(want)) and np.array_equal(np.isinf(c), np.isinf(want))
    finite = np.isfinite(want)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(c[finite], ref[finite], rtol=1e-5, atol=1e-5)


def test_k_beyond_the_exact_int32_range_is_summed_in_slices(rng):
    k = ozaki.MAX_EXACT_K + 1000
    a = rng.standard_normal((4, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    c = ozaki.matmul_reference(a, b)
    # The slices add up to the exact product of the scaled integers (norms below 2^27: int64 holds every partial sum).
    h_a, h_b = ozaki.side_bits(ozaki.choose_moduli(k))
    (ai, ea), (bi, eb) = ozaki.scaled_integers(a, h_a, axis=1), ozaki.scaled_integers(b, h_b, axis=0)
    assert np.array_equal(c, np.ldexp((ai @ bi).astype(np.float64), -(ea + eb)).astype(np.float32))
    # And that is float32-accurate: the largest error against |A| @ |B| at most 3/4 of that of cuBLAS's order (an
    # in-order float32 sum; over 260 seeds the ratio's median was 0.21, its largest 0.54: a bound of 0.5 failed about
    # one seed in 150). Not against NumPy's blocked BLAS: at 22 bits a row its sums are as accurate as these, and on
    # a small result which one wins is a coin toss.
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    assert (np.abs(c - ref) / scale).max() <= 0.75 * (np.abs(_fma_in_order(a, b) - ref) / scale).max()


def test_shapes_that_cannot_multiply_are_refused():
    with pytest.raises(ValueError, match=r"\(M, K\) by \(K, N\)"):
        ozaki.matmul_reference(np.ones((2, 3)), np.ones((4, 5)))


@pytest.mark.parametrize("rows", [128, 256])
@pytest.mark.parametrize("r,k", [(1, 1), (130, 129), (256, 384), (300, 1000)])
def test_tiles_put_every_value_where_the_int8_kernel_reads_it(r, k, rows, rng):
    x = rng.integers(-128, 128, (r, k), dtype=np.int8)
    t = ozaki.tiles(x, rows)
    rp, kp = -(-r // rows) * rows, -(-k // 128) * 128
    assert t.shape == (rp // rows, kp // 128, rows, 128) and t.dtype == np.int8 and t.flags.c_contiguous
    flat = t.reshape(-1)
    i, j = np.meshgrid(np.arange(rp), np.arange(kp), indexing="ij")
    at = ((i // rows) * (kp // 128) + j // 128) * rows * 128 + (i % rows) * 128 + ((j % 128 // 16) ^ (i % 8)) * 16 + j % 16
    expected = np.zeros((rp, kp), np.int8)
    expected[:r, :k] = x
    assert np.array_equal(flat[at], expected)  # every value, and zeros in the padding
    assert len(np.unique(at)) == at.size


@pytest.mark.parametrize("k", [1, 300, 8192, ozaki.MAX_EXACT_K])
def test_the_reconstruction_gives_back_the_integers_to_within_2_to_the_minus_47_of_p(k, rng):
    """The pass's double arithmetic (`crt_as_the_pass_does`) against the exact integers, at the bound of what a
    product of rows and columns of `side_bits` norms reaches, at zero and one either side."""
    moduli = ozaki.choose_moduli(k)
    total = math.prod(moduli)
    bound = int(_largest(moduli))
    assert 2 * bound <= total
    x = [int(v) for v in rng.integers(-2**62, 2**62, 50)] + [bound, -bound, 0, 1, -1, bound // 3, -bound // 7]
    x = [v % (2 * bound + 1) - bound if abs(v) > bound else v for v in x]
    residues = np.array([[v % m for v in x] for m in moduli], np.int64)
    got = ozaki.crt_as_the_pass_does(residues, moduli)
    exact = np.array([float(v) for v in x])
    assert np.abs(got - exact).max() <= 2.0**-47 * total
    assert np.array_equal(np.sign(got[np.abs(exact) > 2.0**-46 * total]), np.sign(exact[np.abs(exact) > 2.0**-46 * total]))


def test_the_table_takes_only_a_prefix_of_the_compiled_in_moduli():
    ozaki.crt_table(ozaki.MODULI)
    with pytest.raises(ValueError, match="prefix of MODULI"):
        ozaki.crt_table((255, 256))


def test_the_passes_compile_in_the_moduli_of_the_reference():
    from fastmm.kernels.passes import OZAKI_RESIDUES

    macros = OZAKI_RESIDUES.macros(OZAKI_RESIDUES and __import__("fastmm").kernels.configs.Variant())
    assert tuple(int(m) for m in macros["MODULI"].split(",")) == ozaki.MODULI
    assert macros["NMODULI"] == len(ozaki.MODULI) and macros["NONFINITE"] == ozaki.NONFINITE


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (16384, 16384, 16384), (65536, 8192, 8192), (300, 70000, 5)])
def test_the_workspace_is_bounded(m, n, k):
    nm = len(ozaki.choose_moduli(k))
    chunk = ozaki.column_chunk(m, n, nm, 256)
    assert chunk == n or (chunk % 256 == 0 and nm * m * chunk <= ozaki.PRODUCTS_BYTES)
    mp, np_, kp = -(-m // 128) * 128, -(-n // 256) * 256, -(-k // 128) * 128
    tiles = nm * (mp + np_) * kp
    assert tiles < ozaki.workspace_bytes(m, n, k, nm, 128, 256) <= tiles + ozaki.PRODUCTS_BYTES + nm * m * 256 + 2**20


def test_the_workspace_tiles_k_as_the_int8_kernels_do():
    """One layout of the workspace for the plan and the runtime: its K-tiles are every INT8 kernel's."""
    from fastmm.kernels.configs import INT8_WG

    assert all(config.BK == ozaki.TILE_K for config in INT8_WG)
    w = ozaki.workspace(300, 70000, 5, 8, 128, 256)
    assert w.size == ozaki.workspace_bytes(300, 70000, 5, 8, 128, 256)
    assert all(x % 256 == 0 for x in (w.shifts_a, w.tiles_a, w.products)) and w.shifts_a >= 8 * ozaki.TABLE_WORDS


def test_what_one_launch_sequence_takes():
    assert ozaki.fits(8192, 8192, 8192) is None
    assert "past 131071" in ozaki.fits(8, 8, ozaki.MAX_EXACT_K + 1)
    assert "rows per launch" in ozaki.fits(5_000_000, 8, 8)


def test_a_product_ozaki_cannot_take_warns_once_through_fastmms_warnings(monkeypatch):
    """Forced 'ozaki' on a K past int32's exact range: 3xTF32 instead, with one PerformanceWarning that the process's
    once-only registry (`fastmm._errors.warn_once`) knows, as every other fallback's."""
    import warnings

    import fastmm
    from fastmm import _errors, _plan
    from fastmm._plan.precision import OZAKI_INT8
    from fastmm._runtime import gemm as _gemm

    monkeypatch.setattr(_errors, "_warned", set())
    ran = []
    monkeypatch.setattr(_gemm, "gemm", lambda a, b, c, kernel=None, **kw: ran.append(kernel))
    k = _plan.ozaki.MAX_EXACT_K + 1
    a, b, c = np.zeros((4, k), np.float32), np.zeros((k, 4), np.float32), np.zeros((4, 4), np.float32)
    with pytest.warns(fastmm.PerformanceWarning, match="Ozaki scheme II cannot take this product"):
        _gemm._ozaki(a, b, c, None, _plan.Device(), 0, OZAKI_INT8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _gemm._ozaki(a, b, c, None, _plan.Device(), 0, OZAKI_INT8)
    assert len(ran) == 2 and len(_errors._warned) == 1
