"""Every kernel (forced in turn) and `auto` against a float64 NumPy reference, on the GPU.

Outputs are poisoned with NaN before each product, inputs are fresh random numbers each run, and the
relative Frobenius error must stay near float32 rounding (FP32 SIMT lands near 1e-6).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fastmm.kernels.configs import CONFIGS

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

KERNELS = ["auto", *(c.name for c in CONFIGS)]
SIZES = [0, 1, 7, 31, 127, 128, 129, 1000]
SHAPES = [(s, s, s) for s in SIZES] + [
    (127, 129, 31), (1, 1000, 7), (1000, 1, 129), (7, 31, 1000), (129, 128, 1), (0, 5, 3), (5, 0, 3),
    (5, 3, 0), (33, 65, 257), (1000, 129, 127), (130, 258, 9),
    # K a multiple of 32 with tiles inside C: the sub-tile loop (all blocks; and next to edge blocks).
    (256, 512, 96), (300, 600, 160),
    # The ragged loops (any K, any block): K past two runs of 512 with a tail of 3 terms, inside C and across its
    # edges; one to three whole K-tiles and a tail (the prologue then copies the partial K-tile); slots allocated
    # and no flush (K = 515: 32 whole K-tiles).
    (256, 512, 1043), (300, 600, 1043), (256, 512, 17), (256, 512, 40), (300, 520, 50), (256, 512, 515),
]
LAYOUTS = ["nn", "tn", "nt", "tt"]
TOL = 1e-5
# One TF32 pass ("medium") rounds every operand to 10 mantissa bits: relative error near 3e-4 (cuBLAS's TF32 too).
TOLS = {"highest": TOL, "high": TOL, "medium": 3e-3}


def tol(kernel: str) -> float:
    from fastmm.kernels.configs import BY_NAME

    config = BY_NAME.get(kernel)
    return TOLS[config.precision] if config is not None else TOL


def host_operand(rng, rows, cols, transposed):
    """A (rows, cols) float32 NumPy array; `transposed` makes it a transposed view of a (cols, rows) array."""
    if transposed:
        return rng.uniform(-1, 1, (cols, rows)).astype(np.float32).T
    return rng.uniform(-1, 1, (rows, cols)).astype(np.float32)


def device(x):
    """Upload keeping the layout (a transposed host view becomes a transposed device view)."""
    if x.ndim >= 2 and not x.flags.c_contiguous and x.swapaxes(-1, -2).flags.c_contiguous:
        return cp.asarray(np.ascontiguousarray(x.swapaxes(-1, -2))).swapaxes(-1, -2)
    return cp.asarray(x)


def rel_error(c, ref) -> float:
    c = cp.asnumpy(c).astype(np.float64)
    assert np.isfinite(c).all(), "NaN in the result: an output element was not written"
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(c - ref) / denom) if denom else float(np.linalg.norm(c))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_float64_reference(kernel, m, n, k, layout, rng):
    import fastmm

    a = host_operand(rng, m, k, layout[0] == "t")
    b = host_operand(rng, k, n, layout[1] == "t")
    da, db = device(a), device(b)
    out = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(da, db, out=out, kernel=kernel)
    assert rel_error(out, a.astype(np.float64) @ b.astype(np.float64)) < tol(kernel)


BATCHED = [
    ((2, 1, 33, 17), (5, 17, 9)),
    ((3, 4, 65, 70), (70, 66)),
    ((70,), (3, 70, 5)),
    ((6, 1, 1, 40, 12), (1, 5, 3, 12, 40)),
    ((1, 1, 129, 8), (7, 8, 130)),
    ((2, 256, 1043), (1043, 512)),  # whole tiles of a batch item on a ragged K: the tail's batch offset
]


@pytest.mark.parametrize("ashape,bshape", BATCHED, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_batched_broadcasting(kernel, ashape, bshape, rng):
    import fastmm

    a = rng.uniform(-1, 1, ashape).astype(np.float32)
    b = rng.uniform(-1, 1, bshape).astype(np.float32)
    c = fastmm.matmul(cp.asarray(a), cp.asarray(b), kernel=kernel)
    assert c.shape == np.matmul(a, b).shape
    assert rel_error(c, np.matmul(a.astype(np.float64), b.astype(np.float64))) < tol(kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_batch_axes_that_do_not_collapse(kernel, rng):
    """Three batch axes with strides no two of which merge: fastmm loops over the outermost on the host."""
    import fastmm

    a = rng.uniform(-1, 1, (6, 1, 1, 40, 12)).astype(np.float32)
    b_full = rng.uniform(-1, 1, (1, 5, 6, 12, 40)).astype(np.float32)
    da, db = cp.asarray(a), cp.asarray(b_full)[:, :, ::2]
    b = b_full[:, :, ::2]
    c = fastmm.matmul(da, db, kernel=kernel)
    assert rel_error(c, np.matmul(a.astype(np.float64), b.astype(np.float64))) < tol(kernel)


def _views(base):
    return {
        "offset-by-one (unaligned)": lambda x: x[1:, 1:],
        "reversed rows": lambda x: x[::-1],
        "every other row": lambda x: x[::2],
        "every other column (copied)": lambda x: x[:, ::2],
        "reversed columns (copied)": lambda x: x[:, ::-1],
        "transposed slice": lambda x: x[3:, 5:].T,
    }


@pytest.mark.parametrize("view", list(_views(None)))
@pytest.mark.parametrize("kernel", KERNELS)
def test_sliced_views(kernel, view, rng):
    import fastmm

    fn = _views(None)[view]
    a_host = rng.uniform(-1, 1, (300, 301)).astype(np.float32)
    b_host = rng.uniform(-1, 1, (302, 299)).astype(np.float32)
    a, b = fn(a_host), fn(b_host)
    k = min(a.shape[1], b.shape[0])
    a, b = a[:, :k], b[:k]
    da, db = fn(cp.asarray(a_host))[:, :k], fn(cp.asarray(b_host))[:k]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastmm.PerformanceWarning)
        c = fastmm.matmul(da, db, kernel=kernel)
    assert rel_error(c, a.astype(np.float64) @ b.astype(np.float64)) < tol(kernel)


@pytest.mark.parametrize("ashape,bshape", [((50,), (50, 7)), ((9, 50), (50,)), ((50,), (50,)), ((4, 9, 50), (50,)),
                                           ((50,), (4, 50, 9)), ((0,), (0, 3)), ((0,), (0,))])
@pytest.mark.parametrize("kernel", ["auto", "naive", "smem", "regtile", "warptile"])
def test_one_dimensional_operands(kernel, ashape, bshape, rng):
    import fastmm

    a = rng.uniform(-1, 1, ashape).astype(np.float32)
    b = rng.uniform(-1, 1, bshape).astype(np.float32)
    c = fastmm.matmul(cp.asarray(a), cp.asarray(b), kernel=kernel)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert c.shape == want.shape
    assert isinstance(c, fastmm.ndarray)
    np.testing.assert_allclose(cp.asnumpy(c), want, rtol=1e-4, atol=1e-4)


def test_sanity_large_product_has_fp32_accuracy(rng):
    """One product big enough to run the 128x128 tiles over many K steps: error near float32 rounding."""
    import fastmm

    a = rng.uniform(-1, 1, (2048, 2048)).astype(np.float32)
    b = rng.uniform(-1, 1, (2048, 2048)).astype(np.float32)
    da, db = cp.asarray(a), cp.asarray(b)
    ref = cp.matmul(da.astype(cp.float64), db.astype(cp.float64))
    for kernel in ("auto", "regtile_128x128x8_8x8", "warptile_128x256x32_64x64_8x16_s4_spread"):
        c = cp.full((2048, 2048), cp.nan, cp.float32)
        fastmm.matmul(da, db, out=c, kernel=kernel)
        assert bool(cp.isfinite(c).all())
        err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
        assert err < 2e-6, err


@pytest.mark.parametrize("m,n,k", [(128, 128, 65536), (64, 100, 10000), (33, 65, 8191), (40, 200, 5003),
                                   (256, 300, 20000),
                                   # split-k-idle, K with no even cut (a shallow last launch); a few-row output
                                   (804, 40, 7189), (48, 60, 2392), (64, 4096, 4096),
                                   # split-K's slices on the narrow tiles (17-32 rows or columns)
                                   (24, 48, 65536), (3000, 24, 12000),
                                   # split-k on 128x256 tiles in runs of 512, K with no even cut into a wave's slices
                                   (1000, 1000, 20008),
                                   # the tiled rule's split (balanced slice counts): 64x64 tiles, 128x64 with tile sums
                                   (4375, 615, 7371), (3418, 186, 1980)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_k_is_correct_and_deterministic(m, n, k, layout, rng):
    """Long-K products with few output tiles take the split-K path: right, and bitwise the same every run."""
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    assert _plan.choose(_plan.Problem(m, n, k), _cuda.device(0)).splits > 1
    _check_split_product(m, n, k, layout, rng)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_k_just_past_one_block_per_sm_is_correct_and_deterministic(layout, rng):
    """The tiled rule's 3 slices on a K under 1024, where the 64x64 tiles are just past one block per SM: 102 rows
    and as many columns as make 3 or 4 tiles more than this GPU has SMs (102x4352x905 on an H100 or H200, 136 tiles)."""
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    m, n, k = 102, 64 * (_cuda.device(0).sm_count // 2 + 2), 905
    c = _plan.choose(_plan.Problem(m, n, k), _cuda.device(0))
    assert (c.rule, c.splits) == ("tiled", 3), c
    _check_split_product(m, n, k, layout, rng)


def _check_split_product(m, n, k, layout, rng):
    """A split product is right, and bitwise the same on every run, replay and fresh operand of its signature."""
    import fastmm

    a = host_operand(rng, m, k, layout[0] == "t")
    b = host_operand(rng, k, n, layout[1] == "t")
    da, db = device(a), device(b)
    first = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(da, db, out=first)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_error(first, ref) < 1e-5
    again = fastmm.matmul(da, db)
    assert bool((again == first).all())
    # Later products of the same signature replay the split (fresh workspace, same slices, same order).
    for _ in range(2):
        assert bool((fastmm.matmul(da, db) == first).all())
        out = cp.full((m, n), cp.nan, cp.float32)
        assert bool((fastmm.matmul(da, db, out=out) == first).all())
    a2 = host_operand(rng, m, k, layout[0] == "t")
    fresh = fastmm.matmul(device(a2), db)
    assert rel_error(fresh, a2.astype(np.float64) @ b.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("m,n,k", [(399, 137, 11639), (804, 33, 7189), (41, 269, 8637), (482, 42, 2613)], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_k_reads_nothing_past_k(m, n, k, layout, rng, launches):
    """Split-K on the warp tiles runs its slices as one launch whose last slice ends at K, short of the others (the
    kernel's k_total): with A and B views into arrays whose values past K are NaN, the result is finite and right, so
    no slice read past K; one launch of slices and the ordered sum, replays bitwise the same."""
    import fastmm
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    choice = _plan.choose(_plan.Problem(m, n, k, a_t=layout[0] == "t", b_t=layout[1] == "t"), _cuda.device(0))
    depth, slices, rest = _plan.split_cut(k, choice.splits, choice.config)
    assert choice.splits > 1 and rest == 0 and slices * depth > k, (choice, depth, slices)
    past = 64 + -k % 4  # (rows of A along K stay 16-byte aligned, as the plan above assumed)
    a = np.full((k + past, m) if layout[0] == "t" else (m, k + past), np.nan, np.float32)
    b = np.full((n, k + past) if layout[1] == "t" else (k + past, n), np.nan, np.float32)
    a_in = a[:k].T if layout[0] == "t" else a[:, :k]
    b_in = b[:, :k].T if layout[1] == "t" else b[:k]
    a_in[...] = rng.uniform(-1, 1, a_in.shape)
    b_in[...] = rng.uniform(-1, 1, b_in.shape)
    da, db = cp.asarray(a), cp.asarray(b)
    da, db = (da[:k].T if layout[0] == "t" else da[:, :k]), (db[:, :k].T if layout[1] == "t" else db[:k])
    first = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(da, db, out=first)
    assert rel_error(first, a_in.astype(np.float64) @ b_in.astype(np.float64)) < 1e-5
    assert launches == [choice.config.name, "slicesum"], launches
    for _ in range(2):
        assert bool((fastmm.matmul(da, db) == first).all())


@pytest.mark.parametrize("shape_a,shape_b", [((2, 95, 10191), (2, 10191, 150)),  # each of two items split
                                             ((70, 10604), (4, 10604, 27)),       # A broadcast over B's four items
                                             ((3, 98, 3100), (3100, 258))])       # B broadcast
@pytest.mark.parametrize("out_kind", ["new", "strided"])
def test_split_k_on_a_small_batch_is_correct_and_deterministic(shape_a, shape_b, out_kind, rng):
    """A small batch of few tiles on a long K: every item's slices in one launch, each item's sum into its slice of C (a
    fresh result or rows of a wider array); right, untouched outside the result, bitwise the same on replays."""
    import fastmm

    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in (shape_a, shape_b))
    da, db = device(a), device(b)
    assert "split-K" in fastmm.explain(da, db) and "slices in one launch" in fastmm.explain(da, db)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    base = cp.full(ref.shape[:-1] + (ref.shape[-1] + 8,), cp.nan, cp.float32)
    out = base[..., 4:4 + ref.shape[-1]] if out_kind == "strided" else cp.full(ref.shape, cp.nan, cp.float32)
    fastmm.matmul(da, db, out=out)
    assert rel_error(out, ref) < 1e-5
    if out_kind == "strided":
        assert int(cp.isnan(base).sum()) == base.size - out.size
    first = out.copy()
    for _ in range(2):  # replays
        assert bool((fastmm.matmul(da, db) == first).all())


@pytest.mark.parametrize("m,n,k", [(804, 32, 7189), (18, 804, 7189), (792, 27, 8083), (3000, 20, 700), (380, 22, 820)],
                         ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_wide_few_columns_are_correct_and_deterministic(m, n, k, layout, rng):
    """17 to 32 columns (or rows, as the transposed product) on the 32-column kernel, K summed by a cluster's blocks
    in slices: right, and bitwise the same every run (the cluster adds its slices in a fixed order)."""
    import fastmm
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    a = host_operand(rng, m, k, layout[0] == "t")
    b = host_operand(rng, k, n, layout[1] == "t")
    da, db = device(a), device(b)
    problem = _plan.Problem(m, n, k, a_t=layout[0] == "t", b_t=layout[1] == "t")
    assert _plan.choose(problem, _cuda.device(0)).rule == "wide-few-columns"
    first = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(da, db, out=first)
    assert rel_error(first, a.astype(np.float64) @ b.astype(np.float64)) < 1e-5
    for _ in range(2):
        assert bool((fastmm.matmul(da, db) == first).all())


@pytest.mark.parametrize("m,n,k", [(128, 128, 65536), (64, 100, 10000), (4096, 16, 4096), (8, 4096, 4096),
                                   (2048, 1, 16384)])
@pytest.mark.parametrize("where", ["row slice", "misaligned", "column-major"])
def test_split_products_sum_into_any_out(m, n, k, where, rng):
    """Split products (split-K, the few-column kernel's slices and its clusters) add their slices into out= views:
    rows of a wider array, a start that is not 16-byte aligned, a Fortran-ordered out; nothing outside the view is
    touched, and replays give the same bits."""
    import fastmm
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (k, n)))
    da, db = device(a), device(b)
    choice = _plan.choose(_plan.Problem(m, n, k), _cuda.device(0))
    assert choice.splits > 1 or getattr(choice.config, "cluster", 1) > 1, fastmm.explain(da, db)
    if where == "row slice":
        base = cp.full((m, n + 8), cp.nan, cp.float32)
        out = base[:, 4:4 + n]
    elif where == "misaligned":
        base = cp.full(m * n + 1, cp.nan, cp.float32)
        out = base[1:].reshape(m, n)
    else:
        base = cp.full((n, m), cp.nan, cp.float32)
        out = base.T
    fastmm.matmul(da, db, out=out)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_error(out, ref) < 1e-5
    first = out.copy()
    outside = cp.isnan(base)
    assert int(outside.sum()) == base.size - out.size  # every element of the view written, none outside it
    for _ in range(2):
        out[...] = cp.nan
        fastmm.matmul(da, db, out=out)
        assert bool((out == first).all())


def _into_unaligned_out(da, db, ref):
    """da @ db into an out= view whose rows are 16-byte aligned nowhere: right against `ref`, every element of the
    view written once and none outside it, and replays (and a product without out=) give the same bits."""
    import fastmm

    m, n = ref.shape
    base = cp.full((m, n + 8), cp.nan, cp.float32)
    out = base[:, 3:3 + n]
    fastmm.matmul(da, db, out=out)
    assert rel_error(out, ref) < 1e-5
    assert int(cp.isnan(base).sum()) == base.size - out.size
    first = out.copy()
    for _ in range(2):
        out[...] = cp.nan
        fastmm.matmul(da, db, out=out)
        assert bool((out == first).all())
    assert bool((fastmm.matmul(da, db) == first).all())


_WARP_TILES = [c.name for c in CONFIGS if c.name.startswith("warptile_")]


@pytest.mark.parametrize("m,n,k", [(300, 301, 3), (257, 515, 16), (129, 200, 1043), (64, 64, 64)], ids=str)
@pytest.mark.parametrize("kernel", _WARP_TILES)
def test_warp_tiles_store_unaligned_rows_of_c(kernel, m, n, k, rng):
    """C's rows not 16-byte aligned: every warp tile writes every element of the view once and none outside it,
    whole and ragged, short K and long; on the `_cstage` tile, a K of at most 16 goes through shared memory (whole
    rows of the block tile per warp store), a longer one straight from the registers."""
    import fastmm

    a, b = rng.uniform(-1, 1, (m, k)).astype(np.float32), rng.uniform(-1, 1, (k, n)).astype(np.float32)
    da, db = device(a), device(b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    base = cp.full((m, n + 8), cp.nan, cp.float32)
    out = base[:, 3:3 + n]
    fastmm.matmul(da, db, out=out, kernel=kernel)
    assert rel_error(out, ref) < TOL
    assert int(cp.isnan(base).sum()) == base.size - out.size
    pitch = n if n % 2 else n + 1  # an odd row pitch: rows aligned four different ways
    odd = cp.full((m, pitch), cp.nan, cp.float32)[:, : n - 1]
    fastmm.matmul(da, db[:, : n - 1], out=odd, kernel=kernel)
    assert rel_error(odd, ref[:, : n - 1]) < TOL


@pytest.mark.parametrize("m,n,k", [(256, 512, 512), (256, 512, 528), (300, 600, 1040), (256, 256, 4096)], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_sums_in_runs_of_k(m, n, k, layout, rng):
    """The loop that sums K in runs of 512 (split-K's slices): K at, past and well past one run, tiles inside C and on
    its edges (300 x 600), every layout; outputs NaN-poisoned."""
    import fastmm
    from fastmm import _plan

    a = host_operand(rng, m, k, layout[0] == "t")
    b = host_operand(rng, k, n, layout[1] == "t")
    out = cp.full((m, n), cp.nan, cp.float32)
    fastmm.matmul(fastmm.asarray(device(a)), fastmm.asarray(device(b)), out=out, kernel=_plan.tiles.WT256_SLICES)
    assert rel_error(out, a.astype(np.float64) @ b.astype(np.float64)) < TOL


def test_partial_sums_lower_the_error_of_a_long_k(rng):
    """Runs of 512 against one running sum on the same loop: relative error ~ sqrt(512 + K / 512) against ~ sqrt(K)
    (measured 4.1e-7 against 1.6e-6 at K = 8192)."""
    import fastmm
    from fastmm import _plan

    a = rng.uniform(-1, 1, (256, 16384)).astype(np.float32)
    b = rng.uniform(-1, 1, (16384, 256)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    runs = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT256_SLICES), ref)
    one = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT256_LOOP16), ref)
    assert runs < 0.5 * one, (runs, one)


def test_tile_sums_in_runs_of_four_k_tiles_lower_the_error_of_a_long_k(rng):
    """The 64x64 tile's partial sums over runs of 4 K-tiles (64 terms) against runs of one (16 terms) and one running sum
    over K, the same tile otherwise: error ~ sqrt(64 + K / 64) against sqrt(16 + K / 16) and sqrt(K) at K = 16384 (K not a
    multiple of 64 either, so that the last run is short)."""
    import fastmm
    from fastmm import _plan

    k = 16384 - 16
    a = rng.uniform(-1, 1, (128, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, 192)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    four = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT64), ref)
    one = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT64_SHORT), ref)  # (C staged only where K <= 16)
    chain = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT64_SHORT8), ref)
    assert four < 0.85 * one and four < 0.3 * chain, (four, one, chain)


@pytest.mark.parametrize("m,n", [(256, 256), (300, 330)])
def test_the_ragged_loops_sum_a_ragged_k_and_their_edges_in_runs(m, n, rng):
    """A K that is not a multiple of 16, on blocks inside and across C's edges: the ragged loop in runs of 512 against
    the unrolled tile's one running sum (what such products and edges ran before), same run."""
    import fastmm
    from fastmm import _plan

    k = 16383
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fa, fb = fastmm.asarray(a), fastmm.asarray(b)
    runs = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT256_SLICES_RAGGED), ref)
    one = rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT256), ref)
    assert runs < 0.5 * one, (runs, one)
    small = rel_error(fastmm.matmul(fa, fb, kernel="warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"), ref)
    assert small < 0.5 * rel_error(fastmm.matmul(fa, fb, kernel=_plan.tiles.WT128x64), ref)


