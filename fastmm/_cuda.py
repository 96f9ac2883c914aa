"""PyCUDA runtime: loading compiled kernels into CuPy's context and launching them on CuPy's stream.

PyCUDA is imported lazily (it cannot even be built without a CUDA driver), so importing fastmm, planning and
compiling work on any machine.

Contexts and threads. fastmm shares CuPy's context: CuPy uses the CUDA runtime, whose context is the
device's primary context, and fastmm loads its modules into that same context (``pycuda.autoinit`` would
create a second context, in which CuPy's pointers are invalid). What PyCUDA does with contexts decides the
design (facts from PyCUDA's src/cpp/cuda.hpp):

* PyCUDA keeps its own stack of contexts per thread; when a thread ends with anything on it (or the
  process exits with anything on the main thread's), PyCUDA prints "The context stack was not empty upon
  module cleanup" and calls abort(). So fastmm never leaves a context pushed: it pushes only around a
  module load or a stream creation and pops in ``finally``.
* A PyCUDA module or stream remembers the context that was on top of that stack when it was made, and that
  context remembers the thread that retained it. Destroying the module or stream on any other thread with
  the context not pushed fails with "module in out-of-thread context could not be cleaned up" (and a
  leak); after a sticky fault its clean-up prints a warning. So fastmm never destroys them: the context,
  modules, functions and bridge streams live in a process-wide holder that is never freed (`_KEEP`), not
  even at interpreter exit. The driver frees them with the process.
* A launch (``cuLaunchKernel``) needs no PyCUDA stack at all: it runs in the driver's current context of the
  calling thread. CuPy's runtime makes the current device's primary context current on each thread that
  uses it, so a launch only checks that the current context is the right one (one driver call) and makes it
  so when it is not: a thread that has not touched CUDA yet gets the primary context of its current device,
  as CuPy's first call would give it; any other mismatch is switched for the launch and switched back.

Streams: CuPy's default stream is the legacy null stream, which PyCUDA's ``stream=None`` also means, so the
common case costs nothing. PyCUDA cannot launch on a stream handle it did not create, so when CuPy's current
stream is another one, fastmm launches on a bridge stream of its own, ordered after CuPy's stream by an event
and before it by a second event: results stay correct and the host never waits. Each thread borrows one
bridge per device while it lives and gives it back to a pool when it ends, so threads on different streams
do not serialise each other, and thousands of short-lived threads reuse a few streams.

Faults: every driver error becomes a fastmm error (fastmm/_errors.py) whose message says what to do. A
sticky fault (an illegal address, say) breaks the device's context for the whole process; fastmm says so
(`DeviceFaultError`). Any other failure leaves the device usable and the next product works.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from contextlib import contextmanager
from typing import Any

from . import _errors
from ._plan import Device, validated
from .kernels import build
from .kernels.configs import MAX_GRID_Y, MAX_GRID_Z, Variant, _Config

__all__ = ["device", "Launch", "loaded_function", "as_fastmm_error"]

# Everything PyCUDA would clean up in a context-dependent way, kept for the life of the process. The extra
# reference taken here is never dropped, so neither thread exit nor interpreter shutdown destroys them.
_KEEP: list = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_KEEP))

_lock = threading.RLock()       # driver initialisation, per-device set-up, module loads, bridge creation
_tls = threading.local()        # per thread: {device id: borrowed bridge}
_drv = None
_primary: dict[int, Any] = {}   # device id -> PyCUDA Context of the device's primary context
_functions: dict[tuple[int, str], Any] = {}
_devices: dict[int, Device] = {}
_bridge_pools: dict[int, list] = {}

# CUDA errors after which the context is unusable for the rest of the process (the driver's "sticky" errors):
# 700 illegal address, 702 launch timeout, 710 device-side assert, 714 hardware stack error, 715 illegal
# instruction, 716 misaligned address, 717 invalid address space, 718 invalid program counter, 719 launch
# failure.
_STICKY = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})


def _driver():
    """PyCUDA's driver module, initialised once per process."""
    global _drv
    if _drv is not None:
        return _drv
    with _lock:
        if _drv is None:
            try:
                import pycuda.driver as drv
            except ImportError as e:  # pragma: no cover - depends on the machine
                raise _errors.CUDAUnavailableError(
                    "fastmm launches its kernels through PyCUDA, which is not installed (or failed to load: "
                    f"{e}); on a machine with a CUDA toolkit: pip install 'fastmm[cuda13]'") from e
            try:
                drv.init()
            except drv.Error as e:
                raise _errors.CUDAUnavailableError(
                    f"fastmm could not initialise the CUDA driver ({e}); check that an NVIDIA GPU and its driver "
                    "are installed (nvidia-smi lists them)") from None
            _drv = drv
    return _drv


