"""The kernel cache cannot poison a process: damaged entries are recompiled and replaced, an unwritable or
full cache directory only costs recompiles (said once), and concurrent cold starts agree.

These need nvcc but no GPU. The GPU half (a damaged entry in a real process that loads the kernel, an entry
the driver refuses) is in test_gpu_runtime.py.
"""

from __future__ import annotations

import errno
import hashlib
import subprocess
import sys
import warnings

import pytest

from fastmm import _errors
from fastmm.kernels import build
from fastmm.kernels.configs import Naive, Variant


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_errors, "_warned", set())  # each test sees its own once-per-process warnings
    return tmp_path


@pytest.fixture(scope="module")
def naive_cubin():
    """A real cubin and its ptxas log, compiled once for the module (no cache)."""
    return build.compile_cubin(Naive(), Variant(), "sm_90", use_cache=False)


def entry_of(cache):
    entries = sorted((cache / "kernels").glob("*.entry"))
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.nvcc
def test_entry_round_trip(cache):
    first = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert not first.cached and build.is_cubin(first.cubin)
    path = entry_of(cache)
    assert path == build.cache_path(Naive(), Variant(), "sm_90")
    again = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert again.cached and again.cubin == first.cubin and again.registers == first.registers
    assert not list((cache / "kernels").glob("*.tmp")), "a temporary file was left behind"


def _truncate_to(n):
    return lambda data: data[:n]


DAMAGE = {
    "empty": _truncate_to(0),
    "truncated to the header": _truncate_to(100),
    "truncated by half": lambda data: data[:len(data) // 2],
    "last byte missing": lambda data: data[:-1],
    "garbage": lambda data: hashlib.sha512(data).digest() * (len(data) // 64),
    "one bit flipped in the cubin": lambda data: data[:-200] + bytes([data[-200] ^ 1]) + data[-199:],
    "one bit flipped in the digest": lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:],
    "trailing bytes": lambda data: data + b"\0" * 16,
}


@pytest.mark.nvcc
@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_entry_is_recompiled_and_replaced(cache, damage):
    good = build.compile_cubin(Naive(), Variant(), "sm_90")
    path = entry_of(cache)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a repaired entry is not worth a warning
        r = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert not r.cached, "a damaged entry was returned from the cache"
    assert build.is_cubin(r.cubin) and r.registers == good.registers
    repaired = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert repaired.cached and repaired.cubin == r.cubin


@pytest.mark.nvcc
def test_valid_cubin_with_a_matching_digest_is_trusted_and_refresh_replaces_it(cache, naive_cubin):
    # What the runtime relies on: an entry that passes every check is returned as it is (the driver then
    # decides), and refresh=True compiles again and replaces it.
    build.compile_cubin(Naive(), Variant(), "sm_90")
    path = entry_of(cache)
    other = build.compile_cubin(Naive(), Variant(), "sm_80", use_cache=False).cubin
    build._write_entry(path, "foreign", other)
    r = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert r.cached and r.cubin == other
    fresh = build.compile_cubin(Naive(), Variant(), "sm_90", refresh=True)
    assert not fresh.cached and build.is_cubin(fresh.cubin) and fresh.cubin != other
    assert build._read_entry(path)[1] == fresh.cubin


@pytest.mark.nvcc
def test_is_cubin_rejects_every_truncation(naive_cubin):
    data = naive_cubin.cubin
    assert build.is_cubin(data)
    for n in [0, 4, 63, 64, 65, *range(100, len(data), max(1, len(data) // 97)), len(data) - 1]:
        assert not build.is_cubin(data[:n]), n
    assert not build.is_cubin(b"\x7fELF" + bytes(len(data) - 4))


@pytest.mark.nvcc
def test_unwritable_cache_dir_only_costs_recompiles(tmp_path, monkeypatch, naive_cubin):
    # A path below a regular file can be neither created nor written, for root too (unlike a chmod).
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("FASTMM_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(_errors, "_warned", set())
    with pytest.warns(_errors.PerformanceWarning, match="could not write its kernel cache .*FASTMM_CACHE_DIR"):
        r = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert build.is_cubin(r.cubin) and r.registers == naive_cubin.registers and not r.cached
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not on every compile
        again = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert build.is_cubin(again.cubin) and not again.cached


@pytest.mark.nvcc
def test_full_disk_leaves_no_partial_entry(cache, monkeypatch, naive_cubin):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build.os, "replace", full)
    with pytest.warns(_errors.PerformanceWarning, match="No space left on device"):
        r = build.compile_cubin(Naive(), Variant(), "sm_90")
    assert build.is_cubin(r.cubin) and r.registers == naive_cubin.registers
    assert list((cache / "kernels").iterdir()) == [], "a partial entry or temporary file was left behind"


@pytest.mark.nvcc
def test_concurrent_cold_starts_agree(cache):
    code = ("import hashlib; from fastmm.kernels import build; from fastmm.kernels.configs import Naive, Variant; "
            "r = build.compile_cubin(Naive(), Variant(), 'sm_90'); print(hashlib.sha256(r.cubin).hexdigest())")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all(err == "" for _, err in outs), outs
    # nvcc embeds its temporary directory in the cubin, so the processes' cubins differ; the entry is one of them.
    digests = {out.strip() for out, _ in outs}
    log, cubin = build._read_entry(entry_of(cache))
    assert hashlib.sha256(cubin).hexdigest() in digests
    assert not list((cache / "kernels").glob("*.tmp"))


# The runtime's recompile decision (fastmm/_runtime/cuda.py), with the compile and the driver load replaced: no GPU.

@pytest.fixture
def runtime(monkeypatch):
    from fastmm import _plan
    from fastmm._runtime import cuda as _cuda

    monkeypatch.setattr(_cuda, "_functions", {})
    monkeypatch.setattr(_cuda, "device", lambda device_id: _plan.Device())
    compiles = []

    def compile_cubin(config, variant, arch, *, refresh=False):
        compiles.append(refresh)
        return build.Compiled(config.binary_name(variant), arch, b"cubin", 32, 0, 0, 0, 0, "", cached=not refresh)

    monkeypatch.setattr(build, "compile_cubin", compile_cubin)
    return _cuda, compiles


def _refusing(times):
    from fastmm._runtime import cuda as _cuda

    left = [times]

    def load(config, dev, device_id, compiled):
        if left[0]:
            left[0] -= 1
            raise _cuda._NotLoaded(RuntimeError("cuModuleLoadDataEx failed: device kernel image is invalid"))
        return ("function", compiled.cached)

    return load


def test_refused_cached_kernel_is_recompiled_once(runtime, monkeypatch):
    _cuda, compiles = runtime
    monkeypatch.setattr(_cuda, "_load", _refusing(1))
    assert _cuda.loaded_function(Naive(), Variant(), 0) == ("function", False)
    assert compiles == [False, True]
    assert _cuda.loaded_function(Naive(), Variant(), 0) == ("function", False)  # once per process
    assert compiles == [False, True]


def test_kernel_refused_even_freshly_compiled_is_a_clear_error(runtime, monkeypatch):
    _cuda, compiles = runtime
    monkeypatch.setattr(_cuda, "_load", _refusing(2))
    with pytest.raises(_errors.KernelLoadError, match="would not load .* even freshly compiled .*update the driver"):
        _cuda.loaded_function(Naive(), Variant(), 0)
    assert compiles == [False, True]
    # Nothing was kept: the next call tries again (and here succeeds).
    assert _cuda.loaded_function(Naive(), Variant(), 0) == ("function", True)
