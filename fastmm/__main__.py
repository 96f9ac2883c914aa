"""fastmm's command line: what was found, kernel resources, the plan for a product, the bench table, autotuning.

info, compile and explain need no GPU (compile needs nvcc); bench and autotune need a CUDA GPU and CuPy.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
from concurrent.futures import ThreadPoolExecutor


def _all_binaries():
    """Every (configuration, layout variant) fastmm can compile: what `compile` and the CPU tests cover."""
    from .kernels.configs import AUXILIARY, CONFIGS, INT8_WG, Variant

    variants = [Variant(a_t, b_t, vec) for a_t in (False, True) for b_t in (False, True) for vec in (4, 1)]
    return [(c, v) for c in CONFIGS + INT8_WG + AUXILIARY for v in (variants if c.layout_macros else [Variant()])]


def _runs_on(config, arch: str) -> bool:
    """Whether a GPU of architecture `arch` (sm_XY) runs `config` (configs.arch_errors)."""
    from .kernels.configs import arch_errors

    digits = arch.removeprefix("sm_").rstrip("af")
    if not (digits.isdigit() and len(digits) >= 2):
        return True  # not a form we read: compile everything, and let nvcc say what it thinks of the name
    return not arch_errors(config, (int(digits[:-1]), int(digits[-1])))


def _default_arch() -> str:
    """The architecture of the GPU present (sm_XY), else Hopper's sm_90 (H100/H200)."""
    try:
        import cupy

        major, minor = cupy.cuda.Device().compute_capability
        return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no CuPy, driver or GPU: compile for Hopper
        return "sm_90"


def _arch(text: str) -> str:
    """--arch's type: sm_ and the compute capability's digits (sm_90 for 9.0)."""
    if re.fullmatch(r"sm_\d{2,3}", text):
        return text
    raise argparse.ArgumentTypeError(f"takes sm_ and the compute capability's digits (sm_90 for H100 and H200, "
                                     f"sm_89, sm_80), got {text!r}; fastmm adds the 'a' of sm_90a itself where a "
                                     "kernel needs it")


