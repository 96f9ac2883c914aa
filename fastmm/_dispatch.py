"""NumPy semantics -> GEMM problems.

Two halves:
* shape rules (``*_shapes``): pure functions on shape tuples that raise NumPy's own errors, worded as NumPy
  words them. They need no GPU and are tested against NumPy itself.
* execution: device arrays in, a float32 batched product described as a `_plan.Problem`, launched through
  `_cuda`; every other dtype goes to CuPy. Results are plain CuPy arrays; `fastmm._array` wraps them.

Layouts: every kernel reads A and B through (row stride, column stride) pairs, so transposed, sliced,
negatively strided and broadcast views need no copy as long as one of the two core axes of each operand has
unit stride. Only an operand with no unit-stride axis (e.g. ``a[::2, ::2]``) is copied, with a
PerformanceWarning. C needs unit stride along n; an output with unit stride along m is handled by computing
C^T = B^T A^T instead, and anything else is computed into a temporary and copied.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import _errors, _plan

__all__ = [
    "matmul_shapes", "dot_shapes", "inner_shapes", "tensordot_axes", "einsum_as_gemm",
    "to_device", "matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot",
    "problem_for", "plan_matmul",
]

_F32 = np.dtype(np.float32)
_MATMUL_SIG = "(n?,k),(k,m?)->(n?,m?)"


# --------------------------------------------------------------------------------------------------------
# Shape rules (pure)
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# Device arrays
# --------------------------------------------------------------------------------------------------------

_cp = None


def _cupy():
    global _cp
    if _cp is None:
        import cupy

        _cp = cupy
    return _cp


def to_device(x, dtype=None):
    """Any array-like as a CuPy array: device arrays without a copy, host data uploaded once."""
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return x if dtype is None else x.astype(dtype, copy=False)
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return cp.asarray(x, dtype=dtype)
        if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
            dev_type, _ = x.__dlpack_device__()
            if dev_type in (2, 13):  # kDLCUDA, kDLCUDAManaged: zero-copy on the GPU
                return cp.from_dlpack(x) if dtype is None else cp.from_dlpack(x).astype(dtype, copy=False)
        return cp.asarray(np.asarray(x), dtype=dtype)
    except cp.cuda.memory.OutOfMemoryError as e:
        raise _errors.OutOfMemoryError(str(e)) from None
    except cp.cuda.runtime.CUDARuntimeError as e:
        raise _errors.CUDAUnavailableError(f"fastmm needs a CUDA GPU and could not use one: {e}") from None


def _empty(shape, dtype=_F32):
    cp = _cupy()
    try:
        return cp.empty(shape, dtype)
    except cp.cuda.memory.OutOfMemoryError as e:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        raise _errors.OutOfMemoryError(
            f"out of GPU memory allocating a {_fmt(shape)} {np.dtype(dtype)} result ({nbytes / 2**20:.1f} MiB): "
            f"{e}") from None


def _extent(x) -> tuple[int, int]:
    """[low, high) byte range that x's elements can touch."""
    lo = hi = x.data.ptr
    for s, st in zip(x.shape, x.strides):
        if st > 0:
            hi += (s - 1) * st
        else:
            lo += (s - 1) * st
    return lo, hi + x.itemsize


def _may_overlap(x, y) -> bool:
    if x.size == 0 or y.size == 0:
        return False
    (a0, a1), (b0, b1) = _extent(x), _extent(y)
    return a0 < b1 and b0 < a1


