"""float32 products by Ozaki scheme II on the INT8 tensor cores (fastmm/_plan/ozaki.py has the arithmetic): the
launch sequence of one product and its workspace.

The sequence: the scaling pass over A's rows and B's columns (a shift each, or a non-finite flag), the residue pass
writing each modulus's int8 residues of A and B^T in the INT8 kernel's tiles, then per chunk of C's columns the
batched INT8 products (one batch item per modulus, each sum written as its residue, one byte) and the reconstruction
pass into C. Rows of A and columns of B holding a NaN or an infinity are computed again on the FP32 path (3xTF32's
kernels) and written over their part of C.
"""

from __future__ import annotations

import numpy as np

from .._plan import ozaki as _ozaki
from ..kernels.configs import Int8Tile, Variant
from ..kernels.passes import OZAKI_CRT, OZAKI_RESIDUES, OZAKI_SCALE
from .arrays import cupy as _cupy
from .arrays import empty
from .int8 import int8_launch

__all__ = ["ozaki_product"]

_tables: dict[tuple[int, int], object] = {}  # (device, moduli) -> the reconstruction table on that device


def _table(device_id: int, moduli: tuple[int, ...]):
    cp = _cupy()
    key = (device_id, moduli)
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = cp.asarray(_ozaki.crt_table(moduli))
    return table


def _launch(config, device_id: int, **args):
    from . import cuda as _cuda

    base = dict(m=1, n=1, k=1, a_sm=0, a_sk=0, b_sk=0, b_sn=0, c_sm=0, c_sn=0, batch=1, batch_inner=1,
                batch_strides=(0,) * 6)
    base.update(args)
    return _cuda.Launch(config, Variant(), device_id, **base)


def ozaki_product(a, b, c, device_id: int, config: Int8Tile, count: int | None = None):
    """c = a @ b (float32 device arrays, 2-D; c with unit column stride) by Ozaki scheme II over the first `count`
    moduli (by default `fastmm._plan.ozaki.choose_moduli`'s); returns the rows of A and the columns of B that hold
    NaN or an infinity, whose rows and columns of c the caller computes on the FP32 path.

    `config` must reduce its sums to residues (``config.residues``). Raises fastmm's OutOfMemoryError where the
    workspace does not fit (the caller falls back), ValueError where the shape is past what one sequence takes
    (`fastmm._plan.ozaki.fits`)."""
    cp = _cupy()
    (m, k), n = a.shape, b.shape[1]
    why = _ozaki.fits(m, n, k)
    if why is not None:
        raise ValueError(f"Ozaki scheme II cannot take this product: {why}")
    if not config.residues:
        raise ValueError(f"{config.name} writes int32 sums; Ozaki scheme II's reconstruction reads residues (an "
                         "Int8Tile with residues=True)")
    moduli = _ozaki.choose_moduli(k, count)
    bits = _ozaki.side_bits(moduli)
    nm = len(moduli)
    bm, bn = config.bm, config.bn
    w = _ozaki.workspace(m, n, k, nm, bm, bn)  # (its K-tiles are the INT8 kernel's: config.BK)
    mp, np_, kp, chunk = w.mp, w.np_, w.kp, w.chunk
    shifts_a, shifts_b, tiles_a, tiles_b, products = w.shifts_a, w.shifts_b, w.tiles_a, w.tiles_b, w.products
    ws = empty((w.size,), np.uint8)
    base = ws.data.ptr
    ws[:8 * _ozaki.TABLE_WORDS] = _table(device_id, moduli).view(cp.uint8)

    sa = [s // 4 for s in a.strides]
    sb = [s // 4 for s in b.strides]
    # A's rows and B^T's rows (B's columns): R x K with strides (along r, along k).
    for x_ptr, rows, padded, (s_r, s_k), shifts, tiles, tile_rows, norm_bits in (
            (a.data.ptr, m, mp, (sa[0], sa[1]), shifts_a, tiles_a, bm, bits[0]),
            (b.data.ptr, n, np_, (sb[1], sb[0]), shifts_b, tiles_b, bn, bits[1])):
        _launch(OZAKI_SCALE, device_id, m=rows, k=k, a_sm=s_r, a_sk=s_k, c_sm=1, c_sn=norm_bits)(
            x_ptr, 0, base + shifts)
        _launch(OZAKI_RESIDUES, device_id, m=rows, n=padded, k=k, a_sm=s_r, a_sk=s_k, b_sk=tile_rows, b_sn=nm,
                c_sm=kp, batch_strides=(0, 0, 0, 0, padded * kp, 0))(x_ptr, base + shifts, base + tiles)

    c_sm = c.strides[0] // 4 if m > 1 else 0
    crt_rows = OZAKI_CRT.tile[0] * 65535  # one launch of the reconstruction: at most this many rows
    for n0 in range(0, n, chunk):
        nc = min(chunk, n - n0)
        int8_launch(config, device_id, m, nc, k, nm, mp * kp, np_ * kp, nc, m * nc)(
            base + tiles_a, base + tiles_b + n0 * kp, base + products)
        for m0 in range(0, m, crt_rows):
            mc = min(crt_rows, m - m0)
            _launch(OZAKI_CRT, device_id, m=mc, n=nc, k=nm, a_sm=nc, a_sk=m * nc,
                    b_sk=shifts_a // 4 + m0, b_sn=shifts_b // 4 + n0, c_sm=c_sm, c_sn=1)(
                base + products + m0 * nc, base, c.data.ptr + 4 * (m0 * c_sm + n0))

    shifts = ws[shifts_a:shifts_a + 4 * m].view(cp.int32), ws[shifts_b:shifts_b + 4 * n].view(cp.int32)
    bad_a, bad_b = (cp.flatnonzero(s == _ozaki.NONFINITE) for s in shifts)
    del ws
    return bad_a, bad_b
