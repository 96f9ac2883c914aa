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


@pytest.mark.parametrize("k", [1, 100, 4096, 8192, 65536, ozaki.MAX_EXACT_K])
def test_enough_moduli_keep_the_products_below_half_their_product(k):
    moduli = ozaki.choose_moduli(k)
    assert k * 2 ** (2 * ozaki.bits_for(k)) < math.prod(moduli) // 2
    assert k * 128 * 128 <= 2**31 - 1 or k > ozaki.MAX_EXACT_K
    assert len(moduli) <= 8  # FP32 accuracy in at most eight INT8 products, up to the exact int32 range


def test_the_bits_by_k_are_all_that_eight_moduli_hold():
    assert [most for most, _ in ozaki.BITS_BY_K] == sorted(most for most, _ in ozaki.BITS_BY_K)
    assert ozaki.BITS_BY_K[-1][0] == ozaki.MAX_EXACT_K
    for least, (most, bits) in zip([1] + [m + 1 for m, _ in ozaki.BITS_BY_K], ozaki.BITS_BY_K):
        assert ozaki.bits_for(least) == ozaki.bits_for(most) == bits
        assert len(ozaki.choose_moduli(most, bits)) == 8
        assert bits == 26 or len(ozaki.choose_moduli(least, bits + 1)) == 9  # one bit more takes a ninth
    assert ozaki.bits_for(ozaki.MAX_EXACT_K + 1) == ozaki.BITS_BY_K[-1][1]


def test_scaling_puts_each_row_just_below_the_bits():
    x = np.array([[3.0, -0.5, 0.0], [0.0, 0.0, 0.0], [1e-30, 2e-30, -4e-30]], np.float32)
    ints, shift = ozaki.scaled_integers(x, 26, axis=1)
    assert np.abs(ints[0]).max() == 3 * 2**24 and np.all(ints[1] == 0)
    assert 2**25 <= np.abs(ints[2]).max() < 2**26
    assert np.allclose(np.ldexp(ints.astype(np.float64), -shift), x, rtol=2**-25, atol=0)


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


@pytest.mark.parametrize("k", [1024, 4096, 16384])
@pytest.mark.parametrize("kind", ["normal", "random signs", "uniform", "rows spanning 2^+-60"])
def test_the_bits_by_k_keep_the_error_at_half_sgemms(kind, k, rng):
    a, b = _kind(kind, 32, k, 24, rng)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    products = ozaki.matmul_reference(a, b), _fma_in_order(a, b), np.matmul(a, b)
    ozaki_rows, sgemm_rows, blas_rows = (np.linalg.norm(c.astype(np.float64) - ref, axis=1) / np.linalg.norm(ref, axis=1)
                                         for c in products)
    # Each element's error against |A| @ |B| (what a sum's rounding is bounded by): Ozaki's worst at most half the
    # in-order sum's worst (measured <= 0.09x over 100 seeds a kind). Not a row's relative error: where a row of C is
    # one element (columns of B scaled 2^+-60 apart), that element's cancellation makes either method's worst row a
    # lottery (Ozaki's worst row reached 1.4x in 1 seed of 100, its median row 0.15x at most).
    ozaki_elements, sgemm_elements = (np.abs(c.astype(np.float64) - ref) / scale for c in products[:2])
    assert ozaki_elements.max() <= 0.5 * sgemm_elements.max()
    # The median row at most half the in-order sum's, and no worse than NumPy's float32 BLAS, whose blocked sums are
    # 3-10x more accurate than cuBLAS's (measured 0.1-0.9x).
    assert np.median(ozaki_rows) <= 0.5 * np.median(sgemm_rows)
    assert np.median(ozaki_rows) <= max(np.median(blas_rows), 2**-24)


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
    # The slices add up to the exact product of the scaled integers (|ai|, |bi| < 2^22 and K < 2^18: int64 holds it).
    bits = ozaki.bits_for(k)
    (ai, ea), (bi, eb) = ozaki.scaled_integers(a, bits, axis=1), ozaki.scaled_integers(b, bits, axis=0)
    assert np.array_equal(c, np.ldexp((ai @ bi).astype(np.float64), -(ea + eb)).astype(np.float32))
    # And that is float32-accurate: each element's error against |A| @ |B| at most half that of cuBLAS's order (an
    # in-order float32 sum; measured <= 0.24x over 60 seeds). Not against NumPy's blocked BLAS: at 22 bits a row its
    # sums are as accurate as these, and on a small result which one wins is a coin toss.
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    assert (np.abs(c - ref) / scale).max() <= 0.5 * (np.abs(_fma_in_order(a, b) - ref) / scale).max()


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
    """The pass's double arithmetic (`crt_as_the_pass_does`) against the exact integers, at the bound of what a K-long
    product of `bits_for(K)`-bit integers reaches, at zero and one either side."""
    moduli = ozaki.choose_moduli(k)
    total = math.prod(moduli)
    bound = k * 2 ** (2 * ozaki.bits_for(k))
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
