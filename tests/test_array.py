"""fastmm.ndarray's own machinery that needs no GPU: how product results become fastmm arrays."""

from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy", reason="fastmm arrays need CuPy")


def _bare():
    """A CuPy array object holding no memory (CuPy's base class's constructor, no initialiser): no GPU needed."""
    from cupy._core.core import _ndarray_base

    return _ndarray_base.__new__(cp.ndarray)


def test_fastmm_arrays_have_cupys_layout():
    from fastmm import _array

    assert _array.ndarray.__slots__ == ()
    assert _array.ndarray.__basicsize__ == cp.ndarray.__basicsize__
    assert _array.ndarray.__dictoffset__ == cp.ndarray.__dictoffset__ == 0
    assert _array._RETYPE  # this CuPy allows the in-place retyping


def test_fresh_results_are_retyped_in_place_and_operands_never(monkeypatch):
    from fastmm import _array

    x = _bare()
    assert _array._fresh(x, object()) is x and type(x) is _array.ndarray
    wrapped = []
    monkeypatch.setattr(_array, "_wrap", lambda v: wrapped.append(v) or "wrapped")
    operand = _bare()
    assert _array._fresh(operand, "other", operand) == "wrapped"  # handed back: the user's, so never retyped
    assert type(operand) is cp.ndarray and wrapped == [operand]
    assert _array._returned(operand, operand) is operand  # out= is returned as it is
    assert type(operand) is cp.ndarray


def test_astype_answers_a_cast_to_its_own_dtype_and_leaves_the_rest_to_cupy():
    from fastmm import _array

    x = _array._retype(_bare())
    assert x.astype(x.dtype, copy=False) is x
    assert x.astype(x.dtype, "K", None, None, False) is x  # as CuPy's own routines call it
    with pytest.raises(TypeError):  # CuPy's refusal of casting= and subok=, not a shortcut's silence
        x.astype(x.dtype, casting="unsafe", copy=False)
    with pytest.raises(TypeError):
        x.astype(x.dtype, subok=True, copy=False)


def test_np_dot_returns_a_positional_out_itself(monkeypatch):
    import numpy as np

    from fastmm import _array

    a, b, out = _array._retype(_bare()), _array._retype(_bare()), _bare()
    monkeypatch.setitem(_array._GEMM_FUNCTIONS, np.dot, lambda a, b, out=None: out)
    assert np.dot(a, b, out) is out and type(out) is cp.ndarray
    assert np.dot(a, b, out=out) is out
