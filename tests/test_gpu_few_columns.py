"""The few-column kernel on the GPU: matrix-vector and few-column products, few rows (the transposed product), in
every layout, split over K and batched, right against float64 and bitwise the same on every run."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

import fastmm  # noqa: E402
from fastmm import _plan
from fastmm._runtime import cuda as _cuda  # noqa: E402
from fastmm.kernels.configs import get_config  # noqa: E402

SHAPES = [(4096, 1, 8192), (3000, 3, 777), (2049, 16, 4100), (1, 4096, 8192), (8, 3000, 5000), (16, 16, 65536),
          (1, 1, 100000), (16513, 5, 401), (16513, 4, 63)]  # (5-16 columns on K <= 384: few-columns-tiles)


def _operand(rng, rows, cols, transposed):
    if transposed:
        return cp.asarray(rng.uniform(-1, 1, (cols, rows)).astype(np.float32)).T
    return cp.asarray(rng.uniform(-1, 1, (rows, cols)).astype(np.float32))


def _right_and_repeatable(a, b, kernel):
    """`kernel`'s a @ b into a NaN-poisoned output: within 1e-5 of float64, and the same bits a second time."""
    want = a.astype(cp.float64) @ b.astype(cp.float64)
    c = cp.full(want.shape, cp.nan, cp.float32)
    fastmm.matmul(a, b, out=c, kernel=kernel)
    err = float(cp.linalg.norm(c - want) / cp.linalg.norm(want))
    assert err < 1e-5, err
    assert bool((fastmm.matmul(a, b, kernel=kernel) == c).all())


@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_few_columns_and_rows_are_right_and_deterministic(m, n, k, layout, rng, launches):
    a, b = _operand(rng, m, k, layout[0] == "t"), _operand(rng, k, n, layout[1] == "t")
    choice = _plan.choose(_plan.Problem(m, n, k), _cuda.device(0))
    assert choice.rule == "few-columns"
    want = a.astype(cp.float64) @ b.astype(cp.float64)
    c = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(a, b, out=c)
    # Against |A| |B|, the scale of a float32 sum's rounding: a 1x1x100000 product of uniform draws can cancel to a
    # millionth of it (the relative error of any float32 order is then ~1e-4), while a slice left out errs by 1e-3 or more.
    err = float(cp.linalg.norm(c - want) / cp.linalg.norm(cp.abs(a).astype(cp.float64) @ cp.abs(b).astype(cp.float64)))
    assert err < 1e-6, err
    # The few-column kernel, and where K was split, the ordered sum of its slices.
    assert all(name.startswith("fewcol") or name == "slicesum" for name in launches), launches
    assert ("slicesum" in launches) == (choice.splits > 1), (launches, choice.splits)
    for _ in range(2):
        assert bool((fastmm.matmul(a, b) == c).all())  # the same slices, summed in the same order


def test_matrix_vector_forms(rng, launches):
    a = cp.asarray(rng.uniform(-1, 1, (3000, 2000)).astype(np.float32))
    v = cp.asarray(rng.uniform(-1, 1, 2000).astype(np.float32))
    w = cp.asarray(rng.uniform(-1, 1, 3000).astype(np.float32))
    fa = fastmm.asarray(a)
    for got, want in ((fa @ v, a @ v), (w @ fa, w @ a), (np.dot(fa, v), a @ v), (np.matvec(fa, v), a @ v),
                      (fa[::2] @ v, a[::2] @ v), (fa.T @ w, a.T @ w), (fastmm.matmul(fa[None], v[:, None]),
                                                                      (a @ v)[None, :, None])):
        assert got.shape == want.shape
        err = float(cp.linalg.norm(got - want) / cp.linalg.norm(want))
        assert err < 1e-5, err
    assert launches and all(name.startswith("fewcol") or name == "slicesum" for name in launches), launches


def test_batched_matrix_vector(rng, launches):
    a = cp.asarray(rng.uniform(-1, 1, (64, 1024, 1024)).astype(np.float32))
    v = cp.asarray(rng.uniform(-1, 1, (64, 1024, 1)).astype(np.float32))
    got = fastmm.matmul(a, v)
    want = cp.matmul(a.astype(cp.float64), v.astype(cp.float64))
    assert float(cp.linalg.norm(got - want) / cp.linalg.norm(want)) < 1e-5
    assert launches == ["fewcol_n1"]  # one launch for the whole batch


@pytest.mark.parametrize("kernel", ["fewcol_n1", "fewcol_n1_c2", "fewcol_n1_c8"])
@pytest.mark.parametrize("m,k,offset", [(97, 1, 1), (97, 2, 3), (97, 3, 2), (300, 5, 1), (300, 131, 1), (129, 4097, 0),
                                        (2048, 4093, 2), (1000, 1001, 0), (64, 384, 3)], ids=str)