@pytest.mark.parametrize("m,n,k", [(2049, 2049, 2049), (2052, 2176, 2051), (2176, 2063, 2100)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ragged_edges_are_peeled_off_correctly(m, n, k, layout, rng):
    """Large products a few rows or columns past a multiple of 128 run their interior on whole tiles and the edges
    on the few-column kernel: right in every layout, every element written once, and replays give the same bits,
    on fresh operands too."""
    import fastmm

    a = host_operand(rng, m, k, layout[0] == "t")
    b = host_operand(rng, k, n, layout[1] == "t")
    da, db = device(a), device(b)
    assert "rule    ragged-edge" in fastmm.explain(da, db)
    # rows 16-byte aligned nowhere: the interior's stores and the edges' alike
    _into_unaligned_out(da, db, a.astype(np.float64) @ b.astype(np.float64))
    a2 = host_operand(rng, m, k, layout[0] == "t")
    fresh = fastmm.matmul(device(a2), db)
    assert rel_error(fresh, a2.astype(np.float64) @ b.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("m,n,k", [(2601, 2599, 2603), (2600, 2601, 2600)], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_unaligned_operands_are_copied_aligned_correctly(m, n, k, layout, rng):
    """Large products whose A or B rows are not 16-byte aligned run on aligned copies of them (or, B n-contiguous with
    2601 columns aside, k-contiguous ones are aligned already): right in every layout, into an out= whose rows are
    aligned nowhere, every element written once, the operands untouched, and replays give the same bits."""
    import fastmm

    a, b = host_operand(rng, m, k, layout[0] == "t"), host_operand(rng, k, n, layout[1] == "t")
    da, db = device(a), device(b)
    a0, b0 = da.copy(), db.copy()
    text = fastmm.explain(da, db)
    unaligned = (da.strides[0] if layout[0] == "n" else da.strides[1]) % 16 or \
        (db.strides[0] if layout[1] == "n" else db.strides[1]) % 16
    assert ("copy    aligned-copy" in text) == bool(unaligned), text
    _into_unaligned_out(da, db, cp.asnumpy(da.astype(cp.float64) @ db.astype(cp.float64)))
    assert bool((da == a0).all()) and bool((db == b0).all())


def test_autotune_writes_the_cache_and_auto_uses_it(tmp_path, monkeypatch, rng):
    import fastmm
    from fastmm import _plan
    from fastmm._tools import autotune as _autotune
    from fastmm._runtime import cuda as _cuda
    from fastmm._dispatch import products as _dispatch
    from fastmm._tools.bench import Shape

    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    _plan.reload_tuned()
    try:
        rows = _autotune.tune([Shape("300x200x100", 300, 200, 100), Shape("long-K", 64, 64, 8192)], progress=False)
        tuned, skipped = rows
        assert "skipped" in skipped and "split-k" in skipped["skipped"]
        assert tuned["kernel"] in tuned["candidates"] and tuned["tflops"] == max(tuned["candidates"].values())
        device = _cuda.device(0)
        assert _plan.tune_cache_path(device).exists()
        a = rng.uniform(-1, 1, (300, 100)).astype(np.float32)
        b = rng.uniform(-1, 1, (100, 200)).astype(np.float32)
        da, db = cp.asarray(a), cp.asarray(b)
        problem, choice, _ = _dispatch.plan_matmul(da, db, device)
        assert choice.rule == "tuned" and choice.name == tuned["kernel"]
        assert "rule    tuned" in fastmm.explain(da, db)
        assert rel_error(fastmm.matmul(da, db), a.astype(np.float64) @ b) < TOL
    finally:
        _plan.reload_tuned()


def test_the_sweep_measures_every_layout_on_operands_drawn_on_the_gpu():
    from fastmm._tools import sweep

    problems = [sweep.SweepProblem(37, 29, 300, 1, layout) for layout in sweep.LAYOUTS]
    problems.append(sweep.SweepProblem(5, 70, 9, 3, "fortran"))
    a, b = problems[0].make(np.random.default_rng(0), cp)
    assert a.dtype == b.dtype == np.float32 and -1 <= float(a.min()) and float(a.max()) < 1
    assert 0.3 < float(cp.abs(a).mean()) < 0.7  # uniform in [-1, 1): mean |x| near 1/2
    rows = sweep.run(problems, seed=0, budget_s=600, show_progress=False)
    assert [r["label"] for r in rows] == [p.label for p in problems]
    for r in rows:
        assert r["speed"] > 0 and r["errors"]["fastmm"] < 1e-5 and r["error_ratio"] < 10, r
