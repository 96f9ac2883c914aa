"""The longest run of terms one accumulator of a kernel configuration adds over a K: the kernels' side of accuracy
(`accuracy.serial_run` puts a plan's launches together; the plan's rules read it too)."""

from __future__ import annotations

from ..kernels.configs import FewColumns, Naive, WarpTile

__all__ = ["run_of", "lane_terms", "blocked", "tile_sums_run", "SERIAL_RUN_BOUND"]

# A running sum of this many terms or fewer kept fastmm's error at or below cuBLAS's on the shapes measured.
SERIAL_RUN_BOUND = 4096

# The few-column kernel (7_few_columns.cu): each lane adds 4 of every 128-deep step of K (16 where it owns a row, as
# where A has unit stride along M: a warp takes every 8th k); up to 8 columns, and up to 16 where a lane owns a row
# (BLOCKED), it restarts its sums every 8 steps (every 2 where a lane owns a row: FOLD) and adds those blocks
# in order.
_STEP, _BLOCKED_NMAX, _LANE_ROWS_BLOCKED_NMAX = 128, 8, 16


def run_of(config, k: int, a_t: bool = False, edges: bool = False) -> int:
    """The longest run of terms one accumulator of `config` adds, over a K of `k` (an upper bound); `edges`: some of
    its blocks cross C's edges and `config` leaves them to the unrolled path's one running sum (a sub-tile loop, but
    where `WarpTile.loops_edges`)."""
    if isinstance(config, Naive) and config.f64_sums:
        return 1  # float64 sums: the one float32 rounding is C's
    if isinstance(config, WarpTile) and config.sub_k and (edges or k % config.bk and not config.ragged):
        return k  # (a loop forced or tuned onto a ragged K leaves every block to the unrolled path)
    if isinstance(config, FewColumns):
        if blocked(config, a_t):
            lane_rows = lane_owns_row(config, a_t)
            steps, fold = -(-k // (_STEP * config.cluster)), 2 if lane_rows else 8
            return max(1, min(steps, fold) * _per_step(lane_rows), -(-steps // fold))
        return lane_terms(config, k, a_t)
    if isinstance(config, WarpTile) and config.flush and k > config.flush:
        tail = k % config.bk if config.ragged else 0  # (a ragged K's last terms join the last run)
        return max(config.flush + tail, -(-k // config.flush))  # runs of `flush`, then the runs' sums in order
    if isinstance(config, WarpTile) and config.tile_sums:
        run = tile_sums_run(config, k)
        return max(min(run, k), -(-k // run))  # sums per run of K-tiles, then those in order
    return k


def tile_sums_run(config: WarpTile, k: int) -> int:
    """The terms of one partial sum of a tile-sums configuration over a K of `k` (4_warptile.cu's run_tiles): runs of
    `tile_sums` K-tiles, at most a quarter of the K-tiles (one at least)."""
    return max(1, min(config.tile_sums, -(-k // config.bk) // 4)) * config.bk


def lane_owns_row(config: FewColumns, a_t: bool) -> bool:
    """The few-column kernel's LANE_ROWS: a lane owns a row of C where A has unit stride along M or past 16 columns."""
    return a_t or config.nmax > 16


def blocked(config: FewColumns, a_t: bool) -> bool:
    """The few-column kernel's BLOCKED: its lanes restart their sums every few steps (else one running sum a lane)."""
    return config.nmax <= (_LANE_ROWS_BLOCKED_NMAX if lane_owns_row(config, a_t) else _BLOCKED_NMAX)


def _per_step(lane_rows: bool) -> int:
    return 16 if lane_rows else 4


def lane_terms(config: FewColumns, k: int, a_t: bool = False) -> int:
    """The terms of K one lane of the few-column kernel multiplies into one element of C, its slice of K over a
    cluster (its one running sum where it keeps one)."""
    return max(1, -(-k // (_STEP * config.cluster)) * _per_step(lane_owns_row(config, a_t)))
