"""accelerate_numpy(): plain NumPy float32, float64 and complex matmul on the GPU, by replacing NumPy's own inner loops.

NumPy lets a package replace a ufunc's inner loop for one type signature (``PyUFunc_ReplaceLoopBySignature``, in
NumPy's ufunc C API since NumPy 1.x and still in NumPy 2). ``np.matmul`` is a gufunc, and its float32 loop (``ff->f``;
float64's, ``dd->d``, alike) receives the host pointers, the batch count, the core dimensions and every stride, after
NumPy has done all of its own work: argument parsing, broadcasting, type resolution, ``out=``, overlap checks,
temporaries. So fastmm replaces those loops and nothing else, and every case NumPy accepts comes through with NumPy's
semantics.

The replacement is a small C loop (fastmm/_hooks/hostloop.c, compiled on first use with the machine's C compiler) that
hands a product to fastmm only when it has enough work to be worth the trip to the GPU (`HostModel`), and runs
NumPy's own loop otherwise, at a cost of nanoseconds. fastmm's part runs as a ctypes callback, which takes the GIL;
any failure there (no GPU, out of memory, a driver fault) gives one `PerformanceWarning` and NumPy's loop computes
the product, so a result is never wrong or missing. Without a C compiler the whole loop is a ctypes callback: the
same behaviour, about a microsecond more per small product.

This module sits on top of fastmm, beside the array type: NumPy loop -> `_staged` (pinned staging) -> dispatch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading

import numpy as np

from . import fastpath as _fastpath
from . import numpy_loop as _loop
from . import hostmem as _hostmem
from . import resident as _resident
from . import staged as _staged
from .._errors import warn_once
from .._runtime import compiling as _compiling
from .._switch import Hook, Switch
from .host_model import (FULL_RATE_FP64, HostModel, blas_name, complex_model, compute_capability,  # noqa: F401
                         dtype_models, float64_model, load_model, model_path, save_model)

from .numpy_loop import (_DECLINED, _DONE, _INTERRUPTED, _NPY_CDOUBLE, _NPY_CFLOAT, _NPY_DOUBLE,
                         _NPY_FLOAT, _replace_loop)

_log = logging.getLogger("fastmm")

__all__ = ["accelerate_numpy", "restore_numpy", "numpy_hook_status", "HostModel"]

# --------------------------------------------------------------------------------------------------------
# fastmm's side of the loop
# --------------------------------------------------------------------------------------------------------

class _HostBuffer:
    """NumPy's operand or output buffer, seen through the array interface (no copy)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address, shape, strides, readonly, dtype=np.float32):
        self.__array_interface__ = {"data": (address, readonly), "shape": shape, "strides": strides,
                                    "typestr": np.dtype(dtype).str, "version": 3}


def _offload(args, dims, steps, lane=None) -> int:
    """Compute NumPy's product on the GPU (_DONE), or decline and let NumPy's loop compute it; `lane` is the dtype's
    state (the float32 one by default).

    Runs as a ctypes callback: no exception may leave it (ctypes would print it and return 0, which declines, so
    even then the result is NumPy's). A KeyboardInterrupt declines with _INTERRUPTED: NumPy's loop computes the
    whole product and the loop raises the interrupt again afterwards.
    """
    lane = lane or _state.lanes["float32"]
    if getattr(_inside, "offload", False):
        return _DECLINED  # a product made by fastmm's own side (a float64 one, say): NumPy's, never back here
    _inside.offload = True
    try:
        return _offload_in(args, dims, steps, lane)
    finally:
        _inside.offload = False


_inside = threading.local()
_BUILDING_KINDS = 256  # kinds of product remembered as waiting for a kernel (then forgotten all at once)


def _kind(args, dims, steps) -> tuple:
    """What picks a product's kernel: its sizes, strides and the alignment of its three buffers."""
    return (*dims[:4], *steps[:9], args[0] % 16, args[1] % 16, args[2] % 16)


