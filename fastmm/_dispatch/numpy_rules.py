"""NumPy's rules for the matrix-product family, as pure functions on shapes and dtypes.

Output shapes, broadcasting, ``out=`` checks and dtype resolution raise NumPy's own exceptions, worded as NumPy
words them, so that a NumPy user recognises them. Nothing here touches a GPU or imports CuPy: the rules are
tested against NumPy itself on any machine.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

from .._errors import format_shape as _fmt

__all__ = ["matmul_shapes", "vector_product_shape", "dot_shapes", "inner_shapes", "tensordot_axes", "einsum_as_gemm", "check_out",
           "check_dot_out", "input_dtype"]

_MATMUL_SIG = "(n?,k),(k,m?)->(n?,m?)"


def _broadcast_batch(ashape, bshape, a_core: int, b_core: int, out_core: tuple) -> tuple[int, ...]:
    abatch, bbatch = tuple(ashape[:len(ashape) - a_core]), tuple(bshape[:len(bshape) - b_core])
    try:
        return tuple(np.broadcast_shapes(abatch, bbatch))
    except ValueError:
        # NumPy's iterator words it: each operand's batch axes plus one newaxis per core axis of the output, and
        # the output's core shape written without a trailing comma.
        remap = lambda s, batch: f"{_fmt(s)}->{_fmt(batch + ('newaxis',) * len(out_core))}"  # noqa: E731
        raise ValueError(
            "operands could not be broadcast together with remapped shapes [original->remapped]: "
            f"{remap(ashape, abatch)} {remap(bshape, bbatch)}  and requested shape "
            f"({','.join(str(d) for d in out_core)})") from None


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


_VECTOR_SIGS = {"matvec": "(m,n),(n)->(m)", "vecmat": "(n),(n,m)->(m)", "vecdot": "(n),(n)->()"}


def vector_product_shape(name: str, ashape: Sequence[int], bshape: Sequence[int]) -> tuple[int, ...]:
    """Output shape of ``np.matvec``, ``np.vecmat`` or ``np.vecdot`` on these shapes, or NumPy's ValueError.

    >>> vector_product_shape("matvec", (5, 2, 3), (3,))
    (5, 2)
    """
    sig = _VECTOR_SIGS[name]
    ca, cb = {"matvec": (2, 1), "vecmat": (1, 2), "vecdot": (1, 1)}[name]
    ashape, bshape = tuple(ashape), tuple(bshape)
    for i, (shape, need) in enumerate(((ashape, ca), (bshape, cb))):
        if len(shape) < need:
            raise _too_few_dims(name, sig, i, len(shape), need)
    ka, kb = ashape[-1], bshape[-1] if cb == 1 else bshape[-2]
    if ka != kb:
        raise _gufunc_core_error(name, sig, 1, 0, kb, ka)
    core = {"matvec": ashape[-2:-1], "vecmat": bshape[-1:], "vecdot": ()}[name]
    return _broadcast_batch(ashape, bshape, ca, cb, core) + core


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



def check_out(out, shape) -> None:
    """NumPy's ValueError for a gufunc's `out` whose shape is not the result's (its dtype is checked with the
    loop, see `ufunc_dtypes`)."""
    if out is not None and tuple(out.shape) != tuple(shape):
        raise ValueError(f"non-broadcastable output operand with shape {_fmt(out.shape)} doesn't match the "
                         f"broadcast shape {_fmt(shape)}")


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
        raise ValueError("output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)" if out.ndim != len(shape) else "output array has wrong dimensions")
    if out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError("output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)")



# --------------------------------------------------------------------------------------------------------
# Generalised-ufunc keywords: dtype/signature/casting, axes/axis/keepdims, order
# --------------------------------------------------------------------------------------------------------

_CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")
_ORDERS = ("C", "F", "A", "K")
_GUFUNC_KEYWORDS = {"out", "dtype", "casting", "order", "subok", "signature", "axes", "axis", "keepdims"}


def check_gufunc_keywords(name: str, kwargs: dict) -> None:
    """NumPy's TypeError/ValueError for keywords a gufunc call does not take or takes with a bad value."""
    for key in kwargs:
        if key not in _GUFUNC_KEYWORDS:
            raise TypeError(f"{name}() got an unexpected keyword argument '{key}'")
    if kwargs.get("casting", "same_kind") not in _CASTINGS:
        raise ValueError(f"casting must be one of 'no', 'equiv', 'safe', 'same_kind', 'unsafe' "
                         f"(got {kwargs['casting']!r})")
    order = kwargs.get("order", "K")
    if order is not None and str(order).upper() not in _ORDERS:
        raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    if kwargs.get("dtype") is not None and kwargs.get("signature") is not None:
        raise TypeError("cannot specify both 'signature' and 'dtype'")
    if kwargs.get("axes") is not None and kwargs.get("axis") is not None:
        raise TypeError("cannot specify both 'axis' and 'axes'")


