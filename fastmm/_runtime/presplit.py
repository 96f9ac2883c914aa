"""The tensor-core products ("high" and "medium" precision on the wgmma kernels): A and B split into TF32 parts by a
pass of their own (or read through tensor maps where their layout allows), then the product, and its replay."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from .. import _errors
from ..kernels.configs import MAX_GRID_Y, SPLIT, Split, Variant, WgTile
from ..kernels.passes import NONFINITE_FIX
from .arrays import _batch_item, empty
from .recording import Recorder, _SwappedReplay

# Marks of mapped products' guard flags (1 .. 2^31 - 1), one per product built.
_MARKS = itertools.count()


class _PresplitReplay:
    """A product on the wgmma kernels (see _presplit): a fresh workspace, the split passes over A and B (either None:
    that operand read through its tensor map), the product, and around a mapped one its guard (`guard`: the launch
    that fixes the tiles the product flagged, and the flags' offset in the workspace). Called with the
    addresses of A, B and C (plus fixed offsets: a piece of a larger product)."""

    __slots__ = ("size", "split_a", "split_b", "b_at", "product", "guard", "offsets")

    def __init__(self, size, split_a, split_b, b_at, product, offsets=(0, 0, 0), guard=None):
        self.size, self.split_a, self.split_b, self.b_at, self.product = size, split_a, split_b, b_at, product
        self.offsets, self.guard = offsets, guard

    def __call__(self, pa: int, pb: int, pc: int):
        ws = empty((self.size,))
        base = ws.data.ptr
        da, db, dc = self.offsets
        pa, pb, pc = pa + da, pb + db, pc + dc
        a, b = pa, pb  # (an operand read through its tensor map: its own address for the map)
        if self.split_a is not None:
            self.split_a(pa, 0, base)
            a = base
        if self.split_b is not None:
            self.split_b(pb, 0, base + 4 * self.b_at)
            b = base + 4 * self.b_at
        if self.guard is None:
            self.product(a, b, pc)
            return
        fix, at = self.guard
        flags = base + 4 * at
        self.product(a, b, pc, flags)
        fix(pa, pb, pc, flags)


def _presplit(a, b, c, config: WgTile, device_id: int, record: Recorder | None, mapped: bool = True,
              swapped: bool = False) -> None:
    """c = a @ b on a wgmma kernel: A and B^T written by the split pass (pass_tf32_split.cu) as TF32 parts in swizzled
    block tiles of whole K-tiles, zero-padded, into one workspace, then the product on those.

    Workspace: A's parts (mp x kp each, 3xTF32 two), B^T's (np x kp each), then 3xTF32's flags (one int per 32 x 32
    tile of A, then of B^T). A batched product runs item by item."""
    from . import cuda as _cuda
    from . import tensor_map as _tensor_map

    if c.ndim > 2 and math.prod(c.shape[:-2]) > 1:
        if record is not None:
            record.append(None)
        for index in np.ndindex(*c.shape[:-2]):
            _presplit(_batch_item(a, index), _batch_item(b, index), c[index], config, device_id, None)
        return
    a, b, c = (x.reshape(x.shape[-2:]) for x in (a, b, c))
    (m, k), n = a.shape, b.shape[1]
    # One pass: operands go through tensor maps where they can (a map's copy rounds; the guard's tiles are these).
    mapped = mapped and config.passes == 1 and (config.bm, config.bn) == NONFINITE_FIX.tile
    if mapped and not swapped and _swaps(a, b, config):
        # B's rows along N, which TF32 wgmma does not read from shared memory, and A's along K: C^T = B^T A^T, with
        # B^T (along M there) as wgmma's register operand and A^T (K-major) through a map: neither is split.
        _presplit(b.T, a.T, c.T, config, device_id, record, swapped=True)
        return
    # The rows of A and of B^T that one launch of the split pass covers (a forced kernel; the plan stays below).
    rows, cols = SPLIT.rows_per_launch(config.bm, MAX_GRID_Y), SPLIT.rows_per_launch(config.bn, MAX_GRID_Y)
    if (m > rows or n > cols) and not (swapped and mapped):  # (swapped and mapped: neither operand is split)
        if record is not None:
            record.append(None)
        for m0 in range(0, m, rows):
            for n0 in range(0, n, cols):
                _presplit(a[m0:m0 + rows], b[:, n0:n0 + cols], c[m0:m0 + rows, n0:n0 + cols], config, device_id, None)
        return
    mp, np_, kp = (-(-x // t) * t for x, t in ((m, config.bm), (n, config.bn), (k, config.BK)))
    parts = 2 if config.passes == 3 else 1
    b_at = parts * mp * kp
    flags_a = b_at + parts * np_ * kp  # 3xTF32's flags
    flags_b = flags_a + mp // Split.TILE * (kp // Split.TILE)
    size = flags_b + np_ // Split.TILE * (kp // Split.TILE) if parts == 2 else flags_a

    def split(rows, padded, s_r, s_k, flags, tile):  # one operand into block tiles of `tile` rows (b_sk)
        return _cuda.Launch(SPLIT, Variant(), device_id, m=rows, n=padded, k=k, a_sm=s_r, a_sk=s_k, b_sk=tile, b_sn=0,
                            c_sm=kp, c_sn=1, batch=1, batch_inner=1,
                            batch_strides=(0, 0, 0, 0, tile * config.BK if parts == 2 else 0,
                                           flags if parts == 2 else 0))

    sa, sb = ([st // 4 for st in x.strides] for x in (a, b))
    c_sm, c_sn = (c.strides[0] // 4 if m > 1 else 0), (c.strides[1] // 4 if n > 1 else 1)  # (C^T: c_sn its rows')
    # One pass: a K-major operand (A's rows, or B's columns, contiguous along K) goes through a tensor map, whose
    # copies round it (6_wgmma.cu, A_TMA / B_TMA); so does an A along M, into registers (A_RS); the others are split.
    a_map = _tensor_map.operand_map(a.data.ptr, m, k, sa[0], sa[1], (config.bm, config.BK)) if mapped else None
    r_map = _along_m(a, config) if mapped and a_map is None else None
    b_map = _tensor_map.operand_map(b.data.ptr, n, k, sb[1], sb[0], (config.bn, config.BK)) if mapped else None
    maps = ("a" if a_map else "r" if r_map else "") + ("b" if b_map else "")
    at_b = 0 if a_map or r_map else b_at  # B^T's tiles right after A's, or first
    split_a = None if a_map or r_map else split(m, mp, sa[0], sa[1], flags_a, config.bm)
    split_b = None if b_map else split(n, np_, sb[1], sb[0], flags_b - b_at, config.bn)
    guard = None
    if maps:
        tiles_x, tiles_y = np_ // config.bn, mp // config.bm
        # The guard of the maps' rounding: an int per block tile after the tiles, set to this product's mark where C
        # holds a non-finite value; not zeroed first (pass_nonfinite_fix.cu: a stale mark costs a second look only).
        mark = next(_MARKS) % 0x7FFFFFFF + 1
        product = _tensor_map.MappedLaunch(
            dataclasses.replace(config, maps=maps), Variant(), device_id, maps=(a_map or r_map, b_map),
            a_along_m=r_map is not None, m=m, n=n, k=kp, a_sm=sa[0] if a_map or r_map else 0, a_sk=1, b_sk=0, b_sn=0,
            c_sm=c_sm, c_sn=c_sn, batch=1, batch_inner=1,
            batch_strides=(0, mark, 0, 0, tiles_x, 0))  # (a_sm: a chunk of rows starts A's map that many rows on)
        size = (0 if a_map or r_map else mp * kp) + (0 if b_map else np_ * kp)
        fix = _tensor_map.GuardLaunch(
            NONFINITE_FIX, Variant(), device_id, m=m, n=n, k=k, a_sm=sa[0], a_sk=sa[1], b_sk=sb[0], b_sn=sb[1],
            c_sm=c_sm, c_sn=c_sn, batch=1, batch_inner=1, batch_strides=(0, tiles_x, mark, 0, 0, 0))
        guard, size = (fix, size), size + tiles_x * tiles_y
    else:
        product = _cuda.Launch(dataclasses.replace(config, maps=""), Variant(), device_id, m=m, n=n, k=kp, a_sm=0,
                               a_sk=0, b_sk=0, b_sn=0, c_sm=c_sm, c_sn=c_sn, batch=1, batch_inner=1,
                               batch_strides=(flags_a, 0, flags_b - b_at, 0, 0, 0))
    run = _PresplitReplay(size, split_a, split_b, at_b, product, guard=guard)
    try:
        run(a.data.ptr, b.data.ptr, c.data.ptr)
    except _errors.LaunchError as e:
        if not maps:
            raise
        # The driver would not encode a map for these operands (a limit mappable() does not know) or launch the mapped
        # kernel: split them.
        key = f"the CUDA driver would not take {config.name}'s operands through tensor maps: they are split instead"
        if swapped:  # both split: the product's own orientation, C stored row by row
            _presplit(b.T, a.T, c.T, config, device_id, record, mapped=False)
        else:
            _presplit(a, b, c, config, device_id, record, mapped=False)  # (C whole before a warning that may raise)
        _errors.warn_once(key, f"{key} ({e})")
        return
    if record is not None:
        bases = (record.base[1], record.base[0], record.base[2]) if swapped else record.base
        run.offsets = tuple(x.data.ptr - base for x, base in zip((a, b, c), bases))
        record.append(_SwappedReplay(run, 0, 0, 0) if swapped else run)


def _along_m(a, config: WgTile):
    """The tensor map of an A whose rows run along M (its K x M view row-major), copied in 32 x 32 boxes into
    registers (6_wgmma.cu, A_RS); None where a map cannot read it."""
    from . import tensor_map as _tensor_map

    (m, k), (s_m, s_k) = a.shape, (st // 4 for st in a.strides)
    if m < 2 or s_m != 1 or k < 2:
        return None
    return _tensor_map.operand_map(a.data.ptr, k, m, s_k, s_m, (config.BK, 32))


def _swaps(a, b, config: WgTile) -> bool:
    """Whether A @ B runs as C^T = B^T A^T on a mapped one-pass product: B's rows along N (no map reads that for
    wgmma's shared-memory operand) and A's along K (a map reads A^T as the swapped product's B)."""
    from . import tensor_map as _tensor_map

    (m, k), n = a.shape, b.shape[1]
    (s_am, s_ak), (s_bk, s_bn) = ((st // 4 for st in x.strides) for x in (a, b))
    if min(m, n, k) < 2 or s_bn != 1 or s_ak != 1:
        return False
    return (_tensor_map.operand_map(a.data.ptr, m, k, s_am, s_ak, (config.bn, config.BK)) is not None
            and _along_m(b.T, config) is not None)
