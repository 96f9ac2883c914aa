"""``python -m fastmm bench --sweep N``: fastmm against cuBLAS on N random problems that nobody tuned for.

The bench table's shapes are the ones the plan was fitted to; a user's are not. The sweep draws problems with a
seed (M, N and K log-uniform over 1..16384, a few with one side up to 100000, some batched, every layout:
transposed, Fortran order, rows with padding between them, a start that is not 16-byte aligned), multiplies each
with ``np.matmul`` on fastmm arrays and with ``cupy.matmul`` on the same data, and reports the distribution of
the speed ratio and of the error ratio, with the worst problems and the rule that planned them. Change the seed
to check that a fix generalises. The method (float64 reference, NaN-poisoned output, CUDA events, medians) is the
bench's: docs/measuring.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time

import numpy as np

from .timing import progress, rel_error, time_per_call

__all__ = ["SweepProblem", "LAYOUTS", "draw", "summarize", "format_summary", "run", "main"]

# How the operands are laid out in memory; each is a form a NumPy user meets.
LAYOUTS = ("c", "a_t", "b_t", "fortran", "strided", "offset")
MAX_SIDE = 16384
LONG_SIDE = 100_000
LONG_SHARE = 0.03  # of the problems, one side drawn from MAX_SIDE..LONG_SIDE
BATCHED_SHARE = 0.15
MAX_BYTES = 3 << 30  # operands and result of one problem (the float64 reference takes twice that again)


@dataclasses.dataclass(frozen=True)
class SweepProblem:
    m: int
    n: int
    k: int
    batch: int = 1
    layout: str = "c"

    @property
    def label(self) -> str:
        return (f"{f'{self.batch}x' if self.batch > 1 else ''}{self.m}x{self.n}x{self.k}"
                f"{'' if self.layout == 'c' else ' ' + self.layout}")

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def nbytes(self) -> int:
        return 4 * self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)

    def make(self, rng, xp):
        """Fresh random float32 operands (uniform in [-1, 1)) in this problem's layout, on `xp` (NumPy or CuPy)."""
        lead = (self.batch,) if self.batch > 1 else ()
        return (_laid_out(xp, rng, lead + (self.m, self.k), self.layout in ("a_t", "fortran"), self.layout),
                _laid_out(xp, rng, lead + (self.k, self.n), self.layout in ("b_t", "fortran"), self.layout))


def _uniform(xp, rng, shape):
    """Float32 values uniform in [-1, 1) of `shape`, drawn from `rng`: on the GPU where `xp` is CuPy (with a seed
    from `rng`). Drawn on the host, the 2.5 G values of the 217 problems a 45 s seed-1 sweep measured take NumPy
    about 75 s on a 2-core machine."""
    if xp is np:
        return rng.uniform(-1, 1, shape).astype(np.float32)
    x = xp.random.default_rng(int(rng.integers(2**63))).random(shape, dtype=np.float32)
    x *= 2
    x -= 1
    return x


def _laid_out(xp, rng, shape, transposed: bool, layout: str):
    rows, cols = shape[-2], shape[-1]
    if transposed:  # the transpose of a C-ordered array: unit stride along the rows
        return _uniform(xp, rng, shape[:-2] + (cols, rows)).swapaxes(-1, -2)
    if layout == "strided":  # rows with 3 floats between them (an odd row stride: not 16-byte aligned either)
        return _uniform(xp, rng, shape[:-1] + (cols + 3,))[..., :cols]
    if layout == "offset":  # the first element one float past an aligned address
        return _uniform(xp, rng, (math.prod(shape) + 1,))[1:].reshape(shape)
    return _uniform(xp, rng, shape)