def _core_layout(x) -> tuple[bool, int] | None:
    """(transposed?, leading dimension) of x's last two axes, or None when neither has unit stride.

    A size-1 axis has no meaningful stride, so it never forces a copy: its stride is reported as 0.
    """
    rows, cols = x.shape[-2:]
    sr, sc = (s // 4 if s % 4 == 0 else None for s in x.strides[-2:])
    if (sc == 1 or cols == 1) and (sr is not None or rows == 1):
        return False, (sr if rows > 1 else 0)
    if (sr == 1 or rows == 1) and sc is not None:
        return True, (sc if cols > 1 else 0)
    return None


def _laid_out(x, name: str):
    """x and its core layout; a contiguous copy of x (with a PerformanceWarning) when no layout fits."""
    layout = _core_layout(x)
    if layout is not None and all(s % 4 == 0 for s in x.strides[:-2]):
        return x, layout
    _errors.warn_once(f"copy-{name}", f"operand {name} has no unit-stride axis (strides {x.strides}); fastmm copies "
                      "it to a contiguous array first")
    x = _cupy().ascontiguousarray(x)
    return x, _core_layout(x)


def _batch_dims(c_batch, *operands) -> list[tuple[int, list[int]]]:
    """Collapse the broadcast batch axes to as few (size, [element stride per operand]) axes as possible."""
    dims = []
    for axis, size in enumerate(c_batch):
        if size == 1:
            continue
        strides = []
        for x in operands:
            xb = x.ndim - 2
            j = axis - (len(c_batch) - xb)
            strides.append(0 if j < 0 or x.shape[j] == 1 else x.strides[j] // 4)
        if dims and all(p == s * size for p, s in zip(dims[-1][1], strides)):
            dims[-1] = (dims[-1][0] * size, strides)
        else:
            dims.append((size, strides))
    return dims


def problem_for(a, b, c) -> tuple[_plan.Problem, dict]:
    """Describe ``c = a @ b`` (float32 device arrays, c with unit stride along n) for the plan and the launch."""
    a0, b0 = a, b
    a, (a_t, lda) = _laid_out(a, "a") if not isinstance(a, _Meta) else (a, _core_layout(a))
    b, (b_t, ldb) = _laid_out(b, "b") if not isinstance(b, _Meta) else (b, _core_layout(b))
    m, k = a.shape[-2:]
    n = b.shape[-1]
    dims = _batch_dims(c.shape[:-2], a, b, c)
    outer, inner = dims[:-2], dims[-2:]
    if len(inner) == 0:
        inner = [(1, [0, 0, 0]), (1, [0, 0, 0])]
    elif len(inner) == 1:
        inner = [(1, [0, 0, 0]), inner[0]]
    (n0, s0), (n1, s1) = inner
    ldc = c.strides[-2] // 4 if m > 1 else 0
    a_sm, a_sk = (1, lda) if a_t else (lda, 1)
    b_sk, b_sn = (1, ldb) if b_t else (ldb, 1)
    strides = [lda, ldb, ldc, *s0, *s1, *(s for _, st in outer for s in st)]
    ptrs = (a.data.ptr, b.data.ptr, c.data.ptr)
    aligned = all(p % 16 == 0 for p in ptrs) and all(s % 4 == 0 for s in strides)
    problem = _plan.Problem(m, n, k, n0 * n1, a_t, b_t, aligned)
    args = dict(m=m, n=n, k=k, a=ptrs[0], a_sm=a_sm, a_sk=a_sk, b=ptrs[1], b_sk=b_sk, b_sn=b_sn,
                c=ptrs[2], c_sm=ldc, c_sn=1, batch=n0 * n1, batch_inner=n1,
                batch_strides=(s0[0], s1[0], s0[1], s1[1], s0[2], s1[2]))
    # `keep` holds any contiguous copies alive until the caller has launched on them.
    return problem, dict(args=args, outer=outer, copied=a is not a0 or b is not b0, keep=(a, b))


class _Recorder(list):
    """The steps of one product, kept so that later products of the same signature can replay them.

    Steps are (Launch, a offset, b offset, c offset), offsets in bytes from the data pointers `base` of the
    top-level a, b and c, or a `_SplitKReplay`. A None step means the product went through a copy or a
    temporary whose address changes per call: such a product is not replayed.
    """

    def __init__(self, a_ptr: int, b_ptr: int, c_ptr: int):
        super().__init__()
        self.base = (a_ptr, b_ptr, c_ptr)

    def launch(self, prepared, pa: int, pb: int, pc: int) -> None:
        self.append((prepared, pa - self.base[0], pb - self.base[1], pc - self.base[2]))


def _replay(steps, a, b, c) -> None:
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    for step in steps:
        if type(step) is tuple:
            prepared, da, db, dc = step
            prepared(pa + da, pb + db, pc + dc)
        else:
            step(a, b, c)


def _gemm(a, b, c, kernel=None, record: _Recorder | None = None) -> None:
    """c[...] = a @ b for float32 device arrays a (..., m, k), b (..., k, n), c (batch..., m, n).

    With `record`, the steps are recorded for replay (see `_Recorder`).
    """
    from . import _cuda

    m, n = c.shape[-2:]
    if c.size == 0:
        return
    if a.shape[-1] == 0:  # an empty sum: zeros, with no kernel (and no layout to speak of)
        c.fill(0)
        if record is not None:
            record.append(None)
        return
    if _may_overlap(c, a) or _may_overlap(c, b):
        return _via_temporary(a, b, c, kernel, record)
    sm, sn = c.strides[-2:]
    if not (sn == 4 or n == 1):
        if sm == 4 or m == 1:  # C is column-major: C^T = B^T A^T is row-major
            if record is not None:
                record.append(None)  # operands swap roles: not a replay of (a, b, c)
            return _gemm(b.swapaxes(-1, -2), a.swapaxes(-1, -2), c.swapaxes(-1, -2), kernel)
        return _via_temporary(a, b, c, kernel, record)
    problem, launch = problem_for(a, b, c)
    device_id = c.device.id
    choice = _plan.choose(problem, _cuda.device(device_id), kernel)
    if choice.splits > 1:
        return _split_k(a, b, c, choice, record)
    args = launch["args"]
    ptrs = (args.pop("a"), args.pop("b"), args.pop("c"))
    prepared = _cuda.Launch(choice.config, choice.variant, device_id, **args)
    for index in np.ndindex(*(size for size, _ in launch["outer"])):
        offs = [sum(i * st[j] for i, (_, st) in zip(index, launch["outer"])) * 4 for j in range(3)]
        pa, pb, pc = (p + o for p, o in zip(ptrs, offs))
        prepared(pa, pb, pc)
        if record is not None:
            if launch["copied"]:
                record.append(None)
            else:
                record.launch(prepared, pa, pb, pc)


class _SplitKReplay:
    """Replay of a split-K product: a fresh workspace, the recorded slice launches, the ordered reduction."""

    def __init__(self, steps, ws_shape, c_offset, c_shape, c_strides):
        self.steps, self.ws_shape = steps, ws_shape
        self.c_offset, self.c_shape, self.c_strides = c_offset, c_shape, c_strides

    def __call__(self, a, b, c):
        cp = _cupy()
        ws = _empty(self.ws_shape)
        _replay(self.steps, a, b, ws)
        view = cp.ndarray(self.c_shape, _F32, memptr=c.data + self.c_offset, strides=self.c_strides)
        cp.sum(ws, axis=0, out=view)


def _split_k(a, b, c, choice, record: _Recorder | None = None) -> None:
    """c = a @ b (2-D) as `choice.splits` slices of K, each a batch item of one product, summed in order.

    The slices are strided views of a and b (no copies); their products land in a (splits, m, n) workspace
    that CuPy reduces over its first axis in a fixed order, so the result is deterministic run to run.
    """
    cp = _cupy()
    # The plan splits only single products: any batch axes here have size 1 and drop out as views.
    a, b, c = (x.reshape(x.shape[-2:]) for x in (a, b, c))
    (m, k), n = a.shape, b.shape[1]
    depth = -(-k // choice.splits)
    depth += -depth % 8  # whole BK steps per slice
    full = k // depth
    tail = k - full * depth
    ws = _empty((full + (tail > 0), m, n))
    strided = cp.lib.stride_tricks.as_strided
    a_slices = strided(a, (full, m, depth), (depth * a.strides[1], a.strides[0], a.strides[1]))
    b_slices = strided(b, (full, depth, n), (depth * b.strides[0], b.strides[0], b.strides[1]))
    # Recorded relative to a, b and the workspace, so that a replay can run them on a fresh workspace.
    sub = _Recorder(a.data.ptr, b.data.ptr, ws.data.ptr) if record is not None else None
    _gemm(a_slices, b_slices, ws[:full], choice.config.name, sub)
    if tail:
        _gemm(a[:, full * depth:], b[full * depth:], ws[full], choice.config.name, sub)
    cp.sum(ws, axis=0, out=c)
    if record is not None:
        base_a, base_b, base_c = record.base
        if None in sub or a.data.ptr != base_a or b.data.ptr != base_b:
            record.append(None)
        else:
            record.append(_SplitKReplay(tuple(sub), ws.shape, c.data.ptr - base_c, c.shape, c.strides))


def _via_temporary(a, b, c, kernel, record):
    tmp = _empty(c.shape)
    _gemm(a, b, tmp, kernel)
    c[...] = tmp
    if record is not None:
        record.append(None)


class _Meta:
    """Shape, strides and address of an array that need not exist: what `explain` plans with."""

    def __init__(self, shape, strides, ptr=0):
        self.shape, self.strides, self.ndim = tuple(shape), tuple(strides), len(shape)
        self.size = math.prod(shape)
        self.data = type("ptr", (), {"ptr": ptr})

    def swapaxes(self, i, j):
        shape, strides = list(self.shape), list(self.strides)
        shape[i], shape[j], strides[i], strides[j] = shape[j], shape[i], strides[j], strides[i]
        return _Meta(shape, strides, self.data.ptr)


def _meta(x, shape=None) -> _Meta:
    """A float32 stand-in for x: a device array as it is; host data as the upload will lay it out (CuPy keeps
    a Fortran-ordered NumPy array Fortran-ordered, and makes anything else C-ordered)."""
    shape = tuple(np.shape(x)) if shape is None else shape
    if hasattr(x, "strides") and hasattr(x, "data") and hasattr(x.data, "ptr") and x.dtype == _F32:
        return _Meta(x.shape, x.strides, x.data.ptr)
    fortran = isinstance(x, np.ndarray) and x.flags.f_contiguous and not x.flags.c_contiguous
    order = shape if fortran else shape[::-1]
    strides = tuple(int(s) * 4 for s in np.cumprod((1,) + order[:-1])) if shape else ()
    return _Meta(shape, strides if fortran else strides[::-1])


def plan_matmul(a, b, device: _plan.Device, kernel=None) -> tuple[_plan.Problem, _plan.Choice, list[str]] | str:
    """The plan `matmul(a, b)` would follow, from shapes and strides alone (no GPU work, no copies)."""
    # Device arrays have a dtype; only host data (lists, scalars) is asked for one through NumPy.
    dtype = np.result_type(*(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype for x in (a, b)))
    out_shape, m, n, k = matmul_shapes(np.shape(a), np.shape(b))
    if dtype != _F32:
        return f"{dtype} product: CuPy (cuBLAS); fastmm's own kernels are float32"
    ma, mb = _meta(a), _meta(b)
    if ma.ndim == 1:
        ma = _Meta((1,) + ma.shape, (0,) + ma.strides, ma.data.ptr)
    if mb.ndim == 1:
        mb = _Meta(mb.shape + (1,), mb.strides + (0,), mb.data.ptr)
    c = _meta(None, tuple(np.broadcast_shapes(ma.shape[:-2], mb.shape[:-2])) + (m, n))
    notes = []
    for name, x in (("a", ma), ("b", mb)):
        if _core_layout(x) is None:
            notes.append(f"operand {name} has no unit-stride axis and is copied first")
            x.strides = x.strides[:-2] + (x.shape[-1] * 4, 4)
    problem, _ = problem_for(ma, mb, c)
    return problem, _plan.choose(problem, device, kernel), notes


# --------------------------------------------------------------------------------------------------------
# NumPy functions
# --------------------------------------------------------------------------------------------------------

def _check_out(out, shape, dtype, casting, name):
    if out is None:
        return
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"non-broadcastable output operand with shape {_fmt(out.shape)} doesn't match the "
                         f"broadcast shape {_fmt(shape)}")
    if not np.can_cast(dtype, out.dtype, casting=casting):
        raise TypeError(f"Cannot cast ufunc '{name}' output from {dtype!r} to {out.dtype!r} with casting rule "
                        f"{casting!r}")


def _deliver(result, out):
    """Write a device result into `out` (device or host array) and return what the caller should get."""
    if out is None:
        return result
    if isinstance(out, np.ndarray):
        out[...] = result.get()
    elif out is not result:
        out[...] = result
    return out


def _input_dtype(a, b, dtype, casting, name):
    res = np.result_type(a.dtype, b.dtype) if dtype is None else np.dtype(dtype)
    for i, x in enumerate((a, b)):
        if not np.can_cast(x.dtype, res, casting=casting):
            raise TypeError(f"Cannot cast ufunc '{name}' input {i} from {x.dtype!r} to {res!r} with casting rule "
                            f"{casting!r}")
    return res


# Replays of earlier float32 products, per call signature: shapes, strides, 16-byte alignment of both operands,
# device and forced kernel determine everything but the three pointers (see _cuda.Launch).
_replays: dict[tuple, tuple] = {}
_REPLAYS_MAX = 1024
_plan.on_reload(_replays.clear)  # a new autotune entry can change what a signature should run


def _signature(a, b, out, kernel):
    return (a.shape, a.strides, a.data.ptr & 15, b.shape, b.strides, b.data.ptr & 15, a.device.id,
            kernel if kernel is not None else _plan.forced_kernel(),
            None if out is None else (out.strides, out.data.ptr & 15))


def matmul(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.matmul`` with NumPy's rules; float32 products run on fastmm's kernels, others on CuPy."""
    cp = _cupy()
    fast = dtype is None and isinstance(a, cp.ndarray) and isinstance(b, cp.ndarray) \
        and a.dtype == _F32 and b.dtype == _F32 and (out is None or isinstance(out, cp.ndarray) and out.dtype == _F32)
    if fast:
        key = _signature(a, b, out, kernel)
        hit = _replays.get(key)
        # A replay needs what the signature cannot promise: an `out` of the right shape that shares no memory
        # with the operands (else the full path below raises NumPy's error or goes through a temporary).
        if hit is not None and (out is None or out.shape == hit[0] and not (_may_overlap(out, a)
                                                                             or _may_overlap(out, b))):
            out_shape, steps = hit
            c = _empty(out_shape) if out is None else out
            _replay(steps, a, b, c)
            return c
    a, b = to_device(a), to_device(b)
    out_shape, m, n, k = matmul_shapes(a.shape, b.shape)
    res = _input_dtype(a, b, dtype, casting, "matmul")
    _check_out(out, out_shape, res, casting, "matmul")
    if res != _F32:
        cp = _cupy()
        r = cp.matmul(a.astype(res, copy=False), b.astype(res, copy=False))
        return _deliver(r, out)
    a = a.astype(_F32, copy=False)
    b = b.astype(_F32, copy=False)
    # Write straight into a device `out` of our dtype; anything else goes through a fresh result.
    cp = _cupy()
    direct = out is not None and isinstance(out, cp.ndarray) and out.dtype == _F32
    c = out if direct else _empty(out_shape)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    # Views of c (never reshapes, which could copy a user's `out`) with the promoted axes put back.
    c2 = c[None, None] if a.ndim == 1 and b.ndim == 1 else c[..., None, :] if a.ndim == 1 else \
        c[..., None] if b.ndim == 1 else c
    record = _Recorder(a.data.ptr, b.data.ptr, c.data.ptr) if fast else None
    _gemm(a2, b2, c2, kernel, record)
    if fast and None not in record:
        if len(_replays) >= _REPLAYS_MAX:
            _replays.clear()
        _replays[key] = (out_shape, tuple(record))
    return _deliver(c, out) if not direct else out


def _scalar_multiply(a, b, out):
    cp = _cupy()
    r = cp.multiply(a, b)
    return _deliver(r, out)


def _check_dot_out(out, shape, dtype):
    if out is None:
        return
    if tuple(out.shape) != tuple(shape):
        raise ValueError("output array has wrong dimensions" if out.ndim != len(shape) else
                         "output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)")
    if out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError("output array is not acceptable (must have the right datatype, number of dimensions, "
                         "and be a C-Array)")


def dot(a, b, out=None, *, kernel=None):
    """``np.dot``: N-D operands contract a's last axis with b's second-to-last, as one batched product."""
    a, b = to_device(a), to_device(b)
    if a.ndim == 0 or b.ndim == 0:
        return _scalar_multiply(a, b, out)
    shape = dot_shapes(a.shape, b.shape)
    res = np.result_type(a.dtype, b.dtype)
    _check_dot_out(out, shape, res)
    if res != _F32 or a.ndim <= 2 and b.ndim <= 2:
        if res != _F32:
            return _deliver(_cupy().dot(a, b), out)
        return matmul(a, b, out=out, kernel=kernel)
    # a (..., k) x b (p..., k, n): every batch item of b meets all rows of a, and lands in c[..., p..., n].
    k = a.shape[-1]
    n = 1 if b.ndim == 1 else b.shape[-1]
    a2 = a.reshape(-1, k)
    b3 = b.reshape(-1, k, n)
    c = out if out is not None and isinstance(out, _cupy().ndarray) else _empty(shape)
    c3 = c.reshape(a2.shape[0], b3.shape[0], n).swapaxes(0, 1)
    _gemm(a2[None], b3, c3, kernel)
    return _deliver(c, out)


def inner(a, b, *, kernel=None):
    """``np.inner``: contract the last axes, i.e. a2 @ b2.T without copying b."""
    a, b = to_device(a), to_device(b)
    if a.ndim == 0 or b.ndim == 0:
        return _scalar_multiply(a, b, None)
    shape = inner_shapes(a.shape, b.shape)
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().inner(a, b)
    k = a.shape[-1]
    c = matmul(a.reshape(-1, k), b.reshape(-1, k).T, kernel=kernel)
    return c.reshape(shape)


def vdot(a, b, *, kernel=None):
    """``np.vdot``: the dot product of the flattened operands (conjugating a) as a 1 x k x 1 product."""
    a, b = to_device(a), to_device(b)
    if a.size != b.size:
        raise ValueError(f"vdot: the operands have {a.size} and {b.size} elements; they must have the same number")
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().vdot(a, b)
    return matmul(a.ravel(), b.ravel(), kernel=kernel)


def tensordot(a, b, axes=2, *, kernel=None):
    """``np.tensordot`` as one product: move the summed axes together, flatten, multiply, unflatten."""
    a, b = to_device(a), to_device(b)
    axes_a, axes_b = tensordot_axes(a.ndim, b.ndim, axes)
    for ia, ib in zip(axes_a, axes_b):
        if a.shape[ia] != b.shape[ib]:
            raise ValueError("shape-mismatch for sum")
    if np.result_type(a.dtype, b.dtype) != _F32:
        return _cupy().tensordot(a, b, axes)
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [i for i in range(b.ndim) if i not in axes_b]
    k = math.prod(a.shape[i] for i in axes_a)
    a2 = a.transpose(free_a + axes_a).reshape(-1, k)
    b2 = b.transpose(axes_b + free_b).reshape(k, -1)
    c = matmul(a2, b2, kernel=kernel)
    return c.reshape([a.shape[i] for i in free_a] + [b.shape[i] for i in free_b])


def einsum(subscripts, *operands, kernel=None, **kwargs):
    """``np.einsum``: a two-operand contraction that is one batched product runs on fastmm, the rest on CuPy."""
    cp = _cupy()
    ops = [to_device(x) for x in operands]
    spec = None
    if len(ops) == 2 and isinstance(subscripts, str) and not kwargs:
        spec = einsum_as_gemm(subscripts, ops[0].shape, ops[1].shape)
    if spec is None or np.result_type(*(x.dtype for x in ops)) != _F32:
        return cp.einsum(subscripts, *ops, **kwargs)
    la, lb, batch, m, k, n, out, sizes = spec
    a, b = ops
    size = lambda labels: math.prod(sizes[c] for c in labels)  # noqa: E731
    a3 = a.transpose([la.index(c) for c in batch + m + k]).reshape(size(batch), size(m), size(k))
    b3 = b.transpose([lb.index(c) for c in batch + k + n]).reshape(size(batch), size(k), size(n))
    c = matmul(a3, b3, kernel=kernel).reshape([sizes[c] for c in batch + m + n])
    order = batch + m + n
    return c.transpose([order.index(c) for c in out])


_MATVEC_SIG, _VECMAT_SIG, _VECDOT_SIG = "(m,n),(n)->(m)", "(n),(n,m)->(m)", "(n),(n)->()"


def _vector_product(name, sig, a, b, a_core, b_core, kdims, out, dtype, casting, kernel, conj_a):
    a, b = to_device(a), to_device(b)
    for i, (x, need) in enumerate(((a, a_core), (b, b_core))):
        if x.ndim < need:
            raise _too_few_dims(name, sig, i, x.ndim, need)
    ka, kb = a.shape[kdims[0]], b.shape[kdims[1]]
    if ka != kb:
        raise _gufunc_core_error(name, sig, 1, 0, kb, ka)
    res = _input_dtype(a, b, dtype, casting, name)
    if conj_a and res.kind == "c":
        a = a.conj()
    return a, b, res


def matvec(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.matvec``: (..., m, n) x (..., n) -> (..., m), as a matmul with the vector as a column."""
    a, b, res = _vector_product("matvec", _MATVEC_SIG, a, b, 2, 1, (-1, -1), out, dtype, casting, kernel, False)
    r = matmul(a, b[..., None], dtype=res, casting=casting, kernel=kernel)[..., 0]
    return _deliver(r, out)


def vecmat(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.vecmat``: (..., n) x (..., n, m) -> (..., m), conjugating the vector."""
    a, b, res = _vector_product("vecmat", _VECMAT_SIG, a, b, 1, 2, (-1, -2), out, dtype, casting, kernel, True)
    r = matmul(a[..., None, :], b, dtype=res, casting=casting, kernel=kernel)[..., 0, :]
    return _deliver(r, out)


def vecdot(a, b, out=None, *, dtype=None, casting="same_kind", kernel=None):
    """``np.vecdot``: (..., n) x (..., n) -> (...), conjugating the first vector."""
    a, b, res = _vector_product("vecdot", _VECDOT_SIG, a, b, 1, 1, (-1, -1), out, dtype, casting, kernel, True)
    r = matmul(a[..., None, :], b[..., :, None], dtype=res, casting=casting, kernel=kernel)[..., 0, 0]
    return _deliver(r, out)
