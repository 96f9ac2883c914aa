"""How long a run of K each plan sums into one FP32 accumulator: the plan's side of accuracy.

A float32 sum of n products has a rounding error that grows with n (about sqrt(n) ulps for random data, n in the
worst case), so the longest run of terms added into one accumulator is what a plan decides about accuracy. The
kernels shorten it in three ways: partial sums over runs of K (`flush`), sums per K-tile (`tile_sums`), and
split-K (slices summed in a fixed order); the few-column kernel spreads K over a warp's lanes and folds their sums.
docs/kernels/heuristic.md, section 'Accuracy: the longest running sum', has the measurements behind the bound.
"""

from __future__ import annotations

from ..kernels.configs import FewColumns, WarpTile
from .problem import Choice, Device, Problem
from .table import aligned_copies, choose, interior, split_cut

__all__ = ["serial_run", "SERIAL_RUN_BOUND"]

# A running sum of this many terms or fewer kept fastmm's error at or below cuBLAS's on the shapes measured.
SERIAL_RUN_BOUND = 4096

# The few-column kernel (7_few_columns.cu): each lane adds 4 of every 128-deep step of K (16 where A has unit
# stride along M: a warp takes every 8th k); a matrix-vector product restarts its sums every 8 steps (FOLD) and
# adds those blocks in order.
_STEP, _FOLD = 128, 8


def _run_of(config, k: int, a_t: bool = False, edges: bool = False) -> int:
    """The longest run of terms one accumulator of `config` adds, over a K of `k` (an upper bound); `edges`: some of
    its blocks cross C's edges, which a sub-tile loop leaves to the unrolled path's one running sum."""
    if isinstance(config, WarpTile) and config.sub_k and (edges or k % config.bk):
        return k  # (a loop on a ragged K, forced or tuned, leaves every block to the unrolled path)
    if isinstance(config, FewColumns):
        per_step = 16 if a_t or config.nmax > 16 else 4  # past 16 columns a warp takes every 8th k in every layout
        steps = -(-k // (_STEP * config.cluster))
        if config.nmax == 1:
            return max(1, min(steps, _FOLD) * per_step, -(-steps // _FOLD))
        return max(1, steps * per_step)
    if isinstance(config, WarpTile) and config.flush and k > config.flush:
        return max(config.flush, -(-k // config.flush))  # runs of `flush`, then the runs' sums in order
    if isinstance(config, WarpTile) and config.tile_sums:
        return max(config.bk, -(-k // config.bk))  # sums per K-tile, then those in order
    return k


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
    edges = isinstance(config, WarpTile) and bool(problem.m % config.bm or problem.n % config.bn)
    if splits > 1:
        depth, full, tail = split_cut(k, splits)
        return max(_run_of(config, depth, choice.variant.a_t, edges),
                   _run_of(config, tail, choice.variant.a_t, edges) if tail else 0, full + (tail > 0))
    return _run_of(config, k, choice.variant.a_t, edges)
