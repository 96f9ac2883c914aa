"""accelerate_numpy(): plain NumPy float32 matmul on the GPU, by replacing NumPy's own inner loop.

NumPy lets a package replace a ufunc's inner loop for one type signature (``PyUFunc_ReplaceLoopBySignature``, in
NumPy's ufunc C API since NumPy 1.x and still in NumPy 2). ``np.matmul`` is a gufunc, and its float32 loop (``ff->f``)
receives the host pointers, the batch count, the core dimensions and every stride, after NumPy has done all of its
own work: argument parsing, broadcasting, type resolution, ``out=``, overlap checks, temporaries. So fastmm replaces
that one loop and nothing else, and every case NumPy accepts comes through with NumPy's semantics.

The replacement is a small C loop (fastmm/_hooks/hostloop.c, compiled on first use with the machine's C compiler) that
hands a product to fastmm only when it has enough work to be worth the trip to the GPU (`HostModel`), and runs
NumPy's own loop otherwise, at a cost of nanoseconds. fastmm's part runs as a ctypes callback, which takes the GIL;
any failure there (no GPU, out of memory, a driver fault) gives one `PerformanceWarning` and NumPy's loop computes
the product, so a result is never wrong or missing. Without a C compiler the whole loop is a ctypes callback: the
same behaviour, about a microsecond more per small product.

This module sits on top of fastmm, beside the array type: NumPy loop -> `_staged` (pinned staging) -> dispatch.
"""

from __future__ import annotations

import _thread
import ctypes
import dataclasses
import functools
import json
import logging
import math
import os
import platform
import threading
import time

import numpy as np

from . import hostmem as _hostmem
from .._errors import warn_once
from .._switch import Hook, Switch

_log = logging.getLogger("fastmm")

__all__ = ["accelerate_numpy", "restore_numpy", "numpy_hook_status", "HostModel"]

_NPY_FLOAT = 11  # NumPy's type number of float32 (stable since NumPy 1.0)
_ARGS = ctypes.POINTER(ctypes.c_void_p)
_INTS = ctypes.POINTER(ctypes.c_ssize_t)
_LOOP = ctypes.CFUNCTYPE(None, _ARGS, _INTS, _INTS, ctypes.c_void_p)
_OFFLOAD = ctypes.CFUNCTYPE(ctypes.c_int, _ARGS, _INTS, _INTS)
# PYFUNCTYPE: called with the GIL held, so no NumPy call runs its loop setup while the pointer is swapped.
_REPLACE = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_void_p))
_REPLACE_INDEX = 30  # PyUFunc_ReplaceLoopBySignature's slot in NumPy's ufunc C-API table (numpy/__ufunc_api.h)
_DECLINED, _DONE, _INTERRUPTED = 0, 1, 2  # what fastmm's part of the loop did (as in hostloop.c)


