"""float32 products on fastmm's kernels: the plan's choice carried out (strategies: split-K, aligned copies, the
TF32 split (presplit.py), peeled edges, a temporary), and replays of earlier products.

Replays: a product's launches depend only on shapes, strides, alignment, device and forced kernel, so the
steps of one call are recorded (recording.py) and later calls with the same signature replay them with new pointers.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _errors, _plan
from ..kernels.configs import REPITCH, SLICE_SUM, FewColumns, Int8Tile, Variant, WgTile
from .arrays import cupy as _cupy
from .arrays import _batch_dims, _batch_item, _Meta, contiguous_strides, empty, may_overlap, problem_for
from .presplit import _presplit
from .recording import Recorder, _replay, _runner, replay

__all__ = ["gemm", "Recorder", "replay", "signature", "replays", "remember"]

def gemm(a, b, c, kernel=None, record: Recorder | None = None, *, runs: bool = False, k_total: int = 0) -> None:
    """c[...] = a @ b for float32 device arrays a (..., m, k), b (..., k, n), c (batch..., m, n).

    With `record`, the steps are recorded for replay (see `Recorder`). `runs`: a and b are the aligned copies of a
    larger product (see `_padded`), on which the plan may sum K in runs; the pieces of this product inherit it.
    `k_total`: a and b are split-K's slices (see `_split_k`), the last ending at that K, short of the views' depth.
    """
    from . import cuda as _cuda

    m, n = c.shape[-2:]
    if c.size == 0:
        return
    if not _plan.kernels_on():  # $FASTMM_KERNELS=off: CuPy's product (cuBLAS), for comparison
        return _on_cupy(a, b, c, record)
    if a.shape[-1] == 0:  # an empty sum: zeros, with no kernel (and no layout to speak of)
        c.fill(0)
        if record is not None:
            record.append(None)
        return
    # (Split-K's slices: the last slice's view reaches past the operand, which the kernel never reads; their
    # product goes to a fresh workspace.)
    if not k_total and (may_overlap(c, a) or may_overlap(c, b)):
        return _via_temporary(a, b, c, kernel, record, runs)
    sm, sn = c.strides[-2:]
    if not (sn == 4 or n == 1):
        if sm == 4 or m == 1:  # C is column-major: C^T = B^T A^T is row-major
            if record is not None:
                record.append(None)  # operands swap roles: not a replay of (a, b, c)
            return gemm(b.swapaxes(-1, -2), a.swapaxes(-1, -2), c.swapaxes(-1, -2), kernel, runs=runs)
        return _via_temporary(a, b, c, kernel, record, runs)
    problem, launch = problem_for(a, b, c, runs)
    # The current device runs the product (CuPy's rule); operands elsewhere were checked for peer access.
    device_id = _cupy().cuda.runtime.getDevice()
    device = _cuda.device(device_id)
    choice = _plan.choose(problem, device, kernel)
    if _plan.yielding_to_cublas():
        # Of every part the runtime plans on its own (aligned copies, a peeled product's interior and edges) before
        # any launch: a part found later would waste the launches made for the others.
        why = _plan.cublas_ahead_of_parts(problem, choice, device)
        if why is not None:
            raise _plan.CublasAhead(why)
    if choice.pad:
        if launch["copied"] and record is not None:  # the operands' own copies change address per call
            record.append(None)
            record = None
        try:
            return _padded(*launch["keep"], c, problem, device_id, record)
        except _errors.OutOfMemoryError:  # no room for the copies
            choice = _plan.after_out_of_memory(problem, device, choice)
    if isinstance(choice.config, Int8Tile):  # Ozaki scheme II: data-dependent fallbacks, never replayed
        if record is not None:
            record.append(None)
            record = None
        try:
            return _ozaki(*launch["keep"], c, problem, device, device_id, choice.config)
        except _errors.OutOfMemoryError:  # no room for the residues and products
            choice = _plan.after_out_of_memory(problem, device, choice)
            message = f"out of GPU memory for Ozaki scheme II's workspace: {choice.name} (3xTF32) instead"
            _errors.warn_once(message, message)
    if isinstance(choice.config, WgTile):
        if launch["copied"] and record is not None:  # the operands' own copies change address per call
            record.append(None)
            record = None
        try:
            return _presplit(*launch["keep"], c, choice.config, device_id, record)
        except _errors.OutOfMemoryError:  # no room for the split operands
            choice = _plan.after_out_of_memory(problem, device, choice)
    if choice.peel != (0, 0):
        return _peeled(a, b, c, choice.peel, record, runs)
    if choice.splits > 1:
        # The slices are views of the operands as the kernels read them (an operand with no unit stride copied).
        if launch["copied"] and record is not None:  # the copies change address per call
            record.append(None)
            record = None
        a, b = launch["keep"]
        return _split_k(a, b, c, choice, device_id, record, runs)
    swapped = isinstance(choice.config, FewColumns) and _plan.few_rows(problem, choice.config)
    if swapped:
        # Few rows: the few-column kernel on C^T = B^T A^T (it writes C through both strides).
        a, b, c = b.swapaxes(-1, -2), a.swapaxes(-1, -2), c.swapaxes(-1, -2)
        problem, launch = problem_for(a, b, c, runs)
    args = launch["args"]
    ptrs = (args.pop("a"), args.pop("b"), args.pop("c"))
    # The layout the arguments describe (the plan's own variant, except on a transposed launch, where a size-1
    # axis can read either way: the kernel and its strides must agree).
    if k_total:  # a forced kernel on views of one product: nothing above may copy, swap or cut them
        assert not (swapped or launch["copied"] or launch["outer"]) and choice.splits == 1, choice
    prepared = _cuda.Launch(choice.config, problem.variant_for(choice.config), device_id, **args, k_total=k_total)
    for index in np.ndindex(*(size for size, _ in launch["outer"])):
        offs = [sum(i * st[j] for i, (_, st) in zip(index, launch["outer"])) * 4 for j in range(3)]
        pa, pb, pc = (p + o for p, o in zip(ptrs, offs))
        prepared(pa, pb, pc)
        if record is not None:
            if launch["copied"]:
                record.append(None)
            else:
                record.launch(prepared, pa, pb, pc, swapped)


class _SplitKReplay:
    """Replay of a split-K product: a fresh workspace, the recorded slice launches, the ordered sum into C. The split
    product's operands sit at fixed byte offsets from the top-level ones (a piece of a peeled product, see _peeled)."""

    __slots__ = ("steps", "ws_shape", "total", "offsets")

    def __init__(self, steps, ws_shape, total, offsets):
        self.steps, self.ws_shape, self.total, self.offsets = steps, ws_shape, total, offsets

    def __call__(self, pa: int, pb: int, pc: int):
        ws = empty(self.ws_shape)
        da, db, dc = self.offsets
        _replay(self.steps, pa + da, pb + db, ws.data.ptr)
        self.total(ws.data.ptr, 0, pc + dc)


