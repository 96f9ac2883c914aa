"""NumPy's rules for the matrix-product family, as pure functions on shapes and dtypes.

Output shapes, broadcasting, ``out=`` checks and dtype resolution raise NumPy's own exceptions, worded as NumPy
words them, so that a NumPy user recognises them. Nothing here touches a GPU or imports CuPy: the rules are
tested against NumPy itself on any machine.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["matmul_shapes", "dot_shapes", "inner_shapes", "tensordot_axes", "einsum_as_gemm", "check_out",
           "check_dot_out", "input_dtype"]

_MATMUL_SIG = "(n?,k),(k,m?)->(n?,m?)"


def _fmt(shape: Sequence[Any]) -> str:
    """NumPy's way of printing a shape in error messages: (2,3), (3,), ()."""
    items = ",".join(str(s) for s in shape)
    return f"({items},)" if len(shape) == 1 else f"({items})"


def _broadcast_batch(ashape, bshape, a_core: int, b_core: int, out_core: tuple) -> tuple[int, ...]:
    abatch, bbatch = tuple(ashape[:len(ashape) - a_core]), tuple(bshape[:len(bshape) - b_core])
    try:
        return tuple(np.broadcast_shapes(abatch, bbatch))
    except ValueError:
        remap = lambda s, batch, core: f"{_fmt(s)}->{_fmt(batch + ('newaxis',) * core)}"  # noqa: E731
        raise ValueError(
            "operands could not be broadcast together with remapped shapes [original->remapped]: "
            f"{remap(ashape, abatch, a_core)} {remap(bshape, bbatch, b_core)}  and requested shape "
            f"{_fmt(out_core)}") from None


def _gufunc_core_error(name: str, sig: str, operand: int, dim: int, got: int, want: int, which="Input"):
    return ValueError(f"{name}: {which} operand {operand} has a mismatch in its core dimension {dim}, with gufunc "
                      f"signature {sig} (size {got} is different from {want})")


def _too_few_dims(name: str, sig: str, operand: int, has: int, needs: int):
    return ValueError(f"{name}: Input operand {operand} does not have enough dimensions (has {has}, gufunc core "
                      f"with signature {sig} requires {needs})")


def matmul_shapes(ashape: Sequence[int], bshape: Sequence[int]) -> tuple[tuple[int, ...], int, int, int]:
    """Output shape and (m, n, k) of ``np.matmul`` on these shapes, or NumPy's ValueError.

    1-D operands are promoted (a to a row, b to a column) and the promoted axis is dropped from the result.

    >>> matmul_shapes((2, 1, 3, 4), (5, 4, 6))
    ((2, 5, 3, 6), 3, 6, 4)
    >>> matmul_shapes((4,), (4,))
    ((), 1, 1, 4)
    """
    ashape, bshape = tuple(ashape), tuple(bshape)
    for i, s in enumerate((ashape, bshape)):
        if len(s) == 0:
            raise _too_few_dims("matmul", _MATMUL_SIG, i, 0, 1)
    m = 1 if len(ashape) == 1 else ashape[-2]
    k = ashape[-1]
    kb, n = (bshape[0], 1) if len(bshape) == 1 else (bshape[-2], bshape[-1])
    if kb != k:
        raise _gufunc_core_error("matmul", _MATMUL_SIG, 1, 0, kb, k)
    core = (() if len(ashape) == 1 else (m,)) + (() if len(bshape) == 1 else (n,))
    batch = _broadcast_batch(ashape, bshape, min(len(ashape), 2), min(len(bshape), 2), core)
    return batch + core, m, n, k


def dot_shapes(ashape: Sequence[int], bshape: Sequence[int]) -> tuple[int, ...]:
    """Output shape of ``np.dot`` for operands of at least one dimension, or NumPy's ValueError."""
    ashape, bshape = tuple(ashape), tuple(bshape)
    kdim = 0 if len(bshape) == 1 else len(bshape) - 2
    if ashape[-1] != bshape[kdim]:
        raise ValueError(f"shapes {_fmt(ashape)} and {_fmt(bshape)} not aligned: "
                         f"{ashape[-1]} (dim {len(ashape) - 1}) != {bshape[kdim]} (dim {kdim})")
    return ashape[:-1] + bshape[:kdim] + bshape[kdim + 1:]