def test_unaligned_rows_of_a_matrix_vector_product(kernel, m, k, offset, rng):
    """Rows of A that start 1-3 floats past a 16-byte boundary (an odd row length, a view at an offset) are copied
    through aligned windows: every misalignment in every warp, K shorter than one piece, ragged K, the vector aligned
    or not; outputs NaN-poisoned, against float64, the same on every run."""
    width = k + 4 if k % 2 == 0 else k + 5  # odd: consecutive rows start at every misalignment in turn
    base = cp.asarray(rng.uniform(-1, 1, (m, width)).astype(np.float32))
    a = base[:, offset:offset + k]
    for v in (cp.asarray(rng.uniform(-1, 1, k).astype(np.float32)),
              cp.asarray(rng.uniform(-1, 1, k + 1).astype(np.float32))[1:]):
        _right_and_repeatable(a, v[:, None], kernel)


@pytest.mark.parametrize("kernel,n", [("fewcol_n4", 3), ("fewcol_n4_c3", 4), ("fewcol_n8", 5), ("fewcol_n8_c16", 8),
                                      ("fewcol_n16", 16), ("fewcol_n16_c2", 11)], ids=str)
@pytest.mark.parametrize("m,k,offset", [(97, 1, 1), (97, 2, 3), (97, 3, 2), (300, 5, 1), (300, 131, 1), (129, 4097, 0),
                                        (2048, 4093, 2), (64, 384, 3), (33, 125, 3)], ids=str)
def test_unaligned_rows_of_a_few_column_product(kernel, n, m, k, offset, rng):
    """2-16 columns whose row-major A has rows starting 1-3 floats past a 16-byte boundary (8-16: 33 aligned pieces a
    row and step, each lane's 4 values of k picked at the row's shift; 4: 4-byte copies): every misalignment in every
    warp, K shorter than a piece, K ending in the 33rd piece (125 + 3), clusters; B aligned or not; NaN-poisoned,
    against float64, the same bits on every run."""
    width = k + 4 if k % 2 == 0 else k + 5  # odd: consecutive rows start at every misalignment in turn
    a = cp.asarray(rng.uniform(-1, 1, (m, width)).astype(np.float32))[:, offset:offset + k]
    for b in (cp.asarray(rng.uniform(-1, 1, (k, n)).astype(np.float32)),
              cp.asarray(rng.uniform(-1, 1, (n, k + 1)).astype(np.float32))[:, 1:].T):
        _right_and_repeatable(a, b, kernel)


@pytest.mark.parametrize("kernel", ["fewcol_n1", "fewcol_n1_c2", "fewcol_n1_c8"])
@pytest.mark.parametrize("k,n,offset", [(1, 97, 1), (5, 300, 1), (131, 300, 2), (4097, 129, 0), (1001, 1000, 0),
                                        (3000, 2048, 3), (64, 33, 3)], ids=str)
def test_unaligned_columns_of_a_vector_matrix_product(kernel, k, n, offset, rng):
    """v . A with A's rows (the transposed product's columns) starting 1-3 floats past a 16-byte boundary: aligned
    pieces per column, every shift, a ragged last block of columns, clusters; NaN-poisoned, against float64, the
    same on every run."""
    width = n + 4 if n % 2 == 0 else n + 5  # odd: consecutive rows of A start at every misalignment in turn
    base = cp.asarray(rng.uniform(-1, 1, (k, width)).astype(np.float32))
    a = base[:, offset:offset + n]
    v = cp.asarray(rng.uniform(-1, 1, (1, k)).astype(np.float32))
    _right_and_repeatable(v, a, kernel)


@pytest.mark.parametrize("kernel,n", [("fewcol_n4", 3), ("fewcol_n4_c4", 4), ("fewcol_n16", 7), ("fewcol_n16", 16),
                                      ("fewcol_n16_c2", 13), ("fewcol_n32_s3", 30), ("fewcol_n64_s3_c8", 50)], ids=str)
@pytest.mark.parametrize("m,k,offset", [(97, 1, 1), (300, 131, 2), (1001, 1000, 3), (33, 2049, 1), (5000, 77, 0)],
                         ids=str)
def test_unaligned_columns_of_a_transposed_a(kernel, n, m, k, offset, rng):
    """A with unit stride along m (a transposed view) whose columns start 1-3 floats past a 16-byte boundary, with 3 to
    50 columns of C: each column of A copied as aligned pieces and read at its shift; NaN-poisoned, against float64,
    the same on every run."""
    width = m + 4 if m % 2 == 0 else m + 5  # odd: consecutive columns of A start at every misalignment in turn
    base = cp.asarray(rng.uniform(-1, 1, (k, width)).astype(np.float32))
    a = base[:, offset:offset + m].T
    b = cp.asarray(rng.uniform(-1, 1, (k, n)).astype(np.float32))
    _right_and_repeatable(a, b, kernel)


WIDE = ["fewcol_n32_s3", "fewcol_n32_s3_c4", "fewcol_n64_s3", "fewcol_n64_s3_c8"]


