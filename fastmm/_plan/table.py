"""The heuristic table and `choose`: rules in order, the first whose test holds names the kernel, unless a kernel is
forced or an autotuned entry covers the product; then the current precision mode's tiles.

The numbers in the rules are break-even points measured with ``python -m fastmm bench``; the measurements are in
docs/kernels/heuristic.md, section 'The heuristic's break-even points'.
"""

from __future__ import annotations

import dataclasses
import logging

from ..kernels.configs import BY_NAME, FAMILIES, WarpTile, WgTile, get_config
from . import tuned as _tuned
from .forced import _FAMILY_DEFAULT, _check_name, _forced, validated
from .forced import OZAKI
from .precision import (_WG_MIN_MACS, _WG_MIN_SIDE, OZAKI_INT8, _check_precision, _hopper, _macs, _ozaki, _tensor, _wgmma,
                        current_precision, ozaki_fallback, ozaki_reason)
from .problem import _FEW, Choice, Device, Problem, Rule, RuleName
from .few import (_NARROW_FEW, _NARROW_FEW_MIN_K, _WIDE_FEW, _WIDE_FEW_DEPTH, _WIDE_FEW_SHORT_DEPTH,
                  _WIDE_FEW_SHORT_OTHER, _FEW_SUM_MIN_MACS, _FEW_TILES_MAX_K, _few, _few_columns_kernel, _few_on_tiles,
                  _narrow_few, _short_k_few, _wide_few, _wide_few_kernel, few_columns_splits)
from .splits import (_SPLIT_K_OVER_MN, _SPLIT_MIN_K, _SPLIT_MIN_SLICE, _even_splits, balanced_splits,
                     slices_of, split_cut)
from .tiles import (SMALL_TILES, small_tile, _MIN_USEFUL, _MIN_WAVE, _NARROW_AREA, _NARROW_MIN_K, _NARROW_TILE_OTHER,
                    _SHORT_K, FEW_COLUMNS, NAIVE, NAIVE_F64, NAIVE_F64_DOT, NAIVE_SHORT, WT64, WT256_SLICES,
                    WT256_SLICES_RAGGED, WT128x64, WT128x64_LOOP, _few_tiles, _fill, _lighter, _looped, _narrow_tile,
                    _useful)
from .tuned import tune_bucket, tuned_entries

_log = logging.getLogger("fastmm")

__all__ = ["RULES", "choose", "split_cut", "split_count", "few_columns_splits", "mid_splits", "idle_splits", "wave_splits",
           "tiled_splits", "peel_edges", "pads", "padded_k", "aligned_copies", "without_copies", "items_in_turn",
           "after_out_of_memory", "interior", "narrow_splits"]

# Products this small are bound by their launch: float64 sums cost them nothing and round C once, a warp's lanes
# sharing K from the fourth constant's K where the warps fit, else a thread per element of C up to the second
# constant's K (and third's elements), at most the threads and warps the probe found free (a thread walking K alone
# waits on each load in turn: past K = 16 that, not the host, set the call's time) (docs/kernels/heuristic.md,
# section 'The heuristic's break-even points', small). GPUs whose float64 runs at 1/32 or 1/64 of float32 (most
# GeForce, L4, T4) take 1/8 of the multiply-adds.
_SMALL_MACS, _SMALL_THREAD_K, _SMALL_OUTPUTS, _SMALL_K = 1 << 21, 96, 1 << 17, 4096
_SMALL_THREADS, _SMALL_WARPS, _SMALL_SLOW_F64_MACS, _SMALL_LANES_K = 576 << 10, 24 << 10, 1 << 18, 16


