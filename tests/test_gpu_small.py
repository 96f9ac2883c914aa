"""The small rule on the GPU: products bound by their launch sum in float64, so that C is the exact product rounded
once, in every layout and batch, on either kernel (a thread or a warp per element of C), past the grid's limits."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

import fastmm  # noqa: E402
from fastmm import _plan  # noqa: E402
from fastmm._runtime import cuda as _cuda  # noqa: E402
from fastmm._tools import sweep  # noqa: E402

LAYOUTS = sweep.LAYOUTS  # transposed, Fortran order, rows 3 floats apart, a start one float past alignment


def _operands(rng, m, n, k, layout):
    """Uniform [-1, 1) float32 operands on the GPU in `layout`, made as the random sweep makes them."""
    return sweep.SweepProblem(m, n, k, 1, layout).make(rng, cp)


def _rounded_once(a, b, c):
    """C equals the float64 product rounded to float32 (a tie within float64's own error may round the other way:
    at most one element in 10^4), and a second call gives the same bits."""
    want = cp.matmul(a.astype(cp.float64), b.astype(cp.float64)).astype(cp.float32)
    assert c.shape == want.shape
    assert int((c != want).sum()) <= max(1, c.size // 10_000), float(cp.abs(c - want).max())
    again = cp.full(c.shape, cp.nan, cp.float32)
    np.matmul(fastmm.asarray(a), fastmm.asarray(b), out=fastmm.asarray(again))
    assert bool((again == c).all())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k,kernel", [
    (1, 1, 1, "naive_32x8_f64sum"), (3, 5, 7, "naive_32x8_f64sum"), (1, 8299, 10, "naive_32x8_f64sum"),
    (442, 258, 17, "naive_32x8_f64sum"), (30, 51, 16, "naive_32x8_f64sum"), (30, 51, 96, "naive_32x8_f64dot"),
    (7, 16, 97, "naive_32x8_f64dot"), (2, 25, 766, "naive_32x8_f64dot"), (8, 59, 1612, "naive_32x8_f64dot"),
    (1, 1, 2048, "naive_32x8_f64dot"), (33, 31, 1000, "naive_32x8_f64dot"),
])
def test_small_products_are_the_exact_product_rounded_once(m, n, k, kernel, layout, rng, launches):
    a, b = _operands(rng, m, n, k, layout)
    choice = _plan.choose(_plan.Problem(m, n, k), _cuda.device(0))
    assert (choice.rule, choice.name) == ("small", kernel)
    c = cp.full((m, n), cp.nan, cp.float32)
    np.matmul(fastmm.asarray(a), fastmm.asarray(b), out=fastmm.asarray(c))
    assert launches and all(name.startswith(kernel) for name in launches), launches
    _rounded_once(a, b, c)


@pytest.mark.parametrize("ashape,bshape", [((64, 8, 3), (64, 3, 4)), ((9, 1, 59), (9, 59, 6)), ((5, 4, 200), (200, 3)),
                                           ((2, 1, 3, 40), (4, 40, 2))])
def test_batches_and_broadcasts(ashape, bshape, rng):
    a = cp.asarray(rng.uniform(-1, 1, ashape).astype(np.float32))
    b = cp.asarray(rng.uniform(-1, 1, bshape).astype(np.float32))
    assert "rule    small:" in fastmm.explain(a, b)
    _rounded_once(a, b, cp.asarray(np.matmul(fastmm.asarray(a), fastmm.asarray(b))))


@pytest.mark.parametrize("m,n,k,kernel", [(600_000, 3, 5, "naive_32x8_f64sum"), (70_000, 2, 200, "naive_32x8_f64dot")])
def test_rows_past_the_grid_limit(m, n, k, kernel, rng):
    """Forced onto more rows than one launch's 65535 blocks cover: the runtime launches again for the rest."""
    a, b = _operands(rng, m, n, k, "c")
    c = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(a, b, out=c, kernel=kernel)
    want = cp.matmul(a.astype(cp.float64), b.astype(cp.float64)).astype(cp.float32)
    assert int((c != want).sum()) <= c.size // 10_000


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_every_precision_keeps_the_float64_sums(precision, rng):
    """Bound by the launch, a small product gains nothing from tensor cores: each mode runs it rounded once."""
    a, b = _operands(rng, 40, 30, 50, "c")
    with fastmm.matmul_precision(precision):
        assert _plan.choose(_plan.Problem(40, 30, 50), _cuda.device(0)).rule == "small"
        c = cp.asarray(np.matmul(fastmm.asarray(a), fastmm.asarray(b)))
    _rounded_once(a, b, c)