# --------------------------------------------------------------------------------------------------------
# When the GPU is worth it: a model of both sides, fitted to measurements on this machine
# --------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HostModel:
    """When `accelerate_numpy` sends a product to the GPU: predicted times on the host and through the GPU.

    A product goes to the GPU when ``overhead + bytes / link + flops / gpu`` is less than ``flops / host``, where
    ``bytes`` counts the operands (a broadcast one once) and the result. The defaults are deliberately unfavourable
    to the GPU (a fast host, a slow link) until ``python -m fastmm autotune --numpy-hook`` measures this machine.

    Parameters
    ----------
    host : float
        NumPy's float32 matmul rate, FLOP/s.
    link : float
        Bytes per second of staging: host to pinned memory to the GPU and back, operands and result together.
    gpu : float
        fastmm's kernel rate, FLOP/s.
    overhead : float
        Seconds of fixed cost per offloaded product (the callback, allocations, synchronisation).
    measured : str
        Where the figures come from: empty for the defaults, else the file that holds them.

    See Also
    --------
    accelerate_numpy : Takes one.

    Examples
    --------
    >>> from fastmm import HostModel
    >>> m = HostModel(host=1e12, link=25e9, gpu=50e12, overhead=100e-6)
    >>> m.offloads(1, 4096, 4096, 4096), m.offloads(1, 8192, 8192, 1)
    (True, False)
    """

    host: float = 1.5e12
    link: float = 8.0e9
    gpu: float = 30.0e12
    overhead: float = 300e-6
    measured: str = ""  # where the figures come from: "" for the defaults, else the file that holds them

    def numpy_seconds(self, batch, m, k, n) -> float:
        return 2.0 * batch * m * k * n / self.host

    def gpu_seconds(self, batch, m, k, n, a_batch=None, b_batch=None) -> float:
        a_batch = batch if a_batch is None else a_batch
        b_batch = batch if b_batch is None else b_batch
        nbytes = 4 * (a_batch * m * k + b_batch * k * n + batch * m * n)
        return self.overhead + nbytes / self.link + 2.0 * batch * m * k * n / self.gpu

    def offloads(self, batch, m, k, n, a_batch=None, b_batch=None) -> bool:
        return self.gpu_seconds(batch, m, k, n, a_batch, b_batch) < self.numpy_seconds(batch, m, k, n)

    def min_flops(self) -> float:
        """The fewest FLOPs any offloaded product has: that of the smallest square product the model offloads.

        A square product moves the fewest bytes for its FLOPs, so a product with fewer FLOPs than this one never
        wins; the C loop uses it to decide in nanoseconds without asking Python.
        """
        s = 1.0
        while s < 1e6:
            if self.offloads(1, s, s, s):
                return 2.0 * s ** 3
            s = math.ceil(s * 1.05)
        return math.inf

    def threshold_text(self) -> str:
        flops = self.min_flops()
        side = round((flops / 2) ** (1 / 3)) if math.isfinite(flops) else None
        src = f"measured ({self.measured})" if self.measured else "defaults, not measured on this machine"
        return (f"float32 products of {flops / 1e9:.3g} GFLOP and up (a {side}^3 square product) when the GPU is "
                f"predicted faster; {src}" if side else f"never (the GPU is never predicted faster; {src})")


def model_path() -> Path:
    """Where `autotune --numpy-hook` keeps this machine's figures: one JSON file per host CPU, BLAS and GPU."""
    from ..kernels.build import cache_dir

    return cache_dir().parent / "numpy_hook" / f"{_host_key()}.json"


def _host_key() -> str:
    import hashlib

    cpu = platform.processor() or platform.machine()
    ident = f"{platform.node()}|{cpu}|{os.cpu_count()}|numpy {np.__version__}|{blas_name()}|{_gpu_name()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def blas_name() -> str:
    """The BLAS NumPy was built with (name and version), which sets the host's side of the model."""
    try:
        deps = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{deps.get('name', '?')} {deps.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older NumPy: the key only gets less specific
        return "unknown BLAS"


def _gpu_name() -> str:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"].decode()
    except Exception:  # noqa: BLE001 - no GPU: the figures would be of no use anyway
        return "no gpu"


def load_model() -> HostModel:
    """This machine's measured model, or the defaults (also when the file is unreadable: never an error)."""
    path = model_path()
    try:
        fields = json.loads(path.read_text())["model"]
        return HostModel(**{f.name: float(fields[f.name]) for f in dataclasses.fields(HostModel)
                            if f.name != "measured"}, measured=str(path))
    except (OSError, ValueError, KeyError, TypeError):
        return HostModel()


def save_model(model: HostModel, measurements: list[dict]) -> Path:
    path = model_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"model": {f.name: getattr(model, f.name) for f in dataclasses.fields(HostModel) if f.name != "measured"},
            "measurements": measurements}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    return path


# --------------------------------------------------------------------------------------------------------
# NumPy's loop table
# --------------------------------------------------------------------------------------------------------

