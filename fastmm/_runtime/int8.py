"""The INT8 products of Ozaki scheme II (fastmm/kernels/8_int8_wgmma.cu) launched on tiles: c[z] = A[z] @ B[z], exact
in int32, for a batch of residue products of one shape. Not on the float32 product path yet: the Ozaki passes that
make the tiles and reconstruct C from these products are what calls it."""

from __future__ import annotations

from ..kernels.configs import INT8_WG, MAX_GRID_Y, Int8Tile, Variant

__all__ = ["int8_launch", "int8_products"]


def int8_launch(config: Int8Tile, device_id: int, m: int, n: int, k: int, batch: int, a_stride: int, b_stride: int,
                c_sm: int, c_stride: int):
    """The launch of `batch` products (M x K by K x N) on tiles: A's at a_stride bytes apart, B^T's at b_stride, C's
    (int32, or uint8 residues where config.residues; rows c_sm elements apart) at c_stride elements; called with the
    three addresses of the first."""
    from . import cuda as _cuda

    most = config.bm * (MAX_GRID_Y - 1)  # one launch (rows rounded up to whole clusters): Launch would not offset A's tiles
    if m > most:
        raise ValueError(f"at most {most} rows per launch of {config.name} (got {m})")
    kp = -(-k // config.BK) * config.BK
    return _cuda.Launch(config, Variant(), device_id, m=m, n=n, k=kp, a_sm=0, a_sk=0, b_sk=0, b_sn=0, c_sm=c_sm, c_sn=1,
                        batch=batch, batch_inner=1, batch_strides=(a_stride, 0, b_stride, 0, c_stride, 0))


def int8_products(a_tiles, b_tiles, c, k: int, config: Int8Tile = INT8_WG[0]) -> None:
    """c[z] = A[z] @ B[z] for every z, exact: `a_tiles` (batch, ...) int8, each item A (M x K) as
    `fastmm._plan.ozaki.tiles(A, config.bm)` lays it out; `b_tiles` likewise B^T (N x K) in tiles of config.bn rows;
    `c` (batch, M, N) int32 CuPy array with unit column stride (any row stride: a view of wider rows). Where
    ``config.residues``, `c` is uint8 and receives each sum modulo the z-th of Ozaki scheme II's moduli, in [0, m_z)."""
    import cupy as cp

    batch, m, n = c.shape
    kt = -(-k // config.BK)
    need = (("a_tiles", a_tiles, -(-m // config.bm) * config.bm), ("b_tiles", b_tiles, -(-n // config.bn) * config.bn))
    for what, x, rows in need:
        if x.dtype != cp.int8 or x.shape[0] != batch or x[0].size != rows * kt * config.BK or not x[0].flags.c_contiguous:
            raise ValueError(f"{what} must hold {batch} contiguous int8 items of {rows} x {kt * config.BK} values "
                             f"(tiles of {config.name}), not {x.shape} {x.dtype}")
    dtype = cp.dtype(cp.uint8 if config.residues else cp.int32)
    if c.dtype != dtype or c.strides[2] != dtype.itemsize:
        raise ValueError(f"c must be {dtype} with unit column stride for {config.name} (got {c.dtype}, strides "
                         f"{c.strides})")
    launch = int8_launch(config, cp.cuda.runtime.getDevice(), m, n, k, batch, a_tiles.strides[0], b_tiles.strides[0],
                         c.strides[1] // dtype.itemsize, c.strides[0] // dtype.itemsize)
    launch(a_tiles.data.ptr, b_tiles.data.ptr, c.data.ptr)
