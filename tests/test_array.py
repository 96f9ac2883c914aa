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


@pytest.fixture
def stand_in_device(monkeypatch):
    """CuPy arrays over stand-in memory (no GPU): device 0 current, each allocation a new address from CuPy's
    allocator hook, and fastmm's launches recorded as (kernel, a, b, c) instead of run."""
    from cupy.cuda import memory

    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda
    from fastmm._runtime import gemm as _gemm

    state = {"next": 1 << 40}

    def memory_at(size):
        ptr, state["next"] = state["next"], state["next"] + max(size, 1) + 512
        return memory.MemoryPointer(memory.UnownedMemory(ptr, size, None, device_id=0), 0)

    launched = []

    class Launch:
        def __init__(self, config, variant, device_id, **args):
            self.name = config.name

        def __call__(self, a, b, c):
            launched.append((self.name, a, b, c))

    previous = cp.cuda.get_allocator()
    cp.cuda.set_allocator(memory_at)
    monkeypatch.setattr(cp.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(_cuda, "device", lambda device_id: _plan.Device())
    monkeypatch.setattr(_cuda, "Launch", Launch)
    monkeypatch.setattr(_gemm, "replays", {})
    monkeypatch.setattr(_plan.tuned, "_memo", {})
    try:
        yield memory_at, launched
    finally:
        cp.cuda.set_allocator(previous)


def test_small_products_replay_on_cupy_arrays(stand_in_device):
    """A small product's path on CuPy's own array objects: np.matmul and @ give new fastmm arrays, later calls
    replay the recorded launch on new pointers, and the dispatch layer's inline key is `_gemm.signature`'s."""
    import numpy as np

    import fastmm
    from fastmm._dispatch import products as _dispatch
    from fastmm._runtime import gemm as _gemm

    memory_at, launched = stand_in_device

    def array(shape, memptr=None):
        return fastmm.ndarray(shape, np.float32, memptr or memory_at(4 * int(np.prod(shape))))

    fa, fb = array((64, 64)), array((64, 64))
    results = [np.matmul(fa, fb), fa @ fb, np.matmul(fa, fb)]
    plain = _dispatch.matmul(fa.view(cp.ndarray), fb.view(cp.ndarray))
    assert [type(r) for r in results] == [fastmm.ndarray] * 3 and type(plain) is cp.ndarray
    assert all(r.base is None and r.shape == (64, 64) and r.flags.c_contiguous for r in results)
    assert len({r.data.ptr for r in results + [plain]}) == 4  # each result its own memory
    assert [(a, b, c) for _, a, b, c in launched] == [(fa.data.ptr, fb.data.ptr, r.data.ptr) for r in results + [plain]]
    assert len(_gemm.replays) == 1 and _gemm.signature(fa, fb, None, None, 0) in _gemm.replays

    out = array((64, 64))
    assert np.matmul(fa, fb, out=out) is out and np.matmul(fa, fb, out=out) is out
    assert _gemm.signature(fa, fb, out, None, 0) in _gemm.replays and launched[-1][3] == out.data.ptr
    assert _dispatch.matmul(fa, fb, kernel="smem") is not None
    assert _gemm.signature(fa, fb, None, "smem", 0) in _gemm.replays and launched[-1][0].startswith("smem")
    with fastmm.matmul_precision("medium"):
        np.matmul(fa, fb)
        assert _gemm.signature(fa, fb, None, None, 0) in _gemm.replays
    # 4 bytes off 16-byte alignment: another signature (the kernels load aligned operands 16 bytes at a time).
    shifted = array((64, 64), memory_at(4 * 64 * 64 + 16) + 4)
    np.matmul(shifted, fb)
    assert len(_gemm.replays) == 5 and _gemm.signature(shifted, fb, None, None, 0) in _gemm.replays


def test_a_replay_into_out_checks_overlap_with_the_operands(stand_in_device, monkeypatch):
    """A replay into `out` tests overlap from the spans kept with the signature: an `out` of the recorded strides that
    shares memory with A or B (in place, a row block into A, the last row of B) goes the full path, through a temporary; one just
    past them replays."""
    import numpy as np

    import fastmm
    from fastmm._runtime import gemm as _gemm

    memory_at, launched = stand_in_device
    through = []

    def via_temporary(a, b, c, kernel, record, runs=False):  # (as the real one: not replayed)
        through.append(c.data.ptr)
        if record is not None:
            record.append(None)

    monkeypatch.setattr(_gemm, "_via_temporary", via_temporary)
    buf = memory_at(4 * 64 * 64 * 4)

    def at(row):  # a 64 x 64 matrix `row` rows into one allocation of 256 rows
        return fastmm.ndarray((64, 64), np.float32, buf + 4 * 64 * row)

    a, b = at(0), at(64)
    assert np.matmul(a, b, out=at(128)) is not None and np.matmul(a, b, out=at(128)) is not None  # recorded, replayed
    assert len(launched) == 2 and not through
    for row, overlaps in ((0, True), (32, True), (100, True), (127, True), (128, False), (192, False)):
        out = at(row)
        np.matmul(a, b, out=out)
        if overlaps:
            assert through[-1] == out.data.ptr, row
        else:
            assert launched[-1][3] == out.data.ptr, row
    assert len(through) == 4 and len(launched) == 4 and len(_gemm.replays) == 1