def inner_shapes(ashape: Sequence[int], bshape: Sequence[int]) -> tuple[int, ...]:
    """Output shape of ``np.inner`` for operands of at least one dimension, or NumPy's ValueError."""
    ashape, bshape = tuple(ashape), tuple(bshape)
    if ashape[-1] != bshape[-1]:
        # NumPy reports b with its last two axes swapped, as its implementation (a dot with b^T) sees it.
        moved = bshape[:-2] + (bshape[-1], bshape[-2]) if len(bshape) > 1 else bshape
        raise ValueError(f"shapes {_fmt(ashape)} and {_fmt(moved)} not aligned: "
                         f"{ashape[-1]} (dim {len(ashape) - 1}) != {bshape[-1]} (dim {max(len(bshape) - 2, 0)})")
    return ashape[:-1] + bshape[:-1]


def tensordot_axes(andim: int, bndim: int, axes) -> tuple[list[int], list[int]]:
    """Normalise ``np.tensordot``'s `axes` argument to two lists of non-negative axes."""
    try:
        iter(axes)
    except TypeError:
        n = int(axes)
        return list(range(andim - n, andim)), list(range(0, n))
    axes_a, axes_b = axes
    axes_a = [axes_a] if np.ndim(axes_a) == 0 else list(axes_a)
    axes_b = [axes_b] if np.ndim(axes_b) == 0 else list(axes_b)
    if len(axes_a) != len(axes_b):
        raise ValueError("shape-mismatch for sum")
    return [a % andim if andim else a for a in axes_a], [b % bndim if bndim else b for b in axes_b]


def einsum_as_gemm(subscripts: str, ashape: Sequence[int], bshape: Sequence[int]):
    """Recognise a two-operand einsum that is one batched matrix product.

    Returns ``(a_perm, b_perm, batch, m, k, n, out_perm)`` label groups, or None when the contraction is
    anything else (a trace, a diagonal, a sum over one operand's own axis, an ellipsis): those go to CuPy.
    Each label is in exactly one class: batch (in A, B and the output), m (A and output), n (B and output)
    or k (A and B only).
    """
    if "." in subscripts or "->" not in subscripts:
        return None
    ins, out = subscripts.replace(" ", "").split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    la, lb = parts
    if len(la) != len(ashape) or len(lb) != len(bshape):
        return None
    if any(len(set(s)) != len(s) for s in (la, lb, out)):
        return None
    sa, sb, so = set(la), set(lb), set(out)
    if not so <= (sa | sb):
        return None
    batch = [c for c in out if c in sa and c in sb]
    m = [c for c in la if c in so and c not in sb]
    n = [c for c in lb if c in so and c not in sa]
    k = [c for c in la if c in sb and c not in so]
    if len(batch) + len(m) + len(k) != len(la) or len(batch) + len(n) + len(k) != len(lb):
        return None  # a label summed within one operand only
    sizes = {}
    for labels, shape in ((la, ashape), (lb, bshape)):
        for c, s in zip(labels, shape):
            if sizes.setdefault(c, s) != s:
                return None  # size-1 broadcasting in einsum: leave it to CuPy
    return la, lb, batch, m, k, n, out, sizes



def check_out(out, shape, dtype, casting, name):
    if out is None:
        return
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"non-broadcastable output operand with shape {_fmt(out.shape)} doesn't match the "
                         f"broadcast shape {_fmt(shape)}")
    if not np.can_cast(dtype, out.dtype, casting=casting):
        raise TypeError(f"Cannot cast ufunc '{name}' output from {dtype!r} to {out.dtype!r} with casting rule "
                        f"{casting!r}")



def input_dtype(a, b, dtype, casting, name):
    res = np.result_type(a.dtype, b.dtype) if dtype is None else np.dtype(dtype)
    for i, x in enumerate((a, b)):
        if not np.can_cast(x.dtype, res, casting=casting):
            raise TypeError(f"Cannot cast ufunc '{name}' input {i} from {x.dtype!r} to {res!r} with casting rule "
                            f"{casting!r}")
    return res



def check_dot_out(out, shape, dtype):
    if out is None:
        return
    if tuple(out.shape) != tuple(shape):
        raise ValueError("output array has wrong dimensions" if out.ndim != len(shape) else
                         "output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)")
    if out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError("output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)")