def _slice_sum(ws, c, device_id: int):
    """The launch that adds the workspace's slices (ws: (batch..., slices, m, pitch), C-ordered, its first n =
    c.shape[-1] columns written) into c (batch..., m, n) in slice order, every item of a batch in one launch."""
    from . import cuda as _cuda

    *_, slices, m, pitch = ws.shape
    n = c.shape[-1]
    c_sm, c_sn = (s // 4 for s in c.strides[-2:])
    dims = _batch_dims(c.shape[:-2], ws[..., 0, :, :], c)  # (at most two axes: see _one_launch)
    (n0, s0), (n1, s1) = ([(1, [0, 0])] * 2 + dims)[-2:]
    return _cuda.Launch(SLICE_SUM, Variant(), device_id, m=m, n=n, k=slices, a_sm=pitch, a_sk=m * pitch, b_sk=0,
                        b_sn=0, c_sm=c_sm if m > 1 else 0, c_sn=c_sn if n > 1 else 1, batch=n0 * n1, batch_inner=n1,
                        batch_strides=(s0[0], s1[0], 0, 0, s0[1], s1[1]))


def _one_launch(a_slices, b_slices, ws_shape: tuple, full: int, n: int, c, short_last: bool) -> bool:
    """Whether a batch's slices run as one launch, and its items' sums as one more: batch axes that collapse to at most
    two (NumPy's broadcasting of A and B over C's batch; a C with strided batch axes may not). Where the last slice is
    short (`short_last`: the kernel counts a slice's K from the inner batch axis), that axis must be the slices alone;
    else items and slices may merge into one axis (K that the slices divide, A or B copied along K). The workspace
    (C-ordered, `ws_shape`) is judged by its layout before it is allocated, so that a product that will not use it does
    not run out of memory for it."""
    strides = contiguous_strides(ws_shape)  # (as `empty` allocates it)
    slices = _Meta((*ws_shape[:-3], full, *ws_shape[-2:-1], n), strides)
    dims = _batch_dims(slices.shape[:-2], a_slices, b_slices, slices)
    first = _Meta((*ws_shape[:-3], *ws_shape[-2:]), (*strides[:-3], *strides[-2:]))  # ws[..., 0, :, :]
    return (len(dims) <= 2 and (not short_last or dims[-1][0] == full)
            and len(_batch_dims(c.shape[:-2], first, c)) <= 2)


def _split_k(a, b, c, choice, device_id: int, record: Recorder | None = None, runs: bool = False) -> None:
    """c = a @ b as `choice.splits` slices of K, summed in order; a batch (the plan splits small ones) as one launch of
    every item's slices and one of their sums.

    The slices are strided views of a and b (no copies); their products land in a (batch..., splits, m, pitch)
    workspace whose first n columns fastmm's slice-sum kernel adds into c slice by slice, so the result is the same on
    every run. Every step is a launch of fastmm's own: a replay costs one allocation and two or three launches, where a
    CuPy reduction cost more host time than the products it summed (docs/history.md, section 'Staged uploads and
    split-K's sum (2026-11-23)'); a batch's items split one after another cost two launches each.
    """
    cp = _cupy()
    batch = c.shape[:-2]
    if math.prod(batch) == 1:  # a single product: any batch axes have size 1 and drop out as views
        a, b, c = (x.reshape(x.shape[-2:]) for x in (a, b, c))
        batch = ()
    (m, k), n = a.shape[-2:], b.shape[-1]
    # The plan's cut: `full` slices as one batched launch (the last ending at K where they reach past it), a `tail`
    # of K as one shallow launch of its own.
    depth, full, tail = _plan.split_cut(k, choice.splits, choice.config)
    # The tiles' workspace rows are padded to 16 bytes, so that the slices store them 16 bytes at a time whatever N
    # (docs/kernels/split-k.md, section 'The workspace's rows'). The few-column kernels write rows of 1 to 16 floats,
    # which padding would spread out.
    pitch = n if isinstance(choice.config, FewColumns) else -(-n // 4) * 4
    ws_shape = (*batch, full + (tail > 0), m, pitch)
    strided = cp.lib.stride_tricks.as_strided
    a_slices = strided(a, (*a.shape[:-2], full, m, depth), (*a.strides[:-2], depth * a.strides[-1], *a.strides[-2:]))
    b_slices = strided(b, (*b.shape[:-2], full, depth, n), (*b.strides[:-2], depth * b.strides[-2], *b.strides[-2:]))
    k_total = k if full * depth > k else 0
    if batch and not _one_launch(a_slices, b_slices, ws_shape, full, n, c, k_total > 0):
        if not _plan.items_in_turn(k, math.prod(batch)):  # one launch, unsplit
            return gemm(a, b, c, choice.config.name, record, runs=runs)
        for index in np.ndindex(*batch):  # each item split on its own, in turn
            _split_k(_batch_item(a, index), _batch_item(b, index), c[index], choice, device_id, record, runs)
        return
    ws = empty(ws_shape)
    slices = ws[..., :n]
    # Recorded relative to a, b and the workspace, so that a replay can run them on a fresh workspace.
    sub = Recorder(a.data.ptr, b.data.ptr, ws.data.ptr) if record is not None else None
    gemm(a_slices, b_slices, slices[..., :full, :, :], choice.config.name, sub, runs=runs, k_total=k_total)
    if tail:
        gemm(a[..., full * depth:], b[..., full * depth:, :], slices[..., full, :, :], choice.config.name, sub,
             runs=runs)
    total = _slice_sum(ws, c, device_id)
    total(ws.data.ptr, 0, c.data.ptr)
    if record is not None:
        if None in sub:
            record.append(None)
        else:
            offsets = tuple(x.data.ptr - base for x, base in zip((a, b, c), record.base))
            record.append(_SplitKReplay(tuple(sub), ws.shape, total, offsets))


class _Repitch:
    """The launches that copy an operand into rows padded to 16 bytes (pass_repitch.cu) and write the zero rows past
    its K where K counts the copy's rows; called with (the operand's address, the copy's)."""

    __slots__ = ("copy", "zeros", "zeros_at")

    def __init__(self, device_id: int, rows: int, cols: int, pitch: int, width: int, out_rows: int):
        from . import cuda as _cuda

        def launch(m, k, a_sm):
            return _cuda.Launch(REPITCH, Variant(), device_id, m=m, n=width, k=k, a_sm=a_sm, a_sk=1, b_sk=0, b_sn=0,
                                c_sm=width, c_sn=1, batch=1, batch_inner=1, batch_strides=(0,) * 6)

        self.copy = launch(rows, cols, pitch)
        self.zeros = launch(out_rows - rows, 0, 0) if out_rows > rows else None  # reads nothing: K = 0
        self.zeros_at = 4 * rows * width

    def __call__(self, src: int, dst: int) -> None:
        self.copy(src, 0, dst)
        if self.zeros is not None:
            self.zeros(0, 0, dst + self.zeros_at)


def _aligned_copy(x, device_id: int, k_axis: int, depth: int):
    """x (2-D, unit stride along one axis; the product's K along axis `k_axis`) copied into a new buffer whose rows
    along that axis are padded to 16 bytes, and K to `depth` with zeros: (the copy, as a view of x's layout, `depth`
    long along k_axis; the buffer's shape; the `_Repitch` that copies, called with (x's address, the buffer's))."""
    rows, cols = x.shape
    along_rows = x.strides[1] != 4 and cols > 1  # unit stride along axis 0: copy x^T's rows
    if along_rows:
        rows, cols = cols, rows
    pitch = x.strides[along_rows] // 4 if rows > 1 else cols
    k_within = (k_axis == 1) != along_rows  # K runs along the copy's rows (else it counts them)
    width = -(-(depth if k_within else cols) // 4) * 4
    out_rows = rows if k_within else depth
    buf = empty((out_rows, width))
    copy = _Repitch(device_id, rows, cols, pitch, width, out_rows)
    copy(x.data.ptr, buf.data.ptr)
    view = buf[:, :depth] if k_within else buf[:, :cols]
    return (view.T if along_rows else view), buf.shape, copy


class _PaddedReplay:
    """Replay of a product on aligned copies (see _padded): fresh buffers, the copies, the product's recorded steps."""

    __slots__ = ("copies", "steps", "offsets")

    def __init__(self, copies, steps, offsets):
        self.copies, self.steps, self.offsets = copies, steps, offsets

    def __call__(self, pa: int, pb: int, pc: int):
        ptrs = [pa + self.offsets[0], pb + self.offsets[1]]
        keep = []
        for i, (shape, copy) in enumerate(self.copies):
            if copy is not None:
                buf = empty(shape)
                keep.append(buf)
                copy(ptrs[i], buf.data.ptr)
                ptrs[i] = buf.data.ptr
        _replay(self.steps, ptrs[0], ptrs[1], pc + self.offsets[2])


def _padded(a, b, c, problem, device_id: int, record: Recorder | None) -> None:
    """c = a @ b (a single product; a and b as the kernels read them) with A and B, where their rows are not 16-byte
    aligned, copied into rows that are (the plan's aligned-copy rule), K padded with zeros to whole K-tiles (both
    copied where it is not), then planned and run like any product, K summed in runs; C is written in place."""
    a, b, c = (x.reshape(x.shape[-2:]) for x in (a, b, c))  # the plan pads single products only
    depth = _plan.padded_k(problem.k)
    copies, operands = [], []
    for x, ok, k_axis in ((a, problem.a_aligned, 1), (b, problem.b_aligned, 0)):
        if ok and depth == problem.k:
            copies.append((None, None))
            operands.append(x)
        else:
            view, shape, copy = _aligned_copy(x, device_id, k_axis, depth)
            copies.append((shape, copy))
            operands.append(view)
    sub = Recorder(operands[0].data.ptr, operands[1].data.ptr, c.data.ptr) if record is not None else None
    gemm(operands[0], operands[1], c, "auto", sub, runs=True)  # the plan's, as for _peeled's parts
    if record is not None:
        if None in sub:
            record.append(None)
        else:
            offsets = tuple(x.data.ptr - base for x, base in zip((a, b, c), record.base))
            record.append(_PaddedReplay(tuple(copies), tuple(sub), offsets))


def _ozaki(a, b, c, problem, device, device_id: int, config: Int8Tile) -> None:
    """c = a @ b by Ozaki scheme II (fastmm/_runtime/ozaki.py), batch item by batch item; a product one launch sequence
    cannot take runs on 3xTF32 instead, with a PerformanceWarning."""
    from .ozaki import ozaki_product

    if c.ndim > 2 and math.prod(c.shape[:-2]) > 1:
        for index in np.ndindex(*c.shape[:-2]):
            _ozaki(_batch_item(a, index), _batch_item(b, index), c[index], problem, device, device_id, config)
        return
    a, b, c = (x.reshape(x.shape[-2:]) for x in (a, b, c))
    why = _plan.ozaki.fits(*c.shape, a.shape[1])
    if why is None:
        bad_a, bad_b = ozaki_product(a, b, c, device_id, config)
        if bad_a.size or bad_b.size:  # NaN and infinities as IEEE arithmetic gives them: the FP32 path
            _nonfinite(a, b, c, bad_a, bad_b, device)
        return
    single = _plan.Problem(c.shape[0], c.shape[1], a.shape[1])
    name = _plan.ozaki_fallback(single, device)
    message = f"Ozaki scheme II cannot take this product ({why}): {name} (3xTF32) instead"
    _errors.warn_once(message, message)
    gemm(a, b, c, name)


def _nonfinite(a, b, c, bad_a, bad_b, device) -> None:
    """Rows `bad_a` and columns `bad_b` of c, after Ozaki scheme II, computed again on the 3xTF32 kernels (gathered
    copies)."""
    for rows, cols in ((bad_a, None), (None, bad_b)):
        if (rows if rows is not None else cols).size == 0:
            continue
        sub_a = a[rows] if rows is not None else a
        sub_b = b[:, cols] if cols is not None else b
        out = empty((sub_a.shape[0], sub_b.shape[1]))
        problem = _plan.Problem(out.shape[0], out.shape[1], a.shape[1])
        gemm(sub_a, sub_b, out, _plan.ozaki_fallback(problem, device))
        if rows is not None:
            c[rows] = out
        else:
            c[:, cols] = out


def _peeled(a, b, c, peel: tuple[int, int], record: Recorder | None, runs: bool = False) -> None:
    """c = a @ b as the interior on whole tiles and its last `rows` rows and `cols` columns as few-row and
    few-column products (each planned on its own, as `explain` says, also inside `use_kernel`: only the plan peels;
    all are views of a, b and c, so a replay runs them again)."""
    rows, cols = peel
    m, n = c.shape[-2:]
    mm, nn = m - rows, n - cols
    gemm(a[..., :mm, :], b[..., :nn], c[..., :mm, :nn], "auto", record, runs=runs)
    if cols:
        gemm(a[..., :mm, :], b[..., nn:], c[..., :mm, nn:], "auto", record, runs=runs)
    if rows:
        gemm(a[..., mm:, :], b, c[..., mm:, :], "auto", record, runs=runs)


def _on_cupy(a, b, c, record) -> None:
    """c[...] = a @ b by CuPy's own matmul (cuBLAS), on plain CuPy views of the three arrays; never replayed."""
    cp = _cupy()
    a, b, c = (cp.ndarray(x.shape, x.dtype, x.data, x.strides) for x in (a, b, c))
    c[...] = cp.matmul(a, b)
    if record is not None:
        record.append(None)


def _via_temporary(a, b, c, kernel, record, runs: bool = False):
    tmp = empty(c.shape)
    gemm(a, b, tmp, kernel, runs=runs)
    c[...] = tmp
    if record is not None:
        record.append(None)


# Replays of earlier float32 products, per call signature: shapes, strides, 16-byte alignment of both operands,
# device and forced kernel determine everything but the three pointers (see _cuda.Launch). An entry is (the
# result's shape, the callable that runs the steps on (pa, pb, pc): see `_runner`, and for a product into `out` the
# byte spans of A, B and `out` relative to their pointers: see `arrays.apart`).
replays: dict[tuple, tuple] = {}
REPLAYS_MAX = 1024
_plan.on_reload(replays.clear)  # a new autotune entry can change what a signature should run


def signature(a, b, out, kernel, device_id):
    """The replay key of ``matmul(a, b, out, kernel=kernel)`` on device `device_id`."""
    return (a.shape, a.strides, a.data.ptr & 15, b.shape, b.strides, b.data.ptr & 15, device_id, kernel,
            _plan.settings(), None if out is None else (out.strides, out.data.ptr & 15))


def remember(key, out_shape, steps, spans=None) -> None:
    """Keep a recorded product for replay under `key` (at most REPLAYS_MAX signatures: past that, start over);
    `spans`: of A, B and `out` where the product had one."""
    if len(replays) >= REPLAYS_MAX:
        replays.clear()
    replays[key] = (out_shape, _runner(steps), spans)
