"""How long a run of K each plan sums into one FP32 accumulator: the plan's side of accuracy.

A float32 sum of n products has a rounding error that grows with n (about sqrt(n) ulps for random data, n in the
worst case), so the longest run of terms added into one accumulator is what a plan decides about accuracy. The
kernels shorten it in three ways: partial sums over runs of K (`flush`), sums per run of K-tiles (`tile_sums`), and
split-K (slices summed in a fixed order); the few-column kernel spreads K over a warp's lanes and folds their sums.
docs/kernels/heuristic.md, section 'Accuracy: the longest running sum', has the measurements behind the bound.
"""

from __future__ import annotations

from ..kernels.configs import WarpTile
from .problem import Choice, Device, Problem
from .runs import SERIAL_RUN_BOUND
from .runs import run_of as _run_of
from .table import aligned_copies, choose, interior, split_cut

__all__ = ["serial_run", "SERIAL_RUN_BOUND"]

def serial_run(choice: Choice, problem: Problem, device: Device = Device()) -> int:
    """The longest run of terms that `choice` adds into one FP32 accumulator for `problem`.

    Split-K counts its deepest slice and the slices' sum (in order); a product on aligned copies or with its ragged
    edges peeled off counts the plan of the copies or of the interior (the edges' few-column runs are shorter); blocks
    across C's edges on a sub-tile loop's tile count the one running sum of the unrolled path they take."""
    if problem.k == 0:
        return 0
    if choice.pad:
        copies = aligned_copies(problem)
        return serial_run(choose(copies, device, "auto"), copies, device)
    if choice.peel != (0, 0):
        inside = interior(problem, choice.peel)
        return serial_run(choose(inside, device, "auto"), inside, device)
    k, splits, config = problem.k, choice.splits, choice.config
    edges = (isinstance(config, WarpTile) and bool(problem.m % config.bm or problem.n % config.bn)
             and not config.loops_edges(choice.variant))
    if splits > 1:
        depth, full, tail = split_cut(k, splits, config)
        return max(_run_of(config, depth, choice.variant.a_t, edges),
                   _run_of(config, tail, choice.variant.a_t, edges) if tail else 0, full + (tail > 0))
    return _run_of(config, k, choice.variant.a_t, edges)
