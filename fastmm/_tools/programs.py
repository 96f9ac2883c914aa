"""``python -m fastmm bench --numpy-hook --programs``: whole NumPy programs, unchanged, with and without the hook.

A single product's speed-up is not what a program gets: its other work (elementwise code, LAPACK, Python) stays on
the host, and every product's operands cross to the GPU. So each program here runs three times, each in a fresh
process, timed on its second pass (the first loads BLAS, compiles or loads fastmm's kernels, fills pools):

- as NumPy runs it;
- with the hook's loops installed and nothing sent to the GPU: their clocks then give the seconds NumPy spent in
  float32, float64 and complex products, the program's *share* in products, and the bound that share allows (Amdahl:
  1 / (1 - share), products made free);
- under ``fastmm.accelerate_numpy()`` with its default settings, as a user runs it first: the speed-up, the fraction
  of the bound it reaches, and where the hook's time went (products on the GPU, products NumPy kept, the rest).

The programs are ours, each typical of a kind of NumPy code, in float32 unless said: they use NumPy only, and
each returns a number (a loss, a residual, a sum of eigenvalues) that the two runs must agree on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from typing import Callable

import numpy as np

__all__ = ["PROGRAMS", "Program", "amdahl_bound", "measure", "run", "print_table", "main"]

F4 = np.float32


def _n(size: int, scale: float) -> int:
    return max(8, int(size * scale))


def softmax_regression(scale: float) -> float:
    """Multinomial logistic regression by full-batch gradient descent: X @ W and X.T @ G each step."""
    rng = np.random.default_rng(0)
    n, d, c = _n(65536, scale), _n(1024, scale), _n(128, scale)
    x = rng.standard_normal((n, d), dtype=F4)
    y = rng.integers(0, c, n)
    w = np.zeros((d, c), F4)
    for _ in range(60):
        logits = x @ w
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
        p[np.arange(n), y] -= 1
        w -= F4(0.5) * (x.T @ p) / F4(n)
    return float(loss)


def subspace_iteration(scale: float) -> float:
    """The top eigenvalues of a symmetric matrix: A @ V, then QR on the host, with A unchanged throughout."""
    rng = np.random.default_rng(1)
    n, k = _n(12288, scale), _n(256, scale)
    b = rng.standard_normal((n, n), dtype=F4) / F4(math.sqrt(n))
    a = (b + b.T) / F4(2) + F4(3) * np.eye(n, dtype=F4)  # positive definite: the top eigenvalues are the largest
    v = np.linalg.qr(rng.standard_normal((n, k), dtype=F4))[0]
    for _ in range(25):
        v = np.linalg.qr(a @ v)[0]
    return float(np.trace(v.T @ (a @ v)))


def block_cg(scale: float) -> float:
    """Block conjugate gradients for a dense SPD system with 64 right-hand sides: A @ P each step, small solves.

    The result is the solution's norm once the residual is 1e-5 of the right-hand side's."""
    rng = np.random.default_rng(2)
    n, s = _n(8192, scale), _n(64, scale)
    g = rng.standard_normal((n, n), dtype=F4) / F4(math.sqrt(n))
    a = g.T @ g + F4(0.1) * np.eye(n, dtype=F4)  # condition number about 40: converges in a few tens of steps
    rhs = rng.standard_normal((n, s), dtype=F4)
    x = np.zeros_like(rhs)
    r = rhs.copy()
    p = r.copy()
    rr = r.T @ r
    for _ in range(100):
        if np.linalg.norm(r) < 1e-5 * np.linalg.norm(rhs):
            break
        q = a @ p
        alpha = np.linalg.solve(p.T @ q, rr)
        x += p @ alpha
        r -= q @ alpha
        rr_new = r.T @ r
        p = r + p @ np.linalg.solve(rr, rr_new)
        rr = rr_new
    return float(np.linalg.norm(x))


def alternating_least_squares(scale: float) -> float:
    """A dense low-rank factorization R ~ U V^T by alternating least squares: R @ V and R.T @ U, small solves."""
    rng = np.random.default_rng(3)
    m, n, r = _n(16384, scale), _n(8192, scale), _n(192, scale)
    rt = rng.standard_normal((m, r), dtype=F4) @ rng.standard_normal((r, n), dtype=F4) / F4(r)
    rt += F4(0.01) * rng.standard_normal((m, n), dtype=F4)  # noise below the low-rank signal
    u = rng.standard_normal((m, r), dtype=F4)
    v = rng.standard_normal((n, r), dtype=F4)
    reg = F4(0.1) * np.eye(r, dtype=F4)
    for _ in range(8):
        u = np.linalg.solve(v.T @ v + reg, (rt @ v).T).T
        v = np.linalg.solve(u.T @ u + reg, (rt.T @ u).T).T
    return float(np.linalg.norm(rt - u @ v.T) / np.linalg.norm(rt))


def attention_layers(scale: float) -> float:
    """A transformer encoder's forward pass: projections, batched Q K^T and softmax @ V, an MLP with GELU."""
    rng = np.random.default_rng(4)
    batch, length, d, heads = 8, _n(1024, scale), _n(512, scale), 8
    dh = max(1, d // heads)
    d = dh * heads
    h = rng.standard_normal((batch * length, d), dtype=F4)
    for _ in range(12):
        wq, wk, wv, wo = (rng.standard_normal((d, d), dtype=F4) / F4(math.sqrt(d)) for _ in range(4))
        w1 = rng.standard_normal((d, 4 * d), dtype=F4) / F4(math.sqrt(d))
        w2 = rng.standard_normal((4 * d, d), dtype=F4) / F4(math.sqrt(4 * d))
        q, k, v = ((h @ w).reshape(batch, length, heads, dh).transpose(0, 2, 1, 3) for w in (wq, wk, wv))
        scores = q @ k.transpose(0, 1, 3, 2) / F4(math.sqrt(dh))
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        att = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, d)
        h = h + att @ wo
        z = h @ w1
        z = F4(0.5) * z * (F4(1) + np.tanh(F4(0.7978846) * (z + F4(0.044715) * z ** 3)))
        h = h + z @ w2
        h = (h - h.mean(axis=1, keepdims=True)) / (h.std(axis=1, keepdims=True) + F4(1e-5))
    return float(np.abs(h).mean())