def _replace_loop(new: int) -> int:
    """Put `new` in np.matmul's float32 loop slot; return what was there."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as umath
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = ctypes.cast(get(umath._UFUNC_API, None), ctypes.POINTER(ctypes.c_void_p))
    replace = _REPLACE(table[_REPLACE_INDEX])
    signature = (ctypes.c_int * 3)(_NPY_FLOAT, _NPY_FLOAT, _NPY_FLOAT)
    old = ctypes.c_void_p()
    if replace(np.matmul, new, signature, ctypes.byref(old)) != 0 or not old.value:
        raise RuntimeError("NumPy refused to replace np.matmul's float32 loop (PyUFunc_ReplaceLoopBySignature "
                           f"failed on NumPy {np.__version__}); fastmm's NumPy hook cannot work with this NumPy")
    return old.value


# --------------------------------------------------------------------------------------------------------
# The loop: C where a compiler exists, ctypes otherwise; both kept for the life of the process
# --------------------------------------------------------------------------------------------------------

class _Shim:
    """The replacement loop and its settings. Never freed: a thread inside NumPy may still call it after an
    uninstall (it read the loop's address before), and then finds NumPy's loop through it.

    NumPy's own loop is learnt from the first install (the slot's previous content), and the loop waits for it in
    the microseconds between that swap and `set_numpy_loop`, should another thread arrive then.
    """

    def __init__(self):
        self.numpy_loop = None
        self.offload = _OFFLOAD(_offload)
        self.lib = _compile_c_loop()
        if self.lib is not None:
            self.kind = "C"
            self.lib.fastmm_configure.argtypes = [ctypes.c_void_p, ctypes.c_double]
            self.lib.fastmm_set_numpy_loop.argtypes = [ctypes.c_void_p]
            self.lib.fastmm_set_python_api.argtypes = [ctypes.c_void_p] * 5
            api = ctypes.pythonapi
            self.lib.fastmm_set_python_api(
                *(ctypes.cast(f, ctypes.c_void_p) for f in (api.PyGILState_Ensure, api.PyGILState_Release,
                                                             api.PyErr_Occurred, api.PyErr_SetNone)),
                ctypes.c_void_p.in_dll(api, "PyExc_KeyboardInterrupt"))
            self.address = ctypes.cast(self.lib.fastmm_matmul_loop, ctypes.c_void_p).value
            self.lib.fastmm_below_threshold.restype = ctypes.c_longlong
            self.lib.fastmm_loop_times.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        else:
            self.kind = "ctypes"
            self._numpy = None
            self._loop = _LOOP(self._python_loop)
            self.address = ctypes.cast(self._loop, ctypes.c_void_p).value
        self.min_flops = math.inf
        self.on = False
        self._below = 0  # the ctypes loop's count of products below the threshold (the C loop keeps its own)
        self._times = [0] * 5  # the ctypes loop's times, as the C loop's (fastmm_loop_times)
        self._times_lock = threading.Lock()

    def below_threshold(self) -> int:
        """Products the loop left to NumPy without asking fastmm: too little work for the GPU."""
        return self.lib.fastmm_below_threshold() if self.lib is not None else self._below

    def _add(self, *deltas: int) -> None:
        """The ctypes loop's counters (threads multiply at once): gpu ns and products, numpy ns and products,
        declined ns, as fastmm_loop_times orders them."""
        with self._times_lock:
            for i, d in enumerate(deltas):
                self._times[i] += d

    def times(self) -> dict:
        """Seconds and products, since the first install: on fastmm's path (the GPU, staging included), in NumPy's
        own loop, and in fastmm's part for products it then declined."""
        if self.lib is not None:
            raw = (ctypes.c_longlong * 5)()
            self.lib.fastmm_loop_times(raw)
        else:
            raw = self._times
        return {"gpu_seconds": raw[0] * 1e-9, "gpu_products": raw[1], "numpy_seconds": raw[2] * 1e-9,
                "numpy_products": raw[3], "declined_seconds": raw[4] * 1e-9}

    def set_numpy_loop(self, address: int) -> None:
        self.numpy_loop = address
        if self.lib is not None:
            self.lib.fastmm_set_numpy_loop(address)
        else:
            self._numpy = _LOOP(address)

    def configure(self, on: bool, min_flops: float) -> None:
        self.on, self.min_flops = on, min_flops
        if self.lib is not None:
            self.lib.fastmm_configure(ctypes.cast(self.offload, ctypes.c_void_p) if on else None,
                                      min_flops if math.isfinite(min_flops) else 1e300)

    def _python_loop(self, args, dims, steps, data):
        if self._numpy is None:  # the first install's swap is still finishing (see the class docstring)
            with _on_off.lock:
                pass
        outcome = _DECLINED
        start = asked = time.perf_counter_ns()
        if self.on and 2.0 * dims[0] * dims[1] * dims[2] * dims[3] >= self.min_flops:
            outcome = _offload(args, dims, steps)
            asked = time.perf_counter_ns()
        elif self.on:
            self._below += 1
        if outcome == _DONE:
            self._add(asked - start, 1)
        else:
            self._numpy(args, dims, steps, data)
            self._add(0, 0, time.perf_counter_ns() - asked, 1, asked - start)
        if outcome == _INTERRUPTED:
            # A ctypes callback cannot leave an exception for NumPy to raise, as the C loop does: the interrupt is
            # simulated, and reaches the main thread at its next check for signals. The result is whole either way.
            _thread.interrupt_main()