def _log_uniform(rng, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def draw(count: int, seed: int, *, max_bytes: int = MAX_BYTES) -> list[SweepProblem]:
    """`count` problems drawn with `seed` (the same seed, the same problems, on any machine)."""
    rng = np.random.default_rng(seed)
    problems: list[SweepProblem] = []
    while len(problems) < count:
        m, n, k = (_log_uniform(rng, 1, MAX_SIDE) for _ in range(3))
        if rng.random() < LONG_SHARE:
            side = int(rng.integers(3))
            long = _log_uniform(rng, MAX_SIDE, LONG_SIDE)
            m, n, k = (long if i == side else x for i, x in enumerate((m, n, k)))
        batch = _log_uniform(rng, 2, 64) if rng.random() < BATCHED_SHARE else 1
        problem = SweepProblem(m, n, k, batch, LAYOUTS[int(rng.integers(len(LAYOUTS)))])
        if problem.nbytes <= max_bytes:
            problems.append(problem)
    return problems


# Errors within this many times the correctly rounded result's count as equal in `error_ratio_past_rounding`: with a
# few terms (K <= 16, a third of the sweep) both libraries sum the same chain, and their ratio (median 1.00 there)
# scattered to 1.1-1.6 between two errors at float32's unit roundoff (docs/kernels/heuristic.md, the sweep).
ROUNDINGS = 2.0


# Where C has fewer elements than this, each side's relative error is the root mean square over enough draws of the
# inputs (the timed one and fresh ones, the same for both) to cover as many elements, at most MAX_DRAWS: over 1-4
# elements one draw's ratio is a sample of a few roundings (4x1x10886 (A^T) read 2.01x cuBLAS's error on one draw,
# 1.23x over 8 and 1.03x over 8 others; docs/kernels/heuristic.md, the sweep).
SMALL_OUTPUT, MAX_DRAWS = 4096, 64


def error_draws(problem: SweepProblem) -> int:
    """How many draws of the inputs `problem`'s errors are pooled over."""
    return min(MAX_DRAWS, -(-SMALL_OUTPUT // (problem.m * problem.n * problem.batch)))


def _pooled_errors(problem: SweepProblem, first: dict, draws: int, rng) -> dict:
    import cupy as cp

    import fastmm

    squares = {name: value ** 2 for name, value in first.items()}
    for _ in range(draws - 1):
        a, b = problem.make(rng, cp)
        ref = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
        for name, value in (("fastmm", np.matmul(fastmm.asarray(a), fastmm.asarray(b))), ("cublas", cp.matmul(a, b)),
                            ("rounded", ref.astype(cp.float32))):
            squares[name] += rel_error(value, ref) ** 2
    return {name: math.sqrt(total / draws) for name, total in squares.items()}


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else (1.0 if ours == 0 else math.inf)


def _percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else math.nan


def _geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(rows: list[dict], worst: int = 20) -> dict:
    """The distribution of speed (cuBLAS time / fastmm time: above 1 is faster) and of error (fastmm's relative
    error / cuBLAS's: below 1 is more accurate), the `worst` problems by speed and by error, and each rule's share:
    which rules a fix has to change."""
    speed = [r["speed"] for r in rows]
    error = [r["error_ratio"] for r in rows if math.isfinite(r["error_ratio"])]
    past = [r["error_ratio_past_rounding"] for r in rows
            if math.isfinite(r.get("error_ratio_past_rounding", math.nan))]
    by_rule: dict[str, list[dict]] = {}
    for r in rows:
        by_rule.setdefault(r["rule"], []).append(r)
    rules = {rule: {"problems": len(rs), "geomean": _geomean([r["speed"] for r in rs]),
                    "slowest": min(r["speed"] for r in rs), "below_0.9": sum(r["speed"] < 0.9 for r in rs),
                    "worst_error_ratio": max((r["error_ratio"] for r in rs if math.isfinite(r["error_ratio"])),
                                             default=math.nan)}
             for rule, rs in sorted(by_rule.items(), key=lambda item: -sum(r["speed"] < 0.9 for r in item[1]))}
    return {
        "problems": len(rows),
        "speed": {"p1": _percentile(speed, 1), "p5": _percentile(speed, 5), "median": _percentile(speed, 50),
                  "geomean": _geomean(speed), "below_0.9": sum(s < 0.9 for s in speed)},
        "error_ratio": {"median": _percentile(error, 50), "p95": _percentile(error, 95), "p99": _percentile(error, 99),
                        "above_1.5": sum(e > 1.5 for e in error), "above_1.1": sum(e > 1.1 for e in error),
                        "p99_past_rounding": _percentile(past, 99),
                        "above_1.1_past_rounding": sum(e > 1.1 for e in past) if past else math.nan},
        "worst": sorted(rows, key=lambda r: r["speed"])[:worst],
        "least_accurate": sorted((r for r in rows if math.isfinite(r["error_ratio"])),
                                 key=lambda r: -r["error_ratio"])[:worst // 2],
        "rules": rules,
    }


def _micros(row: dict) -> str:
    """Microseconds a call, fastmm / cuBLAS, each with its host time in brackets: a call whose host time reaches
    its per-call time waits on Python and the launch, not on its kernels."""
    secs, host = row["seconds"], row.get("host_seconds", {})
    return "/".join(f"{secs[x] * 1e6:.0f}({host.get(x, math.nan) * 1e6:.0f})" for x in ("fastmm", "cublas"))


def format_summary(summary: dict, seed: int) -> str:
    s, e = summary["speed"], summary["error_ratio"]
    lines = [f"sweep of {summary['problems']} problems (seed {seed}); speed = cuBLAS time / fastmm time, "
             "error ratio = fastmm's relative error / cuBLAS's",
             f"  speed        p1 {s['p1']:.2f}  p5 {s['p5']:.2f}  median {s['median']:.2f}  geomean {s['geomean']:.3f}"
             f"  ({s['below_0.9']} below 0.9x)",
             f"  error ratio  median {e['median']:.2f}  p95 {e['p95']:.2f}  p99 {e['p99']:.2f}"
             f"  ({e['above_1.1']} above 1.1x, {e['above_1.5']} above 1.5x; where C has < {SMALL_OUTPUT} elements, "
             f"each side's RMS over draws of as many, at most {MAX_DRAWS})",
             f"  past rounding  p99 {e['p99_past_rounding']:.2f}  ({e['above_1.1_past_rounding']} above 1.1x; errors "
             f"within {ROUNDINGS:g}x the correctly rounded product's count as equal)",
             f"  the {len(summary['worst'])} slowest against cuBLAS:",
             f"  {'problem':34s} {'speed':>6s} {'err ratio':>9s} {'us fastmm/cuBLAS (host)':>27s}  rule: kernel"]
    for r in summary["worst"]:
        lines.append(f"  {r['label']:34s} {r['speed']:6.2f} {r['error_ratio']:9.2f} {_micros(r):>27s}  "
                     f"{r['rule']}: {r['kernel']}")
    lines.append(f"  the {len(summary['least_accurate'])} least accurate against cuBLAS:")
    for r in summary["least_accurate"]:
        lines.append(f"  {r['label']:34s} {r['speed']:6.2f} {r['error_ratio']:9.2f}  {r['rule']}: {r['kernel']}")
    lines.append(f"  by rule: {'rule':22s} {'problems':>8s} {'geomean':>8s} {'slowest':>8s} {'below 0.9':>9s} "
                 f"{'worst err':>9s}")
    for rule, x in summary["rules"].items():
        lines.append(f"           {rule:22s} {x['problems']:8d} {x['geomean']:8.2f} {x['slowest']:8.2f} "
                     f"{x['below_0.9']:9d} {x['worst_error_ratio']:9.2f}")
    return "\n".join(lines)


def _plan_of(fa, fb) -> tuple[str, str]:
    import fastmm

    text = fastmm.explain(fa, fb)
    fields = dict(line.strip().split(None, 1) for line in text.splitlines()[1:] if line.startswith("  "))
    return fields.get("rule", "?").split(":", 1)[0], fields.get("kernel", "?").split()[0]


def run(problems: list[SweepProblem], *, seed: int, budget_s: float, show_progress: bool) -> list[dict]:
    """Measure the problems in order until `budget_s` seconds have passed; rows of the ones measured."""
    import cupy as cp

    import fastmm

    rng = np.random.default_rng(seed + 1)
    rows, started = [], time.perf_counter()
    bar = progress(len(problems), show_progress)
    for problem in problems:
        if time.perf_counter() - started > budget_s:
            break
        a, b = problem.make(rng, cp)
        fa, fb = fastmm.asarray(a), fastmm.asarray(b)
        ref = cp.matmul(a.astype(cp.float64), b.astype(cp.float64))
        out_shape = ref.shape
        outs = {"fastmm": fastmm.asarray(cp.empty(out_shape, cp.float32)), "cublas": cp.empty(out_shape, cp.float32)}
        calls = {"fastmm": lambda i: np.matmul(fa, fb, out=outs["fastmm"]),
                 "cublas": lambda i: cp.matmul(a, b, out=outs["cublas"])}
        seconds, errors, host = {}, {}, {}
        for name, fn in calls.items():
            outs[name].fill(cp.nan)  # an element nobody writes cannot pass
            fn(0)
            errors[name] = rel_error(outs[name], ref)
            returned: list[float] = []
            seconds[name] = time_per_call(fn, 1, warmup=1, runs=5 if problem.flops < 1e12 else 3,
                                          min_seconds=0.01, host=returned)
            host[name] = returned[0]
        errors["rounded"] = rel_error(ref.astype(cp.float32), ref)  # the exact product rounded once: the floor
        draws = error_draws(problem)
        if draws > 1:
            errors = _pooled_errors(problem, errors, draws, np.random.default_rng([seed + 1, len(rows)]))
        rule, kernel = _plan_of(fa, fb)
        rows.append({"label": problem.label, **dataclasses.asdict(problem), "rule": rule, "kernel": kernel,
                     "speed": seconds["cublas"] / seconds["fastmm"], "seconds": seconds, "host_seconds": host,
                     "errors": errors, "error_draws": draws,
                     "error_ratio": _ratio(errors["fastmm"], errors["cublas"]),
                     "error_ratio_past_rounding": _ratio(*(max(errors[x], ROUNDINGS * errors["rounded"])
                                                           for x in ("fastmm", "cublas")))})
        bar.update(1)
    bar.close()
    return rows


def main(args) -> int:
    problems = draw(args.sweep, args.sweep_seed)
    rows = run(problems, seed=args.sweep_seed, budget_s=args.sweep_budget, show_progress=not args.no_progress)
    if len(rows) < len(problems):
        print(f"the time budget ({args.sweep_budget:.0f} s) covered {len(rows)} of {len(problems)} problems; "
              "raise --sweep-budget for the rest", file=sys.stderr)
    if not rows:
        return 1
    summary = summarize(rows)
    print(format_summary(summary, args.sweep_seed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.sweep_seed,
                       "summary": {k: v for k, v in summary.items() if k not in ("worst", "least_accurate")},
                       "rows": rows}, f, indent=1, default=str)
    return 0
