"""The NumPy programs of `bench --numpy-hook --programs`, on the CPU: each runs, plain NumPy, with a stable result;
the hook's loop measures their share of time in products; the report's arithmetic. Their speed under the hook is
measured by the bench on a GPU machine (docs/numpy-hook.md)."""

from __future__ import annotations

import argparse
import inspect
import math

import numpy as np
import pytest

from fastmm._tools import programs

TINY = 0.03


@pytest.mark.parametrize("name", list(programs.PROGRAMS))
def test_each_program_is_plain_numpy_with_a_stable_result(name):
    program = programs.PROGRAMS[name]
    source = inspect.getsource(program.run)
    assert "import" not in source and "fastmm" not in source  # NumPy code as it is: the hook alone changes anything
    assert program.what
    first, second = program.run(TINY), program.run(TINY)
    assert math.isfinite(first) and first == second


def test_the_hooks_loop_measures_the_share_of_time_in_products():
    """With a model that sends nothing to the GPU, the hook's loop times NumPy's own float32 products."""
    pytest.importorskip("cupy", reason="the hook's status needs fastmm's array module, which needs CuPy")
    row = programs._child("softmax_regression", "share", 0.1)
    assert row["on_gpu"] == 0 and row["kept_on_cpu"]["below_threshold"] > 0
    assert 0 < row["product_seconds"]["kept_on_cpu"] < row["seconds"]
    plain = programs._child("softmax_regression", "numpy", 0.1)
    assert plain["checksum"] == row["checksum"]  # the loop computes NumPy's own products: bit for bit


def test_the_report_arithmetic():
    numpy_row = {"program": "p", "seconds": 10.0, "checksum": 1.0}
    share_row = {"seconds": 10.5, "product_seconds": {"kept_on_cpu": 8.4}}
    hook_row = {"seconds": 4.0, "checksum": 1.0000001, "on_gpu": 30, "kept_on_cpu": {"below_threshold": 5},
                "product_seconds": {"on_gpu": 1.5, "kept_on_cpu": 0.5, "deciding_then_declining": 0.0}}
    r = programs.summarize(numpy_row, share_row, hook_row)
    assert r["share"] == pytest.approx(0.8) and r["bound"] == pytest.approx(5.0)
    assert r["speedup"] == pytest.approx(2.5) and r["of_bound"] == pytest.approx(0.5)
    assert r["hook_rest_s"] == pytest.approx(2.0) and r["agree"]
    assert programs.amdahl_bound(1.0) == math.inf
    assert not programs.summarize(numpy_row, share_row, {**hook_row, "checksum": 1.01})["agree"]


def test_an_unknown_program_is_named_with_the_valid_ones(capsys):
    args = argparse.Namespace(programs_only="softmax_regression,nope", programs_scale=TINY, json=None)
    assert programs.main(args) == 2
    err = capsys.readouterr().err
    assert "unknown program(s) ['nope']; valid: softmax_regression, subspace_iteration" in err
    with pytest.raises(ValueError, match="valid: numpy, share, hook"):
        programs.measure("block_cg", "fast", TINY)


def test_float64_products_are_timed_too():
    """The float64 loop times a float64 program's products as the float32 one does."""
    pytest.importorskip("cupy", reason="the hook's status needs fastmm's array module, which needs CuPy")
    row = programs._child("covariance_float64", "share", 0.1)
    assert row["product_seconds"]["kept_on_cpu"] > 0 and row["on_gpu"] == 0
    assert row["checksum"] == programs._child("covariance_float64", "numpy", 0.1)["checksum"]  # NumPy's own loop
    assert np.isfinite(row["checksum"])


def test_repeated_runs_count_each_modes_median(monkeypatch):
    """With --programs-repeat the modes take turns, and each mode's median run makes the line."""
    order, times = [], {"numpy": iter([3.0, 1.0, 2.0]), "share": iter([2.0, 2.0, 2.0]), "hook": iter([1.5, 0.5, 9.0])}

    def child(name, mode, scale):
        order.append(mode)
        row = {"program": name, "mode": mode, "seconds": next(times[mode]), "checksum": 1.0,
               "product_seconds": {"on_gpu": 0.0, "kept_on_cpu": 0.5, "deciding_then_declining": 0.0},
               "on_gpu": 0, "kept_on_cpu": {"host_faster": 1}}
        return row

    monkeypatch.setattr(programs, "_child", child)
    (row,) = programs.run(["block_cg"], TINY, repeat=3)
    assert order == list(programs.MODES) * 3
    assert row["numpy_s"] == 2.0 and row["hook_s"] == 1.5 and row["runs"] == 3
    assert programs.median_run([{"seconds": 2.0}, {"seconds": 1.0}]) == {"seconds": 1.0}
    args = argparse.Namespace(programs_only="", programs_scale=TINY, programs_repeat=0, json=None)
    assert programs.main(args) == 2