def _context(device_id: int):
    """PyCUDA's handle on the primary context of `device_id` (retained once per process, never released)."""
    ctx = _primary.get(device_id)
    if ctx is None:
        drv = _driver()
        with _lock:
            ctx = _primary.get(device_id)
            if ctx is None:
                try:
                    ctx = drv.Device(device_id).retain_primary_context()
                except drv.Error as e:
                    raise _errors.CUDAError(
                        f"fastmm could not open CUDA device {device_id} ({e}); this process sees "
                        f"{drv.Device.count()} device(s): use one of those (cupy.cuda.Device(i).use())") from None
                _KEEP.append(ctx)
                _primary[device_id] = ctx
    return ctx


@contextmanager
def _pushed(device_id: int):
    """The primary context of `device_id` on PyCUDA's stack of this thread for the block, and off it after."""
    drv = _driver()
    _context(device_id).push()
    try:
        yield drv
    finally:
        drv.Context.pop()


def device(device_id: int) -> Device:
    """The plan's view of a GPU, queried once per process."""
    dev = _devices.get(device_id)
    if dev is None:
        drv = _driver()
        _context(device_id)  # an invalid device id fails here, with the error that says so
        d = drv.Device(device_id)
        a = drv.device_attribute
        dev = _devices[device_id] = Device(
            name=d.name(),
            sm_count=d.get_attribute(a.MULTIPROCESSOR_COUNT),
            compute_capability=d.compute_capability(),
            max_threads_per_block=d.get_attribute(a.MAX_THREADS_PER_BLOCK),
            max_smem_per_block=d.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
            max_smem_optin=d.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            max_regs_per_block=d.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
            driver_version=drv.get_driver_version(),
        )
    return dev


# --------------------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------------------

def _sticky_status(device_id: int) -> int | None:
    """The sticky error that has broken the current context, or None when it is healthy.

    Any call into a broken context returns its sticky error at once; a stream query does not wait for work.
    Called with the primary context of `device_id` current.
    """
    import cupy

    try:
        status = cupy.cuda.runtime.streamQuery(0)
    except cupy.cuda.runtime.CUDARuntimeError as e:
        status = e.status
    return status if status in _STICKY else None


def as_fastmm_error(error: Exception, device_id: int, doing: str) -> Exception:
    """The fastmm exception for a CUDA error met outside a launch (CuPy's allocator, enabling peer access).

    Called with the primary context of `device_id` current, while `doing` (a phrase) failed with `error`.
    """
    return _fatal(error, device_id, doing) or _errors.CUDAError(
        f"{doing} on CUDA device {device_id} failed ({error}); the device is still usable")


def _fatal(error: Exception, device_id: int, doing: str) -> Exception | None:
    """The fastmm exception for a CUDA error that retrying cannot fix (no memory, a broken context), or None.

    Called with the primary context of `device_id` current, while `doing` (a phrase) failed with `error`.
    """
    if (_drv is not None and isinstance(error, _drv.MemoryError)) or "out of memory" in str(error):
        return _errors.OutOfMemoryError(
            f"out of GPU memory on device {device_id} {doing} ({error}): free GPU memory (drop arrays you no "
            "longer need, then cupy.get_default_memory_pool().free_all_blocks()) and try again")
    status = _sticky_status(device_id)
    if status is None:
        return None
    import cupy

    return _errors.DeviceFaultError(
        f"CUDA device {device_id} is unusable: an earlier fault ({cupy.cuda.runtime.CUDARuntimeError(status)}) "
        f"broke its context, which CUDA cannot recover inside a process, so {doing} failed ({error}) and every "
        "later GPU call on it will too. Restart the Python process; to find the faulting kernel, run the program "
        "under compute-sanitizer (if only fastmm's products ran, report it with fastmm.explain(a, b) for their "
        "shapes)")


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------