def _offload_in(args, dims, steps, lane) -> int:
    try:
        batch, m, k, n = dims[0], dims[1], dims[2], dims[3]
        sa, sb = steps[0], steps[1]
        # A product of a kind whose kernel nvcc is building declines at once, before the cache's decision or any
        # copy, until the compile thread finishes a binary (then it tries again): deciding, then declining, cost
        # about 1.3 ms a product, 9% of a softmax regression's steps on an empty cache (docs/numpy-hook.md).
        finished = _compiling.finished()
        if lane.building and lane.building.get(_kind(args, dims, steps)) == finished:
            lane.compiling += 1
            return _DECLINED
        a_batch, b_batch = 1 if sa == 0 else batch, 1 if sb == 0 else batch
        cache, views = _state.cache, (None, None)
        if cache is not None:
            offload, views = cache.decide(lane.model, batch, m, k, n,
                                          ((args[0], (batch, m, k), (sa, steps[3], steps[4]), a_batch),
                                           (args[1], (batch, k, n), (sb, steps[5], steps[6]), b_batch)), lane.dtype)
        else:
            offload = lane.model.offloads(batch, m, k, n, a_batch, b_batch)
        if not offload:
            lane.host_faster += 1
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("numpy hook: %s %dx%dx%d batch %d stays on NumPy (the model predicts the host faster)",
                           lane.dtype, m, n, k, batch)
            return _DECLINED
        a = np.asarray(_HostBuffer(args[0], (batch, m, k), (sa, steps[3], steps[4]), True, lane.dtype))
        b = np.asarray(_HostBuffer(args[1], (batch, k, n), (sb, steps[5], steps[6]), True, lane.dtype))
        c = np.asarray(_HostBuffer(args[2], (batch, m, n), (steps[2], steps[7], steps[8]), False, lane.dtype))
        a, b = (x if v is None else _resident.Resident(x, v) for x, v in zip((a, b), views))
        try:
            with _compiling.in_background():  # never wait for nvcc: NumPy computes while it builds the kernel
                _state.product(a, b, c)
        finally:
            if cache is not None:
                _hostmem.touch(args[2])  # the result may have come down by DMA, which no write fault reports
        lane.offloaded += 1
        if cache is not None:
            cache.count_served(views, _resident.operand_bytes(m, k, n, a_batch, b_batch, lane.model.itemsize))
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("numpy hook: %s %dx%dx%d batch %d computed on the GPU", lane.dtype, m, n, k, batch)
        return _DONE
    except KeyboardInterrupt:
        return _INTERRUPTED
    except _compiling.KernelCompiling:
        lane.compiling += 1
        if len(lane.building) >= _BUILDING_KINDS:
            lane.building.clear()
        lane.building[_kind(args, dims, steps)] = finished
        return _DECLINED
    except BaseException as e:  # noqa: BLE001 - anything: NumPy's loop computes the product instead
        lane.declined += 1
        try:
            warn_once(f"numpy-hook-{type(e).__name__}",
                      f"fastmm's NumPy hook could not run a {lane.dtype} product on the GPU, so NumPy computed it "
                      f"({type(e).__name__}: {e}); later products still try the GPU", stacklevel=2)
        except BaseException:  # noqa: BLE001 - warnings turned into errors: still never fail NumPy's call
            pass
        return _DECLINED


@functools.lru_cache(maxsize=1)
def _why_no_gpu() -> str | None:
    """Asked once per process: a `with accelerate_numpy():` block per call must not query the driver each time."""
    from .._runtime.cuda import why_no_gpu

    return why_no_gpu()


def _gpu_product(a, b, c) -> None:
    da, db = getattr(a, "dev", a), getattr(b, "dev", b)  # (a Resident: its device view)
    if da is a and db is b or not _fastpath.matmul(da, db, c):  # (the fast path: a kept operand times small ones)
        _staged.matmul_host(da, db, c)
    elif (cache := _state.cache) is not None:
        cache.count_fast()


class _Lane:
    """One dtype's part of the hook: its loop, its model, and what it did."""

    def __init__(self, dtype: str, type_num: int):
        self.dtype, self.type_num = dtype, type_num
        self.shim: _loop.Shim | None = None
        self.model = HostModel()
        self.enabled = dtype == "float32"  # the others as accelerate_numpy() decides (see its float64 parameter)
        self.installed = False  # its loop is in NumPy's table
        self.offloaded = 0
        self.declined = 0
        self.host_faster = 0  # products the model kept on the host (its prediction, past the loop's threshold)
        self.compiling = 0  # products NumPy computed while nvcc built their kernel
        # Kinds of product (shape, strides, alignment) whose kernel was being built -> binaries the compile thread
        # had finished then
        self.building: dict[tuple, int] = {}

    def ensure_shim(self) -> _loop.Shim:
        if self.shim is None:
            self.shim = _loop.Shim(functools.partial(_offload, lane=self), _on_off.lock)
        return self.shim


