"""bench --numpy-hook's table on the CPU: every dtype's row is measured and checked, with a stand-in GPU (a NumPy
product in the widest dtype) in place of fastmm's."""

from __future__ import annotations

import numpy as np
import pytest

import fastmm
from fastmm._hooks import numpy_hook as hook
from fastmm._tools import hook_measure


def _stand_in(a, b, c):
    wide = np.complex128 if np.iscomplexobj(c) else np.float64
    c[...] = np.matmul(np.asarray(a, wide), np.asarray(b, wide))


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(hook._state, "product", _stand_in)
    yield
    fastmm.restore_numpy()


def test_every_dtype_of_the_table_gets_a_checked_row(gpu):
    dtypes = {row[5] if len(row) > 5 else "float32" for row in hook_measure.BENCH_SHAPES}
    assert dtypes == {"float32", "float64", "complex64", "complex128"}
    shapes = [("64^3", 1, 64, 64, 64), ("2 x 48x40x24 batched", 2, 48, 40, 24), ("64^3 float64", 1, 64, 64, 64,
              "float64"), ("64^3 complex64", 1, 64, 64, 64, "complex64"), ("64^3 complex128", 1, 64, 64, 64,
              "complex128")]
    before = {d: s["on_gpu"] for d, s in fastmm.numpy_hook_status()["by_dtype"].items() if d != "other dtypes"}
    rows = hook_measure.bench_rows(hook.HostModel(), shapes=shapes, repeats=1)
    after = fastmm.numpy_hook_status()["by_dtype"]
    assert all(after[d]["on_gpu"] > before[d] for d in dtypes), (before, after)  # each row's GPU path ran on the GPU
    assert [r["dtype"] for r in rows] == ["float32", "float32", "float64", "complex64", "complex128"]
    for r in rows:
        assert max(r["err_numpy"], r["err_hook"], r["err_gpu"]) < 1e-5, r
    # Real FLOPs: a complex multiply-add is four real ones.
    assert rows[3]["gflop"] == pytest.approx(4 * rows[0]["gflop"])
    assert not any(r["offloaded"] for r in rows)  # the defaults: 64^3 is too small for the GPU
    assert hook.dtype_models(hook.HostModel(gpu=1e18, link=1e18, overhead=0.0), None)["complex64"].offloads(
        1, 64, 64, 64)