def _compile_c_loop():
    """fastmm/_hooks/hostloop.c built and loaded (once per process), or None where it cannot be."""
    return _hostmem.compile_c("hostloop.c", "fastmm's NumPy hook runs NumPy's loop through a ctypes callback, which "
                              "adds about a microsecond to every float32 matmul")


# --------------------------------------------------------------------------------------------------------
# fastmm's side of the loop
# --------------------------------------------------------------------------------------------------------

class _HostBuffer:
    """NumPy's operand or output buffer, seen through the array interface (no copy)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address, shape, strides, readonly):
        self.__array_interface__ = {"data": (address, readonly), "shape": shape, "strides": strides,
                                    "typestr": np.dtype(np.float32).str, "version": 3}


def _offload(args, dims, steps) -> int:
    """Compute NumPy's product on the GPU (_DONE), or decline and let NumPy's loop compute it.

    Runs as a ctypes callback: no exception may leave it (ctypes would print it and return 0, which declines, so
    even then the result is NumPy's). A KeyboardInterrupt declines with _INTERRUPTED: NumPy's loop computes the
    whole product and the loop raises the interrupt again afterwards.
    """
    try:
        batch, m, k, n = dims[0], dims[1], dims[2], dims[3]
        sa, sb = steps[0], steps[1]
        if not _state.model.offloads(batch, m, k, n, 1 if sa == 0 else batch, 1 if sb == 0 else batch):
            _state.host_faster += 1
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("numpy hook: %dx%dx%d batch %d stays on NumPy (the model predicts the host faster)",
                           m, n, k, batch)
            return _DECLINED
        a = np.asarray(_HostBuffer(args[0], (batch, m, k), (sa, steps[3], steps[4]), True))
        b = np.asarray(_HostBuffer(args[1], (batch, k, n), (sb, steps[5], steps[6]), True))
        c = np.asarray(_HostBuffer(args[2], (batch, m, n), (steps[2], steps[7], steps[8]), False))
        _state.product(a, b, c)
        _state.offloaded += 1
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("numpy hook: %dx%dx%d batch %d computed on the GPU", m, n, k, batch)
        return _DONE
    except KeyboardInterrupt:
        return _INTERRUPTED
    except BaseException as e:  # noqa: BLE001 - anything: NumPy's loop computes the product instead
        _state.declined += 1
        try:
            warn_once(f"numpy-hook-{type(e).__name__}",
                      f"fastmm's NumPy hook could not run a float32 product on the GPU, so NumPy computed it "
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
    from . import staged as _staged

    _staged.matmul_host(a, b, c)


class _State:
    def __init__(self):
        self.shim: _Shim | None = None
        self.model = HostModel()
        self.product = _gpu_product  # tests put a stand-in GPU here
        self.offloaded = 0
        self.declined = 0
        self.host_faster = 0  # products the model kept on the host (its prediction, past the loop's threshold)


_state = _State()


def _install() -> None:
    numpy_loop = _replace_loop(_state.shim.address)
    if _state.shim.numpy_loop is None:
        _state.shim.set_numpy_loop(numpy_loop)


def _uninstall() -> None:
    _state.shim.configure(False, math.inf)
    _replace_loop(_state.shim.numpy_loop)


_on_off = Switch(_install, _uninstall)


# --------------------------------------------------------------------------------------------------------
# Public
# --------------------------------------------------------------------------------------------------------

class accelerate_numpy(Hook):
    """Run plain NumPy float32 matrix products on the GPU, through fastmm's kernels, from now on.

    Replaces NumPy's own float32 inner loop of ``np.matmul`` (which ``@`` and ``@=`` also use) with one that sends
    a product to the GPU when a model of this machine predicts it is faster there, and runs NumPy's own loop
    otherwise. Nothing else changes: other dtypes, other functions, and products below the threshold run NumPy's
    code and give NumPy's bit-identical results. Idempotent and thread-safe; `restore_numpy` undoes it. As a context
    manager (``with fastmm.accelerate_numpy():``) it keeps the hook on for the block: blocks in several threads may
    overlap, and the hook stays on until the last one exits, or for good if a plain call turned it on.

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

    Raises
    ------
    RuntimeError
        If this NumPy does not let fastmm replace the loop.

    Notes
    -----
    What differs from NumPy for an offloaded product: the result is computed by fastmm's FP32 kernels, so it
    matches NumPy's to float32 accuracy (relative error about 1e-6), not bit for bit. A GPU failure (no GPU, out
    of memory, a driver fault) never loses a result: NumPy computes it, with one `PerformanceWarning`.
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

    def __init__(self, model: HostModel | None = None, *, pinned: bool = True):
        with _on_off.lock:
            _state.model = model if model is not None else load_model()
            if _state.shim is None:
                _state.shim = _Shim()
            _state.shim.configure(True, _state.model.min_flops())
            super().__init__()
        # NumPy's allocator is a setting of the calling thread's context, not of the process.
        self._allocator = _hostmem.install_allocator() if pinned else None
        if _state.product is _gpu_product:  # (tests put a stand-in GPU there)
            reason = _why_no_gpu()
            if reason is not None:
                warn_once("numpy-hook-no-gpu", f"accelerate_numpy() is on, but no CUDA GPU can run fastmm's kernels "
                          f"here ({reason}), so NumPy computes every product itself", stacklevel=3)

    def __exit__(self, *exc):
        if self._allocator is not None:
            _hostmem.restore_allocator(self._allocator)
        return super().__exit__(*exc)


