"""What a user sees without a debugger: the `fastmm` logger (compiles, plans), $FASTMM_PRECISION, and the tools'
answer where no GPU can run them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from conftest import gpu_unavailable_reason, nvcc_unavailable_reason
from fastmm import _plan


def test_a_new_problem_signature_logs_its_plan_once(caplog):
    problem = _plan.Problem(1234, 567, 891)
    _plan.reload_tuned()  # no decision remembered
    with caplog.at_level(logging.DEBUG, logger="fastmm"):
        _plan.choose(problem, _plan.Device())
        _plan.choose(problem, _plan.Device())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan 1234x567x891")]
    assert len(lines) == 1 and "by rule" in lines[0], lines


@pytest.mark.skipif(nvcc_unavailable_reason() is not None, reason="needs nvcc")
def test_a_compile_logs_its_binary_and_time(caplog, tmp_path, monkeypatch):
    from fastmm.kernels import build
    from fastmm.kernels.configs import NAIVE

    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="fastmm"):
        build.compile_cubin(NAIVE, arch="sm_90")
    assert any(r.getMessage().startswith(f"compiled {NAIVE.name}") and " s (nvcc " in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("value,mode,warns", [("high", "high", False), ("MEDIUM", "medium", False),
                                              ("", "highest", False), ("hihg", "highest", True)])
def test_the_precision_mode_comes_from_the_environment(value, mode, warns):
    code = "import warnings, fastmm; print(fastmm.get_float32_matmul_precision())"
    p = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                       env={**os.environ, "FASTMM_PRECISION": value}, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == mode, p.stdout + p.stderr
    assert ("FASTMM_PRECISION='hihg' is not a float32 matmul precision" in p.stderr) == warns, p.stderr


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU: bench would run")
@pytest.mark.parametrize("args", [["bench"], ["autotune"], ["bench", "--dask"]])
def test_without_a_gpu_the_tools_say_why_and_what_works(args):
    p = subprocess.run([sys.executable, "-m", "fastmm", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"python -m fastmm {' '.join(args)} needs a CUDA GPU: " in p.stderr
    assert "Without a GPU: python -m fastmm info" in p.stderr


@pytest.mark.parametrize("args", [["bench"], ["autotune"]])
def test_without_cupy_the_tools_name_the_extra_that_brings_it(args, tmp_path):
    """README's test install has no CuPy: bench and autotune say what to install, not ModuleNotFoundError."""
    code = f"import sys; sys.modules['cupy'] = None; from fastmm.__main__ import main; sys.exit(main({args!r}))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "CuPy is not installed" in p.stderr and "pip install 'fastmm[cuda13]'" in p.stderr, p.stderr
    assert "Without a GPU: python -m fastmm info" in p.stderr


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU: the hook has work to do")
def test_the_numpy_hook_says_at_install_that_it_will_do_nothing_without_a_gpu():
    code = ("import warnings, numpy as np, fastmm\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    fastmm.accelerate_numpy()\n"
            "a = np.ones((300, 300), np.float32)\n"
            "assert (a @ a)[0, 0] == 300\n"
            "print([str(w.message) for w in seen])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "accelerate_numpy() is on, but no CUDA GPU can run fastmm's kernels here" in p.stdout
    assert "NumPy computes every product itself" in p.stdout


def test_fastmm_kernels_off_is_read_at_import_and_explained():
    """$FASTMM_KERNELS=off turns fastmm's kernels off for a quick comparison (CuPy's product runs instead), and
    `explain` says so; a value that is neither on nor off warns and leaves them on."""
    import os

    code = ("import warnings, fastmm; from fastmm import _plan; "
            "print(_plan.kernels_on()); print(fastmm.explain((64, 64), (64, 64)).splitlines()[-1])")
    for value, on in (("off", False), ("OFF ", False), ("on", True), ("", True), ("cublas", True)):
        env = dict(os.environ, FASTMM_KERNELS=value)
        p = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, env=env,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        first, last = p.stdout.splitlines()[:2]
        assert first == str(on), (value, p.stdout)
        assert ("$FASTMM_KERNELS=off" in last) == (not on), (value, last)
        assert ("neither 'on' nor 'off'" in p.stderr) == (value == "cublas"), (value, p.stderr)


class _NoDriver:
    """Stands in for ctypes.CDLL where libcuda.so.1 is absent, or present."""

    def __init__(self, present: bool):
        self.present = present

    def __call__(self, name, *args, **kwargs):
        if not self.present:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")


@pytest.mark.parametrize("libcuda,status,says", [
    (False, 35, "no NVIDIA driver is installed (libcuda.so.1 was not found): install the NVIDIA driver"),
    (True, 35, "the NVIDIA driver is older than the CUDA runtime CuPy was built for"),
    (True, 100, "the CUDA driver did not start"),
])
def test_why_no_gpu_names_the_missing_piece_and_what_to_install(monkeypatch, libcuda, status, says):
    """CuPy's runtime reports a missing driver as cudaErrorInsufficientDriver too: fastmm looks for the driver's
    library before it repeats that."""
    import ctypes

    cupy = pytest.importorskip("cupy", reason="CuPy's runtime errors are what fastmm explains")
    from fastmm._runtime.cuda import why_no_gpu

    def fails():
        raise cupy.cuda.runtime.CUDARuntimeError(status)

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", fails)
    monkeypatch.setattr(ctypes, "CDLL", _NoDriver(libcuda))
    assert why_no_gpu().startswith(says), why_no_gpu()


def test_why_no_gpu_without_cupy_names_the_extra(monkeypatch):
    from fastmm._runtime.cuda import why_no_gpu

    monkeypatch.setitem(sys.modules, "cupy", None)
    assert why_no_gpu().startswith("CuPy is not installed") and "pip install 'fastmm[cuda13]'" in why_no_gpu()


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU: asarray succeeds")
def test_asarray_without_a_gpu_says_why_in_fastmms_words():
    import numpy as np

    import fastmm
    from fastmm._runtime.cuda import why_no_gpu

    pytest.importorskip("cupy", reason="without CuPy, asarray's ImportError names the extra")
    with pytest.raises(fastmm.CUDAUnavailableError) as e:
        fastmm.asarray(np.ones((2, 2)))
    assert str(e.value) == f"fastmm needs a CUDA GPU and could not use one: {why_no_gpu()}"


def test_info_says_why_there_is_no_gpu_in_short_lines():
    p = subprocess.run([sys.executable, "-m", "fastmm", "info"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    gpu, = [line for line in p.stdout.splitlines() if line.startswith("gpu ")]
    if gpu_unavailable_reason() is not None:
        assert gpu.startswith("gpu         none: ") and len(gpu) > len("gpu         none: ") + 10, gpu
    assert max(map(len, p.stdout.splitlines())) <= 200, p.stdout