class _State:
    """The hook's state: a lane per dtype; the float32 lane's fields are also reachable here (shim, model, counts)."""

    def __init__(self):
        types = (("float32", _NPY_FLOAT), ("float64", _NPY_DOUBLE), ("complex64", _NPY_CFLOAT),
                 ("complex128", _NPY_CDOUBLE))
        self.lanes = {name: _Lane(name, num) for name, num in types}
        self.product = _gpu_product  # tests put a stand-in GPU here
        self.device = _resident.CupyDevice()  # ... and a stand-in device for the cache of operands here
        self.cache: _resident.Cache | None = None  # operands kept on the GPU; None: off


def _float32_field(name):
    return property(lambda self: getattr(self.lanes["float32"], name),
                    lambda self, value: setattr(self.lanes["float32"], name, value))


for _name in ("shim", "model", "offloaded", "declined", "host_faster"):
    setattr(_State, _name, _float32_field(_name))
_state = _State()


def _put_loop(lane: _Lane) -> None:
    numpy_loop = _replace_loop(lane.shim.address, lane.type_num)
    if lane.shim.numpy_loop is None:
        lane.shim.set_numpy_loop(numpy_loop)
    lane.installed = True


def _take_loop(lane: _Lane) -> None:
    lane.shim.configure(False, math.inf)
    _replace_loop(lane.shim.numpy_loop, lane.type_num)
    lane.installed = False


def _install() -> None:
    for lane in _state.lanes.values():
        if lane.enabled and lane.shim is not None and not lane.installed:
            _put_loop(lane)


def _uninstall() -> None:
    for lane in _state.lanes.values():
        if lane.installed:
            _take_loop(lane)
    _drop_cache()  # every block writable again: nothing faults once the hook is off
    _fastpath.release()


_on_off = Switch(_install, _uninstall)


# --------------------------------------------------------------------------------------------------------
# Public
# --------------------------------------------------------------------------------------------------------

