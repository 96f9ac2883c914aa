"""The command line as a user meets it first: --version, help without a command, one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fastmm
from conftest import nvcc_unavailable_reason


def _run(*args):
    return subprocess.run([sys.executable, "-m", "fastmm", *args], capture_output=True, text=True, timeout=120)


def test_version_flag():
    p = _run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"fastmm {fastmm.__version__}"


def test_no_command_prints_the_commands():
    p = _run()
    assert p.returncode == 2
    for command in ("info", "compile", "explain", "bench", "autotune"):
        assert command in p.stdout


def test_an_unknown_kernel_is_one_line_with_the_valid_names():
    p = _run("explain", "64", "64", "64", "--kernel", "foo")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line, = p.stderr.strip().splitlines()
    assert line.startswith("python -m fastmm explain: error: unknown kernel 'foo'; valid names: auto, naive")


def test_shapes_that_cannot_multiply_are_numpys_error_in_one_line():
    p = _run("explain", "0", "-1", "3")
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_completion_finds_the_lazily_loaded_names():
    assert {"asarray", "ndarray", "matmul", "einsum", "explain"} <= set(dir(fastmm))


def test_bench_plot_without_matplotlib_says_so_before_measuring(tmp_path):
    """`bench --plot` checks for matplotlib first (a bench run takes minutes), and names the extra that has it."""
    code = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['fastmm', 'bench', '--plot', 'x.png']; "
            "from fastmm.__main__ import main; sys.exit(main())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and "pip install 'fastmm[bench]'" in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "x.png").exists()


def test_counts_below_one_are_refused_in_one_line():
    for args in (["explain", "64", "64", "64", "--batch", "0"], ["compile", "--jobs", "0"]):
        p = _run(*args)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.splitlines()[-1].endswith("must be 1 or more, got 0"), p.stderr


def test_an_architecture_not_of_the_form_sm_xy_is_refused_before_nvcc_runs():
    p = _run("compile", "--arch", "sm_90a")
    assert p.returncode == 2 and not p.stdout, p.stdout
    assert "argument --arch: takes sm_ and the compute capability's digits" in p.stderr.splitlines()[-1]


@pytest.mark.skipif(nvcc_unavailable_reason() is not None, reason="needs nvcc")
def test_an_architecture_nvcc_does_not_know_is_said_once():
    p = _run("compile", "--arch", "sm_20", "--jobs", "2")
    assert p.returncode == 2 and "COMPILE ERROR" not in p.stderr, p.stderr
    line, = p.stderr.strip().splitlines()
    assert line.startswith("python -m fastmm compile: error: this nvcc (") and "does not compile for sm_20" in line