def _positive(text: str) -> int:
    """A count of 1 or more (--jobs, --batch)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def cmd_compile(args) -> int:
    import time

    from .kernels import build

    args.arch = args.arch or _default_arch()
    started = time.perf_counter()
    jobs = [(c, v) for c, v in _all_binaries() if _runs_on(c, args.arch)]
    skipped = sorted({c.name for c, _ in _all_binaries()} - {c.name for c, _ in jobs})
    if skipped:
        print(f"not for {args.arch} (they need Hopper's own instructions or clusters): {', '.join(skipped)}")
    failed = spilled = 0
    print(f"{'binary':36s} {'arch':6s} {'regs':>5s} {'smem B':>7s} {'spill st/ld B':>14s} {'stack B':>8s}")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(c, v, pool.submit(build.compile_cubin, c, v, args.arch, use_cache=not args.no_cache))
                   for c, v in jobs]
        for done, (config, variant, fut) in enumerate(futures, 1):
            name = config.binary_name(variant)
            if sys.stderr.isatty():  # progress where a person watches; logs get the table alone
                print(f"\r{done}/{len(futures)} {name[:60]:60s}", end="", file=sys.stderr, flush=True)
            try:
                r = fut.result()
            except build.CompileError as e:
                if "Unsupported gpu architecture" in str(e):  # every binary would say so: say it once
                    pool.shutdown(wait=False, cancel_futures=True)
                    if sys.stderr.isatty():
                        print("\r" + " " * 72 + "\r", end="", file=sys.stderr)
                    print(f"python -m fastmm compile: error: this nvcc ({build.find_nvcc()}) does not compile for "
                          f"{args.arch}: nvcc --list-gpu-arch lists those it does", file=sys.stderr)
                    return 2
                failed += 1
                print(f"{name:36s} COMPILE ERROR\n{e}", file=sys.stderr)
                continue
            spill = r.spill_stores + r.spill_loads
            spilled += bool(spill)
            flag = "  <- SPILLS" if spill else ""
            print(f"{name:36s} {r.arch:6s} {r.registers:5d} {r.smem_bytes:7d} "
                  f"{f'{r.spill_stores}/{r.spill_loads}':>14s} {r.stack_bytes:8d}{flag}")
    if sys.stderr.isatty():
        print("\r" + " " * 72 + "\r", end="", file=sys.stderr)
    print(f"{len(jobs)} binaries: {failed} failed to compile, {spilled} spill registers "
          f"({time.perf_counter() - started:.0f} s, {args.jobs} in parallel)")
    return 1 if failed or spilled else 0


def cmd_explain(args) -> int:
    from . import explain

    m, n, k = args.m, args.n, args.k
    a = (args.batch, m, k) if args.batch > 1 else (m, k)
    print(explain(a, (k, n), kernel=args.kernel, precision=args.precision))
    return 0


def cmd_info(args) -> int:
    import numpy

    from .kernels.configs import CONFIGS, FAMILIES

    print(f"fastmm      {__import__('fastmm').__version__}")
    print(f"python      {platform.python_version()}")
    print(f"numpy       {numpy.__version__}")
    try:
        import cupy

        print(f"cupy        {cupy.__version__}")
    except ImportError:
        cupy = None
        print("cupy        not installed")
    try:
        from .kernels.build import find_nvcc

        print(f"nvcc        {find_nvcc()}")
    except RuntimeError as e:
        print(f"nvcc        not found ({e})")
    if cupy is not None and cupy.cuda.is_available():
        from ._runtime import cuda as _cuda

        rt = cupy.cuda.runtime
        dev = _cuda.device(cupy.cuda.Device().id)
        print(f"gpu         {dev.name}, compute capability {dev.compute_capability[0]}.{dev.compute_capability[1]}, "
              f"{dev.sm_count} SMs")
        print(f"driver      CUDA {rt.driverGetVersion() // 1000}.{rt.driverGetVersion() % 1000 // 10}, "
              f"runtime {rt.runtimeGetVersion() // 1000}.{rt.runtimeGetVersion() % 1000 // 10}")
    else:
        from ._runtime.cuda import why_no_gpu

        print(f"gpu         none: {why_no_gpu() or 'CuPy sees no GPU'}")
    families = ", ".join(f"{f} {sum(c.family == f for c in CONFIGS)}" for f in FAMILIES)
    print(f"kernels     {len(CONFIGS)} configurations: {families} (python -m fastmm compile lists them)")
    from ._hooks.numpy_hook import load_model, numpy_hook_status

    status = numpy_hook_status()
    model = load_model()
    print(f"numpy hook  {'on' if status['active'] else 'off'} in this process; when on, it offloads "
          f"{model.threshold_text()}")
    from ._hooks.cupy_hook import cupy_hook_status

    status = cupy_hook_status()
    print(f"cupy hook   {'on' if status['active'] else 'off'} in this process; when on, float32 products of plain "
          "CuPy arrays run on fastmm's kernels where the bench measured them level with cuBLAS or ahead")
    return 0


def _command_name(args) -> str:
    flags = [f"--{f.replace('_', '-')}" for f in ("numpy_hook", "cupy_hook", "dask", "sweep")
             if getattr(args, f, False)]
    return " ".join([args.cmd, *flags])


def cmd_bench(args) -> int:
    from ._tools.timing import no_gpu

    if args.plot:  # checked before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("python -m fastmm bench: error: --plot needs matplotlib: pip install 'fastmm[bench]'",
                  file=sys.stderr)
            return 2
    if args.dask:
        from ._tools.dask_bench import parse_kinds, parse_stealing

        try:
            parse_kinds(args.dask_kinds)
            parse_stealing(args.dask_stealing)
            if args.dask_threads < 1:
                raise ValueError(f"--dask-threads must be at least 1 (got {args.dask_threads})")
            if args.dask_repeat < 1:
                raise ValueError(f"--dask-repeat must be at least 1 (got {args.dask_repeat})")
        except ValueError as e:
            print(f"python -m fastmm bench: error: {e}", file=sys.stderr)
            return 2
    if no_gpu(_command_name(args)):
        return 2
    from ._tools import bench as _bench

    return _bench.main(args)


def cmd_autotune(args) -> int:
    from ._tools.timing import no_gpu

    if no_gpu(_command_name(args)):
        return 2
    from ._tools import autotune as _autotune

    return _autotune.main(args)


def main(argv=None) -> int:
    from ._version import __version__

    p = argparse.ArgumentParser(prog="python -m fastmm", description=__doc__.strip())
    p.add_argument("--version", action="version", version=f"fastmm {__version__}")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="GPU, driver, library versions, kernels")
    c = sub.add_parser("compile", help="compile every kernel binary with nvcc and report ptxas resources")
    c.add_argument("--arch", default=None, type=_arch,
                   help="GPU architecture to compile for (default: the GPU present's, else sm_90: H100/H200)")
    c.add_argument("--jobs", type=_positive, default=os.cpu_count() or 2,
                   help="nvcc processes in parallel (default: one per CPU core)")
    c.add_argument("--no-cache", action="store_true", help="recompile even when a cached cubin exists")
    e = sub.add_parser("explain", help="which kernel runs for an M x N x K product, and why")
    e.add_argument("m", type=int, help="rows of A and C")
    e.add_argument("n", type=int, help="columns of B and C")
    e.add_argument("k", type=int, help="columns of A, rows of B")
    e.add_argument("--batch", type=_positive, default=1, help="a stack of BATCH products, A batched, B shared (default: 1)")
    e.add_argument("--kernel", default=None, help="plan with this kernel forced (a name from fastmm.kernel_names())")
    e.add_argument("--precision", default=None, choices=["highest", "high", "medium"],
                   help="plan in this precision mode (default: the current one, 'highest')")
    b = sub.add_parser("bench", help="TFLOP/s of every kernel, auto and cuBLAS over a table of shapes")
    from ._tools import bench as _bench

    _bench.add_arguments(b)
    t = sub.add_parser("autotune", help="time every configuration for a list of shapes; auto uses the winners")
    from ._tools import autotune as _autotune

    _autotune.add_arguments(t)
    args = p.parse_args(argv)
    if args.cmd is None:  # no command: say what there is, as `git` does
        p.print_help()
        return 2
    command = {"info": cmd_info, "compile": cmd_compile, "explain": cmd_explain, "bench": cmd_bench,
               "autotune": cmd_autotune}[args.cmd]
    try:
        return command(args)
    except (KeyError, ValueError) as e:  # a user's input fastmm refused (its message names what to change)
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"python -m fastmm {args.cmd}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