def ufunc_dtypes(ufunc, in_dtypes, out_dtype, dtype=None, signature=None, casting="same_kind"):
    """The loop NumPy's `ufunc` would run: (input dtype, input dtype, output dtype), or NumPy's own TypeError.

    NumPy's `resolve_dtypes` gives the loop and checks the cast to `out`; the casts of the inputs to the loop
    are checked here, as the ufunc call does.
    """
    if dtype is not None:
        signature = (None,) * len(in_dtypes) + (np.dtype(dtype),)
    extra = {} if signature is None else {"signature": signature}
    loop = ufunc.resolve_dtypes((*in_dtypes, out_dtype), casting=casting, **extra)
    for i, (have, want) in enumerate(zip(in_dtypes, loop)):
        if not np.can_cast(have, want, casting=casting):
            raise TypeError(f"Cannot cast ufunc '{ufunc.__name__}' input {i} from {have!r} to {want!r} with casting "
                            f"rule {casting!r}")
    return loop


def _axis_index(value, ndim: int) -> int:
    i = operator.index(value)
    if not -ndim <= i < ndim:
        raise np.exceptions.AxisError(i, ndim)
    return i % ndim


def gufunc_axes(name: str, sig: str, cores: Sequence[int], ndims: Sequence[int], *, axes=None, axis=None,
                keepdims=None) -> tuple[list[tuple[int, ...]], bool]:
    """Normalise a gufunc's ``axes=``/``axis=``/``keepdims=`` to one tuple of core axes per operand.

    `cores` and `ndims` list the number of core dimensions and the number of dimensions of each operand, inputs
    first, then the output. The result holds, for each operand, the positions (non-negative) of its core axes
    in its own order; with ``keepdims`` the output's entry says where the kept (size-1) core axes go. ``keepdims``
    is None when not given (NumPy refuses it, even False, for signatures whose output has core dimensions) and is
    returned as a bool. Errors are NumPy's.

    >>> gufunc_axes("matmul", "(n?,k),(k,m?)->(n?,m?)", (2, 2, 2), (3, 3, 3), axes=[(0, 1), (0, 1), (0, 1)])
    ([(0, 1), (0, 1), (0, 1)], False)
    """
    nin = len(cores) - 1
    if keepdims is not None:  # given at all, even as False, it must be allowed by the signature
        if not isinstance(keepdims, (bool, np.bool_)):
            raise TypeError("'keepdims' must be a boolean")
        # NumPy names the first operand that breaks the rule: an input whose core count differs from input 0's,
        # else the output when it has core dimensions.
        bad = next((i for i in range(1, nin) if cores[i] != cores[0]), None)
        if bad is not None or cores[nin]:
            which, count = (f"input {bad}", cores[bad]) if bad is not None else ("output 0", cores[nin])
            raise TypeError(f"{name} does not support keepdims: its signature {sig} requires {which} to have "
                            f"{count} core dimensions, but keepdims can only be used when all inputs have the same "
                            "number of core dimensions and all outputs have no core dimensions.")
    keepdims = bool(keepdims)
    if keepdims:  # the output keeps the inputs' core axes, with size 1: as many core axes as an input has
        cores, ndims = (*cores[:nin], cores[0]), (*ndims[:nin], ndims[nin] + cores[0])
    if axis is not None:
        distinct = len({label for part in sig.replace("?", "").replace("->", ",").split(",")
                        for label in part.strip("()").split(",") if label})
        if distinct != 1:
            raise TypeError(f"{name}: axis can only be used with a single shared core dimension, not with the "
                            f"{distinct} distinct ones implied by signature {sig}.")
        core_axes = [(_axis_index(axis, ndims[i]),) for i in range(nin)]
        return core_axes + [(_axis_index(axis, ndims[nin]),) if keepdims else ()], keepdims
    if axes is None:
        return [tuple(range(nd - c, nd)) for nd, c in zip(ndims, cores)], keepdims
    if not isinstance(axes, list):
        raise TypeError("axes should be a list.")
    # Whether the output may be left out depends on the signature (matmul's (n?,m?) has core dimensions even
    # when both are missing from a product of two vectors), not on this call's operands.
    if len(axes) not in (len(cores), nin) or len(axes) == nin and not sig.endswith("->()"):
        raise ValueError(f"axes should be a list with an entry for all {len(cores)} inputs and outputs; entries for "
                         "outputs can only be omitted if none of them has core axes.")
    result = []
    for i, (core, nd) in enumerate(zip(cores, ndims)):
        if i == len(axes):  # the output's entry omitted: its core axes (kept ones only) go last
            result.append(tuple(range(nd - core, nd)))
            break
        item = axes[i]
        if not isinstance(item, tuple):
            if core != 1 and not isinstance(item, (list, type(None))) and _is_integer(item):
                raise np.exceptions.AxisError(f"{name}: operand {i} has {core} core dimensions, but the axes item "
                                              "is a single integer.")
            if not _is_integer(item):
                raise TypeError(f"{name}: axes item {i} should be a tuple.")
            item = (item,)
        if len(item) != core:
            raise np.exceptions.AxisError(f"{name}: operand {i} has {core} core dimensions, but {len(item)} "
                                          "dimensions are specified by axes tuple.")
        positions = tuple(_axis_index(v, nd) for v in item)
        for j, p in enumerate(positions):
            if p in positions[:j]:
                raise ValueError(f"axes item {i} has value {p} repeated")
        result.append(positions)
    return result, keepdims


