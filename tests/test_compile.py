"""Every kernel binary compiles for sm_90 without spills or shared-memory overuse (needs nvcc, not a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastmm.__main__ import _all_binaries
from fastmm.kernels import build


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every binary compiled once per test run, by `python -m fastmm compile` (in parallel, one nvcc per core) into a
    cache of this run's own; the tests below read their binary from it, and check the command's report."""
    cache = tmp_path_factory.mktemp("kernel-cache")
    env = {**os.environ, "FASTMM_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-m", "fastmm", "compile", "--arch", "sm_90"], capture_output=True,
                         text=True, env=env)
    return cache, run


@pytest.mark.nvcc
@pytest.mark.parametrize("config,variant", _all_binaries(), ids=lambda x: getattr(x, "name", None) or x.suffix)
def test_binary_compiles_without_spills(config, variant, compiled, monkeypatch):
    cache, _ = compiled
    monkeypatch.setenv("FASTMM_CACHE_DIR", str(cache))
    path = build.cache_path(config, variant, "sm_90")
    r = build.compile_cubin(config, variant, "sm_90")  # compiled by the fixture, or here (with nvcc's log) if not
    assert path.is_file(), f"{path} was not written"
    assert r.cubin[:4] == b"\x7fELF"
    assert r.registers > 0
    assert r.spill_stores == 0 and r.spill_loads == 0, r.log
    assert r.stack_bytes == 0, r.log
    # ptxas makes every wgmma wait for the one before when an accumulator is read while products may be in flight.
    assert "wgmma.mma_async instructions are serialized" not in r.log, r.log
    assert r.arch == "sm_90" + config.arch_suffix
    if config.dynamic_smem:
        # Sized at launch (ptxas sees none): the configuration's stages must fit Hopper's opt-in limit, and
        # as many blocks as its occupancy plan (min_blocks) must fit one SM's 228 KiB.
        assert r.smem_bytes == 0, r.log
        assert config.smem_bytes <= 227 * 1024
        assert getattr(config, "min_blocks", 1) * (config.smem_bytes + 1024) <= 228 * 1024
    else:
        assert r.smem_bytes == config.smem_bytes, r.log
        assert r.smem_bytes <= 48 * 1024
    assert r.registers * config.threads * getattr(config, "min_blocks", 1) <= 65536
    # The cache gives back what nvcc built, unchanged.
    again = build.compile_cubin(config, variant, "sm_90")
    assert again.cubin == r.cubin and again.registers == r.registers


@pytest.mark.nvcc
def test_compile_errors_carry_nvcc_log(tmp_path, monkeypatch):
    from fastmm.kernels.configs import Naive

    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "source_for", lambda c, v: "this is not CUDA;")
    with pytest.raises(build.CompileError, match="(?s)nvcc failed to compile naive_32x8 for sm_90.*error: expected a declaration"):
        build.compile_cubin(Naive(), arch="sm_90")


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(build.os.path, "isfile", lambda p: False)
    with pytest.raises(build.NvccNotFoundError, match="install a CUDA toolkit"):
        build.find_nvcc()


@pytest.mark.nvcc
def test_compile_command_reports_every_binary(compiled):
    _, p = compiled
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{len(_all_binaries())} binaries: 0 failed to compile, 0 spill registers" in p.stdout


def test_launch_arguments_match_the_kernels_parameter_list():
    """The bytes a launch packs follow FASTMM_GEMM_PARAMS (common.cuh), and packing the three pointers between
    runs packed once (what every launch does) gives the same bytes as packing every argument."""
    import re
    from pathlib import Path

    from fastmm._runtime import cuda as _cuda

    text = (Path(build.__file__).parent / "common.cuh").read_text()
    params = re.search(r"#define FASTMM_GEMM_PARAMS(.*?)\n\n", text, re.S).group(1)
    kinds = {"int": "i", "long long": "q", "float*": "P"}
    fmt = "".join(kinds[re.sub(r"^const |__restrict__|\s+$", "", p.strip().rsplit(" ", 1)[0]).strip()]
                  for p in params.replace("\\", "").split(","))
    assert fmt == _cuda._ARG_FORMAT
    values = list(range(1, len(fmt) + 1))
    pointers = [i for i, ch in enumerate(fmt) if ch == "P"]
    for i, ptr in zip(pointers, (0x7F0000000010, 0x7F0000100020, 0x7F0000200030)):
        values[i] = ptr
    whole = _cuda._ARGS.pack(*values)
    runs = _cuda._ARGS_SPLIT.unpack(_cuda._ARGS.pack(*[0 if i in pointers else v for i, v in enumerate(values)]))
    assert _cuda._pack(runs[0], values[pointers[0]], runs[2], values[pointers[1]], runs[4], values[pointers[2]],
                       runs[6]) == whole
    # What a launch hands cuLaunchKernel: the packed parameters in the thread's buffer, through `extra`.
    import ctypes

    args = _cuda._arg_buffer()
    _cuda._pack_into(args.data, 0, runs[0], values[pointers[0]], runs[2], values[pointers[1]], runs[4],
                     values[pointers[2]], runs[6])
    assert args.data.raw == whole
    extra = list(args.extra)
    assert extra[0::2] == [1, 2, None]  # CU_LAUNCH_PARAM_BUFFER_POINTER, _BUFFER_SIZE, CU_LAUNCH_PARAM_END
    assert extra[1] == ctypes.addressof(args.data) and ctypes.c_size_t.from_address(extra[3]).value == len(whole)
    assert args.address == ctypes.addressof(args.extra)
    # One buffer per thread: the driver call runs without the GIL, while another thread may be packing.
    import threading

    other = []
    t = threading.Thread(target=lambda: other.append(_cuda._arg_buffer()))
    t.start()
    t.join()
    assert other[0] is not args and _cuda._arg_buffer() is args


def test_slice_sum_grid_and_kernel_agree_on_slice_groups():
    """SliceSum.grid sizes blocks by pass_slice_sum.cu's slice_groups: the two must be the same rule."""
    import re

    from fastmm.kernels import configs

    source = build._read_source("pass_slice_sum.cu")
    loop = re.search(r"while \(g < (\d+) && (\d+) \* g <= slices\) g \*= 2;", source)
    assert loop, "pass_slice_sum.cu's slice_groups changed: update SliceSum.slice_groups to match"
    most, per = map(int, loop.groups())
    for slices in range(1, 2000):
        g = 1
        while g < most and per * g <= slices:
            g *= 2
        assert configs.SliceSum.slice_groups(slices) == g
