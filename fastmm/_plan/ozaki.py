"""Ozaki scheme II for float32 products: the arithmetic of the INT8 kernels, as a NumPy reference.

A (M x K) and B (K x N) are scaled, row by row and column by column, by powers of two and rounded to integers A',
B' small enough that every sum of products in C' = A' B' stays below half the product P of a set of pairwise coprime
moduli m_1..m_n, each at most 256. Then C' is exact from its residues: each modulus's residues of A' and B' fit in
int8, their product is exact in int32 (K below `MAX_EXACT_K`), and the Chinese remainder theorem puts the n
products back together into C', which the scaling turns back into C. The only rounding is A's and B's to integers,
so the number of moduli sets the accuracy. Each row of A' and column of B' is scaled to a 2-norm just below
2^`side_bits`, so that |a' . b'| <= ||a'|| ||b'|| < P / 2 (Cauchy-Schwarz) holds for every element of C'. Rows and
columns holding NaN or an infinity take the FP32 path instead, so they come out as IEEE arithmetic says. The method
is that of Ozaki, Uchino and Imamura (arXiv 2508.03984), the norm bound their fast mode's; this module is our own.

Pure NumPy and Python integers (no CUDA): it fixes what the kernels must compute, and the CPU tests check it
against float64.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..kernels.passes import NONFINITE, OZAKI_MODULI, OZAKI_NORM_SLACK, OZAKI_RESIDUES

__all__ = ["MODULI", "MAX_EXACT_K", "TILE_K", "NONFINITE", "TABLE_WORDS", "PRODUCTS_BYTES", "MODULI_BY_K",
           "MOST_MODULI", "NORM_SLACK", "choose_moduli", "side_bits", "scaled_integers", "symmetric_residues", "tiles",
           "crt_table", "crt_as_the_pass_does", "column_chunk", "workspace", "Workspace", "workspace_bytes", "fits",
           "matmul_reference"]

# Pairwise coprime, at most 256: symmetric residues lie in [-128, 127], int8's range. Largest first: the fewest
# moduli for a given product M. (Defined beside the passes that compile them in as constants.)
MODULI = OZAKI_MODULI
# |residue| <= 128: K products of two of them stay within int32 while K * 128 * 128 < 2^31.
MAX_EXACT_K = (2**31 - 1) // (128 * 128)
# int8 values of k per K-tile of the INT8 product kernel (fastmm/kernels/8_int8_wgmma.cu): one 128-byte swizzled row.
TILE_K = 128


# Moduli by K (up to and including the first number). 7 (their product is 2^55.7: 2-norms below 2^27 a side) leave
# at most 0.35x the error of a float32 sum in cuBLAS's SGEMM order on normal, random-sign and row-scaled data up to the
# exact int32 range; rows with one value 256x the rest lose bits to it, 0.5x at K = 16384 but 1.1-2.4x at 1024, where
# 8 keep 0.3-0.4x. 9 buy bits that a float32 result rounds away (docs/kernels/ozaki.md, "How many moduli").
MODULI_BY_K = ((4096, 8), (MAX_EXACT_K, 7))
# A row's 2-norm, summed in double, is taken this much larger: past the sum's rounding (K 2^-53), so that the bound
# holds. (Defined beside the scaling pass, which compiles it in.)
NORM_SLACK = OZAKI_NORM_SLACK


# At most 9: the reconstruction pass's double arithmetic holds x to within 2^-47 P, which past 9 moduli (P > 2^71)
# grows past the float32 rounding of C; and 2 moduli cannot bound even a single product of rounded values (P < 2 r^2).
MOST_MODULI = 9


def choose_moduli(k: int, count: int | None = None) -> tuple[int, ...]:
    """The moduli of a K-long product: the first `count` of MODULI (the largest: the most bits a product), by default
    as many as `MODULI_BY_K` says. The bound they keep holds at every K up to MAX_EXACT_K (`side_bits`); a longer K is
    summed in slices of that."""
    if count is None:
        k = min(max(k, 1), MAX_EXACT_K)
        count = next(count for most, count in MODULI_BY_K if k <= most)
    if not 3 <= count <= MOST_MODULI:
        raise ValueError(f"Ozaki scheme II takes 3 to {MOST_MODULI} moduli, not {count}")
    return MODULI[:count]


def side_bits(moduli: tuple[int, ...]) -> tuple[int, int]:
    """The 2-norm bounds (as powers of two) of each row of A' and each column of B' under `moduli`: the largest
    h_a + h_b with (2^h_a + r)(2^h_b + r) < P / 2, r = sqrt(MAX_EXACT_K) / 2 the most that rounding to integers adds
    to a norm, split evenly; at most 30 each (the passes hold A' and B' in int32)."""
    total = math.prod(moduli)
    r = math.isqrt(MAX_EXACT_K) // 2 + 1
    both = total.bit_length()
    while (2 ** (both // 2) + r) * (2 ** (both - both // 2) + r) * 2 >= total:
        both -= 1
    h_a = min(both // 2, 30)
    return h_a, min(both - both // 2, 30)


def scaled_integers(x: np.ndarray, bits: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """x scaled along `axis` (1: each row, 0: each column) by the power of two that puts its 2-norm (summed in double,
    times NORM_SLACK) just below 2^bits, and rounded to integers (int64); with the exponents to scale back by
    (x ~ ints * 2^-e). A row of zeros keeps a shift of 0."""
    x64 = x.astype(np.float64)
    norm = np.sqrt(np.sum(x64 * x64, axis=axis, keepdims=True)) * NORM_SLACK
    _, exponent = np.frexp(norm)  # norm = f * 2^exponent, f in [0.5, 1): norm < 2^exponent
    shift = np.where(norm > 0, bits - exponent, 0).astype(np.int64)
    return np.rint(np.ldexp(x64, shift)).astype(np.int64), shift


def symmetric_residues(x: np.ndarray, m: int) -> np.ndarray:
    """x mod m in [-m/2, m/2), as int8 (m <= 256)."""
    r = np.mod(x, m)
    return np.where(r >= (m + 1) // 2, r - m, r).astype(np.int8)


def tiles(x, rows: int, xp=np):
    """x (R x K, int8) as the INT8 product kernel (fastmm/kernels/8_int8_wgmma.cu) reads an operand: A with `rows` its
    BM, B^T with `rows` its BN. Zero-padded to whole block tiles of `rows` rows and whole K-tiles of `TILE_K`, cut into
    those tiles, block row by block row and within one K-tile by K-tile, each tile `rows` rows of 128 bytes (k
    contiguous) with the 16-byte piece q of row rr at piece q ^ (rr % 8), the 128-byte swizzle wgmma's descriptors name.
    Returned as (R / rows, K / TILE_K, rows, TILE_K), contiguous: element (r, k) at byte
    ((r // rows) * (Kp // 128) + k // 128) * rows * 128 + (r % rows) * 128 + ((k % 128 // 16) ^ (r % 8)) * 16 + k % 16.

    `xp` is the array module (NumPy, or CuPy for device arrays): the Ozaki passes write this layout on the GPU, and the
    tests build it from whole matrices with this function.
    """
    r, k = x.shape
    rp, kp = -(-r // rows) * rows, -(-max(k, 1) // TILE_K) * TILE_K
    padded = xp.zeros((rp, kp), dtype=xp.int8)
    padded[:r, :k] = x
    blocks = padded.reshape(rp // rows, rows, kp // TILE_K, 8, 16).transpose(0, 2, 1, 3, 4)  # (rb, kt, rr, piece, byte)
    rr = xp.arange(rows)[:, None]
    source = xp.arange(8)[None, :] ^ (rr % 8)  # piece p of row rr holds piece p ^ (rr % 8) of the row as written
    return xp.ascontiguousarray(blocks[:, :, rr, source]).reshape(rp // rows, kp // TILE_K, rows, TILE_K)


# The reconstruction pass's table (pass_ozaki_crt.cu): 8-byte words, an inverse per modulus, then the moduli's product
# as a double.
TABLE_WORDS = len(MODULI) + 1
# Bytes of residue products (one byte each: the INT8 kernel reduces each sum modulo its modulus) one launch sequence
# keeps at a time: the product runs over chunks of columns that fit.
PRODUCTS_BYTES = 1 << 31


def crt_table(moduli: tuple[int, ...]) -> np.ndarray:
    """The reconstruction pass's table for `moduli`, a prefix of MODULI (uint64, TABLE_WORDS long): v_t = (P / m_t)^-1
    mod m_t at word t, P = prod(moduli) as a double's bits at word len(MODULI)."""
    if tuple(moduli) != MODULI[:len(moduli)]:
        raise ValueError(f"the reconstruction pass takes a prefix of MODULI (its moduli are compiled in), not {moduli}")
    total = math.prod(moduli)
    words = np.zeros(TABLE_WORDS, np.uint64)
    for t, m in enumerate(moduli):
        words[t] = pow(total // m, -1, m)
    words[len(MODULI)] = np.array([float(total)]).view(np.uint64)[0]
    return words


def crt_as_the_pass_does(residues: np.ndarray, moduli: tuple[int, ...]) -> np.ndarray:
    """The reconstruction pass's arithmetic (pass_ozaki_crt.cu) in NumPy: `residues` (n, ...) in [0, m_t) to x in
    [-P/2, P/2) as float64, within 2^-47 P of the exact integer (`_crt`)."""
    table = crt_table(moduli)
    fraction = np.zeros(residues.shape[1:], np.float64)
    for t, m in enumerate(moduli):
        fraction += (residues[t].astype(np.int64) * int(table[t]) % m) * (1.0 / m)
    fraction -= np.floor(fraction)
    fraction = np.where(fraction >= 0.5, fraction - 1.0, fraction)
    return fraction * table[len(MODULI):].view(np.float64)[0]


def column_chunk(m: int, n: int, n_moduli: int, bn: int, budget: int = PRODUCTS_BYTES) -> int:
    """Columns of C per launch sequence: the most, in whole block tiles of `bn`, whose n_moduli residue products (M x
    columns each, one byte an element) fit in `budget` bytes; at least one block tile, at most N."""
    fit = budget // (n_moduli * max(m, 1)) // bn * bn
    return min(n, max(bn, fit))


# Each part of the workspace starts 256-byte aligned: for the passes' 16-byte stores and the bulk copies.
_ALIGN = 256


@dataclasses.dataclass(frozen=True)
class Workspace:
    """The Ozaki launch sequence's workspace, one allocation: where each part starts (bytes) and how large it is. The
    table, the shifts of A's rows and B's columns, the residue tiles of A and B^T (n_moduli x (M + N) x K, padded to
    whole tiles: `mp`, `np_`, `kp`) and the residue products (uint8) of one chunk of `chunk` columns."""

    mp: int
    np_: int
    kp: int
    chunk: int
    shifts_a: int
    shifts_b: int
    tiles_a: int
    tiles_b: int
    products: int
    size: int


def workspace(m: int, n: int, k: int, n_moduli: int, bm: int, bn: int, budget: int = PRODUCTS_BYTES) -> Workspace:
    """The workspace of an M x N x K product over `n_moduli` moduli on bm x bn block tiles (the table first, at 0)."""
    def up(x: int) -> int:
        return -(-x // _ALIGN) * _ALIGN

    mp, np_, kp = -(-m // bm) * bm, -(-n // bn) * bn, -(-max(k, 1) // TILE_K) * TILE_K
    chunk = column_chunk(m, n, n_moduli, bn, budget)
    shifts_a = up(8 * TABLE_WORDS)
    shifts_b = shifts_a + 4 * mp
    tiles_a = up(shifts_b + 4 * np_)
    tiles_b = tiles_a + n_moduli * mp * kp
    products = up(tiles_b + n_moduli * np_ * kp)
    return Workspace(mp, np_, kp, chunk, shifts_a, shifts_b, tiles_a, tiles_b, products,
                     products + n_moduli * m * chunk)


def workspace_bytes(m: int, n: int, k: int, n_moduli: int, bm: int, bn: int, budget: int = PRODUCTS_BYTES) -> int:
    """Bytes of the Ozaki launch sequence's workspace (`workspace`)."""
    return workspace(m, n, k, n_moduli, bm, bn, budget).size


def fits(m: int, n: int, k: int) -> str | None:
    """Why one Ozaki launch sequence (fastmm/_runtime/ozaki.py) cannot take an M x N x K product, or None where it can:
    K past MAX_EXACT_K (those products take the FP32 path whole), or a side past the residue pass's rows."""
    rows = OZAKI_RESIDUES.rows_per_launch()
    if k > MAX_EXACT_K:
        return f"K = {k} is past {MAX_EXACT_K}, the longest sum of int8 products that int32 holds exactly"
    if max(m, n) > rows:
        return f"an output side of {max(m, n)} is past {rows}, the residue pass's rows per launch"
    return None


def _crt(residues: list[np.ndarray], moduli: tuple[int, ...]) -> np.ndarray:
    """The integers in [-M/2, M/2) with the given residues (exact: Python integers)."""
    total = math.prod(moduli)
    acc = np.zeros(residues[0].shape, dtype=object)
    for r, m in zip(residues, moduli):
        rest = total // m
        acc = acc + r.astype(object) * (rest * pow(rest, -1, m))
    acc = acc % total
    return np.where(acc >= total // 2, acc - total, acc)


def matmul_reference(a: np.ndarray, b: np.ndarray, count: int | None = None) -> np.ndarray:
    """float32 A @ B by Ozaki scheme II, as the INT8 kernels compute it (float32 result), over the first `count`
    moduli (by default `choose_moduli`'s)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul_reference multiplies (M, K) by (K, N) (got {a.shape} and {b.shape})")
    k = a.shape[1]
    moduli = choose_moduli(k, count)
    h_a, h_b = side_bits(moduli)
    bad_rows = ~np.isfinite(a).all(axis=1)
    bad_cols = ~np.isfinite(b).all(axis=0)
    a_ok, b_ok = np.where(bad_rows[:, None], 0, a), np.where(bad_cols[None, :], 0, b)
    ai, ea = scaled_integers(a_ok, h_a, axis=1)
    bi, eb = scaled_integers(b_ok, h_b, axis=0)
    products = []
    for m in moduli:
        ra, rb = symmetric_residues(ai, m).astype(np.int64), symmetric_residues(bi, m).astype(np.int64)
        acc = np.zeros((a.shape[0], b.shape[1]), np.int64)
        for start in range(0, k, MAX_EXACT_K):  # each slice of K exact in int32, as the int8 products give it
            part = ra[:, start:start + MAX_EXACT_K] @ rb[start:start + MAX_EXACT_K]
            assert np.abs(part).max(initial=0) < 2**31
            acc = np.mod(acc + part, m)
        products.append(acc)
    exact = _crt(products, moduli) if k <= MAX_EXACT_K else None
    if exact is None:  # a sum over more than one slice can pass M/2: each slice reconstructed apart, then added
        exact = np.zeros(products[0].shape, dtype=object)
        for start in range(0, k, MAX_EXACT_K):
            sl = slice(start, start + MAX_EXACT_K)
            exact = exact + _crt([np.mod(symmetric_residues(ai[:, sl], m).astype(np.int64)
                                         @ symmetric_residues(bi[sl], m).astype(np.int64), m) for m in moduli],
                                 moduli)
    c = np.ldexp(exact.astype(np.float64), -(ea + eb))
    out = c.astype(np.float32)
    if bad_rows.any() or bad_cols.any():  # NaN and infinities as IEEE arithmetic gives them: the FP32 path
        with np.errstate(invalid="ignore"):  # inf - inf is NaN, as it should be
            fp32 = a @ b
        out[bad_rows, :] = fp32[bad_rows, :]
        out[:, bad_cols] = fp32[:, bad_cols]
    return out
