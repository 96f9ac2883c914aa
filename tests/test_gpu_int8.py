"""The INT8 products of Ozaki scheme II (fastmm/kernels/8_int8_wgmma.cu) on the GPU: exact against NumPy's int64
products (or, for a configuration that reduces them, each modulo its modulus), for ragged shapes (K not a multiple of
128: zero padding), a batch of residue slices, the extremes of int8 and rows of C wider than N. Hopper only (wgmma)."""

from __future__ import annotations

import numpy as np
import pytest

from fastmm._plan import ozaki
from fastmm.kernels.configs import INT8_WG

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

SHAPES = [(1, 1, 1), (5, 7, 3), (64, 64, 64), (128, 256, 128), (129, 257, 129), (200, 300, 200), (256, 512, 384),
          (1000, 999, 1001), (127, 1, 4000), (1, 300, 255), (513, 769, 2049)]
SLICES = 3


@pytest.fixture(autouse=True)
def _hopper():
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the INT8 wgmma kernels run on Hopper (sm_90) only")


def _product(a, b, config, pitch=0):
    """a (S, M, K) @ b (S, K, N) on the kernel, int32 on the host; `pitch` extra columns in C's rows (a view), which
    must come back as they were (poisoned)."""
    from fastmm._runtime.int8 import int8_products

    (s, m, k), n = a.shape, b.shape[2]
    a_t = cp.stack([ozaki.tiles(cp.asarray(x), config.bm, xp=cp) for x in a])
    b_t = cp.stack([ozaki.tiles(cp.asarray(np.ascontiguousarray(x.T)), config.bn, xp=cp) for x in b])
    poison = 171 if config.residues else -7  # any unwritten element shows
    wide = cp.full((s, m, n + pitch), poison, dtype=cp.uint8 if config.residues else cp.int32)
    int8_products(a_t, b_t, wide[:, :, :n], k, config)
    out = cp.asnumpy(wide)
    assert (out[:, :, n:] == poison).all(), "the kernel wrote past N"
    return out[:, :, :n]


def _expected(a, b, config):
    """The exact products (int64), or where the kernel reduces them, each slice z modulo the z-th modulus."""
    exact = np.matmul(a.astype(np.int64), b.astype(np.int64))
    if not config.residues:
        return exact
    return np.mod(exact, np.array(ozaki.MODULI[:len(exact)], np.int64)[:, None, None])


@pytest.mark.parametrize("config", INT8_WG, ids=lambda c: c.name)
@pytest.mark.parametrize("m,n,k", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
def test_int8_products_are_exact(m, n, k, config, rng):
    a = rng.integers(-128, 128, (SLICES, m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (SLICES, k, n), dtype=np.int8)
    ref = _expected(a, b, config)
    got = _product(a, b, config, pitch=3 if n % 2 else 0)
    bad = np.argwhere(got != ref)
    assert bad.size == 0, f"{len(bad)} wrong elements, first at {tuple(bad[0])}: {got[tuple(bad[0])]} != {ref[tuple(bad[0])]}"


@pytest.mark.parametrize("config", INT8_WG, ids=lambda c: c.name)
def test_the_extremes_of_int8_sum_exactly(config):
    """-128 * -128 over a long K (2^14 per term, 2^27 in all) and sums that cancel to small values, in every slice."""
    m, n, k = 300, 260, 8192
    a = np.full((SLICES, m, k), -128, np.int8)
    b = np.full((SLICES, k, n), -128, np.int8)
    b[1, ::2] = 127  # slice 1: alternating signs along k
    a[2] = np.where(np.arange(k) % 3 == 0, 127, -128).astype(np.int8)[None, :]
    ref = np.matmul(a.astype(np.int64), b.astype(np.int64))
    assert np.abs(ref).max() < 2**31
    assert np.array_equal(_product(a, b, config), _expected(a, b, config))


@pytest.mark.parametrize("config", [c for c in INT8_WG if c.cluster == 1 and c.bn == 256], ids=lambda c: c.name)
def test_odd_row_strides_of_c_take_the_scalar_stores(config, rng):
    """C's rows an odd number of elements apart: no 8-byte (int32) or 2-byte (residues) store may be issued."""
    a = rng.integers(-128, 128, (SLICES, 130, 200), dtype=np.int8)
    b = rng.integers(-128, 128, (SLICES, 200, 270), dtype=np.int8)
    assert np.array_equal(_product(a, b, config, pitch=1), _expected(a, b, config))


@pytest.mark.parametrize("config", [c for c in INT8_WG if c.persistent], ids=lambda c: c.name)
def test_persistent_blocks_walk_every_tile_once(config, rng):
    """More block tiles than the launch has blocks (17 x 17 a batch item against 132): each block takes several,
    its barriers' uses counting on across them, and every element comes out right."""
    m, n, k = 2049, 4100, 128
    assert -(-m // config.bm) * -(-n // config.bn) > config.grid(m, n, 1)[0]
    a = rng.integers(-128, 128, (2, m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (2, k, n), dtype=np.int8)
    assert np.array_equal(_product(a, b, config, pitch=1), _expected(a, b, config))