class accelerate_numpy(Hook):
    """Run plain NumPy matrix products on the GPU from now on: float32 through fastmm's kernels, float64 and complex
    through cuBLAS (see `float64`).

    Replaces NumPy's own float32, float64, complex64 and complex128 inner loops of ``np.matmul`` (which ``@`` and ``@=``
    also use) with one that sends a product to the GPU when a model of this machine predicts it is faster there, and
    runs NumPy's own loop otherwise. Nothing else changes: other dtypes, other functions, and products below the
    threshold run NumPy's code and give NumPy's bit-identical results. Idempotent and thread-safe; `restore_numpy`
    undoes it. As a context manager (``with fastmm.accelerate_numpy():``) it keeps the hook on for the block: blocks in
    several threads may overlap, and the hook stays on until the last one exits, or for good if a plain call turned it
    on.

    Parameters
    ----------
    model : HostModel, optional
        When to offload. Default: this machine's figures measured by ``python -m fastmm autotune --numpy-hook``,
        or conservative defaults.
    pinned : bool, default True
        Also allocate NumPy's new arrays of 1 MiB and more, in this thread, from fastmm's pool of memory that the GPU
        copies directly (page-locked on a block's first trip to the GPU, kept so when NumPy frees it, for the next
        array of about that size). Products of such arrays skip the host-side staging copy: 2048^3 runs in a third
        of the time. Freed blocks stay in the pool up to 1/16 of the host's memory (256 MiB to 4 GiB). As a context
        manager, the block's end puts the thread's previous allocator back; `restore_numpy` puts NumPy's back.
    float64 : bool, default True
        Also take float64 and complex128 products (NumPy's default dtypes) through loops of their own, to cuBLAS's
        DGEMM and ZGEMM through CuPy, on GPUs whose FP64 runs at full rate (P100, V100, A100, H100/H200, B200);
        elsewhere they stay NumPy's. float64's model is float32's with eight-byte elements, NumPy's DGEMM at half its
        SGEMM rate and the GPU's FP64 at half fastmm's FP32 rate. complex64 products always go with float32 ones (to
        cuBLAS's CGEMM); a complex dtype's model is its real dtype's with elements twice the size and a quarter of
        the rate on both sides (a complex multiply-add is four real ones).
    cache_bytes : int, optional
        At most this many bytes of GPU memory for operands kept there between products (arrays of fastmm's pool that
        a program multiplies again unchanged: a write into one makes its copy unusable, see the NumPy hook page of
        the documentation). 0 turns that off. Default: ``$FASTMM_NUMPY_CACHE`` where set (bytes, or with a K, M or
        G suffix), else a quarter of the GPU memory free at the first copy.
    warm_up : bool, default True
        Start the current CUDA device (its context, about 0.1 s) on a background thread now, while the program
        prepares its data, rather than in its first offloaded product. A process whose CUDA has started cannot use
        the GPU in children it forks (their products then stay NumPy's): pass False where the program forks workers
        that should use the GPU themselves, or start them with the "spawn" or "forkserver" method.

    Raises
    ------
    RuntimeError
        If this NumPy does not let fastmm replace the loop.

    Notes
    -----
    What differs from NumPy for an offloaded product: the result is computed by fastmm's FP32 kernels (the other
    dtypes: cuBLAS's DGEMM, CGEMM, ZGEMM), so it matches NumPy's to the dtype's accuracy, not bit for bit. A GPU
    failure (no GPU, out of memory, a driver fault) never loses a result: NumPy computes it, with one
    `PerformanceWarning`.
    ``np.dot``, ``np.inner``, ``np.tensordot`` and ``np.einsum`` call BLAS directly and do not go through this loop:
    see the NumPy hook page of the documentation.

    See Also
    --------
    restore_numpy : Put NumPy's own loop back.
    numpy_hook_status : Whether the hook is on, its threshold, and what it did.
    HostModel : When a product goes to the GPU.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> with fastmm.accelerate_numpy():            # doctest: +SKIP
    ...     c = np.ones((4096, 4096), np.float32) @ np.ones((4096, 4096), np.float32)   # on the GPU
    """

    _switch, _name = _on_off, "NumPy hook"

    def __init__(self, model: HostModel | None = None, *, pinned: bool = True, float64: bool = True,
                 cache_bytes: int | None = None, warm_up: bool = True):
        cap = _resident.cap_bytes(cache_bytes)
        with _on_off.lock:
            model32 = model if model is not None else load_model()
            model64 = float64_model(model32, compute_capability()) if float64 else None
            if model64 is None and float64 and _state.product is not _gpu_product:
                model64 = dataclasses.replace(model32, itemsize=8)  # (a stand-in GPU: as float32's)
            models = dtype_models(model32, model64)
            for name, lane in _state.lanes.items():
                lane.enabled = models[name] is not None
                lane.building.clear()  # (a new start, with a product of its own: each kind tries its kernel again)
                if lane.enabled:
                    lane.model = models[name]
                    lane.ensure_shim().configure(True, lane.model.min_flops())
            super().__init__()
            _sync_lanes()
            _configure_cache(cap)
        # NumPy's allocator is a setting of the calling thread's context, not of the process.
        self._allocator = _hostmem.install_allocator() if pinned else None
        if _state.product is _gpu_product:  # (tests put a stand-in GPU there)
            reason = _why_no_gpu()
            if reason is not None:
                warn_once("numpy-hook-no-gpu", f"accelerate_numpy() is on, but no CUDA GPU can run fastmm's kernels "
                          f"here ({reason}), so NumPy computes every product itself", stacklevel=3)
            elif warm_up:  # the program's first offloaded product then finds the CUDA context made
                from .._runtime.cuda import warm_up_in_background

                warm_up_in_background()

    def __exit__(self, *exc):
        if self._allocator is not None:
            _hostmem.restore_allocator(self._allocator)
        return super().__exit__(*exc)


def _configure_cache(cap: int | None) -> None:
    """(lock held) The cache of operands on or off. A stand-in GPU (tests) goes with a stand-in device; the real
    device only where a GPU is."""
    usable = (not isinstance(_state.device, _resident.CupyDevice)
              or _state.product is _gpu_product and _why_no_gpu() is None)
    if cap == 0 or not usable:
        _drop_cache()
    elif _state.cache is None or _state.cache.device is not _state.device:
        _drop_cache()
        _state.cache = _resident.Cache(_state.device, cap)
    elif cap is not None:
        _state.cache.set_cap(cap)
    candidate = _hostmem.candidate_address() if _state.cache is not None else None
    for lane in _state.lanes.values():
        if lane.shim is not None:
            lane.shim.configure_resident(candidate, lane.model)


def _drop_cache() -> None:
    if _state.cache is not None:
        _state.cache.clear()
    _state.cache = None
    _hostmem.untrack_all()


def time_products_only() -> None:
    """Install every dtype's loop with nothing sent to the GPU: NumPy computes every product, and the
    loops' clocks time them (`numpy_hook_status()["by_dtype"][dtype]["seconds"]["kept_on_cpu"]`), which is how
    ``bench --numpy-hook --programs`` measures a program's share of time in products. `restore_numpy` undoes it."""
    never = HostModel(host=1e18, link=1.0, gpu=1.0, overhead=1.0)
    with _on_off.lock:
        for lane in _state.lanes.values():
            lane.model = dataclasses.replace(never, itemsize=np.dtype(lane.dtype).itemsize)
            lane.enabled = True
            lane.ensure_shim().configure(True, math.inf)
        _configure_cache(0)
        _on_off.on()
        _sync_lanes()