def covariance_float64(scale: float) -> float:
    """NumPy's default dtype: covariance updates and Cholesky solves in float64 (cuBLAS's DGEMM under the hook)."""
    rng = np.random.default_rng(5)
    n, d = _n(32768, scale), _n(2048, scale)
    total = 0.0
    for _ in range(4):
        x = rng.standard_normal((n, d))
        c = x.T @ x / n + np.eye(d)
        chol = np.linalg.cholesky(c)
        total += float(np.log(np.diag(chol)).sum())
    return total


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    run: Callable[[float], float]

    @property
    def what(self) -> str:
        return (self.run.__doc__ or "").strip().split("\n")[0]


PROGRAMS = {p.__name__: Program(p.__name__, p) for p in (softmax_regression, subspace_iteration, block_cg,
                                                          alternating_least_squares, attention_layers,
                                                          covariance_float64)}
MODES = ("numpy", "share", "hook")


def amdahl_bound(share: float) -> float:
    """The most a program can gain when a `share` of its time is made free: 1 / (1 - share)."""
    return math.inf if share >= 1 else 1.0 / (1.0 - share)


def _products(status: dict) -> dict:
    """The hook's lanes (every dtype it takes) added up: products on the GPU, kept by NumPy (by reason), seconds."""
    lanes = [lane for name, lane in status["by_dtype"].items() if name != "other dtypes"]
    return {"on_gpu": sum(x["on_gpu"] for x in lanes),
            "kept_on_cpu": {k: sum(x["kept_on_cpu"][k] for x in lanes) for k in lanes[0]["kept_on_cpu"]},
            "seconds": {k: sum(x["seconds"][k] for x in lanes) for k in lanes[0]["seconds"]}}


def measure(name: str, mode: str, scale: float = 1.0) -> dict:
    """Run program `name` twice in this process, the second timed: `mode` "numpy" (as it is), "share" (the hook's
    loops timing NumPy's own products of every dtype it takes, nothing offloaded) or "hook" (accelerate_numpy() with
    its defaults)."""
    program = PROGRAMS[name]
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if mode != "numpy":
        import warnings

        import fastmm
        from fastmm._hooks.numpy_hook import time_products_only

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no GPU here" where the hook runs on a host without one
            if mode == "share":
                time_products_only()
            else:
                fastmm.accelerate_numpy()
    program.run(scale)  # warm-up pass
    before = _products(fastmm.numpy_hook_status()) if mode != "numpy" else None
    t0 = time.perf_counter()
    checksum = program.run(scale)
    seconds = time.perf_counter() - t0
    row = {"program": name, "mode": mode, "seconds": seconds, "checksum": checksum}
    if before is not None:
        after = _products(fastmm.numpy_hook_status())
        row["product_seconds"] = {k: after["seconds"][k] - before["seconds"][k] for k in after["seconds"]}
        row["on_gpu"] = after["on_gpu"] - before["on_gpu"]
        row["kept_on_cpu"] = {k: after["kept_on_cpu"][k] - before["kept_on_cpu"][k] for k in after["kept_on_cpu"]}
    return row


