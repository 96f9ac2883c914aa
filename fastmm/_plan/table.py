"""The heuristic table and `choose`: rules in order, the first whose test holds names the kernel, unless a kernel is
forced or an autotuned entry covers the product; then the current precision mode's tiles.

The numbers in the rules are break-even points measured with ``python -m fastmm bench``; docs/kernels.md has the
tables they come from.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator

from ..kernels.configs import BY_NAME, FAMILIES, KernelConfig, get_config
from . import tuned as _tuned
from .forced import _FAMILY_DEFAULT, _check_name, _forced, validated
from .precision import _WG_MIN_MACS, _WG_MIN_SIDE, _check_precision, _hopper, _macs, _tensor, _wgmma, current_precision
from .problem import _FEW, Choice, Device, Problem, Rule, RuleName, few_rows
from .tiles import (_MIN_USEFUL, NAIVE, TF32X3_TILES, WT64, WT256, WT256_32, WT256_LOOP, WT256_LOOP16, WT256_SLICES,
                    WT128x64, WT128x64_LOOP, _few_tiles, _fill, _skinny_for, _useful)
from .tuned import tune_bucket, tuned_entries

__all__ = ["RULES", "choose", "split_count", "skinny_splits", "mid_splits", "peel_edges", "pads", "padded_k",
           "aligned_copies", "on_copies", "summed_in_runs", "without_copies", "interior"]

# Split-K: only worth its workspace and extra pass when K dwarfs the output.
_SPLIT_MIN_K = 4096
_SPLIT_K_OVER_MN = 16
_SPLIT_SLICE = 512
_SPLIT_MIN_SLICE = 256


# Skinny products (an output side below this) with a long K are split too, for accuracy as much as speed:
# 8192x1x8192 had 10.9x cuBLAS's relative error as one running sum per element, 2.8x with per-tile sums.
_SKINNY = 32


def _skinny(problem: Problem) -> bool:
    return min(problem.m, problem.n) < _SKINNY


def _long_k(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or problem.k < _SPLIT_MIN_K:
        return False
    few = problem.k >= _SPLIT_K_OVER_MN * max(problem.m, problem.n) and _few_tiles(problem, device)
    return few or _skinny(problem)


def _split_for(problem: Problem, device: Device) -> str:
    """The tile of split-K's slices: 128x256 where both sides of the output hold it with little padding, 128x64 where
    they hold that, else 64x64; the large tiles on their sub-tile loops (slices are whole 16-deep steps).

    Measured (H100, x cuBLAS in the same process): 256x256x65536 0.85x with 128x256 tiles against 0.71x with 64x64
    ones (slices 512 deep); 128x128x65536 1.03-1.04x with 128x64 tiles against 0.93x with 64x64 ones. On the loops,
    in the same slices: 256x256x65536 0.99x (16-deep loop; unrolled 0.93-0.94x, 32-deep loop 0.98x), 512x512x32768
    1.01x (0.94x), 128x128x65536 1.10x (1.03x). 384x384x65536 on 128x256 tiles (a quarter of their area padding) ran
    0.58x, on 128x64 ones 0.84-0.88x. The 128x256 slices sum their K in runs of 512 (partial sums): at the same speed
    (512x512x32768 1.000x against 1.001x, 256x256x65536 0.987x against 0.984x) the error falls below cuBLAS's
    (4.1e-7 against 8.1e-7 and 5.9e-7)."""
    if _skinny(problem):
        return WT64
    side = min(problem.m, problem.n)
    if side >= 256 and _useful(problem, get_config(WT256_SLICES)) >= _MIN_USEFUL:
        return WT256_SLICES
    return WT128x64_LOOP if side >= 128 else WT64


def _even_splits(problem: Problem, config: KernelConfig, most: int, min_depth: int) -> list[int]:
    """Slice counts from 2 to `most` that cut K into whole K-tile steps, slices at least `min_depth` deep: the split
    then runs as one batched launch (an uneven last slice runs as a launch of its own, at a fraction of the SMs)."""
    return [s for s in range(2, most + 1) if problem.k % (config.bk * s) == 0 and problem.k // s >= min_depth]


def split_count(problem: Problem, device: Device) -> int:
    """Slices of K for split-K. On the 128x256 and 128x64 tiles, the most that keep all blocks in one wave, in whole
    16-deep steps (see below); otherwise (64x64 tiles, or no even cut) about _SPLIT_SLICE deep, deeper only where
    that leaves less than a wave of blocks (never shallower than _SPLIT_MIN_SLICE).

    Measured (H100, x cuBLAS in the same run) on 64x64 tiles: the best depth was about 500 whatever the output,
    while filling the SMs was not enough: 128x128x65536 0.68x in 66 slices of 993 (two blocks per SM), 0.93x in
    132 slices of 496 or 256 of 256; 64x64x262144 1.09x / 1.07x / 1.01x in 264 / 528 / 1024 slices. On 128x256
    tiles a second wave cost more than the deeper slices of one: 256x256x65536 0.62x / 0.85x / 0.79x in 66 (uneven)
    / 132 / 256 slices, then 0.94x in 64 even ones.
    """
    name = _split_for(problem, device)
    config = get_config(name)
    tiles = problem.tiles(config)
    if name != WT64:
        # The large tiles: the most slices that keep every block in one wave, cut in whole 16-deep steps (an uneven
        # last slice runs as a launch of its own). Measured (H100): 256x256x65536 on 128x256 tiles 0.94x cuBLAS in 64
        # slices (one wave of 128 blocks) against 0.89x in 128; 512x512x32768 0.95x in 16 against 0.87x in 64;
        # 128x128x65536 on 128x64 tiles 1.04x in 128 (256 blocks of 396 slots).
        even = _even_splits(problem, config, config.min_blocks * device.sm_count // tiles, _SPLIT_MIN_SLICE)
        if even:
            return max(even)
    wave = -(-config.min_blocks * device.sm_count // tiles)
    slices = max(problem.k // _SPLIT_SLICE, min(wave, problem.k // _SPLIT_MIN_SLICE))
    return max(2, slices)




def _few_columns(problem: Problem) -> bool:
    return problem.n <= _FEW and problem.m >= problem.n


def _few(problem: Problem, device: Device) -> bool:
    """The few-column rule's products: few columns or rows, on a GPU with the shared memory for the block that holds
    them (16 columns take 104 KiB: more than Ada's 99; those products then run on the tiles)."""
    return ((_few_columns(problem) or few_rows(problem))
            and get_config(_skinny_for(problem, device)).smem_bytes <= device.max_smem_optin)


def _skinny_count(problem: Problem, device: Device) -> int:
    """Slices of K for the few-column kernel (single products only, as for split-K; slices at least _SPLIT_SLICE
    deep). Up to 8 (where the GPU has clusters) a cluster's blocks split K: 2, 4 or 8, the most whose blocks fit
    one per SM for up to 4 columns, min_blocks per SM for 16 (more FMAs per byte read; see _CLUSTERS). Rows so few that more
    than 16 slices would fill the SMs take those, summed by the slice-sum kernel: of the counts that fill min_blocks
    blocks per SM, the one whose blocks fill their waves best (time ~ waves / slices; the fewest on a tie).

    Rounded up to fill the SMs, a count can leave a mostly idle last wave: 4096x16x4096 has 128 blocks of rows,
    and 3 slices make 384 blocks, 1.45 waves of an H100's 264 block slots (the second half empty), where 2 slices
    make 256, one wave; 8192 rows (256 blocks) need no slices at all."""
    if problem.batch != 1:
        return 1
    config = get_config(_skinny_for(problem, device))
    rows = problem.n if few_rows(problem) else problem.m
    blocks = -(-rows // config.tile[0])
    slots = config.min_blocks * device.sm_count
    most = max(1, min(-(-slots // blocks), problem.k // _SPLIT_SLICE))
    count = min(range(1, most + 1), key=lambda s: -(-blocks * s // slots) / s)
    if not _clusters(device) or count > 2 * _CLUSTERS[-1]:
        return count
    per_sm = config.min_blocks if config.nmax > 4 else 1
    return max(c for c in (1, *_CLUSTERS) if c == 1 or blocks * c <= per_sm * device.sm_count
               and problem.k // c >= _SPLIT_SLICE)


# Few-column products split K over a thread-block cluster of this many blocks, in one launch that sums the slices
# itself (skinny.cu); more slices than a cluster holds run as a batch summed by the slice-sum kernel. Measured on an
# H100 (x cuBLAS in the same process; workspace split -> cluster): 2048x1x16384 0.93x -> 0.98x (2 blocks; the slice
# sum alone took 4.5-8.5% of such products), 4096x16x4096 1.02x -> 1.29x (2), 1024x1x65536 1.15x -> 1.17x (4),
# 1000x3x50000 1.36x -> 1.49x (4). More blocks than one per SM (up to 4 columns) or min_blocks per SM (16 columns)
# lost: 2048x1x16384 0.92x in clusters of 4, 0.95x of 8; 1000x3x50000 1.21x of 8; 4096x16x4096 unsplit 1.21x.
_CLUSTERS = (2, 4, 8)


def _clusters(device: Device) -> bool:
    return device.compute_capability >= (9, 0)


def _skinny_kernel(problem: Problem, device: Device) -> str:
    """The few-column configuration, split over a cluster where its count of slices is one."""
    name, count = _skinny_for(problem, device), _skinny_count(problem, device)
    return f"{name}_c{count}" if count in _CLUSTERS and _clusters(device) else name


def skinny_splits(problem: Problem, device: Device) -> int:
    """Slices of K summed by the slice-sum kernel (a cluster sums its own: 1)."""
    count = _skinny_count(problem, device)
    return 1 if count in _CLUSTERS and _clusters(device) else count


# Split-K over a short K, where the tiled rule's tile would leave SMs idle: slices of 128x64 tiles, counted so that
# the busiest SM's share of the work (blocks per SM, rounded up, times each block's depth) is least. Measured on an
# H100 (x cuBLAS in the same run, unsplit -> split): 768^3 0.72x -> 1.02x (3 slices), 896^3 0.71x -> 0.97x (4),
# 1536^3 0.75x -> 1.01x (4), 1792^3 0.92x -> 1.03x (2), 512x512x2048 0.44x -> 0.95x (4), 768x3072x768 0.75x -> 0.91x
# (4); where the tiles give at least 80% of the SMs a block (1024^3 0.98x, 2048^3 0.99x, 2048x2048x512 0.98x,
# 1024x1024x4096 0.82x) every split measured slower. Slices divide K into whole 16-deep steps: an uneven last slice
# runs as a launch of its own (896^3 in 3 slices: below 0.71x). Small products stay whole: a second launch costs
# more than idle SMs there (640^3 runs 1.22x cuBLAS unsplit on 64x64 tiles).
#
# Small outputs (from _MID_SUMS_TILES[0] to [1] 64x64 tiles per SM: m x n from about 512^2 to 768^2 on an H100) take
# 64x64 tiles with tile sums instead, in slices _MID_SUMS_DEPTH deep (at most _MID_SUMS_MOST of them): their error is
# less than half cuBLAS's (768^3: 1.1e-7 against 2.9e-7 on 128x64 slices, cuBLAS 2.0e-7). These calls are bound by
# the host (about 35 us per call on the measuring host, cuBLAS's too), so through fastmm.matmul the two plans ran
# within a few percent (H100, x cuBLAS, interleaved, 128x64 slices -> 64x64 sums): 640x640x1024 0.80x -> 0.84-0.88x,
# 768^3 1.01-1.02x -> 0.99x, 768x768x512 0.98-0.99x -> 0.98x; replayed alone (no dispatch) the sums ran faster
# (640x640x768 1.03x -> 1.23x, 768x768x1536 0.81x -> 0.87x). Fewer tiles lost (384x384x2048, 36 tiles: 0.99x ->
# 0.85-0.93x) or drew (512x512x2048 0.94x -> 0.93x); more lost on the GPU (896^3 0.97x -> 0.79x, 1536^3 1.02x ->
# 0.77x replayed), as did slices of 64 where the sum of many slices costs more than they gain (768x768x1536 in 24:
# 0.61x).
_IDLE_SMS = 0.8
_MID_MIN_DEPTH = 128
_MID_MIN_MACS = 1 << 28
_MID_SUMS_TILES = (0.5, 1.25)
_MID_SUMS_DEPTH = 128
_MID_SUMS_MOST = 8


def _idle_sms(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or _skinny(problem) or problem.m * problem.n * problem.k < _MID_MIN_MACS:
        return False
    tiled = get_config(_fill(problem, device))
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


# Ragged edges: a large product whose rows (or columns) run a few past a multiple of 128 pays for a whole row of
# mostly empty tiles, and often a mostly idle last wave, for those few (4097^3 on 128x256 tiles: 561 tiles, 4.25 waves
# of an H100's 132 SMs, where 4096 rows and columns make 512, 3.9). Those last rows and columns are a few-row and a
# few-column product, bound by memory and run as such; the interior keeps whole tiles, where its own plan gives at
# least _IDLE_SMS of the SMs a block. Measured on an H100 (x cuBLAS in the same process), whole -> peeled: 2049^3
# 0.91x -> 1.05x, 3073^3 0.89x -> 0.98x, 4097^3 0.93x -> 1.00x (A^T.B 0.90x -> 0.95x), 8193^3 0.92x -> 0.97x,
# 4100^3 1.05x -> 1.13x, 5000^3 0.96x -> 1.02x, 2049x2049x8192 0.85x -> 1.18x. Smaller products lost: their
# interiors leave SMs idle, and the edges' launches cost more than the padded tiles (1537^3 0.91x -> 0.61x with 72
# tiles of 128x256 inside, 1793^3 0.87x -> 0.79x with 98, 1153^3 0.88x -> 0.57x with 162 of 128x64).
_PEEL_MAX = _FEW
_PEEL_MIN_MACS = 1 << 33


def peel_edges(problem: Problem, device: Device) -> tuple[int, int]:
    """Rows and columns past the last multiple of 128 of a large single product, where there are at most _PEEL_MAX
    of them (each side on its own: (rows, 0), (0, cols) or both) and the interior's plan keeps the SMs busy; (0, 0)
    where there is nothing to peel."""
    if problem.batch != 1 or _skinny(problem) or problem.m * problem.n * problem.k < _PEEL_MIN_MACS:
        return (0, 0)
    rows, cols = problem.m % 128, problem.n % 128
    peel = (rows if rows <= _PEEL_MAX else 0, cols if cols <= _PEEL_MAX else 0)
    if peel == (0, 0):
        return peel
    inside = interior(problem, peel)
    plan = _auto(inside, device)  # never peeled again: its sides are whole multiples of 128 or long edges
    busy = inside.blocks(plan.config) * plan.splits >= _IDLE_SMS * device.sm_count
    return peel if busy else (0, 0)


# Rows that do not start 16-byte aligned (an odd leading dimension: 3001^3) cost the tiles their 16-byte copies, the
# 128x64 tile most. A large single product copies its unaligned A and B into rows padded to 16 bytes (repitch.cu, one
# pass over each at 2.6 TB/s on an H100: 2-4% of these products) and runs on the copies; C needs none (its rows
# decide only the stores). Measured on an H100, x cuBLAS in the same process, on 4-byte copies -> with aligned copies:
# 2999^3 0.89x -> 1.00x, 3001^3 0.89x -> 0.99x, 3001x3001x6001 0.85x -> 0.95x, 3073^3 (peeled) 0.94x -> 1.07x (all
# on the 128x64 tile), A^T.B 4097^3 0.94x -> 1.01x (A copied transposing), 6001^3 0.93x -> 0.99x, 8193^3 0.97x ->
# 1.00x. Smaller products lost (1793^3 0.89x -> 0.87x), so the rule starts at 2^34 (2580^3).
# The copies also pad K with zeros to whole 16-deep K-tiles, so that the tiles run their loops there, in runs of 512
# (partial sums): on these shapes cuBLAS sums more accurately than one running sum per element (4097^3: 6.6e-7
# against 1.15e-6; 3001^3: 4.9e-7 against 9.8e-7), and only shorter sums bring the error to its level or below
# (docs/kernels.md, "Accuracy, third round").
_PAD_MIN_MACS = 1 << 34
_PAD_K = 16


def pads(problem: Problem, device: Device) -> bool:
    """A large single product whose A or B rows are not 16-byte aligned runs on aligned copies of them (see above)."""
    if problem.batch != 1 or problem.aligned or _skinny(problem):
        return False
    return problem.m * problem.n * problem.k >= _PAD_MIN_MACS


def padded_k(k: int) -> int:
    """K of the aligned copies: whole 16-deep K-tiles, zeros past the operands' own K."""
    return -(-k // _PAD_K) * _PAD_K


def aligned_copies(problem: Problem) -> Problem:
    """The product on copies of A and B whose rows start 16-byte aligned, K padded with zeros to whole K-tiles and
    summed in runs where the kernel allows."""
    return dataclasses.replace(problem, k=padded_k(problem.k), aligned=True, a_aligned=True, b_aligned=True,
                               runs=True)


# Set while the dispatcher multiplies the aligned copies: the products it then describes sum K in runs.
_on_copies: contextvars.ContextVar[bool] = contextvars.ContextVar("fastmm_on_copies", default=False)


@contextlib.contextmanager
def on_copies() -> Iterator[None]:
    """Within: the products are the aligned copies' (see aligned_copies), and sum K in runs where a kernel does."""
    token = _on_copies.set(True)
    try:
        yield
    finally:
        _on_copies.reset(token)


def summed_in_runs() -> bool:
    return _on_copies.get()


def _auto(problem: Problem, device: Device) -> Choice:
    """The plan's own choice for a product a rule hands on (an interior, aligned copies), tuned entries included."""
    return choose(problem, device, "auto")


def _padded_kernel(problem: Problem, device: Device) -> str:
    return _auto(aligned_copies(problem), device).name


def without_copies(problem: Problem, device: Device) -> Choice:
    """The table's plan for `problem` with no aligned copies: what runs where the copies do not fit in memory."""
    return _lighter(_by_rules(problem, device, _RULES_WITHOUT_COPIES), device)


def interior(problem: Problem, peel: tuple[int, int]) -> Problem:
    """The product left once `peel` = (rows, columns) of C's bottom and right edges are taken off."""
    return dataclasses.replace(problem, m=problem.m - peel[0], n=problem.n - peel[1])


def _peeled_kernel(problem: Problem, device: Device) -> str:
    return _auto(interior(problem, peel_edges(problem, device)), device).name


RULES: tuple[Rule, ...] = (
    Rule(RuleName.EMPTY, "nothing to multiply (a zero-size dimension): the result is empty or zeros, no kernel runs",
         lambda p, d: p.m * p.n * p.batch == 0 or p.k == 0, NAIVE),
    Rule(RuleName.FEW_COLUMNS, f"at most {_FEW} columns (or rows, computed transposed) against more of the other side: "
         "bound by memory, each element of the large operand read once in wide loads, K split into slices where "
         "the rows alone would leave SMs idle (over a cluster of 2, 4 or 8 blocks that sums them, or in more slices "
         "summed in a fixed order)", _few, _skinny_kernel, skinny_splits),
    Rule(RuleName.SPLIT_K, f"K >= {_SPLIT_MIN_K} and either >= {_SPLIT_K_OVER_MN}x the output's sides with too few tiles for "
         f"the SMs, or an output side below {_SKINNY}: slices of K multiplied side by side, then summed in a fixed "
         "order", _long_k, _split_for, split_count),
    Rule(RuleName.ALIGNED_COPY, f"a product of >= 2^{_PAD_MIN_MACS.bit_length() - 1} multiply-adds whose A or B rows do not "
         "start 16-byte aligned (an odd leading dimension): those operands copied into rows padded to 16 bytes (one "
         "pass over each, a few percent of the product) so that the tiles copy 16 bytes at a time, C written in place; "
         f"K padded with zeros to whole {_PAD_K}-deep K-tiles (both operands copied where it is not), so that the "
         "tiles run their loops, K summed in runs of 512 (cuBLAS's accuracy on these shapes)", pads, _padded_kernel,
         pad=True),
    Rule(RuleName.RAGGED_EDGE, f"a product of >= 2^{_PEEL_MIN_MACS.bit_length() - 1} multiply-adds whose rows or columns run "
         f"1 to {_PEEL_MAX} past a multiple of 128: the interior on whole tiles (its own rule's kernel), the last rows "
         "and columns on the few-column kernel, instead of a row of mostly empty tiles and a mostly idle last wave "
         f"(where the interior's own plan gives >= {_IDLE_SMS:.0%} of the SMs a block)",
         lambda p, d: peel_edges(p, d) != (0, 0), _peeled_kernel, peel=peel_edges),
    Rule(RuleName.SPLIT_K_MID, f"the tiled rule's tile would give fewer than {_IDLE_SMS:.0%} of the SMs a block: K split "
         "into whole 16-deep slices of 128x64 tiles, as many as put the least work on the busiest SM (of 64x64 tiles "
         f"with tile sums, {_MID_SUMS_DEPTH} deep or more, at most {_MID_SUMS_MOST}, where those number "
         f"{_MID_SUMS_TILES[0]:g} to {_MID_SUMS_TILES[1]:g} per SM), then summed in a fixed order", _idle_sms,
         _mid_kernel, mid_splits),
    Rule(RuleName.TILED, "warp tiling; the largest block tile that gives half the SMs a block with little padding and, "
         "past one wave, no mostly idle last wave (64x64 for small and skinny products)", lambda p, d: True, _fill),
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


# Where a GPU cannot give a block the table's configuration's shared memory (Hopper: 227 KiB; A100: 163 KiB; Ada:
# 99 KiB), the same block tile with 16-deep stages (half the bytes) runs instead: the table's choices stay the
# measured ones on Hopper, and no GPU that runs the warp tiles meets a configuration it cannot launch.
_LIGHTER = {
    WT256_LOOP: WT256_LOOP16,      # 196 KiB -> 98 KiB
    WT256_32: WT256,               # 196 KiB -> 98 KiB
    WT256_SLICES: WT256_LOOP16,    # 226 KiB (the partial sums' slots) -> 98 KiB: one running sum
    TF32X3_TILES[0]: TF32X3_TILES[1],  # 102 KiB -> 51 KiB
}


def _lighter(choice: Choice, device: Device) -> Choice:
    """`choice`, or the lighter configuration of the same tile where the device lacks the shared memory for it."""
    config = choice.config
    if config.smem_bytes <= device.max_smem_optin or config.name not in _LIGHTER:
        return choice
    lighter = get_config(_LIGHTER[config.name])
    return dataclasses.replace(
        choice, config=lighter,
        reason=f"{choice.reason} (this GPU allows {device.max_smem_optin / 1024:.0f} KiB of shared memory per block, "
               f"fewer than {config.name}'s {config.smem_bytes / 1024:.0f} KiB: {lighter.name})")


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
    _check_name(kernel)
    if kernel == "auto":
        choice = _by_rules(problem, device, RULES)
        if precision != "highest":
            if choice.rule in (RuleName.SPLIT_K, RuleName.FEW_COLUMNS):  # memory-bound or split: the FP32 paths
                choice = dataclasses.replace(choice, reason=choice.reason + f" (in every precision: {precision!r} "
                                             "uses FP32 FMAs here)")
            elif precision == "high" and _hopper(device) and not _wgmma(problem, device, precision):
                choice = dataclasses.replace(choice, reason=choice.reason + " (in 'high' precision: FP32 FMAs, as "
                                             "accurate as 3xTF32 and faster than it below "
                                             f"{_macs(_WG_MIN_MACS['high'])} multiply-adds or an output "
                                             f"side of {_WG_MIN_SIDE['high']} on Hopper)")
            elif choice.rule != RuleName.EMPTY:
                name, rule, reason = _tensor(problem, device, _check_precision(precision))
                choice = Choice(get_config(name), problem.variant, rule, reason)
        choice = _lighter(choice, device)
        # A tuned entry for this problem class overrides the table, except where the table's answer is not a
        # choice of configuration (nothing to do, or a split-K plan the tuner does not time).
        entry = None
        if tuned and choice.splits == 1 and choice.rule not in (RuleName.EMPTY, RuleName.TENSOR, RuleName.TENSOR_WGMMA, RuleName.FEW_COLUMNS,
                                                                RuleName.RAGGED_EDGE, RuleName.ALIGNED_COPY):
            entry = tuned_entries(device).get(tune_bucket(problem))
        if entry is not None and entry.get("kernel") in BY_NAME:
            choice = Choice(get_config(entry["kernel"]), problem.variant, RuleName.TUNED,
                            f"autotuned on this GPU for {tune_bucket(problem)}: {entry['tflops']:.1f} TFLOP/s "
                            f"against {entry['heuristic_tflops']:.1f} for the table's {entry['heuristic']}")
    elif kernel in FAMILIES:
        config = get_config(_FAMILY_DEFAULT[kernel](problem, device))
        choice = _lighter(Choice(config, problem.variant_for(config), RuleName.FORCED,
                                 f"kernel family {kernel!r} was requested; tile chosen for the shape"), device)
    else:
        config = get_config(kernel)
        choice = Choice(config, problem.variant_for(config), RuleName.FORCED, f"kernel {kernel!r} was requested")
    validated(choice.config, device)
    if len(_tuned._memo) > 4096:
        _tuned._memo.clear()
    _tuned._memo[key] = choice
    return choice
