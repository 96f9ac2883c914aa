"""The compile thread: the hooks never wait for nvcc (fastmm/_runtime/compiling.py). Real nvcc, no GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

from fastmm import _errors
from fastmm._runtime import compiling
from fastmm.kernels import build
from fastmm.kernels.configs import Naive, Smem, Variant


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_errors, "_warned", set())
    assert compiling.wait(300)
    monkeypatch.setattr(compiling, "_ready", {})
    return tmp_path


@pytest.mark.nvcc
def test_outside_the_hooks_a_binary_is_compiled_in_the_call(cache):
    got = compiling.binary(Naive(), Variant(), "sm_90")
    assert build.is_cubin(got.cubin) and not got.cached
    assert compiling.status()["pending"] == 0


@pytest.mark.nvcc
def test_inside_a_missing_binary_is_compiled_on_the_thread_and_found_next_time(cache):
    before, generation = compiling.status()["compiled"], compiling.finished()
    with compiling.in_background():
        with pytest.raises(compiling.KernelCompiling, match="compiling naive"):
            compiling.binary(Naive(), Variant(), "sm_90")
        with pytest.raises(compiling.KernelCompiling):  # asked again meanwhile: one compile, not two
            compiling.binary(Naive(), Variant(), "sm_90")
        assert compiling.wait(300)
        got = compiling.binary(Naive(), Variant(), "sm_90")
        assert build.is_cubin(got.cubin)
        again = compiling.binary(Naive(), Variant(), "sm_90")  # from the disk cache now
        assert again.cached and again.cubin == build.cached_cubin(Naive(), Variant(), "sm_90").cubin
    assert compiling.status()["compiled"] == before + 1
    assert compiling.finished() != generation  # (the NumPy hook's cue to try the products that waited for it)


@pytest.mark.nvcc
def test_an_unwritable_cache_still_hands_the_compiled_binary_over(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("FASTMM_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(_errors, "_warned", set())
    assert compiling.wait(300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _errors.PerformanceWarning)  # the cache's own warning, tested elsewhere
        with compiling.in_background():
            with pytest.raises(compiling.KernelCompiling):
                compiling.binary(Smem(), Variant(), "sm_90")
            assert compiling.wait(300)
            got = compiling.binary(Smem(), Variant(), "sm_90")
    assert build.is_cubin(got.cubin) and not got.cached


def test_a_failed_compile_is_raised_on_every_later_call_without_compiling_again(cache, monkeypatch):
    calls = []

    def failing(config, variant, arch, **kw):
        calls.append(config.binary_name(variant))
        raise build.CompileError(f"nvcc failed to compile {config.binary_name(variant)} (exit 1)")

    monkeypatch.setattr(build, "compile_cubin", failing)
    monkeypatch.setattr(build, "cached_cubin", lambda *a: None)
    with compiling.in_background():
        with pytest.raises(compiling.KernelCompiling):
            compiling.binary(Naive(), Variant(), "sm_90")
        assert compiling.wait(60)
        for _ in range(3):  # reported as the failure it is each time (as a compile in the call would be), once run
            with pytest.raises(build.CompileError, match="nvcc failed"):
                compiling.binary(Naive(), Variant(), "sm_90")
    assert len(calls) == 1


def test_without_a_thread_to_be_had_the_call_compiles(cache, monkeypatch):
    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(compiling, "_thread", None)
    monkeypatch.setattr(threading.Thread, "start", refused)
    monkeypatch.setattr(build, "compile_cubin", lambda *a, **kw: "compiled in the call")
    monkeypatch.setattr(build, "cached_cubin", lambda *a: None)
    with compiling.in_background():
        assert compiling.binary(Naive(), Variant(), "sm_90") == "compiled in the call"
    assert compiling.status()["pending"] == 0 and compiling._thread is None


def test_threads_that_need_the_same_binary_run_one_nvcc(cache, monkeypatch):
    calls, gate = [], threading.Event()
    real = build.compile_cubin

    def slow(config, variant, arch, **kw):
        calls.append(threading.current_thread().name)
        gate.wait(30)
        return real(config, variant, arch, **kw)

    monkeypatch.setattr(build, "compile_cubin", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(compiling.binary(Naive(), Variant(), "sm_90")))
               for _ in range(3)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(120)
    # One thread compiled; the others waited for it and read the cache (their own call, which finds the entry).
    assert len(got) == 3 and all(build.is_cubin(g.cubin) for g in got)
    assert sum(not g.cached for g in got) == 1


def test_nothing_is_compiled_ahead_where_the_cache_cannot_keep_it(cache, monkeypatch):
    from fastmm import _plan

    monkeypatch.setattr(build, "_unwritable", {build.cache_dir()})
    assert compiling.compile_ahead(_plan.Device()) == 0


def test_the_switch_belongs_to_the_thread_that_set_it(cache, monkeypatch):
    monkeypatch.setattr(build, "compile_cubin", lambda *a, **kw: "compiled in the call")
    got = []
    with compiling.in_background():
        other = threading.Thread(target=lambda: got.append(compiling.binary(Naive(), Variant(), "sm_90")))
        other.start()
        other.join()
    assert got == ["compiled in the call"]


@pytest.mark.nvcc
def test_a_process_that_ends_during_a_compile_leaves_a_whole_entry_and_no_temporary_files(tmp_path):
    """The exit waits for the compile in progress (nvcc's temporary directory removed, the entry written whole) and
    drops those not started. In a child process: it is the interpreter's exit that is tested."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = textwrap.dedent("""
        import time
        from fastmm._runtime import compiling
        from fastmm.kernels.configs import Naive, Smem, Variant
        with compiling.in_background():
            for config in (Naive(), Smem()):
                try:
                    compiling.binary(config, Variant(), "sm_90")
                except compiling.KernelCompiling:
                    pass
        while compiling._current is None:  # nvcc has started on the first
            time.sleep(0.001)
        print("asked")
    """)
    env = {**__import__("os").environ, "FASTMM_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "asked", proc.stderr
    assert not list(tmp.iterdir()), "nvcc's temporary files were left behind"
    entries = list((tmp_path / "cache" / "kernels").glob("*.entry"))
    assert len(entries) == 1 and all(build._read_entry(e) is not None for e in entries)


def test_binaries_compiled_ahead_wait_behind_those_products_ask_for(cache, monkeypatch):
    from fastmm import _plan

    order, gate = [], threading.Event()

    def compile_cubin(config, variant, arch, **kw):
        gate.wait(60)  # the first compile holds the thread until everything is queued
        order.append(config.binary_name(variant))
        return build.Compiled(config.binary_name(variant), arch, b"", 0, 0, 0, 0, 0, "")

    monkeypatch.setattr(build, "compile_cubin", compile_cubin)
    monkeypatch.setattr(build, "cached_cubin", lambda *a: None)
    queued = compiling.compile_ahead(_plan.Device())
    names = {_plan.choose(_plan.Problem(m, n, k, a_t=a_t, b_t=b_t)).config.binary_name(
        _plan.Problem(m, n, k, a_t=a_t, b_t=b_t).variant_for(_plan.choose(_plan.Problem(m, n, k, a_t=a_t, b_t=b_t)).config))
        for m, n, k, a_t, b_t in compiling.AHEAD}
    assert queued == len(names) >= 5 and compiling.compile_ahead(_plan.Device()) == 0  # queued once
    with compiling.in_background():
        for config in (Smem(), Naive()):
            with pytest.raises(compiling.KernelCompiling):
                compiling.binary(config, Variant(), "sm_90")
    gate.set()
    assert compiling.wait(60)
    # The thread may have taken one binary ahead before the products asked; theirs came next, in their order.
    asked = [Smem().binary_name(Variant()), Naive().binary_name(Variant())]
    start = order.index(asked[0])
    assert start <= 1 and order[start:start + 2] == asked, order
    assert set(order) == names | {Smem().binary_name(Variant()), Naive().binary_name(Variant())}


def test_fastmm_hook_compile_wait_makes_the_hooks_wait(cache, monkeypatch):
    monkeypatch.setattr(build, "compile_cubin", lambda *a, **kw: "compiled in the call")
    monkeypatch.setenv("FASTMM_HOOK_COMPILE", "wait")
    with compiling.in_background():
        assert compiling.binary(Naive(), Variant(), "sm_90") == "compiled in the call"



@pytest.mark.nvcc
def test_ctrl_c_interrupts_the_program_not_a_compile_on_the_thread(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal or a notebook sends it) while nvcc builds a kernel on
    fastmm's thread: the program gets its KeyboardInterrupt, and the compile still finishes whole. In a child
    process of its own group."""
    code = textwrap.dedent("""
        import os, signal, time
        # (Python leaves Ctrl-C ignored where its parent ignored it, as a shell's background job does: a terminal's
        # program is the case tested)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from fastmm._runtime import compiling
        from fastmm.kernels.configs import Naive, Variant
        with compiling.in_background():
            try:
                compiling.binary(Naive(), Variant(), "sm_90")
            except compiling.KernelCompiling:
                pass
        import glob, tempfile
        while not glob.glob(os.path.join(tempfile.gettempdir(), "fastmm-nvcc-*", "*.cu")):
            time.sleep(0.001)
        time.sleep(0.05)  # (nvcc started just after its source was written)
        try:
            os.killpg(os.getpgid(0), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print("interrupted")
        assert compiling.wait(300)
        with compiling.in_background():
            print("compiled", len(compiling.binary(Naive(), Variant(), "sm_90").cubin) > 0)
    """)
    (tmp_path / "tmp").mkdir()
    env = {**__import__("os").environ, "FASTMM_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["interrupted", "compiled", "True"], proc.stdout + proc.stderr


@pytest.mark.skipif(os.name != "posix" or not shutil.which("nice"), reason="niceness is a POSIX scheduler's")
def test_the_compile_thread_runs_nvcc_at_the_lowest_cpu_priority(cache, tmp_path, monkeypatch):
    """nvcc on fastmm's thread competes with the program's own threads (a BLAS call over every core waits for
    its slowest thread): it runs at niceness 19; a compile the caller waits for runs at the caller's priority.
    Both in a process group of their own (Ctrl-C) within the program's session (Linux's autogroup shares the CPU
    between sessions before niceness counts: measured in docs/runtime.md)."""
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    # (`nice` alone prints its niceness; /proc/PID/stat's fields 5 and 6: process group, session)
    nvcc.write_text('#!/bin/sh\n{ nice; cut -d" " -f5,6 /proc/$$/stat 2>/dev/null; } > "$FASTMM_TEST_NICENESS"\n'
                    'exit 3\n')
    nvcc.chmod(0o755)
    seen = tmp_path / "niceness"
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("FASTMM_TEST_NICENESS", str(seen))
    with pytest.raises(build.CompileError, match="exit 3"):
        build.compile_cubin(Naive(), Variant(), "sm_90")

    def niceness():
        nice, *ids = seen.read_text().split()
        if ids:  # (Linux)
            assert int(ids[0]) != os.getpgrp() and int(ids[1]) == os.getsid(0), (ids, os.getpgrp(), os.getsid(0))
        return int(nice)

    assert niceness() == os.nice(0)
    with compiling.in_background():
        with pytest.raises(compiling.KernelCompiling):
            compiling.binary(Smem(), Variant(), "sm_90")
        assert compiling.wait(60)
        with pytest.raises(build.CompileError, match="exit 3"):  # (the thread's failure, handed to the caller)
            compiling.binary(Smem(), Variant(), "sm_90")
    assert niceness() == 19


def test_a_fork_moves_the_count_that_waiting_products_watch():
    """A forked child drops what was queued: products that waited for those binaries must ask again."""
    read, write = os.pipe()
    before = compiling.finished()
    pid = os.fork()
    if pid == 0:  # (the child: report its count, then leave without running the parent's exit handlers)
        os.write(write, str(compiling.finished()).encode())
        os._exit(0)
    os.close(write)
    child = int(os.read(read, 64))
    os.waitpid(pid, 0)
    assert child != before and compiling.finished() == before
