"""17 to 32 rows or columns on the GPU, as the plan runs them: the 32-column few-column kernel (few rows on the
transposed product C^T = B^T A^T) against up to 3072 of the other side, the narrow 32x128 and 128x32 tiles against
more (split K from K = 1024), in every layout of the random sweep: right against float64, the same bits every run."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

import fastmm  # noqa: E402
from fastmm._tools import sweep  # noqa: E402


def _plan_of(a, b) -> tuple[str, str]:
    """The rule and kernel `explain` names for a @ b."""
    text = fastmm.explain(fastmm.asarray(a), fastmm.asarray(b))
    fields = dict(line.strip().split(None, 1) for line in text.splitlines()[1:] if line.startswith("  "))
    return fields["rule"].split(":")[0], fields["kernel"].split()[0]


@pytest.mark.parametrize("layout", sweep.LAYOUTS)
@pytest.mark.parametrize("m,n,k,rule,family", [
    (26, 397, 8784, "wide-few-columns", "fewcol_n32"),   # few rows, transposed; K over a cluster
    (18, 398, 2875, "wide-few-columns", "fewcol_n32"),
    (32, 1438, 1187, "wide-few-columns", "fewcol_n32"),
    (17, 3072, 600, "wide-few-columns", "fewcol_n32"),
    (324, 26, 14637, "wide-few-columns", "fewcol_n32"),  # few blocks: up to 2048 of K a block
    (397, 26, 8784, "wide-few-columns", "fewcol_n32"),   # its mirror: few columns
    (18, 3622, 9839, "narrow-tiles", "warptile_32x128"),  # past 3072 columns: the narrow tiles, K split
    (30, 9000, 900, "narrow-tiles", "warptile_32x128"),   # (K below 1024: one launch)
    (20, 5000, 4100, "narrow-tiles", "warptile_32x128"),
    (6000, 24, 1500, "narrow-tiles", "warptile_128x32"),
    (9787, 30, 1523, "narrow-tiles", "warptile_128x32"),
], ids=str)
def test_17_to_32_rows_or_columns_are_right_and_deterministic(m, n, k, rule, family, layout, rng, launches):
    a, b = sweep.SweepProblem(m, n, k, 1, layout).make(rng, cp)
    assert _plan_of(a, b)[0] == rule
    want = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
    c = cp.full((m, n), cp.nan, cp.float32)
    np.matmul(fastmm.asarray(a), fastmm.asarray(b), out=fastmm.asarray(c))
    assert launches and launches[0].startswith(family), launches
    assert all(name.startswith(family) or name == "slicesum" for name in launches), launches
    err = float(cp.linalg.norm(c - want) / cp.linalg.norm(want))
    assert err < 2e-6, err
    again = cp.full((m, n), cp.nan, cp.float32)
    np.matmul(fastmm.asarray(a), fastmm.asarray(b), out=fastmm.asarray(again))
    assert bool((again == c).all())
