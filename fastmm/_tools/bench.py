"""``python -m fastmm bench``: TFLOP/s of every kernel, ``auto``, cuBLAS and NumPy over a table of shapes.

The measuring method is described in docs/measuring.md; in short: fresh random inputs; every row's result
checked against a float64 product (relative Frobenius error), with the output poisoned with NaN first so an
unwritten element cannot pass; CUDA events on the stream the work runs on, after warm-up; the median of several
timed batches; cuBLAS (``cupy.matmul``) timed in the same run, and ratios reported against it (for ``auto``,
over interleaved rounds of the two). Inputs that fit in L2 are rotated among several sets, so that a kernel is
not timed re-reading a warm cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import statistics
import sys
import time

import numpy as np

from .timing import L2_BYTES, no_gpu, progress as _progress, rel_error, time_per_call

__all__ = ["Shape", "SHAPES", "add_arguments", "main", "cublas_compute_tf32"]



@dataclasses.dataclass(frozen=True)
class Shape:
    label: str
    m: int
    n: int
    k: int
    batch: int = 1
    a_t: bool = False  # A passed as the transpose of a C-ordered (k, m) array

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def make(self, rng, xp):
        """Fresh random operands (uniform in [-1, 1)), float32, laid out as the shape says."""
        a_shape = (self.k, self.m) if self.a_t else (self.m, self.k)
        if self.batch > 1:
            a_shape = (self.batch,) + a_shape
        b_shape = ((self.batch,) if self.batch > 1 else ()) + (self.k, self.n)
        a = xp.asarray(rng.uniform(-1, 1, a_shape).astype(np.float32))
        b = xp.asarray(rng.uniform(-1, 1, b_shape).astype(np.float32))
        return (a.swapaxes(-1, -2) if self.a_t else a), b


SHAPES = (
    Shape("256^3", 256, 256, 256),
    Shape("512^3", 512, 512, 512),
    Shape("768^3", 768, 768, 768),
    Shape("1000^3", 1000, 1000, 1000),
    Shape("1536^3", 1536, 1536, 1536),
    Shape("1024^3", 1024, 1024, 1024),
    Shape("2048^3", 2048, 2048, 2048),
    Shape("4096^3", 4096, 4096, 4096),
    Shape("4097^3", 4097, 4097, 4097),
    Shape("8192^3", 8192, 8192, 8192),
    Shape("batch 64x256^3", 256, 256, 256, batch=64),
    Shape("A^T.B 4096^3", 4096, 4096, 4096, a_t=True),
    # Shapes that starve a tiled kernel of parallelism: narrow outputs, a long K (split-K), a short K.
    Shape("4096x16x4096", 4096, 16, 4096),
    Shape("matvec 8192x1x8192", 8192, 1, 8192),
    Shape("128x128x65536", 128, 128, 65536),
    Shape("65536x128x128", 65536, 128, 128),
    Shape("16384x16384x64", 16384, 16384, 64),
    # Bound by memory: few columns or rows, long K, batched matrix-vector (judged by bandwidth as well).
    Shape("matvec 16384x1x16384", 16384, 1, 16384),
    Shape("A^T.v 8192x1x8192", 8192, 1, 8192, a_t=True),
    Shape("vecmat 1x8192x8192", 1, 8192, 8192),
    Shape("8x4096x4096", 8, 4096, 4096),
    Shape("8192x4x8192", 8192, 4, 8192),
    Shape("16x16x1048576", 16, 16, 1 << 20),
    Shape("batch 64 matvec 1024x1x1024", 1024, 1, 1024, batch=64),
    Shape("3001^3", 3001, 3001, 3001),
    Shape("4096x8x4096", 4096, 8, 4096),
    Shape("2048x1x16384", 2048, 1, 16384),
    Shape("vecmat 1x4096x65536", 1, 4096, 65536),
    Shape("65536x16x1024", 65536, 16, 1024),
    # Long K on a small output: split-K in slices about 512 deep.
    Shape("64x64x262144", 64, 64, 1 << 18),
    Shape("256x256x65536", 256, 256, 65536),
    Shape("512x512x32768", 512, 512, 32768),
)

def _shape_of(label: str) -> Shape | None:
    """A shape the table lacks, written MxNxK (A m x k, B k x n, both C-ordered); None for any other label."""
    parts = label.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        return None
    m, n, k = map(int, parts)
    return Shape(label, m, n, k)


# Extra interleaved (cuBLAS, auto) rounds per row; their timings and the first pass's give the medians.
AUTO_ROUNDS = 4
# NumPy on the CPU only up to this many flops per call (about a second at most on a server CPU).
CPU_MAX_FLOPS = 2 * 1024**3
# Skip a slow kernel on a row when one call would take longer than this at its expected rate.
SLOW_SECONDS = 0.25
_EXPECTED_TFLOPS = {"naive": 5.0, "smem": 8.0}


@contextlib.contextmanager
def cublas_compute_tf32():
    """Inside the block, CuPy's float32 products run cuBLAS's own TF32 path (what CUPY_TF32=1 selects): the
    reference for the "medium" precision mode."""
    import cupy as cp

    linalg = cp._core._routines_linalg
    f32 = np.dtype(np.float32)
    before = linalg.get_compute_type(f32)
    linalg.set_compute_type(f32, linalg.COMPUTE_TYPE_TF32)
    try:
        yield
    finally:
        linalg.set_compute_type(f32, before)


def _per_call_overhead(rng, size: int, calls: int = 2000) -> dict:
    """Host-side cost of np.matmul on small fastmm arrays vs cupy.matmul: a loop of calls, synced at the end."""
    import cupy as cp

    import fastmm

    a_np = rng.uniform(-1, 1, (size, size)).astype(np.float32)
    fa, fb = fastmm.asarray(a_np), fastmm.asarray(a_np.T.copy())
    ca, cb = cp.asarray(a_np), cp.asarray(a_np.T.copy())
    result = {}
    for name, fn in (("fastmm np.matmul", lambda: np.matmul(fa, fb)), ("cupy.matmul", lambda: cp.matmul(ca, cb))):
        for _ in range(50):
            fn()
        cp.cuda.Device().synchronize()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            cp.cuda.Device().synchronize()
            samples.append((time.perf_counter() - t0) / calls)
        result[name] = statistics.median(samples)
    return result


def run(shapes, kernels, *, seed: int, progress: bool, cpu: bool) -> dict:
    import cupy as cp

    import fastmm
    from ..kernels.configs import BY_NAME

    rng = np.random.default_rng(seed)
    rows = []
    bar = _progress(len(shapes) * (len(kernels) + 2 + cpu), progress)
    for shape in shapes:
        set_bytes = 4 * shape.batch * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)
        n_sets = max(1, min(8, math.ceil(2 * L2_BYTES / set_bytes)))
        sets = [shape.make(rng, cp) for _ in range(n_sets)]
        outs = [cp.empty(((shape.batch,) if shape.batch > 1 else ()) + (shape.m, shape.n), cp.float32)
                for _ in range(n_sets)]
        a0, b0 = sets[0]
        ref = cp.matmul(a0.astype(cp.float64), b0.astype(cp.float64))
        fa = [(fastmm.asarray(a), fastmm.asarray(b)) for a, b in sets]
        row = {"shape": shape.label, "m": shape.m, "n": shape.n, "k": shape.k, "batch": shape.batch,
               "a_t": shape.a_t, "flops": shape.flops, "results": {}}

        def record(name, fn):
            bar.set_description(f"{shape.label} {name}")
            outs[0].fill(cp.nan)
            fn(0)  # checked on the first operand set, then timed over all of them
            err = rel_error(outs[0], ref)
            secs = time_per_call(fn, n_sets)
            row["results"][name] = {"seconds": secs, "tflops": shape.flops / secs / 1e12, "rel_error": err,
                                    "samples": [secs]}
            bar.update()

        def cublas(i):
            cp.matmul(*sets[i], out=outs[i])

        record("cublas", cublas)
        for kernel in kernels:
            family = kernel.split("_")[0]
            # The few-column kernels re-read A once per NMAX columns: only shapes whose few columns (or rows) one
            # block holds.
            off_shape = family == "fewcol" and min(shape.m, shape.n) > BY_NAME[kernel].nmax
            if off_shape or shape.flops / (_EXPECTED_TFLOPS.get(family, 30.0) * 1e12) > SLOW_SECONDS:
                bar.update()
                continue
            record(kernel, lambda i, kernel=kernel: fastmm.matmul(*fa[i], out=outs[i], kernel=kernel))

        def auto(i):
            np.matmul(*fa[i], out=outs[i])

        record("auto", auto)

        def cublas_tf32(i):
            with cublas_compute_tf32():
                cp.matmul(*sets[i], out=outs[i])

        modes = [("cublas tf32", cublas_tf32)]
        for mode in ("high", "medium"):
            modes.append((f"auto {mode}", lambda i, mode=mode: fastmm.matmul(*fa[i], out=outs[i], precision=mode)))
        for name, fn in modes:
            record(name, fn)
        # The headline ratios, auto (in each precision) against cuBLAS, from interleaved rounds as well: all then
        # run at the same clocks and temperature (a single pass per kernel read large products 1-3% apart from
        # run to run).
        timed = [("cublas", cublas), ("auto", auto), *modes]
        for _ in range(AUTO_ROUNDS):
            for name, fn in timed:
                row["results"][name]["samples"].append(time_per_call(fn, n_sets))
        for name, _ in timed:
            res = row["results"][name]
            res["seconds"] = statistics.median(res["samples"])
            res["tflops"] = shape.flops / res["seconds"] / 1e12
        kernel_line = fastmm.explain(fa[0][0], fa[0][1]).splitlines()[1].split(maxsplit=1)[1]
        row["auto_kernel"] = re.sub(r", split-K into (\d+) slices.*", r" x\1 K-slices", kernel_line)
        if min(shape.m, shape.n) <= 16:
            # Bound by memory: the bytes a product must move, and a device-to-device copy of A (read + write) as
            # the ceiling, timed on the same operands.
            row["bytes"] = 4 * shape.batch * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)
            # The large operand's copy (A, or B for a few-row product such as a vector times a matrix).
            large = 0 if shape.m >= shape.n else 1
            copies = [cp.empty_like(s[large]) for s in sets]
            copy_s = time_per_call(lambda i: cp.copyto(copies[i], sets[i][large]), n_sets)
            row["copy_tb_s"] = 2 * copies[0].nbytes / copy_s / 1e12
            del copies
        if cpu:
            if shape.flops <= CPU_MAX_FLOPS:
                ha, hb = a0.get(), b0.get()
                t = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    hc = np.matmul(ha, hb)
                    t.append(time.perf_counter() - t0)
                secs = statistics.median(t)
                row["results"]["numpy"] = {"seconds": secs, "tflops": shape.flops / secs / 1e12,
                                           "rel_error": rel_error(cp.asarray(hc), ref)}
            bar.update()
        rows.append(row)
        del sets, outs, fa, ref
        cp.get_default_memory_pool().free_all_blocks()
    bar.close()
    return {"rows": rows}


def _tf32_accuracy(column: str) -> bool:
    """Columns computed with one TF32 pass (10-bit mantissas): judged by TF32's accuracy, not FP32's."""
    from ..kernels.configs import BY_NAME

    config = BY_NAME.get(column)
    return column in ("cublas tf32", "auto medium") or (config is not None and config.precision == "medium")


def format_table(report: dict, kernels) -> str:
    cols = ["cublas", *kernels, "auto", "cublas tf32", "auto high", "auto medium", "numpy"]
    present = [c for c in cols if any(c in r["results"] for r in report["rows"])]
    head = f"| {'shape':16s} | " + " | ".join(f"{c:>22s}" for c in present) + " | max rel err | auto picks |"
    lines = [head, "|" + "---|" * (len(present) + 3)]
    for r in report["rows"]:
        base = r["results"]["cublas"]["tflops"]
        cells = []
        for c in present:
            res = r["results"].get(c)
            if res is None:
                cells.append(f"{'-':>22s}")
            elif c == "cublas":
                cells.append(f"{res['tflops']:>15.1f} TFLOP/s")
            else:
                cells.append(f"{res['tflops']:>8.2f} ({res['tflops'] / base:5.2f}x cuBLAS)")
        err = max(v["rel_error"] for k, v in r["results"].items() if not _tf32_accuracy(k) and k != "numpy")
        lines.append(f"| {r['shape']:16s} | " + " | ".join(cells) + f" | {err:.1e} | {r.get('auto_kernel', '')} |")
    memory = [r for r in report["rows"] if "bytes" in r]
    if memory:
        lines.append("\nbound by memory (TB/s: bytes of A, B and C over the median time; copy: the large "
                     "operand copied device to device, read + write):")
        for r in memory:
            rate = {c: r["bytes"] / r["results"][c]["seconds"] / 1e12 for c in ("cublas", "auto")}
            lines.append(f"  {r['shape']:28s} auto {rate['auto']:5.2f}  cuBLAS {rate['cublas']:5.2f}  "
                         f"copy {r['copy_tb_s']:5.2f}")
    if "overhead" in report:
        o = report["overhead"]
        for size, d in o.items():
            f, c = d["fastmm np.matmul"], d["cupy.matmul"]
            lines.append(f"\nper-call cost, {size}x{size} float32: fastmm np.matmul {f * 1e6:.1f} us, "
                         f"cupy.matmul {c * 1e6:.1f} us (ratio {f / c:.2f})")
    return "\n".join(lines)


def plot(report: dict, kernels, path: str) -> None:
    """A PNG of TFLOP/s against size over the square rows of the table: the FP32 kernels of the ladder, auto and
    cuBLAS on the left; the precision modes ("highest", "high", "medium") and cuBLAS's SGEMM and TF32 on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    # Square rows at multiples of 256 (the ragged 1000 and 4097 rows would draw a vertical jump next to 1024/4096).
    rows = sorted((r for r in report["rows"] if r["m"] == r["n"] == r["k"] and r["m"] % 256 == 0
                   and r["batch"] == 1 and not r["a_t"]), key=lambda r: r["m"])
    fig, (ladder, modes) = plt.subplots(1, 2, figsize=(14, 5.5))

    def line(ax, name, label, **style):
        pts = [(r["m"], r["results"][name]["tflops"]) for r in rows if name in r["results"]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker=style.pop("marker", "o"), label=label, **style)

    # One line style per family (the ladder's rungs), distinct colours within the figure.
    family_style = {"naive": ":", "smem": "-.", "regtile": "--", "warptile": "-"}
    colours = iter(plt.cm.tab20.colors)
    line(ladder, "cublas", "cuBLAS SGEMM (cupy.matmul)", lw=2.5, color="black")
    for name in kernels:
        if name.split("_")[0] in family_style:
            line(ladder, name, name, ls=family_style[name.split("_")[0]], lw=1.5, color=next(colours))
    line(ladder, "auto", "auto", ls=(0, (1, 1)), lw=3, color="red", marker="s")
    line(modes, "cublas", "cuBLAS SGEMM", lw=2.5, color="black")
    line(modes, "cublas tf32", "cuBLAS TF32 (CUPY_TF32=1)", lw=2, color="grey", ls="--")
    line(modes, "auto", 'fastmm "highest" (FP32, the default)', lw=2.5, color="red", marker="s")
    line(modes, "auto high", 'fastmm "high" (3xTF32: FP32 accuracy)', lw=2.5, color="tab:blue", marker="D")
    line(modes, "auto medium", 'fastmm "medium" (one TF32 pass)', lw=2, color="tab:green", marker="^", ls="--")
    for ax, title in ((ladder, "the FP32 kernels of the ladder"), (modes, "precision modes")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("TFLOP/s (2MNK / median time)")
        ax.set_title(f"{title}, {report.get('device', 'GPU')}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    modes.set_yscale("log")
    modes.set_yticks([1, 2, 5, 10, 20, 50, 100, 200, 400])
    modes.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    modes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_arguments(p) -> None:
    p.add_argument("--shapes", default=None,
                   help="comma-separated labels from the shape table, or MxNxK for any other (default: all)")
    p.add_argument("--kernels", default=None, help="comma-separated kernel configurations (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random operands (default: 0)")
    p.add_argument("--json", default=None, help="also write the full results as JSON to this path")
    p.add_argument("--no-cpu", action="store_true", help="skip the NumPy-on-CPU column")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (for logs)")
    p.add_argument("--sweep", type=int, default=0, metavar="N",
                   help="instead of the table: N random problems of every size and layout against cuBLAS, with the "
                        "distribution of the speed and error ratios and the worst problems (e.g. 500)")
    p.add_argument("--sweep-seed", type=int, default=0, help="--sweep: the seed that draws the problems (default: 0)")
    p.add_argument("--sweep-budget", type=float, default=900.0,
                   help="--sweep: stop measuring after this many seconds (default: 900)")
    p.add_argument("--numpy-hook", action="store_true",
                   help="instead: plain NumPy a @ b with and without accelerate_numpy(), in one run")
    p.add_argument("--programs", action="store_true",
                   help="--numpy-hook: whole NumPy programs (fastmm/_tools/programs.py) instead of single products: "
                        "NumPy and hook times, the share of time in products and the bound it allows")
    p.add_argument("--programs-scale", type=float, default=1.0, help="--programs: size factor (default: 1)")
    p.add_argument("--programs-only", default="", help="--programs: these programs only (comma-separated)")
    p.add_argument("--programs-repeat", type=int, default=1,
                   help="--programs: runs of each mode, the median counting (default: 1; 3 to judge a few percent)")
    p.add_argument("--cupy-hook", action="store_true",
                   help="instead: scikit-learn on float32 CuPy data with and without accelerate_cupy(), in one run")
    p.add_argument("--hook-n", type=int, default=16384, help="--cupy-hook: samples (default: 16384)")
    p.add_argument("--hook-d", type=int, default=1024, help="--cupy-hook: features (default: 1024)")
    p.add_argument("--dask", action="store_true",
                   help="instead: Dask graphs of fastmm chunks (in memory, out of core, one GPU and several), one run")
    p.add_argument("--dask-n-memory", type=int, default=32768, help="--dask: the in-memory product's size (0: skipped)")
    p.add_argument("--dask-n-ooc", type=int, default=32768, help="--dask: the out-of-core product's size")
    p.add_argument("--dask-n", default="32768,49152", help="--dask: sizes on the local cluster (comma-separated; \"\": none)")
    p.add_argument("--dask-chunk", type=int, default=8192, help="--dask: chunk side (default: 8192)")
    # 10 GiB: below the 12 GiB that 32768^3's operands and result need together, above what four tasks hold at once
    # (8 GiB ran out on an H200: a task's sum of four 8192^2 products on top of its operands' chunks).
    p.add_argument("--dask-gpu-limit", type=float, default=10.0,
                   help="--dask: GiB of GPU memory the out-of-core product may use (CuPy's pool limit; default 10)")
    p.add_argument("--dask-gpus", type=int, default=None, help="--dask: GPUs of the cluster (default: all)")
    p.add_argument("--dask-threads", type=int, default=1,
                   help="--dask: threads of each worker (default 1, as dask-cuda's LocalCUDACluster starts them)")
    p.add_argument("--dask-repeat", type=int, default=1,
                   help="--dask: timed runs of each cluster product after its warm-up; the median is reported "
                        "(default 1)")
    p.add_argument("--dask-timeline", action="store_true",
                   help="--dask: per worker, where the timed run nearest the median spent its time (Dask's task "
                        "stream: first start, last end, seconds computing and receiving), and the planned graphs' "
                        "plan for the operand as the first timed run has it (fastmm.dask.explain)")
    p.add_argument("--dask-stealing", default="on",
                   help="--dask: the scheduler's work stealing, on, off or on,off (each cluster both ways; default: on, "
                        "Dask's default)")
    p.add_argument("--dask-ucx-wait", default="tasks",
                   help="--dask: what a UCX worker waits for before a device transfer: stream (its default stream, "
                        "fastmm.dask.send_after_default_stream), tasks (the same, and every task finishes its GPU "
                        "work: finish_tasks=True), device (the whole GPU, distributed-ucxx's own), or several, "
                        "comma-separated (each cluster each way; default: tasks)")
    p.add_argument("--dask-protocol", default="tcp,ucx",
                   help="--dask: the cluster's protocols, comma-separated (default: tcp,ucx; ucx where installed)")
    p.add_argument("--dask-kinds", default="fastmm,cupy,planned,planned-cupy",
                   help="--dask: the cluster's graphs, comma-separated: fastmm (Dask's graph, fastmm chunks), cupy "
                        "(the same, CuPy chunks), planned (fastmm.dask.matmul, fastmm chunks), planned-cupy (the "
                        "same, CuPy chunks); default: all four")
    p.add_argument("--plot", default=None, help="also draw TFLOP/s against size per kernel into this PNG")


def main(args) -> int:
    if getattr(args, "sweep", 0):
        from . import sweep

        return sweep.main(args)
    if getattr(args, "numpy_hook", False) and getattr(args, "programs", False):
        from . import programs as _programs

        return _programs.main(args)
    if getattr(args, "numpy_hook", False):
        from . import hook_measure as _hook_measure

        return _hook_measure.main_bench(args)
    if getattr(args, "cupy_hook", False):
        from . import cupy_hook_bench as _cupy_hook_bench

        return _cupy_hook_bench.main(args)
    if getattr(args, "dask", False):
        from . import dask_bench as _dask_bench

        return _dask_bench.main(args)
    import cupy as cp

    if no_gpu("bench"):
        return 2
    from .._runtime import cuda as _cuda
    from .. import _plan
    from ..kernels.configs import CONFIGS

    if args.kernels:
        kernels = args.kernels.split(",")
    else:  # every configuration this GPU can run (the wgmma and cluster kernels need Hopper; some tiles, its memory)
        device = _cuda.device(cp.cuda.Device().id)
        kernels = [c.name for c in CONFIGS if not _plan.invalid(c, device)]
        left_out = [c.name for c in CONFIGS if c.name not in kernels]
        if left_out:
            print(f"left out, as {device.name} cannot run them: {', '.join(left_out)}", file=sys.stderr)
    shapes = SHAPES
    if args.shapes:
        wanted = args.shapes.split(",")
        shapes = [s for s in SHAPES if s.label in wanted] + [s for s in map(_shape_of, wanted) if s is not None]
        missing = set(wanted) - {s.label for s in shapes}
        if missing:
            print(f"unknown shapes {sorted(missing)}; known: {[s.label for s in SHAPES]}, or MxNxK (e.g. 64x4096x4096)",
                  file=sys.stderr)
            return 2
    report = run(shapes, kernels, seed=args.seed, progress=not args.no_progress, cpu=not args.no_cpu)
    rng = np.random.default_rng(args.seed + 1)
    report["overhead"] = {size: _per_call_overhead(rng, size) for size in (64, 256)}
    report["device"] = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"fastmm bench on {report['device']}; TFLOP/s = 2*M*N*K*batch / median seconds; ratios to cuBLAS "
          "(cupy.matmul) measured in the same run")
    print(format_table(report, kernels))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        plot(report, kernels, args.plot)
    bad = [(r["shape"], k) for r in report["rows"] for k, v in r["results"].items()
           if not v["rel_error"] < (5e-3 if _tf32_accuracy(k) else 1e-4)]
    if bad:
        print(f"\nFAILED correctness (rel error >= 1e-4, 5e-3 for one TF32 pass, or unwritten output): {bad}", file=sys.stderr)
        return 1
    return 0