def restore_numpy() -> None:
    """Put NumPy's own float32 matmul loop back: NumPy is then exactly as it was before `accelerate_numpy`.

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


def numpy_hook_status() -> dict:
    """The state of the NumPy hook: on or off, how its loop runs, its threshold, what it did.

    Returns
    -------
    dict
        ``active`` (bool), ``loop`` (``"C"``, ``"ctypes"`` or None before the first install), ``threshold`` (a
        sentence, while active), ``offloaded`` (products computed on the GPU), ``declined_after_failure``
        (products NumPy computed because the GPU path failed), ``by_dtype`` (per dtype, the products the GPU took
        and those NumPy kept, by reason: below the threshold, the host predicted faster, after a failure; and the
        seconds spent in each: on fastmm's path, staging included, in NumPy's loop, and in fastmm's part for the
        products it then declined; dtypes other than float32 are NumPy's own), ``pinned_allocator`` (whether this
        thread's new large arrays come from fastmm's page-locked pool) and ``pool`` (that pool's counts: blocks held
        and pooled, bytes pooled and page-locked, reuses, mappings). The counts are the process's, since the first
        install.

    See Also
    --------
    accelerate_numpy : Turn the hook on.
    restore_numpy : Turn it off.
    HostModel : How the threshold is decided.

    Examples
    --------
    >>> import fastmm
    >>> sorted(fastmm.numpy_hook_status())
    ['active', 'by_dtype', 'declined_after_failure', 'loop', 'offloaded', 'pinned_allocator', 'pool', 'threshold']
    """
    with _on_off.lock:
        below = _state.shim.below_threshold() if _state.shim else 0
        times = _state.shim.times() if _state.shim else {"gpu_seconds": 0.0, "numpy_seconds": 0.0,
                                                          "declined_seconds": 0.0}
        by_dtype = {"float32": {"on_gpu": _state.offloaded,
                                "kept_on_cpu": {"below_threshold": below, "host_predicted_faster": _state.host_faster,
                                                "after_failure": _state.declined},
                                "seconds": {"on_gpu": times["gpu_seconds"], "kept_on_cpu": times["numpy_seconds"],
                                            "deciding_then_declining": times["declined_seconds"]}},
                    "other dtypes": "NumPy's own loops: the hook takes float32 products only"}
        return {"active": _on_off.active, "loop": _state.shim.kind if _state.shim else None,
                "threshold": _state.model.threshold_text() if _on_off.active else None,
                "offloaded": _state.offloaded, "declined_after_failure": _state.declined, "by_dtype": by_dtype,
                "pinned_allocator": _hostmem.allocator_active(), "pool": _hostmem.allocator_stats()}