def _is_integer(x) -> bool:
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------------------------------------
# einsum's sublist form
# --------------------------------------------------------------------------------------------------------

_EINSUM_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _sublist_to_subscripts(sublist) -> str:
    out = []
    for s in sublist:
        if s is Ellipsis:
            out.append("...")
            continue
        if not _is_integer(s):
            raise TypeError("each subscript must be either an integer or an ellipsis")
        s = operator.index(s)
        if not 0 <= s < len(_EINSUM_LETTERS):
            raise ValueError(f"subscript is not within the valid range [0, {len(_EINSUM_LETTERS)})")
        out.append(_EINSUM_LETTERS[s])
    return "".join(out)


def einsum_subscripts(args: Sequence[Any]) -> tuple[str, list[Any]]:
    """``np.einsum``'s two call forms as (subscripts string, operands).

    The sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` pairs each operand with a list of integer labels
    (0-51, ``Ellipsis`` for ``...``) and may end with the output's list; it becomes the string form, labels
    0-25 as ``A``-``Z`` and 26-51 as ``a``-``z`` as NumPy numbers them.

    >>> einsum_subscripts([None, [0, 1], None, [1, Ellipsis], [Ellipsis, 0]])
    ('AB,B...->...A', [None, None])
    """
    if not args:
        raise TypeError("einsum() missing required argument 'subscripts' (pos 0)")
    if isinstance(args[0], str):
        return args[0], list(args[1:])
    operands, labels = [], []
    rest = list(args)
    while len(rest) >= 2:
        operands.append(rest.pop(0))
        labels.append(_sublist_to_subscripts(rest.pop(0)))
    subscripts = ",".join(labels)
    if rest:
        subscripts += "->" + _sublist_to_subscripts(rest[0])
    return subscripts, operands
