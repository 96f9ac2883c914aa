"""What every measuring tool shares: whether a GPU is there, the relative error, the timed median per call, and a
progress bar. The method is described in docs/measuring.md."""

from __future__ import annotations

import math
import statistics
import sys
import time

__all__ = ["L2_BYTES", "no_gpu", "rel_error", "time_per_call", "progress"]

L2_BYTES = 50 * 2**20  # H100: 50 MB, H200: 60 MB; the smaller is the safer bound for rotation


def no_gpu(command: str) -> bool:
    """Say so (on stderr), with why and what works without one, and return True when no CUDA GPU can run `command`."""
    from .._runtime.cuda import why_no_gpu

    reason = why_no_gpu()
    if reason is None:
        return False
    print(f"python -m fastmm {command} needs a CUDA GPU: {reason}.\nWithout a GPU: python -m fastmm info (what was "
          "found), explain M N K (the plan for a product), compile (every kernel, with nvcc alone).", file=sys.stderr)
    return True


def rel_error(c, ref) -> float:
    """‖c − ref‖ / ‖ref‖ (Frobenius), computed in float64; inf when c holds a NaN (an unwritten element)."""
    import cupy as cp

    c64 = cp.asarray(c).astype(cp.float64)
    if not bool(cp.isfinite(c64).all()):
        return math.inf
    denom = float(cp.linalg.norm(ref))
    return float(cp.linalg.norm(c64 - ref)) / (denom or 1.0)


def time_per_call(fn, n_sets: int, *, warmup: int = 2, runs: int = 7, min_seconds: float = 0.02,
                  host: list | None = None) -> float:
    """Median seconds per call of fn(i) over `runs` timed batches, with CUDA events on the current stream. Where
    `host` is a list, the median host seconds a call takes to return (the batch before its synchronize) is appended
    to it: a call whose host time reaches its per-call time is bound by the host, not by its kernels."""
    import cupy as cp

    for i in range(warmup):
        fn(i % n_sets)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    # Size a batch of calls so that one timed batch lasts about min_seconds.
    start.record()
    fn(0)
    end.record()
    end.synchronize()
    one = max(cp.cuda.get_elapsed_time(start, end) * 1e-3, 1e-6)
    inner = max(1, min(1000, int(min_seconds / one)))
    times, host_times = [], []
    for _ in range(runs):
        began = time.perf_counter()
        start.record()
        for i in range(inner):
            fn(i % n_sets)
        end.record()
        host_times.append((time.perf_counter() - began) / inner)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3 / inner)
    if host is not None:
        host.append(statistics.median(host_times))
    return statistics.median(times)


def progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm

        return tqdm(total=total, disable=not enabled, file=sys.stderr, leave=False, dynamic_ncols=True)
    except ImportError:  # pragma: no cover - tqdm is optional
        class _Bar:
            def __init__(self):
                self.n = 0

            def update(self, k=1):
                self.n += k
                if enabled:
                    print(f"\r{self.n}/{total}", end="", file=sys.stderr, flush=True)

            def set_description(self, s):
                pass

            def close(self):
                if enabled:
                    print(file=sys.stderr)

        return _Bar()
