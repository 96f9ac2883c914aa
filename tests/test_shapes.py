"""NumPy's shape rules and error messages, checked against NumPy itself (CPU only)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fastmm._runtime import arrays as _arrays
from fastmm._dispatch import numpy_rules as _rules


def numpy_outcome(fn, ashape, bshape):
    try:
        return fn(np.zeros(ashape), np.zeros(bshape)).shape, None
    except ValueError as e:
        return None, str(e)


MATMUL_CASES = [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((0, 4), (4, 5)), ((3, 0), (0, 5)),
    ((2, 1, 3, 4), (5, 4, 6)), ((7, 3, 4), (4, 2)), ((4,), (6, 4, 2)), ((6, 3, 4), (4,)), ((0, 3, 4), (1, 4, 2)),
    ((2, 3), (4, 5)), ((3,), (4,)), ((2, 3, 4), (5, 4, 3)), ((2, 3, 4), (3, 4, 5)), ((5,), (4, 3)),
    ((3, 5), (4,)), ((1, 2, 3), (2, 3, 2)), ((2, 1, 1, 3), (1, 4, 3, 1)),
]


@pytest.mark.parametrize("ashape,bshape", MATMUL_CASES)
def test_matmul_shapes_match_numpy(ashape, bshape):
    want, err = numpy_outcome(np.matmul, ashape, bshape)
    if err is None:
        out_shape, m, n, k = _rules.matmul_shapes(ashape, bshape)
        assert out_shape == want
        assert k == ashape[-1]
    else:
        with pytest.raises(ValueError, match=re.escape(err)):
            _rules.matmul_shapes(ashape, bshape)


@pytest.mark.parametrize("ashape,bshape", [((), (3, 3)), ((3, 3), ())])
def test_matmul_rejects_scalars_like_numpy(ashape, bshape):
    _, err = numpy_outcome(np.matmul, ashape, bshape)
    assert err is not None
    with pytest.raises(ValueError, match=re.escape(err)):
        _rules.matmul_shapes(ashape, bshape)


DOT_CASES = [
    ((3, 4), (4, 5)), ((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)),
    ((2, 3, 4), (5, 4, 6)), ((2, 3), (4, 5)), ((3,), (4,)), ((2, 3), (4,)), ((2, 3, 4), (5, 3, 6)), ((0, 3), (3, 0)),
]


@pytest.mark.parametrize("ashape,bshape", DOT_CASES)
def test_dot_shapes_match_numpy(ashape, bshape):
    want, err = numpy_outcome(np.dot, ashape, bshape)
    if err is None:
        assert _rules.dot_shapes(ashape, bshape) == want
    else:
        with pytest.raises(ValueError, match=re.escape(err)):
            _rules.dot_shapes(ashape, bshape)


@pytest.mark.parametrize("ashape,bshape", [((3, 4), (5, 4)), ((4,), (4,)), ((2, 3, 4), (5, 4)), ((2, 3), (4, 5)),
                                           ((2, 3), (6, 4, 5)), ((3,), (4,)), ((2, 3, 4), (6, 5, 7))])
def test_inner_shapes_match_numpy(ashape, bshape):
    want, err = numpy_outcome(np.inner, ashape, bshape)
    if err is None:
        assert _rules.inner_shapes(ashape, bshape) == want
    else:
        with pytest.raises(ValueError, match=re.escape(err)):
            _rules.inner_shapes(ashape, bshape)


@pytest.mark.parametrize("andim,bndim,axes,want", [
    (3, 2, 1, ([2], [0])), (3, 3, 2, ([1, 2], [0, 1])), (2, 2, ([1], [0]), ([1], [0])),
    (3, 3, ([0, -1], [2, 1]), ([0, 2], [2, 1])), (2, 2, (1, 0), ([1], [0])), (2, 2, 0, ([], [])),
])
def test_tensordot_axes(andim, bndim, axes, want):
    assert _rules.tensordot_axes(andim, bndim, axes) == want


def test_tensordot_axes_length_mismatch():
    with pytest.raises(ValueError, match="shape-mismatch for sum"):
        _rules.tensordot_axes(2, 2, ([0, 1], [0]))


@pytest.mark.parametrize("spec,ashape,bshape,is_gemm", [
    ("ij,jk->ik", (2, 3), (3, 4), True),
    ("ij,kj->ik", (2, 3), (4, 3), True),
    ("ji,jk->ik", (3, 2), (3, 4), True),
    ("bij,bjk->bik", (5, 2, 3), (5, 3, 4), True),
    ("bij,bjk->bki", (5, 2, 3), (5, 3, 4), True),
    ("ijk,kl->ijl", (2, 3, 4), (4, 5), True),
    ("ij,ij->i", (2, 3), (2, 3), True),        # batched dot products: batch i, k j
    ("i,i->", (3,), (3,), True),
    ("ij,jk", (2, 3), (3, 4), False),          # implicit output: CuPy
    ("ii,ij->j", (3, 3), (3, 4), False),       # diagonal
    ("ij,jk->ijk", (2, 3), (3, 4), True),      # j in both and kept: a batch of outer products (k = 1)
    ("ij,k->ik", (2, 3), (4,), False),         # j summed inside a only
    ("...ij,...jk->...ik", (2, 3), (3, 4), False),
])
def test_einsum_recognises_single_products(spec, ashape, bshape, is_gemm):
    got = _rules.einsum_as_gemm(spec, ashape, bshape)
    assert (got is not None) == is_gemm
    if is_gemm:
        # Same result as NumPy when evaluated the way fastmm would (here with NumPy as the GEMM engine).
        la, lb, batch, m, k, n, out, sizes = got
        rng = np.random.default_rng(0)
        a, b = rng.random(ashape), rng.random(bshape)
        size = lambda labels: int(np.prod([sizes[c] for c in labels]))  # noqa: E731
        a3 = a.transpose([la.index(c) for c in batch + m + k]).reshape(size(batch), size(m), size(k))
        b3 = b.transpose([lb.index(c) for c in batch + k + n]).reshape(size(batch), size(k), size(n))
        c = (a3 @ b3).reshape([sizes[c] for c in batch + m + n]).transpose(
            [(batch + m + n).index(c) for c in out])
        np.testing.assert_allclose(c, np.einsum(spec, a, b))


def test_batch_dims_collapse_and_broadcast():
    class A:  # shape/strides stand-in, strides in bytes
        def __init__(self, shape, strides):
            self.shape, self.strides, self.ndim = shape, strides, len(shape)

    c = A((4, 6, 3, 5), (6 * 15 * 4, 15 * 4, 5 * 4, 4))
    a = A((4, 6, 3, 2), (6 * 6 * 4, 6 * 4, 2 * 4, 4))      # contiguous batch: collapses to one axis
    b = A((2, 5), (20, 4))                                    # broadcast: stride 0
    dims = _arrays._batch_dims(c.shape[:-2], a, b, c)
    assert dims == [(24, [6, 0, 15])]
    a2 = A((4, 1, 3, 2), (6 * 4, 0, 2 * 4, 4))                # broadcast in the inner batch axis only
    dims = _arrays._batch_dims(c.shape[:-2], a2, b, c)
    assert dims == [(4, [6, 0, 90]), (6, [0, 0, 15])]


def test_core_layout_rules():
    class A:
        def __init__(self, shape, strides):
            self.shape, self.strides = shape, strides

    assert _arrays._core_layout(A((3, 5), (20, 4))) == (False, 5)     # row-major
    assert _arrays._core_layout(A((3, 5), (4, 12))) == (True, 3)      # a transposed view
    assert _arrays._core_layout(A((3, 5), (-20, 4))) == (False, -5)   # reversed rows need no copy
    assert _arrays._core_layout(A((1, 5), (999, 4))) == (False, 0)    # a single row has no row stride
    assert _arrays._core_layout(A((3, 5), (40, 8))) is None           # a[::2, ::2]: copied
    assert _arrays._core_layout(A((3, 5), (10, 2))) is None           # not float32-strided
