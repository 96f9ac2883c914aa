"""The random-shape sweep (bench --sweep) without a GPU: what it draws, how it lays operands out, how it reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastmm._tools import sweep


def test_the_same_seed_draws_the_same_problems_and_another_seed_others():
    assert sweep.draw(200, 0) == sweep.draw(200, 0)
    assert sweep.draw(200, 0) != sweep.draw(200, 1)


def test_the_draw_covers_sizes_batches_and_every_layout():
    problems = sweep.draw(600, 3)
    sides = [x for p in problems for x in (p.m, p.n, p.k)]
    assert min(sides) >= 1 and max(sides) <= sweep.LONG_SIDE
    assert any(x == 1 for x in sides) and any(x > sweep.MAX_SIDE for x in sides)
    assert sum(x <= 64 for x in sides) > 100 and sum(x >= 4096 for x in sides) > 100  # log-uniform, both ends
    assert {p.layout for p in problems} == set(sweep.LAYOUTS)
    assert any(p.batch > 1 for p in problems) and sum(p.batch == 1 for p in problems) > 400
    assert all(p.nbytes <= sweep.MAX_BYTES for p in problems)


@pytest.mark.parametrize("layout", sweep.LAYOUTS)
@pytest.mark.parametrize("batch", [1, 3])
def test_operands_have_the_layout_named(layout, batch):
    problem = sweep.SweepProblem(5, 7, 9, batch, layout)
    a, b = problem.make(np.random.default_rng(0), np)
    assert a.shape == ((batch,) if batch > 1 else ()) + (5, 9) and a.dtype == np.float32
    assert b.shape == ((batch,) if batch > 1 else ()) + (9, 7)
    if layout in ("a_t", "fortran"):
        assert a.strides[-2] == 4  # unit stride along the rows
    if layout in ("b_t", "fortran"):
        assert b.strides[-2] == 4
    if layout == "strided":
        assert a.strides[-2] == 4 * (9 + 3) and b.strides[-2] == 4 * (7 + 3)
    if layout == "offset":
        assert a.__array_interface__["data"][0] % 8 == 4  # one float past an aligned start (NumPy aligns to 16)
    if layout == "c":
        assert a.flags.c_contiguous and b.flags.c_contiguous
    assert np.all((a >= -1) & (a < 1))


def test_the_summary_reads_the_distribution_and_the_worst():
    timed = {"seconds": {"fastmm": 40e-6, "cublas": 20e-6}, "host_seconds": {"fastmm": 39e-6, "cublas": 12e-6}}
    rows = [{"label": f"p{i}", "speed": s, "error_ratio": e, "rule": rule, "kernel": "k", **timed}
            for i, (s, e, rule) in enumerate([(0.5, 1.0, "split-k"), (1.0, 0.5, "tiled"), (2.0, 2.0, "tiled"),
                                              (1.0, math.inf, "tiled")])]
    summary = sweep.summarize(rows, worst=2)
    assert summary["problems"] == 4
    assert summary["speed"]["geomean"] == pytest.approx(1.0) and summary["speed"]["median"] == pytest.approx(1.0)
    assert summary["speed"]["below_0.9"] == 1 and summary["error_ratio"]["above_1.5"] == 1
    assert [r["label"] for r in summary["worst"]] == ["p0", "p1"]
    assert [r["label"] for r in summary["least_accurate"]] == ["p2"]
    assert list(summary["rules"]) == ["split-k", "tiled"]  # the rule with the most problems below 0.9x first
    assert summary["rules"]["tiled"] == {"problems": 3, "geomean": pytest.approx(2 ** (1 / 3)), "slowest": 1.0,
                                         "below_0.9": 0, "worst_error_ratio": 2.0}
    assert summary["error_ratio"]["above_1.1"] == 1 and math.isnan(summary["error_ratio"]["p99_past_rounding"])
    text = sweep.format_summary(summary, seed=7)
    assert "sweep of 4 problems (seed 7)" in text and "geomean 1.000" in text and "p0" in text
    assert "the 1 least accurate against cuBLAS" in text and "by rule:" in text
    assert "40(39)/20(12)" in text  # per call and, in brackets, on the host: this one waits on its host code


def test_the_plan_of_a_problem_names_its_rule_and_kernel():
    a, b = sweep.SweepProblem(4096, 16, 4096).make(np.random.default_rng(0), np)
    rule, kernel = sweep._plan_of(a, b)
    assert rule == "few-columns" and kernel.startswith("fewcol_n16")


def test_errors_within_two_roundings_of_the_exact_product_count_as_equal():
    """Both errors at the correctly rounded product's level: a ratio of 1 past rounding, whatever their own ratio;
    an error past that floor keeps its ratio to cuBLAS's (or to the floor, where cuBLAS's is under it)."""
    floor = sweep.ROUNDINGS * 3e-8
    cases = [(5.5e-8, 3.0e-8, 1.0), (1.2e-6, 8e-7, 1.5), (1.8e-7, 2.9e-8, 1.8e-7 / floor)]
    rows = []
    for i, (ours, theirs, want) in enumerate(cases):
        past = sweep._ratio(*(max(x, floor) for x in (ours, theirs)))
        assert past == pytest.approx(want)
        rows.append({"label": f"p{i}", "speed": 1.0, "error_ratio": ours / theirs, "error_ratio_past_rounding": past,
                     "rule": "tiled", "kernel": "k", "seconds": {"fastmm": 1e-5, "cublas": 1e-5}})
    summary = sweep.summarize(rows)["error_ratio"]
    assert summary["above_1.1"] == 3 and summary["above_1.1_past_rounding"] == 2
    assert "past rounding" in sweep.format_summary(sweep.summarize(rows), seed=1)


def test_errors_of_a_small_output_are_pooled_over_several_draws():
    """Over a handful of outputs one draw's error ratio is a sample of a few roundings: below SMALL_OUTPUT elements
    of C (the batch's) each side's error is the RMS over draws that cover as many (at most MAX_DRAWS), and the
    summary says so."""
    assert sweep.error_draws(sweep.SweepProblem(4, 1, 10886, 1, "a_t")) == sweep.MAX_DRAWS == 64
    assert sweep.error_draws(sweep.SweepProblem(63, 64, 9000, 1, "c")) == 2
    assert sweep.error_draws(sweep.SweepProblem(10, 10, 9000, 4, "c")) == 11
    assert sweep.error_draws(sweep.SweepProblem(64, 64, 9000, 1, "c")) == 1
    assert sweep.error_draws(sweep.SweepProblem(16, 16, 9000, 16, "c")) == 1
    rows = [{"label": "p", "speed": 1.0, "error_ratio": 1.0, "error_ratio_past_rounding": 1.0, "rule": "tiled",
             "kernel": "k", "seconds": {"fastmm": 1e-5, "cublas": 1e-5}}]
    assert "each side's RMS over draws" in sweep.format_summary(sweep.summarize(rows), seed=1)