@pytest.mark.parametrize("kernel", WIDE)
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt", "ff", "offset"])
@pytest.mark.parametrize("m,n,k", [(1848, 19, 7157), (142, 28, 15596), (300, 17, 20011), (97, 31, 1001),
                                   (2049, 32, 4100), (33, 33, 129), (1000, 47, 3001), (513, 64, 19999), (5, 64, 1)],
                         ids=str)
def test_wide_few_columns_are_right_and_deterministic(kernel, layout, m, n, k, rng):
    """17 to 64 columns in one pass (a lane per row of C): ragged M, N and K, every layout (transposed views, Fortran
    order, rows starting 1-3 floats past a 16-byte boundary); outputs NaN-poisoned, against float64, the same bits
    on every run. Forced on more columns than it holds, a configuration covers them nmax at a time."""
    if layout == "ff":
        a = cp.asfortranarray(_operand(rng, m, k, False))
        b = cp.asfortranarray(_operand(rng, k, n, False))
    elif layout == "offset":  # odd row lengths at odd offsets: every misalignment of A's and B's rows
        a = cp.asarray(rng.uniform(-1, 1, (m, k + 5)).astype(np.float32))[:, 1:k + 1]
        b = cp.asarray(rng.uniform(-1, 1, (k, n + 3)).astype(np.float32))[:, 3:n + 3]
    else:
        a, b = _operand(rng, m, k, layout[0] == "t"), _operand(rng, k, n, layout[1] == "t")
    _right_and_repeatable(a, b, kernel)


@pytest.mark.parametrize("kernel", ["fewcol_n32_s3", "fewcol_n64_s3_c2"])
@pytest.mark.parametrize("m,n,k", [(23, 3567, 11324), (28, 1537, 10694), (32, 958, 2655), (17, 200, 5000)], ids=str)
def test_wide_few_rows_as_the_transposed_product(kernel, m, n, k, rng, launches):
    """17-64 rows on a long K, as C^T = B^T A^T (A's rows unaligned where K is odd), and wider than the configuration
    (its blocks then cover the columns nmax at a time)."""
    a, b = _operand(rng, m, k, False), _operand(rng, k, n, False)
    want = a.astype(cp.float64) @ b.astype(cp.float64)
    for got in (fastmm.matmul(b.T, a.T, kernel=kernel).T, fastmm.matmul(a, b, kernel=kernel)):
        err = float(cp.linalg.norm(got - want) / cp.linalg.norm(want))
        assert err < 1e-5, err
    assert launches == [kernel, kernel], launches


@pytest.mark.parametrize("m,n,k,layout", [(6690, 10, 4071, "tn"), (10, 6690, 4071, "nn"), (4430, 7, 3088, "tn"),
                                          (5, 2311, 16001, "tn")], ids=str)
def test_lanes_that_own_a_row_keep_cublas_accuracy(m, n, k, layout, rng, launches):
    """5-16 columns (or rows; the 8- or 16-column kernel) where a lane owns a row of C (A, or B^T for few rows, with
    unit stride along M): its 16 terms a step go into sums restarted every 2 steps. With one sum over its slice of K
    (up to 384 terms), such products had up to 1.4x cuBLAS's error; here the relative error, pooled over 3 draws of the
    inputs, is at most cuBLAS's on the same data (measured 0.35-0.64x)."""
    ours = theirs = 0.0
    for _ in range(3):
        a, b = _operand(rng, m, k, layout[0] == "t"), _operand(rng, k, n, layout[1] == "t")
        want = a.astype(cp.float64) @ b.astype(cp.float64)
        ours += float(cp.linalg.norm(fastmm.matmul(a, b) - want) / cp.linalg.norm(want)) ** 2
        theirs += float(cp.linalg.norm(cp.matmul(a, b) - want) / cp.linalg.norm(want)) ** 2
    assert launches and all(name.startswith(("fewcol_n8", "fewcol_n16")) for name in launches), launches
    assert ours <= theirs, (ours ** 0.5, theirs ** 0.5)


@pytest.mark.parametrize("kernel", ["fewcol_n1_c3", "fewcol_n4_c5", "fewcol_n8_c7", "fewcol_n16_c6", "fewcol_n4_c7",
                                    "fewcol_n1_c16", "fewcol_n16_c16", "fewcol_n32_s3_c16"])
@pytest.mark.parametrize("m,k,layout", [(2550, 4808, "tn"), (97, 257, "nn"), (1001, 3001, "tt"), (33, 129, "nt"),
                                        (300, 1, "tn")], ids=str)
def test_clusters_of_any_size_sum_k_in_a_fixed_tree(kernel, m, k, layout, rng):
    """Clusters of 3, 5, 6 or 7 blocks, and of 16 (a non-portable size): K's steps shared out unevenly (a block may get
    none: K = 129 over 7), the partial sums added in a tree with one left over at a level; within 1e-5 of float64, the
    same bits every run."""
    n = get_config(kernel).nmax
    a, b = _operand(rng, m, k, layout[0] == "t"), _operand(rng, k, n, layout[1] == "t")
    _right_and_repeatable(a, b, kernel)