def _child(name: str, mode: str, scale: float) -> dict:
    """`measure` in a fresh process (a program's memory, threads and hook state are its own)."""
    code = ("import json, sys; from fastmm._tools.programs import measure; "
            f"print(json.dumps(measure({name!r}, {mode!r}, {scale!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"program {name} ({mode}) failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(numpy_row: dict, share_row: dict, hook_row: dict) -> dict:
    """One program's line: NumPy and hook seconds, speed-up, share in products, bound, fraction of the bound, where
    the hook's time went, and whether the two runs agree."""
    share = min(1.0, share_row["product_seconds"]["kept_on_cpu"] / share_row["seconds"])
    bound = amdahl_bound(share)
    speedup = numpy_row["seconds"] / hook_row["seconds"]
    ps = hook_row["product_seconds"]
    a, b = numpy_row["checksum"], hook_row["checksum"]
    return {"program": numpy_row["program"], "numpy_s": numpy_row["seconds"], "hook_s": hook_row["seconds"],
            "speedup": speedup, "share": share, "bound": bound,
            "of_bound": speedup / bound if math.isfinite(bound) else None,
            "hook_gpu_s": ps["on_gpu"], "hook_numpy_s": ps["kept_on_cpu"] + ps["deciding_then_declining"],
            "hook_rest_s": hook_row["seconds"] - ps["on_gpu"] - ps["kept_on_cpu"] - ps["deciding_then_declining"],
            "on_gpu": hook_row["on_gpu"], "kept_on_cpu": sum(hook_row["kept_on_cpu"].values()),
            "agree": abs(a - b) <= 1e-3 * max(abs(a), abs(b), 1e-30)}


def median_run(runs: list[dict]) -> dict:
    """Of one mode's runs, the one with the median time (the lower middle of an even number)."""
    return sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]


def run(names=None, scale: float = 1.0, repeat: int = 1) -> list[dict]:
    """Each program's line; with `repeat` > 1 each mode runs that many times, the modes taking turns (a host's
    drift touches all three alike), and each mode's median run counts: one run each varied by 15% on our host,
    too much to tell 0.97x from 1.0x."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1 (got {repeat})")
    rows = []
    for name in names or PROGRAMS:
        runs = {mode: [] for mode in MODES}
        for _ in range(repeat):
            for mode in MODES:
                runs[mode].append(_child(name, mode, scale))
        rows.append(summarize(*(median_run(runs[mode]) for mode in MODES)))
        rows[-1]["runs"] = repeat
        print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    of_bound = f"{r['of_bound']:5.0%}" if r["of_bound"] is not None else "    -"
    print(f"  {r['program']:26s} {r['numpy_s']:8.2f} {r['hook_s']:8.2f} {r['speedup']:6.2f}x {r['share']:6.0%} "
          f"{r['bound']:7.2f}x {of_bound}   {r['hook_gpu_s']:6.2f} {r['hook_numpy_s']:6.2f} {r['hook_rest_s']:6.2f}"
          f"  {r['on_gpu']:5d}/{r['kept_on_cpu']:<5d} {'' if r['agree'] else '  RESULTS DIFFER'}", flush=True)


def print_table(rows) -> None:
    print("NumPy programs, unchanged, with and without accelerate_numpy() (fresh processes, second pass timed)")
    print(f"  {'program':26s} {'NumPy s':>8s} {'hook s':>8s} {'gain':>7s} {'share':>6s} {'bound':>8s} {'of it':>5s}"
          f"   {'GPU s':>6s} {'CPU s':>6s} {'rest s':>6s}  {'on GPU/kept':>11s}")
    for r in rows:
        print_row(r)
    print("  share: NumPy's time in float32, float64 and complex products (the hook's loops timing NumPy's own); "
          "bound: 1 / (1 - share); "
          "GPU s / CPU s: the hook's products on the GPU and those NumPy kept; rest: everything else")


def main(args) -> int:
    names = [n for n in (args.programs_only or "").split(",") if n] or list(PROGRAMS)
    unknown = sorted(set(names) - set(PROGRAMS))
    if unknown:
        print(f"bench --programs: unknown program(s) {unknown}; valid: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    repeat = getattr(args, "programs_repeat", 1)
    if repeat < 1:
        print(f"bench --programs-repeat must be at least 1 (got {repeat})", file=sys.stderr)
        return 2
    rows = run(names, args.programs_scale, repeat)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["agree"] for r in rows) else 1
