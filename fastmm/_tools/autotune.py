"""Autotuner: time every candidate configuration on the GPU for a class of problems, keep the winner.

Sits beside the plan: it uses the plan (problem classes, the table's own choice, the cache's location) and
the public product path (each candidate forced with ``kernel=``), and writes the cache that `_plan` only
reads. The cache is one JSON file per GPU model, driver and fastmm version under the user's cache directory
(``_plan.tune_cache_path``); `auto` then uses an entry for the problem's class when present and the heuristic
table otherwise. Compiles stay bounded: every candidate binary goes through the on-disk kernel cache.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import numpy as np

from .. import _plan
from .._plan import RuleName
from ..kernels.configs import CONFIGS

__all__ = ["tune", "main"]

# naive is never a winner past toy sizes and costs the most time to measure: tune it only below this.
_NAIVE_MAX_FLOPS = 2 * 512**3


def _candidates(problem: _plan.Problem, device: _plan.Device) -> list[str]:
    names = []
    for c in CONFIGS:
        if c.family == "naive" and problem.flops > _NAIVE_MAX_FLOPS:
            continue
        if c.precision != "highest":  # the table it tunes is the FP32 one; tensor-core modes are chosen by mode
            continue
        if c.family == "fewcol":  # few-column shapes follow their own rule, which the tuner does not override
            continue
        if not _plan.invalid(c, device):
            names.append(c.name)
    return names


def tune(shapes, *, seed: int = 0, progress: bool = True) -> list[dict]:
    """Tune each `fastmm._tools.bench.Shape`; write the winners to the cache; return one report row per shape."""
    import cupy as cp

    from .. import linalg
    from .._runtime import cuda as _cuda
    from .._dispatch import products as _dispatch
    from .timing import L2_BYTES, progress as _progress, rel_error, time_per_call

    device = _cuda.device(cp.cuda.Device().id)
    path = _plan.tune_cache_path(device)
    try:
        entries = json.loads(path.read_text()).get("entries", {})
    except (OSError, ValueError):
        entries = {}
    rng = np.random.default_rng(seed)
    rows = []
    bar = _progress(len(shapes), progress)
    for shape in shapes:
        bar.set_description(f"autotune {shape.label}")
        # Several operand sets when they fit in L2, rotated as the bench command does: timings on one warm set
        # favoured the wrong tile at 1000^3 (measured: 25.9 vs 24.2 TFLOP/s here, 22.1 vs 23.4 rotated).
        set_bytes = 4 * shape.batch * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)
        sets = [shape.make(rng, cp) for _ in range(max(1, min(8, -(-2 * L2_BYTES // set_bytes))))]
        a, b = sets[0]
        planned = _dispatch.plan_matmul(a, b, device)
        problem = planned[0]
        table = _plan.choose(problem, device, tuned=False)
        row = {"shape": shape.label, "bucket": _plan.tune_bucket(problem), "heuristic": table.name}
        if table.rule in (RuleName.EMPTY, RuleName.SMALL) or table.splits > 1:
            row["skipped"] = (f"the table's {table.rule} plan is not a choice of configuration" if table.rule
                              != RuleName.SMALL else "the small rule's float64 sums are its accuracy, not tuned")
            rows.append(row)
            bar.update()
            continue
        ref = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
        outs = [cp.empty(ref.shape, cp.float32) for _ in sets]
        c = outs[0]
        timings = {}
        for name in _candidates(problem, device):
            c.fill(cp.nan)
            linalg.matmul(a, b, out=c, kernel=name)
            if not rel_error(c, ref) < 1e-4:  # a wrong kernel never wins
                continue
            secs = time_per_call(lambda i, name=name: linalg.matmul(*sets[i], out=outs[i], kernel=name), len(sets))
            timings[name] = problem.flops / secs / 1e12
        best = max(timings, key=timings.get)
        row.update(kernel=best, tflops=timings[best], heuristic_tflops=timings.get(table.name, float("nan")),
                   candidates=timings)
        entries[row["bucket"]] = {
            "kernel": best, "tflops": timings[best], "heuristic": table.name,
            "heuristic_tflops": row["heuristic_tflops"], "shape": [problem.m, problem.n, problem.k, problem.batch],
            "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        rows.append(row)
        bar.update()
        del a, b, c, ref, sets, outs
        cp.get_default_memory_pool().free_all_blocks()
    bar.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"device": device.name, "driver": device.driver_version, "entries": entries},
                              indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    _plan.reload_tuned()
    return rows


def add_arguments(p) -> None:
    p.add_argument("shapes", nargs="*", help="M,N,K or M,N,K,BATCH (default: the bench command's shape table)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random operands (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (for logs)")
    p.add_argument("--numpy-hook", action="store_true",
                   help="instead: measure when accelerate_numpy() should send a product to the GPU on this machine")


def main(args) -> int:
    if args.numpy_hook:
        from . import hook_measure as _hook_measure

        return _hook_measure.main_autotune(args)
    import cupy as cp

    from .bench import SHAPES, Shape
    from .timing import no_gpu

    if no_gpu("autotune"):
        return 2
    shapes = []
    for text in args.shapes:
        try:
            dims = [int(v) for v in text.split(",")]
            m, n, k = dims[:3]
            batch = dims[3] if len(dims) > 3 else 1
        except ValueError:
            print(f"cannot read shape {text!r}: give M,N,K or M,N,K,BATCH", file=sys.stderr)
            return 2
        shapes.append(Shape(text, m, n, k, batch))
    rows = tune(shapes or list(SHAPES), seed=args.seed, progress=not args.no_progress)
    from .._runtime import cuda as _cuda

    print(f"autotune cache: {_plan.tune_cache_path(_cuda.device(cp.cuda.Device().id))}")
    w = max([28] + [len(r.get(key, "")) for r in rows for key in ("heuristic", "kernel")])  # kernel names
    print(f"| {'shape':20s} | {'class':28s} | {'table picks':{w}s} | {'TFLOP/s':>8s} | {'tuned':{w}s} | {'TFLOP/s':>8s} |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['shape']:20s} | {r['bucket']:28s} | {r['heuristic']:{w}s} | {'':>8s} | {r['skipped']} |")
        else:
            print(f"| {r['shape']:20s} | {r['bucket']:28s} | {r['heuristic']:{w}s} | {r['heuristic_tflops']:8.2f} | "
                  f"{r['kernel']:{w}s} | {r['tflops']:8.2f} |")
    return 0
