"""The few-column kernel's rules: which products it takes (few columns, or few rows computed transposed; 17 to 32
of them against up to a few thousand of the other side; 17 to 47 on a mid K), its configuration, and how K is split
over a cluster's blocks or in slices (docs/kernels/few-columns.md)."""

from __future__ import annotations

from ..kernels.configs import get_config
from .problem import _FEW, Device, Problem, few_rows
from .runs import blocked, lane_terms, run_of
from .splits import _SPLIT_MIN_K, _SPLIT_MIN_SLICE, _SPLIT_SLICE
from .tiles import _SHORT_K, FEW_COLUMNS, _few_columns_for

__all__ = ["few_columns_splits"]


def _few_columns(problem: Problem) -> bool:
    return problem.n <= _FEW and problem.m >= problem.n


def _few(problem: Problem, device: Device) -> bool:
    """The few-column rule's products: few columns or rows, on a GPU with the shared memory for the block that holds
    them (16 columns take 104 KiB: more than Ada's 99; those products then run on the tiles; 8 columns take 96 KiB,
    measured on Hopper only). (A batch on a GPU without clusters walks K whole: its lanes' blocked sums stay under the
    running-sum bound up to a K of 131072, where the tiles' sums per K-tile have passed it; until 2026-11-28 lanes that
    own a row kept one sum, and such batches went to the tiles from K = 32768.)"""
    if not (_few_columns(problem) or few_rows(problem)):
        return False
    return get_config(_few_columns_for(problem, device)).smem_bytes <= device.max_smem_optin


def _short_k_few(problem: Problem, device: Device) -> bool:
    """Few columns or rows on a K of at most _SHORT_K: bound by writing C, where the few-column kernel's lanes (K spread
    over them) idle and its blocks of 32 rows store C slowly (docs/kernels/heuristic.md, section 'The heuristic's
    break-even points', short-k)."""
    return problem.k <= _SHORT_K and _few(problem, device)


# 5 to 16 columns (the 8- and 16-column kernels') on a K of at most this, three of its 128-deep steps: a block's pipeline never
# fills and its lanes' closing reduction (5 shuffles per element) costs as much as their sums; the 128x32 (32x128)
# tile, with sums per K-tile, ran them faster: 21931x7x373 0.60x -> 0.87x cuBLAS, 15579x5x475 (B^T) 0.69x -> 1.02x
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', few-columns-tiles).
_FEW_TILES_MAX_K = 384
_FEW_TILES_ABOVE = 4  # (the 8- and 16-column kernels' products)


def _few_on_tiles(problem: Problem, device: Device) -> bool:
    return (problem.k <= _FEW_TILES_MAX_K and _few(problem, device)
            and get_config(_few_columns_for(problem, device)).nmax > _FEW_TILES_ABOVE)


# A lane of the few-column kernel adds at most this many terms in one running sum, in single products (they take
# slices of K, over a cluster or summed by the slice-sum kernel, to keep it): 6457x15x13544 with A m-contiguous,
# 1693 terms a lane, had 1.9x cuBLAS's error; the 32-column kernel's lanes kept at most cuBLAS's up to 384
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', wide-few-columns).
_FEW_MAX_RUN = 384
# ... and at most this many where a lane keeps one running sum (16 columns with A row-major: 4 x 16 sums fill its
# registers): 5x4963x5899 (B^T), 188 terms a lane, had 1.79x cuBLAS's error (docs/kernels/few-columns.md).
_FEW_MAX_ONE_SUM = 160
# Few-column products below this many multiply-adds take a cluster's slices (one launch) rather than more slices summed
# by the slice-sum kernel (a second launch, which costs them more than the deeper slices; docs/kernels/heuristic.md,
# section 'The heuristic's break-even points', few-columns).
_FEW_SUM_MIN_MACS = 1 << 24