def _sync_lanes() -> None:
    """While the hook is on, each lane's loop installed as it is enabled (a later call may add or drop float64's)."""
    if not _on_off.active:
        return
    _install()
    for lane in _state.lanes.values():
        if not lane.enabled and lane.installed:
            _take_loop(lane)


def restore_numpy() -> None:
    """Put NumPy's own matmul loops back: NumPy is then exactly as it was before `accelerate_numpy`.

    Idempotent and thread-safe. A product already inside fastmm's loop finishes there; fastmm's compiled loop stays
    loaded (a thread may still be about to call it) and sends everything to NumPy's loop. In the calling thread, NumPy
    allocates new arrays with its own allocator again (arrays from fastmm's pool go back to it when freed).

    Returns
    -------
    None

    See Also
    --------
    accelerate_numpy : Turn the hook on.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.restore_numpy()            # nothing to undo: a no-op
    >>> fastmm.numpy_hook_status()["active"]
    False
    """
    _on_off.off()
    _hostmem.restore_allocator()


def _lane_status(lane: _Lane) -> dict:
    shim = lane.shim
    times = shim.times() if shim else {"gpu_seconds": 0.0, "numpy_seconds": 0.0, "declined_seconds": 0.0}
    return {"on_gpu": lane.offloaded,
            "kept_on_cpu": {"below_threshold": shim.below_threshold() if shim else 0,
                            "host_predicted_faster": lane.host_faster, "after_failure": lane.declined,
                            "kernel_compiling": lane.compiling},
            "seconds": {"on_gpu": times["gpu_seconds"], "kept_on_cpu": times["numpy_seconds"],
                        "deciding_then_declining": times["declined_seconds"]},
            "taken": lane.installed and lane.enabled}


def numpy_hook_status() -> dict:
    """The state of the NumPy hook: on or off, how its loop runs, its threshold, what it did.

    Returns
    -------
    dict
        ``active`` (bool), ``loop`` (``"C"``, ``"ctypes"`` or None before the first install), ``threshold`` (a sentence,
        while active), ``offloaded`` (float32 products computed on the GPU), ``declined_after_failure`` (float32
        products NumPy computed because the GPU path failed), ``by_dtype`` (per dtype, the products the GPU took and
        those NumPy kept, by reason: below the threshold, the host predicted faster, after a failure; the seconds spent
        in each: on fastmm's path, staging included, in NumPy's loop, and in fastmm's part for the products it then
        declined; and whether the hook takes that dtype now: float32 and complex64 always, float64 and complex128 on
        GPUs with full-rate FP64 unless ``float64=False``; other dtypes are NumPy's own), ``pinned_allocator`` (whether
        this thread's new large arrays come from fastmm's page-locked pool) and ``pool`` (that pool's counts: blocks
        held and pooled, bytes pooled and page-locked, reuses, mappings), ``cache`` (operands kept on the GPU, None
        while that is off: its cap and bytes, copies held, products served from them (``fast_hits``: of those, the ones
        with small other operands, which took the fast path) and the upload bytes that saved, copies made, copies
        dropped because their buffer was written and for room, write faults seen, blocks tracked). The counts are the
        process's, since the first install.

    See Also
    --------
    accelerate_numpy : Turn the hook on.
    restore_numpy : Turn it off.
    HostModel : How the threshold is decided.

    Examples
    --------
    >>> import fastmm
    >>> sorted(fastmm.numpy_hook_status())
    ['active', 'by_dtype', 'cache', 'declined_after_failure', 'loop', 'offloaded', 'pinned_allocator', 'pool', 'threshold']
    """
    with _on_off.lock:
        by_dtype = {name: _lane_status(lane) for name, lane in _state.lanes.items()}
        by_dtype["other dtypes"] = ("NumPy's own loops: the hook takes float32, float64, complex64 and complex128 "
                                    "products only")
        return {"active": _on_off.active, "loop": _state.shim.kind if _state.shim else None,
                "threshold": _state.model.threshold_text() if _on_off.active else None,
                "offloaded": _state.offloaded, "declined_after_failure": _state.declined, "by_dtype": by_dtype,
                "pinned_allocator": _hostmem.allocator_active(), "pool": _hostmem.allocator_stats(),
                "cache": _state.cache.stats() if _state.cache is not None else None}