class _NotLoaded(Exception):
    """The driver refused a cubin (not for lack of memory, not a broken context): `args[0]` is its error."""


def _load(config: _Config, dev: Device, device_id: int, compiled: build.Compiled):
    """Load one cubin into the device's primary context; the kernel function, set up for its first launch."""
    name = compiled.name
    with _pushed(device_id) as drv:
        try:
            module = drv.module_from_buffer(compiled.cubin)
            _KEEP.append(module)
            fn = module.get_function(config.function)
            _KEEP.append(fn)
            regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
            if config.dynamic_smem and config.smem_bytes > dev.max_smem_per_block:
                # Beyond the default per-block limit a kernel must opt in to its dynamic shared memory, once per
                # loaded function.
                fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, config.smem_bytes)
        except drv.Error as e:
            raise (_fatal(e, device_id, f"loading fastmm's kernel {name}") or _NotLoaded(e)) from None
    # The registers the loaded kernel really uses, checked against the device before the first launch.
    validated(config, dev, regs_per_thread=regs)
    return fn


def loaded_function(config: _Config, variant: Variant, device_id: int):
    """Compile (or take from the disk cache), load and prepare one kernel binary; once per process and device.

    A cached cubin that the driver will not load (copied from another machine, made for another driver) is
    compiled again and replaces the cached one; a kernel that will not load even freshly compiled is a
    `KernelLoadError` naming the toolkit and the driver.
    """
    key = (device_id, config.binary_name(variant))
    fn = _functions.get(key)
    if fn is not None:
        return fn
    dev = device(device_id)
    with _lock:
        fn = _functions.get(key)
        if fn is not None:
            return fn
        compiled = build.compile_cubin(config, variant, dev.arch)
        try:
            fn = _load(config, dev, device_id, compiled)
        except _NotLoaded as refused:
            if not compiled.cached:
                raise _load_error(refused.args[0], dev, compiled, device_id) from None
            compiled = build.compile_cubin(config, variant, dev.arch, refresh=True)
            try:
                fn = _load(config, dev, device_id, compiled)
            except _NotLoaded as again:
                raise _load_error(again.args[0], dev, compiled, device_id) from None
        _functions[key] = fn
    return fn


def _load_error(cause: Exception, dev: Device, compiled: build.Compiled, device_id: int) -> Exception:
    drv_version = f"{dev.driver_version // 1000}.{dev.driver_version % 1000 // 10}"
    try:
        nvcc = build.find_nvcc()
    except _errors.NvccNotFoundError:
        nvcc = "nvcc"
    return _errors.KernelLoadError(
        f"the CUDA driver would not load fastmm's kernel {compiled.name} (compiled for {compiled.arch}) onto device "
        f"{device_id}, {dev.name}, even freshly compiled ({cause}). Check that nvcc ({nvcc}) comes "
        f"from a CUDA toolkit that this driver (CUDA {drv_version}) supports: update the driver, or point "
        "CUDA_HOME at an older toolkit")


# --------------------------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------------------------

class _Bridge:
    """A PyCUDA stream of fastmm's own (non-blocking), CuPy's view of it, and two reusable events."""

    __slots__ = ("stream", "view", "ready", "done")
    created = 0  # bridges made in this process: at most the number of threads that used one at the same time

    def __init__(self, device_id: int):
        import cupy

        _Bridge.created += 1
        with _pushed(device_id) as drv:
            self.stream = drv.Stream(flags=1)  # CU_STREAM_NON_BLOCKING: no implicit sync with the null stream
        _KEEP.append(self.stream)
        with cupy.cuda.Device(device_id):
            self.view = _cupy_view_of(cupy, self.stream.handle, device_id)
            # Re-recording an event is safe once a wait on it is enqueued: the wait captures its state then.
            self.ready = cupy.cuda.Event(block=False, disable_timing=True)
            self.done = cupy.cuda.Event(block=False, disable_timing=True)