def _few_columns_count(problem: Problem, device: Device) -> int:
    """Slices of K for the few-column kernel (slices at least _SPLIT_SLICE deep; a batch only over a cluster). Up
    to 8 (where the GPU has clusters) a cluster's blocks split K: 2, 4 or 8, the most whose blocks fit one per SM
    for up to 4 columns of a row-major A; any of 2 to 8, the most that fit min_blocks per SM, past 4 columns (more
    FMAs per byte read) or where A is m-contiguous (see _CLUSTERS, _ANY_CLUSTER). Rows so few that more
    than 16 slices would fill the SMs take a cluster of 8 where its blocks walk a short K (_FEW_CLUSTER_MAX_DEPTH), else
    those slices, summed by the slice-sum kernel: of the counts that fill min_blocks blocks per SM, the one whose blocks
    fill their waves best (time ~ waves / slices; the fewest on a tie).

    Rounded up to fill the SMs, a count can leave a mostly idle last wave: 4096x16x4096 has 128 blocks of rows,
    and 3 slices make 384 blocks, 1.45 waves of an H100's 264 block slots (the second half empty), where 2 slices
    make 256, one wave; 8192 rows (256 blocks) need no slices at all."""
    config = get_config(_few_columns_for(problem, device))
    # Slices enough that no lane's running sum passes _FEW_MAX_RUN terms, nor (past 4 columns) the terms it multiplies:
    # 16 columns on lane rows fold their sums since 2026-11-28, but 8 of the 9 sweep products whose slices that
    # would have cut ran slower unsliced (5 x 2311 x 16001 (A^T) 0.98x -> 0.65x cuBLAS; docs/kernels/few-columns.md).
    a_t = problem.variant_for(config).a_t
    run, terms = run_of(config, problem.k, a_t), lane_terms(config, problem.k, a_t)
    need = -(-max(run, terms if config.nmax > 4 else 0) // _FEW_MAX_RUN)
    if not blocked(config, a_t):  # one running sum a lane
        need = max(need, -(-terms // _FEW_MAX_ONE_SUM))
    if problem.batch != 1:
        # A batch takes no slice-sum pass: a cluster per item sums its slices, where one lane's run would pass
        # _FEW_MAX_RUN terms (48x14x10x12973 in Fortran order had 2.42x cuBLAS's error on one slice).
        if need <= 1 or not _clusters(device):
            return 1
        return next((c for c in _CLUSTERS if c >= need and problem.k // c >= _SPLIT_MIN_SLICE),
                    max((c for c in _CLUSTERS if problem.k // c >= _SPLIT_MIN_SLICE), default=1))
    rows = problem.n if few_rows(problem) else problem.m
    blocks = -(-rows // config.tile[0])
    slots = config.min_blocks * device.sm_count
    most = max(1, min(-(-slots // blocks), problem.k // _SPLIT_SLICE))
    count = min(range(1, most + 1), key=lambda s: -(-blocks * s // slots) / s)
    small = problem.m * problem.n * problem.k < _FEW_SUM_MIN_MACS
    need = min(need, max(1, problem.k // _SPLIT_MIN_SLICE))  # (each slice at least _SPLIT_MIN_SLICE deep)
    per_sm = config.min_blocks if config.nmax > 4 or a_t else 1
    largest = _CLUSTERS[-1]
    if (_clusters(device) and max(count, need) > 2 * largest and need <= largest
            and problem.k <= largest * _FEW_CLUSTER_MAX_DEPTH and blocks * largest <= per_sm * device.sm_count):
        return largest  # (one launch: see _FEW_CLUSTER_MAX_DEPTH)
    if not _clusters(device) or (max(count, need) > 2 * largest and not small):
        return max(count, need)
    sizes = _ANY_CLUSTER if per_sm > 1 else _CLUSTERS
    fits = max(c for c in (1, *sizes) if c == 1 or blocks * c <= per_sm * device.sm_count
               and problem.k // c >= _SPLIT_SLICE)
    # (past the clusters that fit one wave: the smallest that is enough, over more waves; else that many slices)
    return fits if fits >= need else next((c for c in _CLUSTERS if c >= need), max(count, need))


# Few-column products split K over a cluster of this many blocks, in one launch that sums the slices itself
# (7_few_columns.cu; docs/kernels/heuristic.md, section 'The heuristic's break-even points', few-columns).
_CLUSTERS = (2, 4, 8)
# ... and where two blocks share an SM (A m-contiguous, or past 4 columns), a cluster of any size up to 8: the most
# blocks that fill those slots. On an H200, A m-contiguous: 2898x2x1232 (A^T, 91 blocks of rows) 2.11x -> 3.13x
# cuBLAS in clusters of 2, 1x2358x3046 (74) 1.33x -> 2.07x in 3, 1491x4x2846 (Fortran, 47) 1.92x -> 2.24x in 5; with
# A row-major one block an SM stays the bound (2856x2x1323 (B^T, 90): 2.16x alone, 2.02x in pairs; 791x1x13821
# (strided, 25): 6.4x in 4, 4.5x in 5; docs/kernels/few-columns.md, 'Clusters of any size').
_ANY_CLUSTER = tuple(range(2, _CLUSTERS[-1] + 1))
# Few rows that would fill the SMs only in more than 16 slices (two launches: the slices, their sum) take a cluster
# of 8 instead, one launch, where its blocks walk at most this much of K each: on an H200, 13 such products from 9,414
# to 35,551 deep ran 1.2-2.5x faster than in 17-50 slices (121x16x8751 (B^T) 0.63x -> 1.36x cuBLAS, 278x6x12921 (B^T)
# 0.88x -> 2.18x: the slices' second launch and host time), 5x103x35551 (B^T, 4,444 a block) 0.87x -> 1.01x; from
# 6,357 a block they lost (73x8x99824 (A^T) 1.25x -> 0.42x; docs/kernels/few-columns.md, 'A cluster or slices').
_FEW_CLUSTER_MAX_DEPTH = 5120


def _clusters(device: Device) -> bool:
    return device.compute_capability >= (9, 0)


# A cluster of 8 over at most this many blocks of rows a cluster of 16 instead (Hopper's largest, a non-portable size),
# where its blocks still fit one an SM and walk at least _SPLIT_SLICE of K: on an H200, 142x28x15596 (offset, 5 blocks
# of rows) 0.73x -> 1.20x cuBLAS, 135x1x35769 (Fortran, 5) 0.69x -> 1.20x, 5x103x35551 (B^T, 4) 0.94x -> 1.58x; from 9
# blocks (144 past 132 SMs) 8 stayed faster, and 10 to 14 lost to 8 wherever tried (docs/kernels/few-columns.md,
# 'Clusters of 16').
_LARGE_CLUSTER = 16


def _large_cluster(count: int, blocks: int, problem: Problem, device: Device) -> int:
    """`count`, or _LARGE_CLUSTER where a single product's cluster of 8 blocks would leave most SMs idle."""
    if (count == _CLUSTERS[-1] and problem.batch == 1 and _clusters(device)
            and blocks * _LARGE_CLUSTER <= device.sm_count and problem.k // _LARGE_CLUSTER >= _SPLIT_SLICE):
        return _LARGE_CLUSTER
    return count


def _row_blocks(problem: Problem, config) -> int:
    """The few-column kernel's blocks of rows (of C, or of C^T for few rows)."""
    return -(-(problem.n if few_rows(problem, config) else problem.m) // config.tile[0])


def _in_cluster(count: int, device: Device) -> bool:
    """Whether _few_columns_count's `count` is a cluster's blocks rather than slices for the slice-sum kernel: on a GPU
    with clusters every count from 2 to 8 is (its slices number more than 8 there)."""
    return 1 < count <= _CLUSTERS[-1] and _clusters(device)


def _few_columns_cluster(problem: Problem, device: Device) -> int:
    """The cluster the few-column kernel splits K over (1: none, its slices then summed by the slice-sum kernel)."""
    count = _few_columns_count(problem, device)
    if not _in_cluster(count, device):
        return 1
    return _large_cluster(count, _row_blocks(problem, get_config(_few_columns_for(problem, device))), problem, device)


def _few_columns_kernel(problem: Problem, device: Device) -> str:
    """The few-column configuration, split over a cluster where its count of slices is one."""
    name, cluster = _few_columns_for(problem, device), _few_columns_cluster(problem, device)
    return f"{name}_c{cluster}" if cluster > 1 else name


def few_columns_splits(problem: Problem, device: Device) -> int:
    """Slices of K summed by the slice-sum kernel (a cluster sums its own: 1)."""
    return 1 if _few_columns_cluster(problem, device) > 1 else _few_columns_count(problem, device)


# 17 to 32 columns (rows, computed transposed) against more rows (columns), on a K from _NARROW_FEW_MIN_K: the 32-column
# few-column kernel (a lane per row of C, the large operand read once), K split over a cluster of as many blocks as fit
# one wave, each slice at least _SPLIT_MIN_SLICE deep, where a block walks at most the second constant's K (the third's
# where the other side is at most the fourth: few blocks, whose narrow tiles are few too); deeper, the narrow tiles'
# slices of about 512 are faster (the narrow-tiles rule; docs/kernels/heuristic.md, section 'The heuristic's
# break-even points', wide-few-columns). A lane's running sum then has at most 256 terms (up to 384 kept cuBLAS's
# accuracy; runs of K / 8 past 3072 had 1.5x its error).
_WIDE_FEW = 32
_WIDE_FEW_DEPTH, _WIDE_FEW_SHORT_DEPTH, _WIDE_FEW_SHORT_OTHER = 768, 2048, 1024


def _wide_few(problem: Problem, device: Device) -> bool:
    few, other = sorted((problem.m, problem.n))
    if problem.batch != 1 or not _FEW < few <= _WIDE_FEW or problem.k < _NARROW_FEW_MIN_K:
        return False
    config = get_config(_few_columns_for(problem, device))
    if config.nmax != _WIDE_FEW or config.smem_bytes > device.max_smem_optin:
        return False
    depth = problem.k / _wide_few_count(problem, device)
    return depth <= (_WIDE_FEW_SHORT_DEPTH if other <= _WIDE_FEW_SHORT_OTHER else _WIDE_FEW_DEPTH)


def _wide_few_count(problem: Problem, device: Device) -> int:
    """The blocks of a cluster over which K is split: the most that fit one wave with slices >= _SPLIT_MIN_SLICE."""
    config = get_config(_few_columns_for(problem, device))
    blocks = -(-max(problem.m, problem.n) // config.tile[0])  # (rows of C, or of C^T)
    return max(c for c in (1, *_CLUSTERS) if c == 1 or _clusters(device) and problem.k // c >= _SPLIT_MIN_SLICE
               and blocks * c <= config.min_blocks * device.sm_count)


def _wide_few_kernel(problem: Problem, device: Device) -> str:
    """(The rule's test judges the depth of a cluster of up to 8: a cluster of 16 only halves it.)"""
    name = _few_columns_for(problem, device)
    count = _large_cluster(_wide_few_count(problem, device), _row_blocks(problem, get_config(name)), problem, device)
    return f"{name}_c{count}" if count > 1 else name


# An output side from 17 to below this, on a K from the second constant up to split-k's: the few-column kernel's blocks
# (16 columns each, K spread over a warp's lanes) beat a handful of 64x64 tiles walking K latency-bound
# (docs/kernels/heuristic.md, section 'The heuristic's break-even points', narrow-few-columns).
_NARROW_FEW = 48
_NARROW_FEW_MIN_K = 448


def _narrow_few(problem: Problem, device: Device) -> bool:
    if problem.batch != 1 or not _FEW < min(problem.m, problem.n) < _NARROW_FEW:
        return False
    widest = get_config(FEW_COLUMNS[-1])
    return _NARROW_FEW_MIN_K <= problem.k < _SPLIT_MIN_K and widest.smem_bytes <= device.max_smem_optin