def _small_lanes(problem: Problem) -> bool:
    """A warp per element of C (8 columns a block): from K = 17, where the warps fit."""
    return problem.k > _SMALL_LANES_K and problem.batch * problem.m * -(-problem.n // 8) * 8 <= _SMALL_WARPS


def _small(problem: Problem, device: Device) -> bool:
    outputs = problem.batch * problem.m * problem.n
    most = _SMALL_MACS if device.full_rate_fp64 else _SMALL_SLOW_F64_MACS
    if outputs * problem.k > most or problem.k > _SMALL_K:
        return False
    if _small_lanes(problem):
        return True
    if problem.k > _SMALL_THREAD_K:
        return False
    # a thread per element, blocks of 8 rows x 32 columns
    return (outputs <= _SMALL_OUTPUTS
            and problem.batch * -(-problem.m // 8) * 8 * -(-problem.n // 32) * 32 <= _SMALL_THREADS)


# A sum of this many outer products or fewer (K), over at least the second constant's elements of C (the batch's), A
# not m-contiguous: bound by writing C, a thread per 4x4 piece of it (no shared memory, no barrier) kept more stores
# in flight than the 64x64 tiles: 0.72-0.82x cuBLAS -> 0.90-1.48x; from K = 4, and with A m-contiguous, it lost
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', outer-products).
_OUTER_MAX_K, _OUTER_MIN_OUTPUT = 3, 1 << 23


def _outer_products(problem: Problem, device: Device) -> bool:
    return (problem.k <= _OUTER_MAX_K and not problem.a_t
            and problem.batch * problem.m * problem.n >= _OUTER_MIN_OUTPUT)


# Narrow products (an output side below this) with a long K are split too, for accuracy as much as speed
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k).
_NARROW = 32


def _narrow_output(problem: Problem) -> bool:
    return min(problem.m, problem.n) < _NARROW


def _long_k(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or problem.k < _SPLIT_MIN_K:
        return False
    if _narrow_output(problem):
        return True
    if problem.k < _SPLIT_K_OVER_MN * max(problem.m, problem.n):
        return False
    tiled = get_config(_fill(problem, device))  # K dwarfs the output: split where its tiles leave block slots empty
    return _few_tiles(problem, device) or problem.tiles(tiled) < tiled.min_blocks * device.sm_count


# Split-K's slices take the 128x64 tile only where it covers C at least this share as tightly as the four-warp tile:
# 163x174x6204 (Fortran), 58% of its area inside C against 77%, ran 0.88x cuBLAS on it and 1.23x on 64x64 slices
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k).
_SPLIT_PADDING = 0.9


def _split_for(problem: Problem, device: Device) -> str:
    """The tile of split-K's slices: 128x256 where both sides of the output hold it with little padding, 128x64 where
    they hold that and it pads not much more than 64x64 tiles, else 64x64 (or a narrow four-warp tile that pads far
    less: `small_tile`); the large tiles on their sub-tile loops (slices are whole 16-deep steps). (17-32 rows or
    columns against 64 or more take the narrow-tiles rule before this one.)

    The 128x256 slices sum K in runs of 512 (partial sums): cuBLAS's accuracy at the same speed. The measurements:
    docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k."""
    side = min(problem.m, problem.n)
    if side >= 256 and _useful(problem, get_config(WT256_SLICES)) >= _MIN_USEFUL:
        return _looped(problem, WT256_SLICES)  # (its twin where C's edges would leave blocks to one running sum)
    small = small_tile(problem)
    useful = _useful(problem, get_config(WT128x64_LOOP)) >= _SPLIT_PADDING * _useful(problem, get_config(small))
    return WT128x64_LOOP if side >= 128 and useful else small


def split_count(problem: Problem, device: Device) -> int:
    """Slices of K for split-K. On the 128x256 and 128x64 tiles, the most that keep all blocks in one wave, in whole
    16-deep steps (see below); otherwise (64x64 tiles, or no even cut) about _SPLIT_SLICE deep, deeper only where
    that leaves less than a wave of blocks (never shallower than _SPLIT_MIN_SLICE).

    On 64x64 tiles the best depth was about 500 whatever the output; on the large tiles a second wave cost more
    than deeper slices in one (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k).
    """
    name = _split_for(problem, device)
    config = get_config(name)
    tiles = problem.tiles(config)
    if name not in SMALL_TILES:
        # The large tiles: the most slices that keep every block in one wave, cut in whole 16-deep steps (an uneven
        # last slice runs as a launch of its own).
        most = config.min_blocks * device.sm_count // tiles
        even = _even_splits(problem, config, most, _SPLIT_MIN_SLICE)
        if even and 5 * max(even) >= 3 * most:  # an even cut that fills 60% of the block slots
            return max(even)
        if name in (WT256_SLICES, WT256_SLICES_RAGGED) and most >= 2 and problem.k // most >= _SPLIT_MIN_SLICE:
            return most  # no even cut fills the slots: the rest (under 16 x most deep) runs as one shallow launch
    return _balanced(problem, device, config, slices_of(problem, device, config))


def _balanced(problem: Problem, device: Device, config, own: int, least: int = 2) -> int:
    """`own` slices, or on the unrolled warp tiles of a single product the count that best balances the SMs' work
    (`balanced_splits`)."""
    if problem.batch != 1 or not isinstance(config, WarpTile) or config.sub_k:
        return own
    return balanced_splits(problem, device, config, own, least)


def _narrow_tiles(problem: Problem, device: Device) -> bool:
    """17-32 rows (columns) against at least _NARROW_TILE_OTHER columns (rows), K from _NARROW_FEW_MIN_K, that the
    wide-few-columns rule (before it) leaves: the narrow tiles, their blocks sharing the large operand's reads over 32
    rows (columns)."""
    few, other = sorted((problem.m, problem.n))
    return (problem.batch == 1 and _FEW < few <= _WIDE_FEW and other >= _NARROW_TILE_OTHER
            and problem.k >= _NARROW_FEW_MIN_K)


def narrow_splits(problem: Problem, device: Device) -> int:
    """Slices of K on the narrow tiles: as split-K's on small tiles from K = _IDLE_MIN_K, none below."""
    if problem.k < _IDLE_MIN_K:
        return 1
    config = get_config(_narrow_tile(problem))
    return _balanced(problem, device, config, slices_of(problem, device, config))


# Split-K over a short K where the tiled rule's tile gives fewer than this fraction of the SMs a block, in products
# that pay for a second launch (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k-mid).
_IDLE_SMS = 0.8
_MID_MIN_DEPTH = 128
_MID_MIN_MACS = 1 << 28
# Small outputs (between these counts of 64x64 tiles per SM) split over 64x64 tile sums instead: half cuBLAS's error
# at about its speed (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k-mid).
_MID_SUMS_TILES = (0.5, 1.25)
_MID_SUMS_DEPTH = 128
_MID_SUMS_MOST = 8


def _idle_sms(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or _narrow_output(problem) or problem.m * problem.n * problem.k < _MID_MIN_MACS:
        return False
    if _useful(problem, get_config(WT128x64)) < _MIN_USEFUL and _mid_sums_splits(problem, device) == 1:
        return False  # 128x64 tiles mostly padding (64 rows): split-k-idle's 64x64 slices
    # (Judged on the 128x256 tile from half a wave, as split-k-mid was measured, not on the unsplit product's tile.)
    tiled = get_config(_fill(problem, device, big_tile_min_wave=_MIN_WAVE))
    return problem.tiles(tiled) < _IDLE_SMS * device.sm_count and mid_splits(problem, device) > 1


def _mid_sums_splits(problem: Problem, device: Device) -> int:
    """Slices of 64x64 tile-sum tiles for a small output (see above), or 1 where the output is larger or smaller or K has
    no even split into slices at least _MID_SUMS_DEPTH deep."""
    config = get_config(WT64)
    low, high = _MID_SUMS_TILES
    if not low * device.sm_count <= problem.tiles(config) <= high * device.sm_count:
        return 1
    return max(_even_splits(problem, config, min(_MID_SUMS_MOST, problem.k // _MID_SUMS_DEPTH), _MID_SUMS_DEPTH),
               default=1)


def _mid_kernel(problem: Problem, device: Device) -> str:
    return WT64 if _mid_sums_splits(problem, device) > 1 else WT128x64


def mid_splits(problem: Problem, device: Device) -> int:
    """Slices of K for split-K on a short K (see _IDLE_SMS); 1 where K has no even split into 16-deep steps."""
    sums = _mid_sums_splits(problem, device)
    if sums > 1:
        return sums
    config = get_config(WT128x64)
    tiles = problem.tiles(config)
    counts = _even_splits(problem, config, problem.k // _MID_MIN_DEPTH, _MID_MIN_DEPTH)
    # The busiest SM's share of the work; on a tie the fewest slices (each adds a slice to the sum's pass).
    return min(counts, key=lambda s: (-(-tiles * s // device.sm_count) * (problem.k // s), s), default=1)


# Split-K where even 64x64 tiles fill less than this share of the GPU's block slots (4 per SM) on a long K: a
# lone block walks K latency-bound, about 0.55 us per 16-deep step on an H100, where a wave of slices shares it
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k-idle).
_IDLE_SLOTS = 0.5
_IDLE_MIN_K = 1024
_IDLE_MIN_SLICE = 256
_IDLE_K_OVER_MN = 4
# ... and from K = 512 where SMs have no block at all and the output's shorter side is 48 to 256, in slices at least 128
# deep: 0.56-0.72x cuBLAS unsplit, 0.95-1.2x split; below 512 the second launch cost more than it saved, as it did for
# a shorter side of 428 (docs/kernels/heuristic.md, split-k-idle). Under 48 the few-column kernels take them.
_IDLE_SHORT_K, _IDLE_SHORT_SLICE, _IDLE_SHORT_SIDES = 512, 128, (48, 256)
# A batch whose tiles, all items together, leave SMs without a block, from this K: every item's slices as one launch
# (one wave of block slots), their sums as one more: 70 such batches of 2 to 47 items on an H200, K 527 to 68651, split
# gained 1.03-20x over unsplit (docs/kernels/split-k.md, section 'Small batches').
_BATCH_SPLIT_K = 512
# Where a batch's axes do not collapse to one launch of its slices (A's batch axes swapped, say), each item is split on
# its own in turn, three launches an item, only from K = this x the batch and up to this many items (1.2-2.6x cuBLAS's
# speed split from 1216 per item, slower at 562 and 679: split-k.md, 'Small batches'); else one launch unsplit.
_IN_TURN_K, _IN_TURN_MAX = 1024, 8


def items_in_turn(k: int, batch: int) -> bool:
    """Whether a split batch that cannot run as one launch of its slices runs item by item, each split (else
    unsplit)."""
    return batch <= _IN_TURN_MAX and k >= _IN_TURN_K * batch


def _idle_slots(problem: Problem, device: Device) -> bool:
    tiles = problem.tiles(get_config(WT64))
    if problem.batch != 1:
        return problem.k >= _BATCH_SPLIT_K and tiles < device.sm_count
    if problem.k < _IDLE_SHORT_K:
        return False
    if problem.k < _IDLE_MIN_K:
        low, high = _IDLE_SHORT_SIDES
        return tiles < device.sm_count and low <= min(problem.m, problem.n) <= high
    # Some SMs without a block at all, or few blocks per SM on a K that dwarfs the output.
    return tiles < device.sm_count or (tiles < _IDLE_SLOTS * get_config(WT64).min_blocks * device.sm_count
                                       and problem.k >= _IDLE_K_OVER_MN * max(problem.m, problem.n))


def idle_splits(problem: Problem, device: Device) -> int:
    """Slices of K on the four-warp tile (64x64, or a narrow one that pads far less: `small_tile`): in a batch, as many
    as fill one wave of its block slots with every item's slices, each at least _IDLE_MIN_SLICE deep
    (_IDLE_SHORT_SLICE on a K under _IDLE_MIN_K); a single product, the count that evens out the SMs' blocks
    (`balanced_splits`)."""
    config = get_config(small_tile(problem))
    slots = config.min_blocks * device.sm_count
    depth = _IDLE_MIN_SLICE if problem.k >= _IDLE_MIN_K else _IDLE_SHORT_SLICE
    own = max(2, min(slots // problem.tiles(config), problem.k // depth))
    return _balanced(problem, device, config, own)


def _wave_slots(problem: Problem, device: Device) -> bool:
    """K >= _IDLE_MIN_K where the tiled rule's 64x64 tiles fill less than one wave of the GPU's block slots
    (docs/kernels/heuristic.md, section 'The heuristic's break-even points', split-k-wave)."""
    if problem.batch != 1 or problem.k < _IDLE_MIN_K:
        return False
    config = get_config(WT64)
    return problem.tiles(config) < config.min_blocks * device.sm_count and _fill(problem, device) in SMALL_TILES


def wave_splits(problem: Problem, device: Device) -> int:
    """Slices of K on the four-warp tiles (`small_tile`) of a single product with K >= _IDLE_MIN_K (the rule's): the
    count, 2 or more, that evens out the SMs' blocks (`balanced_splits`)."""
    return _balanced(problem, device, get_config(small_tile(problem)), 2)


# The tiled rule's unrolled tiles split K from this depth where the SMs' shares of blocks are uneven (`balanced_splits`;
# below it a second launch measured slower on small products: 512^3, 640^3, 428x1091x642), up to the second constant's
# waves of block slots, the range the model was fitted on (past it a split evens out a few percent of the blocks at the
# cost of a workspace several times C; docs/kernels/split-k.md, section 'How many slices').
_TILED_SPLIT_MIN_K, _TILED_SPLIT_MAX_WAVES = 1024, 3


# Below _TILED_SPLIT_MIN_K, a single product's four-warp tiles just past one block per SM (a few SMs with a second,
# which set its time), from this K: in this many slices, 3 or 4 blocks on every SM (102x4369x905 0.66x -> 0.83x cuBLAS,
# 165x3498x435 (B^T) 0.86x -> 1.09x; docs/kernels/heuristic.md, section 'tiled: just past one block per SM').
_PAST_ONE_BLOCK_MIN_K, _PAST_ONE_BLOCK_SMS, _PAST_ONE_BLOCK_SPLITS = 384, 4 / 3, 3


def tiled_splits(problem: Problem, device: Device) -> int:
    """Slices of K for the tiled rule: 1, or on the unrolled warp tiles of a single product from K = _TILED_SPLIT_MIN_K,
    up to _TILED_SPLIT_MAX_WAVES waves of their blocks, the count that best balances the SMs' work; below it, where
    the four-warp tiles are just past one block per SM, _PAST_ONE_BLOCK_SPLITS."""
    name = _fill(problem, device)
    config = get_config(name)
    if problem.k < _TILED_SPLIT_MIN_K:
        past_one_block = (problem.batch == 1 and name in SMALL_TILES and problem.k >= _PAST_ONE_BLOCK_MIN_K
                          and device.sm_count < problem.tiles(config) <= _PAST_ONE_BLOCK_SMS * device.sm_count)
        return _PAST_ONE_BLOCK_SPLITS if past_one_block else 1
    if problem.tiles(config) > _TILED_SPLIT_MAX_WAVES * config.min_blocks * device.sm_count:
        return 1
    return _balanced(problem, device, config, 1, least=1)


# A large product's few rows or columns past a multiple of 128 run as few-column products, not as a row of mostly
# empty tiles (docs/kernels/heuristic.md, section 'The heuristic's break-even points', ragged-edge).
_PEEL_MAX = _FEW
_PEEL_MIN_MACS = 1 << 33


def peel_edges(problem: Problem, device: Device) -> tuple[int, int]:
    """Rows and columns past the last multiple of 128 of a large single product, where there are at most _PEEL_MAX
    of them (each side on its own: (rows, 0), (0, cols) or both) and the interior's plan keeps the SMs busy; (0, 0)
    where there is nothing to peel."""
    if problem.batch != 1 or _narrow_output(problem) or problem.m * problem.n * problem.k < _PEEL_MIN_MACS:
        return (0, 0)
    rows, cols = problem.m % 128, problem.n % 128
    peel = (rows if rows <= _PEEL_MAX else 0, cols if cols <= _PEEL_MAX else 0)
    if peel == (0, 0):
        return peel
    inside = interior(problem, peel)
    plan = _auto(inside, device)  # never peeled again: its sides are whole multiples of 128 or long edges
    busy = inside.blocks(plan.config) * plan.splits >= _IDLE_SMS * device.sm_count
    return peel if busy else (0, 0)


# A large product whose A or B rows are not 16-byte aligned runs on aligned copies, K padded to whole K-tiles and
# summed in runs of 512 (docs/kernels/heuristic.md, section 'The heuristic's break-even points', aligned-copy).
_PAD_MIN_MACS = 1 << 34
_PAD_K = 16


# So does a product with K of at most _SHORT_K, B transposed (its rows K long) and at least this many elements of C:
# copying its thin A and B costs little against writing C (docs/kernels/heuristic.md, section 'The heuristic's break-even points', aligned-copy).
_PAD_SHORT_K_MIN_OUTPUT = 1 << 26


def pads(problem: Problem, device: Device) -> bool:
    """A large single product whose A or B rows are not 16-byte aligned runs on aligned copies of them (see above)."""
    # (Both operands' rows, not only those the tiles copy 16 bytes at a time: the copies also pad K for the loops'
    # runs.)
    if problem.batch != 1 or (problem.aligned and problem.a_aligned and problem.b_aligned) or _narrow_output(problem):
        return False
    if problem.k <= _SHORT_K:  # B^T's rows are K floats: the copies' are 16 (measured with B^T's rows unaligned; the
        # rule also takes a product whose only unaligned operand is A, which was not measured)
        return problem.b_t and problem.m * problem.n >= _PAD_SHORT_K_MIN_OUTPUT
    return problem.m * problem.n * problem.k >= _PAD_MIN_MACS


def padded_k(k: int) -> int:
    """K of the aligned copies: whole 16-deep K-tiles, zeros past the operands' own K."""
    return -(-k // _PAD_K) * _PAD_K


def aligned_copies(problem: Problem) -> Problem:
    """The product on copies of A and B whose rows start 16-byte aligned, K padded with zeros to whole K-tiles and
    summed in runs where the kernel allows."""
    return dataclasses.replace(problem, k=padded_k(problem.k), aligned=True, a_aligned=True, b_aligned=True,
                               runs=True)


def _auto(problem: Problem, device: Device) -> Choice:
    """The plan's own choice for a product a rule hands on (an interior, aligned copies), tuned entries included."""
    return choose(problem, device, "auto")


def _padded_kernel(problem: Problem, device: Device) -> str:
    return _auto(aligned_copies(problem), device).name


def without_copies(problem: Problem, device: Device) -> Choice:
    """The table's plan for `problem` with no aligned copies: what runs where the copies do not fit in memory."""
    return _lighter(_by_rules(problem, device, _RULES_WITHOUT_COPIES), device)


def after_out_of_memory(problem: Problem, device: Device, choice: Choice) -> Choice:
    """What runs where `choice`'s workspace does not fit in the GPU's memory: without aligned copies, the table's
    next rule; for the wgmma kernels' split operands, the mma.sync tiles of the same precision (no workspace)."""
    if choice.pad:
        return without_copies(problem, device)
    if isinstance(choice.config, WgTile):
        return choose(problem, device, choice.config.fallback)
    if choice.config is OZAKI_INT8:  # Ozaki scheme II's residues and products: 3xTF32
        return choose(problem, device, ozaki_fallback(problem, device))
    raise ValueError(f"{choice.name} needs no workspace: nothing to fall back from")


def interior(problem: Problem, peel: tuple[int, int]) -> Problem:
    """The product left once `peel` = (rows, columns) of C's bottom and right edges are taken off."""
    return dataclasses.replace(problem, m=problem.m - peel[0], n=problem.n - peel[1])


def _peeled_kernel(problem: Problem, device: Device) -> str:
    return _auto(interior(problem, peel_edges(problem, device)), device).name


_NARROW_NOTE = (f"(32x128 or 128x32 where those cover <= {_NARROW_AREA:.0%} of their area, in a batch or from K = "
                f"{_NARROW_MIN_K})")

RULES: tuple[Rule, ...] = (
    Rule(RuleName.EMPTY, "nothing to multiply (a zero-size dimension): the result is empty or zeros, no kernel runs",
         lambda p, d: p.m * p.n * p.batch == 0 or p.k == 0, NAIVE),
    Rule(RuleName.SMALL, f"at most 2^{_SMALL_MACS.bit_length() - 1} multiply-adds (the batch's; "
         f"2^{_SMALL_SLOW_F64_MACS.bit_length() - 1} where float64 runs at 1/32-1/64 of float32), K <= {_SMALL_K}: "
         "bound by the launch; sums in float64 (C is the exact product rounded once): a warp per element of C from "
         f"K = {_SMALL_LANES_K + 1} (at most {_SMALL_WARPS >> 10} Ki warps), else a thread per element for K <= "
         f"{_SMALL_THREAD_K} (at most 2^{_SMALL_OUTPUTS.bit_length() - 1} elements, {_SMALL_THREADS >> 10} Ki threads "
         "launched)", _small, lambda p, d: NAIVE_F64_DOT if _small_lanes(p) else NAIVE_F64),
    Rule(RuleName.SHORT_K, f"at most {_FEW} columns (or rows) on a K of at most {_SHORT_K}: bound by writing C, on "
         "64x64 tiles, which store C in whole rows sooner than the few-column kernel, whose lanes share out K",
         _short_k_few, WT64),
    Rule(RuleName.OUTER_PRODUCTS, f"K <= {_OUTER_MAX_K} (a sum of that many outer products) and at least "
         f"2^{_OUTER_MIN_OUTPUT.bit_length() - 1} elements of C, A not m-contiguous: bound by writing C, a thread per "
         "4x4 piece of C with 16-byte stores, no shared memory and no barrier (more stores in flight than tiles keep)",
         _outer_products, NAIVE_SHORT),
    Rule(RuleName.FEW_COLUMNS_TILES, f"5 to {_FEW} columns (or rows) on K <= {_FEW_TILES_MAX_K}: 128x32 (32x128) tiles "
         "with sums per run of 4 K-tiles, where the few-column kernel's blocks would walk at most three of its "
         "128-deep steps (its pipeline never fills, and its lanes' closing reduction costs as much as their sums)",
         _few_on_tiles, lambda p, d: _narrow_tile(p)),
    Rule(RuleName.FEW_COLUMNS, f"at most {_FEW} columns (or rows, computed transposed) against more of the other side: "
         "bound by memory, each element of the large operand read once in wide loads, K split into slices where "
         "the rows alone would leave SMs idle (over a cluster of 2 to 8 or 16 blocks that sums them, or in more slices "
         f"summed in a fixed order; below 2^{_FEW_SUM_MIN_MACS.bit_length() - 1} multiply-adds at most a cluster's)",
         _few, _few_columns_kernel, few_columns_splits),
    Rule(RuleName.WIDE_FEW_COLUMNS, f"a single product of {_FEW + 1} to {_WIDE_FEW} columns (or rows, computed "
         f"transposed) against more of the other side, K >= {_NARROW_FEW_MIN_K}: the {_WIDE_FEW}-column few-column "
         "kernel, a lane per row of C, the large operand read once; K over a cluster of 2, 4, 8 or 16 blocks where "
         f"those fit one wave, each slice >= {_SPLIT_MIN_SLICE} deep, a block walking at most {_WIDE_FEW_DEPTH} of K "
         f"({_WIDE_FEW_SHORT_DEPTH} against at most {_WIDE_FEW_SHORT_OTHER} of the other side)", _wide_few,
         _wide_few_kernel),
    Rule(RuleName.NARROW_TILES, f"{_FEW + 1} to {_WIDE_FEW} rows (columns) against at least "
         f"{_NARROW_TILE_OTHER} columns (rows), K >= {_NARROW_FEW_MIN_K}, that wide-few-columns leaves (a block "
         "would walk too much of K): 32x128 (128x32) tiles with sums per "
         f"K-tile, their blocks sharing the large operand's reads over 32 rows; from K = {_IDLE_MIN_K} K split into "
         "the count of slices that evens out the SMs' blocks, then summed in a fixed order",
         _narrow_tiles, lambda p, d: _narrow_tile(p), narrow_splits),
    Rule(RuleName.SPLIT_K, f"K >= {_SPLIT_MIN_K} and either >= {_SPLIT_K_OVER_MN}x the output's sides with too few tiles for "
         f"the SMs, or an output side below {_NARROW}: slices of K multiplied side by side, then summed in a fixed "
         "order", _long_k, _split_for, split_count),
    Rule(RuleName.ALIGNED_COPY, f"a product of >= 2^{_PAD_MIN_MACS.bit_length() - 1} multiply-adds whose A or B rows do not "
         "start 16-byte aligned (an odd leading dimension): those operands copied into rows padded to 16 bytes (one "
         "pass over each, a few percent of the product) so that the tiles copy 16 bytes at a time, C written in place; "
         f"K padded with zeros to whole {_PAD_K}-deep K-tiles (both operands copied where it is not), so that the "
         "tiles run their loops, K summed in runs of 512 (cuBLAS's accuracy on these shapes)", pads, _padded_kernel,
         pad=True),
    Rule(RuleName.RAGGED_EDGE, f"a product of >= 2^{_PEEL_MIN_MACS.bit_length() - 1} multiply-adds whose rows or columns run "
         f"1 to {_PEEL_MAX} past a multiple of 128: the interior on whole tiles (its own rule's kernel), the last rows "
         "and columns as products of their own (the few-column kernel; the small rule's where they are that small), "
         "instead of a row of mostly empty tiles and a mostly idle last wave "
         f"(where the interior's own plan gives >= {_IDLE_SMS:.0%} of the SMs a block)",
         lambda p, d: peel_edges(p, d) != (0, 0), _peeled_kernel, peel=peel_edges),
    Rule(RuleName.SPLIT_K_MID, f"the tiled rule's tile would give fewer than {_IDLE_SMS:.0%} of the SMs a block: K split "
         "into whole 16-deep slices of 128x64 tiles, as many as put the least work on the busiest SM (of 64x64 tiles "
         f"with tile sums, {_MID_SUMS_DEPTH} deep or more, at most {_MID_SUMS_MOST}, where those number "
         f"{_MID_SUMS_TILES[0]:g} to {_MID_SUMS_TILES[1]:g} per SM), then summed in a fixed order", _idle_sms,
         _mid_kernel, mid_splits),
    Rule(RuleName.SPLIT_K_IDLE, f"K >= {_IDLE_MIN_K} (from {_IDLE_SHORT_K} where the output's shorter side is "
         f"{_IDLE_SHORT_SIDES[0]} to {_IDLE_SHORT_SIDES[1]}) where even 64x64 tiles would leave SMs without a block (or, "
         f"with K >= {_IDLE_K_OVER_MN}x the output's sides, fill fewer than {_IDLE_SLOTS:.0%} of the GPU's block "
         f"slots): K cut into slices of 64x64 tiles {_NARROW_NOTE} (sums per run of 4 K-tiles), as many as even out "
         "the SMs' blocks, then summed in a fixed order (a lone block walks a long K latency-bound); "
         f"in a batch whose tiles, all items together, leave SMs without a block, K >= {_BATCH_SPLIT_K}: every item's "
         f"slices, as many as fill one wave of block slots, each >= {_IDLE_MIN_SLICE} deep ({_IDLE_SHORT_SLICE} on K < "
         f"{_IDLE_MIN_K}), in one launch",
         _idle_slots, lambda p, d: small_tile(p), idle_splits),
    Rule(RuleName.NARROW_FEW_COLUMNS, f"a single product with an output side of {_FEW + 1} to {_NARROW_FEW - 1} and "
         f"{_NARROW_FEW_MIN_K} <= K < {_SPLIT_MIN_K}: the few-column kernel, its blocks covering the columns "
         f"{_FEW} at a time, K spread over a warp's lanes (a handful of 64x64 tiles would walk K latency-bound)",
         _narrow_few, FEW_COLUMNS[-1]),
    Rule(RuleName.SPLIT_K_WAVE, f"K >= {_IDLE_MIN_K} where the tiled rule's 64x64 tiles fill less than one wave of the GPU's block slots "
         f"(4 per SM): K cut into slices of 64x64 tiles {_NARROW_NOTE} (sums per run of 4 K-tiles), as many as even "
         "out the SMs' blocks, then summed in a fixed order",
         _wave_slots, lambda p, d: small_tile(p), wave_splits),
    Rule(RuleName.TILED, "warp tiling; the largest block tile that gives half the SMs a block with little padding and, "
         "past one wave, no mostly idle last wave (below K = 256, 128x256 only past one wave of its blocks and not for "
         f"A.B^T; 64x64 {_NARROW_NOTE} for small and narrow products, and with sums per run of K-tiles under a wave "
         f"on a long K not a multiple of 16); from K = {_TILED_SPLIT_MIN_K}, on the unrolled "
         "tiles, K split where that evens out the SMs' shares of blocks, then summed in a fixed order; from K = "
         f"{_PAST_ONE_BLOCK_MIN_K}, four-warp tiles just past one block per SM in {_PAST_ONE_BLOCK_SPLITS} slices",
         lambda p, d: True, _fill, tiled_splits),
)
_RULES_WITHOUT_COPIES = tuple(r for r in RULES if not r.pad)


def _by_rules(problem: Problem, device: Device, rules: tuple[Rule, ...]) -> Choice:
    """The first of `rules` that applies to `problem` (the last one always does)."""
    for rule in rules:
        if rule.test(problem, device):
            name = rule.kernel(problem, device) if callable(rule.kernel) else rule.kernel
            splits = rule.splits(problem, device) if rule.splits else 1
            peel = rule.peel(problem, device) if rule.peel else (0, 0)
            config = get_config(name)
            return Choice(config, problem.variant_for(config), rule.name, rule.reason, splits, peel, rule.pad)
    raise AssertionError("the last rule applies to every problem")


# The table's answers that are not a choice of one configuration, which the tuner therefore never times.
_NOT_TUNED = (RuleName.EMPTY, RuleName.SMALL, RuleName.TENSOR, RuleName.TENSOR_WGMMA, RuleName.OZAKI, RuleName.FEW_COLUMNS, RuleName.RAGGED_EDGE,
              RuleName.ALIGNED_COPY)


def _in_precision(choice: Choice, problem: Problem, device: Device, precision: str) -> Choice:
    """The table's FP32 answer in a tensor-core precision: kept where FP32 is the better path, else its tiles."""
    if precision == "highest":
        return choice
    if precision == "high" and _ozaki(problem, device):
        return Choice(OZAKI_INT8, problem.variant, RuleName.OZAKI, ozaki_reason(problem))
    if choice.rule in (RuleName.SPLIT_K, RuleName.NARROW_TILES, RuleName.FEW_COLUMNS, RuleName.WIDE_FEW_COLUMNS,
                       RuleName.SMALL, RuleName.OUTER_PRODUCTS,
                       RuleName.FEW_COLUMNS_TILES):  # bound by memory or launches
        arithmetic = "float64 sums" if choice.rule == RuleName.SMALL else "FP32 FMAs"
        return dataclasses.replace(choice, reason=choice.reason + f" (in every precision: {precision!r} "
                                   f"uses {arithmetic} here)")
    if precision == "high" and _hopper(device) and not _wgmma(problem, device, precision):
        return dataclasses.replace(choice, reason=choice.reason + " (in 'high' precision: FP32 FMAs, as accurate as "
                                   f"3xTF32 and faster than it below {_macs(_WG_MIN_MACS['high'])} multiply-adds "
                                   f"or an output side of {_WG_MIN_SIDE['high']} on Hopper)")
    if choice.rule == RuleName.EMPTY:
        return choice
    name, rule, reason = _tensor(problem, device, _check_precision(precision))
    return Choice(get_config(name), problem.variant, rule, reason)


def _tuned_instead(choice: Choice, problem: Problem, device: Device) -> Choice:
    """An autotuned entry for the problem's class, where the table's answer is a choice of one configuration."""
    if choice.splits != 1 or choice.rule in _NOT_TUNED:
        return choice
    entry = tuned_entries(device).get(tune_bucket(problem))
    if entry is None or entry.get("kernel") not in BY_NAME:
        return choice
    return Choice(get_config(entry["kernel"]), problem.variant, RuleName.TUNED,
                  f"autotuned on this GPU for {tune_bucket(problem)}: {entry['tflops']:.1f} TFLOP/s "
                  f"against {entry['heuristic_tflops']:.1f} for the table's {entry['heuristic']}")


def _forced_choice(problem: Problem, device: Device, kernel: str) -> Choice:
    if kernel == OZAKI:
        return Choice(OZAKI_INT8, problem.variant, RuleName.FORCED,
                      "Ozaki scheme II was requested ('ozaki'): " + ozaki_reason(problem))
    if kernel in FAMILIES:
        config = get_config(_FAMILY_DEFAULT[kernel](problem, device))
        return _lighter(Choice(config, problem.variant_for(config), RuleName.FORCED,
                               f"kernel family {kernel!r} was requested; tile chosen for the shape"), device)
    config = get_config(kernel)
    return Choice(config, problem.variant_for(config), RuleName.FORCED, f"kernel {kernel!r} was requested")


def choose(problem: Problem, device: Device = Device(), kernel: str | None = None, *, tuned: bool = True,
           precision: str | None = None) -> Choice:
    """The kernel for `problem`: `kernel` if given, else the enclosing `use_kernel`, else an autotuned entry
    for its class (unless `tuned` is False), else the table; in `precision` (default: the current one, see
    `get_float32_matmul_precision`)."""
    kernel = kernel if kernel is not None else (_forced.get() or "auto")
    precision = precision or current_precision()
    key = (problem, device, kernel, tuned, precision)
    hit = _tuned._memo.get(key)
    if hit is not None:
        return hit
    kernel = _check_name(kernel)
    if kernel == "auto":  # the table, then the precision mode, the GPU's shared memory and the tuned entries
        choice = _lighter(_in_precision(_by_rules(problem, device, RULES), problem, device, precision), device)
        choice = _tuned_instead(choice, problem, device) if tuned else choice
    else:
        choice = _forced_choice(problem, device, kernel)
    validated(choice.config, device)
    if len(_tuned._memo) > 4096:
        _tuned._memo.clear()
    _tuned._memo[key] = choice
    if _log.isEnabledFor(logging.DEBUG):  # once per new problem signature (the memo answers the rest)
        _log.debug("plan %dx%dx%d batch %d (%s, %s) in %r: %s by rule %s", problem.m, problem.n, problem.k,
                   problem.batch, problem.variant.suffix, device.name, precision, choice.config.name, choice.rule)
    return choice