class _Borrowed:
    """A thread's loan of a bridge; when the thread ends, its locals die and the bridge goes back to the pool."""

    __slots__ = ("bridge", "pool")

    def __init__(self, bridge: _Bridge, pool: list):
        self.bridge, self.pool = bridge, pool

    def __del__(self):
        self.pool.append(self.bridge)  # list.append is atomic; no module globals needed at shutdown


def _bridge(device_id: int) -> _Bridge:
    borrowed = getattr(_tls, "bridges", None)
    if borrowed is None:
        borrowed = _tls.bridges = {}
    loan = borrowed.get(device_id)
    if loan is None:
        with _lock:
            pool = _bridge_pools.get(device_id)
            if pool is None:
                pool = _bridge_pools[device_id] = []
                _KEEP.append(pool)
            bridge = pool.pop() if pool else _Bridge(device_id)
        loan = borrowed[device_id] = _Borrowed(bridge, pool)
    return loan.bridge


class _StreamHandle:
    """A raw stream handle in the CUDA stream protocol, for CuPy's Stream.from_external."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _cupy_view_of(cupy, handle: int, device_id: int):
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle, device_id)  # CuPy < 14


# --------------------------------------------------------------------------------------------------------
# Launches
# --------------------------------------------------------------------------------------------------------

# Kernel parameters, in the order of FASTMM_GEMM_PARAMS (fastmm/kernels/common.cuh).
_ARG_FORMAT = "iiiPqqPqqPqqii" + "q" * 6
_ARGS = struct.Struct(_ARG_FORMAT)  # native alignment: the same layout as the kernel's C parameter list


def _pointer_split(fmt: str) -> struct.Struct:
    """A struct of `fmt`'s bytes as the runs between its pointers ('P') and the pointers: a launch packs its three
    pointers between runs packed once, three values instead of twenty (a third of the cost of packing all)."""
    ends = [struct.calcsize(fmt[:i + 1]) for i, ch in enumerate(fmt) if ch == "P"]
    parts, start, pointer = [], 0, struct.calcsize("P")
    for end in ends:
        parts.append(f"{end - pointer - start}sP")
        start = end
    return struct.Struct("".join(parts) + f"{struct.calcsize(fmt) - start}s")


_ARGS_SPLIT = _pointer_split(_ARG_FORMAT)
_pack = _ARGS_SPLIT.pack

# Bound on the first Launch (CuPy is imported only then): the per-call driver and CuPy entry points.
_ctx_current = _ctx_set = _current_stream = _get_device = None
_FAULTS: tuple = ()


def _bind() -> None:
    global _ctx_current, _ctx_set, _current_stream, _get_device, _FAULTS
    import cupy

    drv = _driver()
    _ctx_current, _ctx_set = cupy.cuda.driver.ctxGetCurrent, cupy.cuda.driver.ctxSetCurrent
    _current_stream, _get_device = cupy.cuda.get_current_stream, cupy.cuda.runtime.getDevice
    _FAULTS = (drv.Error, cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)


class Launch:
    """One product, ready to run on any operands with the same shapes, strides and alignment.

    Everything that depends only on those (the compiled function, grids, strides, launch splits for the
    hardware's grid limits) is computed once; a call packs three pointers and launches. The dispatcher
    keeps these per call signature, which is what keeps a small product's host cost near CuPy's.

    A Launch may be called from any thread: it runs in the primary context of `device_id` whatever the
    calling thread's current context is, on that thread's current CuPy stream of the device.
    """

    __slots__ = ("name", "device_id", "ctx", "fn", "block", "shared", "chunks")

    def __init__(self, config: _Config, variant: Variant, device_id: int, m: int, n: int, k: int,
                 a_sm: int, a_sk: int, b_sk: int, b_sn: int, c_sm: int, c_sn: int,
                 batch: int, batch_inner: int, batch_strides: tuple[int, int, int, int, int, int]):
        if _ctx_current is None:
            _bind()
        self.name = config.name
        self.device_id = device_id
        self.ctx = _context(device_id).handle
        self.fn = loaded_function(config, variant, device_id)
        self.block = config.block
        self.shared = config.smem_bytes if config.dynamic_smem else 0
        # Launches needed to cover the grid: more than 65535 row tiles or batch items take several, with
        # A and C offset by whole row blocks and z0 counting batch items already done.
        rows = config.tile[0] * MAX_GRID_Y
        self.chunks = []
        for m0 in range(0, max(m, 1), rows):
            mm = min(m - m0, rows)
            for z0 in range(0, batch, MAX_GRID_Z):
                grid = config.grid(mm, n, min(batch - z0, MAX_GRID_Z), k)
                args = _ARGS.pack(mm, n, k, 0, a_sm, a_sk, 0, b_sk, b_sn, 0, c_sm, c_sn, z0, batch_inner,
                                  *batch_strides)
                before_a, _, between_ab, _, between_bc, _, after_c = _ARGS_SPLIT.unpack(args)
                self.chunks.append((grid, 4 * m0 * a_sm, 4 * m0 * c_sm, before_a, between_ab, between_bc, after_c))

    def __call__(self, a: int, b: int, c: int) -> None:
        """Run on CuPy's current stream; a, b, c are device addresses of the operands and the result."""
        if _ctx_current() != self.ctx:
            return self._elsewhere(a, b, c)
        user_stream = _current_stream()
        try:
            if user_stream.ptr == 0:
                self._launch(a, b, c, None)
            else:
                self._bridged(a, b, c, user_stream)
        except _FAULTS as e:
            raise self._fault(e) from None

    def _elsewhere(self, a: int, b: int, c: int) -> None:
        """A call on a thread whose current context is not the device's primary context."""
        current = _ctx_current()
        if current == 0 and _get_device() == self.device_id:
            # A thread that has not used CUDA yet: give it the primary context of its current device, as the
            # CUDA runtime's first call on it would. Nothing to undo, nothing PyCUDA tracks.
            _ctx_set(self.ctx)
            return self(a, b, c)
        _ctx_set(self.ctx)
        try:
            user_stream = _current_stream(self.device_id)
            if user_stream.ptr == 0:
                self._launch(a, b, c, None)
            else:
                self._bridged(a, b, c, user_stream)
        except _FAULTS as e:
            raise self._fault(e) from None
        finally:
            _ctx_set(current)

    def _bridged(self, a: int, b: int, c: int, user_stream) -> None:
        bridge = _bridge(self.device_id)
        bridge.ready.record(user_stream)
        bridge.view.wait_event(bridge.ready)
        self._launch(a, b, c, bridge.stream)
        bridge.done.record(bridge.view)
        user_stream.wait_event(bridge.done)

    def _launch(self, a, b, c, stream) -> None:
        # Function._launch_kernel is what PyCUDA's prepared_async_call ends in; calling it with a buffer
        # packed by a precompiled Struct skips that wrapper's per-call argument handling.
        for grid, da, dc, before_a, between_ab, between_bc, after_c in self.chunks:
            self.fn._launch_kernel(grid, self.block, _pack(before_a, a + da, between_ab, b, between_bc, c + dc,
                                                           after_c), self.shared, stream)

    def _fault(self, error: Exception) -> Exception:
        """The fastmm exception for a failed call (with the device's primary context still current)."""
        grid = self.chunks[0][0] if self.chunks else None
        doing = (f"launching fastmm's kernel {self.name} (grid {grid}, block {self.block}, {self.shared} bytes of "
                 "dynamic shared memory)")
        return _fatal(error, self.device_id, doing) or _errors.LaunchError(
            f"{doing} on CUDA device {self.device_id} failed ({error}); nothing ran and the device is still "
            "usable. Force another kernel for this product (kernel=... or fastmm.use_kernel) and report the shapes "
            "with fastmm.explain(a, b)")
