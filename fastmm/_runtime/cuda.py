"""The CUDA runtime of fastmm's kernels: loading compiled cubins into CuPy's context, launching them on CuPy's stream.

fastmm calls the CUDA driver API (cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel) through the bindings
that CuPy ships (``cupy.cuda.driver``), imported lazily, so importing fastmm, planning and compiling work on any
machine. Why CuPy's bindings and not PyCUDA's (launch cost, streams, contexts per thread): docs/runtime.md,
section 'Threads'.

Contexts and threads. fastmm shares CuPy's context: CuPy uses the CUDA runtime, whose context is the device's
primary context, and fastmm loads its modules into that same context. A launch runs in the driver's current
context of the calling thread, with no stack to balance. CuPy's runtime makes the current device's primary context
current on each thread that uses it, so a launch only checks that the current context is the right one (one
driver call) and makes it so when it is not: a thread that has not touched CUDA yet gets the primary context of
its current device, as CuPy's first call would give it; any other mismatch is switched for the launch and
switched back. Modules and functions are loaded once per process and device and never unloaded (the driver
frees them with the process): a function handle may then be used from any thread at any time.

Streams: a product is launched on CuPy's current stream of the device, whatever it is (the legacy default stream,
a non-blocking stream, the per-thread default stream), so it is ordered with the caller's other work on it.

Faults: every driver error becomes a fastmm error (fastmm/_errors.py) whose message says what to do. A
sticky fault (an illegal address, say) breaks the device's context for the whole process; fastmm says so
(`DeviceFaultError`). Any other failure leaves the device usable and the next product works.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import struct
import threading
from contextlib import contextmanager

from .. import _errors
from .._plan import Device, validated
from ..kernels import build
from ..kernels.configs import MAX_GRID_Y, KernelConfig, Variant
from . import compiling as _compiling

__all__ = ["device", "Launch", "loaded_function", "as_fastmm_error", "warm_up", "warm_up_in_background"]

_lock = threading.RLock()       # driver initialisation, per-device set-up, module loads
_tls = threading.local()        # per thread: the buffer a launch packs its arguments into
_cupy = None
_primary: dict[int, int] = {}   # device id -> handle of the device's primary context
_functions: dict[tuple[int, str], int] = {}
_devices: dict[int, Device] = {}

# CUDA errors after which the context is unusable for the rest of the process (the driver's "sticky" errors):
# 700 illegal address, 702 launch timeout, 710 device-side assert, 714 hardware stack error, 715 illegal
# instruction, 716 misaligned address, 717 invalid address space, 718 invalid program counter, 719 launch
# failure.
_STICKY = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation alike


def why_no_gpu() -> str | None:
    """Why no CUDA GPU can run fastmm's kernels here, in words that say what to install; None where one can."""
    import ctypes

    try:
        import cupy
    except ImportError as e:
        return (f"CuPy is not installed ({e}): pip install 'fastmm[cuda13]' (or [cuda12]), which also brings "
                "the CUDA runtime")
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
        return "the NVIDIA driver sees no GPU (nvidia-smi lists none)"
    except cupy.cuda.runtime.CUDARuntimeError as e:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return ("no NVIDIA driver is installed (libcuda.so.1 was not found): install the NVIDIA driver for your "
                    "GPU, then nvidia-smi lists it")
        if "InsufficientDriver" in str(e):
            return (f"the NVIDIA driver is older than the CUDA runtime CuPy was built for ({e}): update the driver, "
                    "or install the fastmm extra of an older CUDA (pip install 'fastmm[cuda12]')")
        return f"the CUDA driver did not start ({e}); nvidia-smi says whether the GPU and driver are well"


def _driver():
    """CuPy, once the CUDA driver is known to answer (once per process)."""
    global _cupy
    if _cupy is not None:
        return _cupy
    with _lock:
        if _cupy is None:
            try:
                import cupy
            except ImportError as e:  # pragma: no cover - depends on the machine
                raise _errors.CUDAUnavailableError(
                    "fastmm runs its kernels through CuPy's CUDA bindings, and CuPy is not installed (or failed to "
                    f"load: {e}): pip install 'fastmm[cuda13]' (or [cuda12])") from e
            try:
                cupy.cuda.runtime.getDeviceCount()
            except cupy.cuda.runtime.CUDARuntimeError:
                raise _errors.CUDAUnavailableError(f"fastmm needs a CUDA GPU: {why_no_gpu()}") from None
            _cupy = cupy
    return _cupy


def warm_up(device_id: int) -> None:
    """A process's first GPU work on `device_id`, done ahead of its first product: the primary context (about 0.1 s
    on an H100), the launch bindings and CuPy's memory pool there, and the common binaries the disk cache lacks
    queued for compiling (`compiling.compile_ahead`). A failure is left for that product to meet: it reports it the
    way every product does (the NumPy hook computes on NumPy, with a warning)."""
    try:
        _context(device_id)
        if _ctx_current is None:
            _bind()
        cupy = _driver()
        with cupy.cuda.Device(device_id):
            cupy.empty(1, cupy.uint8)
        _compiling.compile_ahead(device(device_id))
    except Exception as e:  # (the product that needs the GPU meets the same error and handles it)
        logging.getLogger("fastmm").debug("warm-up of CUDA device %d failed: %s", device_id, e)


_warmed: set[int] = set()  # devices whose warm-up has started in this process


def warm_up_in_background() -> None:
    """`warm_up` of the calling thread's current device on a thread of its own, once per device and process."""
    try:
        device_id = _driver().cuda.runtime.getDevice()
    except Exception:  # (no usable runtime: the products meet it)
        return
    with _lock:
        if device_id in _warmed:
            return
        _warmed.add(device_id)
    thread = threading.Thread(target=warm_up, args=(device_id,), name="fastmm-warm-up", daemon=True)
    thread.start()
    # A program that ends at once must not finalise Python while the thread is inside the driver: it is waited for
    # at exit (a daemon still, so that a driver that never answers cannot hold the exit past the wait).
    atexit.register(thread.join, 30)


def _context(device_id: int) -> int:
    """The handle of the primary context of `device_id`, initialised (as CuPy's first use of the device would)."""
    ctx = _primary.get(device_id)
    if ctx is None:
        cupy = _driver()
        runtime, driver = cupy.cuda.runtime, cupy.cuda.driver
        with _lock:
            ctx = _primary.get(device_id)
            if ctx is None:
                before_device, before_ctx = runtime.getDevice(), driver.ctxGetCurrent()
                try:
                    runtime.setDevice(device_id)
                    runtime.free(0)  # the runtime's idiom for "initialise this device's primary context now"
                    ctx = driver.ctxGetCurrent()
                except runtime.CUDARuntimeError as e:
                    raise _errors.CUDAError(
                        f"fastmm could not open CUDA device {device_id} ({e}); this process sees "
                        f"{runtime.getDeviceCount()} device(s): use one of those (cupy.cuda.Device(i).use())") from None
                finally:
                    runtime.setDevice(before_device)
                    if driver.ctxGetCurrent() != before_ctx:
                        driver.ctxSetCurrent(before_ctx)
                _primary[device_id] = ctx
    return ctx


@contextmanager
def _current(device_id: int):
    """The primary context of `device_id` current on this thread for the block, and the thread's own after."""
    driver = _driver().cuda.driver
    ctx, before = _context(device_id), driver.ctxGetCurrent()
    if before != ctx:
        driver.ctxSetCurrent(ctx)
    try:
        yield driver
    finally:
        if before != ctx:
            driver.ctxSetCurrent(before)


def device(device_id: int) -> Device:
    """The plan's view of a GPU, queried once per process."""
    dev = _devices.get(device_id)
    if dev is None:
        runtime = _driver().cuda.runtime
        _context(device_id)  # an invalid device id fails here, with the error that says so
        p = runtime.getDeviceProperties(device_id)

        def attribute(name: str) -> int:
            return runtime.deviceGetAttribute(getattr(runtime, "cudaDevAttr" + name), device_id)

        dev = _devices[device_id] = Device(
            name=p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"]),
            sm_count=attribute("MultiProcessorCount"),
            compute_capability=(p["major"], p["minor"]),
            max_threads_per_block=attribute("MaxThreadsPerBlock"),
            max_smem_per_block=attribute("MaxSharedMemoryPerBlock"),
            max_smem_optin=attribute("MaxSharedMemoryPerBlockOptin"),
            max_regs_per_block=attribute("MaxRegistersPerBlock"),
            driver_version=runtime.driverGetVersion(),
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
    if getattr(error, "status", None) == _OUT_OF_MEMORY or "out of memory" in str(error):
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

_PORTABLE_CLUSTER = 8
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CUfunction_attribute (cuda.h); CuPy's driver module does not name it


class _NotLoaded(Exception):
    """The driver refused a cubin (not for lack of memory, not a broken context): `args[0]` is its error."""


def _load(config: KernelConfig, dev: Device, device_id: int, compiled: build.Compiled) -> int:
    """Load one cubin into the device's primary context; the handle of its kernel function, set up for launches."""
    name = compiled.name
    errors = _faults()
    with _current(device_id) as driver:
        try:
            # Never unloaded (the driver frees it with the process): its function may be launched at any time,
            # from any thread.
            module = driver.moduleLoadData(compiled.cubin)
            fn = driver.moduleGetFunction(module, config.function)
            regs = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, fn)
            if config.dynamic_smem and config.smem_bytes > dev.max_smem_per_block:
                # Beyond the default per-block limit a kernel must opt in to its dynamic shared memory, once per
                # loaded function.
                driver.funcSetAttribute(fn, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, config.smem_bytes)
            if getattr(config, "cluster", 1) > _PORTABLE_CLUSTER:
                # Clusters past 8 blocks (Hopper: up to 16) launch only where the function allows non-portable sizes.
                driver.funcSetAttribute(fn, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        except errors as e:
            raise (_fatal(e, device_id, f"loading fastmm's kernel {name}") or _NotLoaded(e)) from None
    # The registers the loaded kernel really uses, checked against the device before the first launch.
    validated(config, dev, regs_per_thread=regs)
    return fn


def loaded_function(config: KernelConfig, variant: Variant, device_id: int):
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
    # A configuration this GPU cannot run (shared memory, architecture) is the plan's clear ValueError, before
    # nvcc or the driver could fail on it with a message about the toolkit.
    validated(config, dev)
    # Compiled (or read from the disk cache) outside the lock: another thread's load of another kernel never waits
    # for this nvcc. KernelCompiling, for a caller that asked not to wait.
    compiled = _compiling.binary(config, variant, dev.arch)
    with _lock:
        fn = _functions.get(key)
        if fn is not None:
            return fn
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
# Launches
# --------------------------------------------------------------------------------------------------------

# Kernel parameters, in the order of FASTMM_GEMM_PARAMS (fastmm/kernels/common.cuh).
_ARG_NAMES = ("M", "N", "K", "A", "a_sm", "a_sk", "B", "b_sk", "b_sn", "C", "c_sm", "c_sn", "z0", "batch_inner",
              "k_total", "a_sb0", "a_sb1", "b_sb0", "b_sb1", "c_sb0", "c_sb1")
_ARG_FORMAT = "iiiPqqPqqPqqiii" + "q" * 6
_ARGS = struct.Struct(_ARG_FORMAT)  # native alignment: the same layout as the kernel's C parameter list


def arg_offset(name: str) -> int:
    """The byte offset of kernel parameter `name` in the packed buffer."""
    i = _ARG_NAMES.index(name)
    return struct.calcsize(_ARG_FORMAT[:i + 1]) - struct.calcsize(_ARG_FORMAT[i])


def _pointer_split(fmt: str) -> struct.Struct:
    """A struct of `fmt`'s bytes as the runs between its pointers ('P') and the pointers: a launch packs its three
    pointers between runs packed once, three values instead of twenty (docs/dispatch.md, section 'Per-call cost')."""
    ends = [struct.calcsize(fmt[:i + 1]) for i, ch in enumerate(fmt) if ch == "P"]
    parts, start, pointer = [], 0, struct.calcsize("P")
    for end in ends:
        parts.append(f"{end - pointer - start}sP")
        start = end
    return struct.Struct("".join(parts) + f"{struct.calcsize(fmt) - start}s")


_ARGS_SPLIT = _pointer_split(_ARG_FORMAT)
_pack = _ARGS_SPLIT.pack
_pack_into = _ARGS_SPLIT.pack_into
# cuLaunchKernel's `extra` markers: the parameters as one packed buffer of a given size.
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0


class _ArgBuffer:
    """A thread's buffer for a launch's packed parameters, and the `extra` array that hands it to cuLaunchKernel.

    Per thread because the driver call runs without the GIL: another thread must not repack the buffer while the
    driver copies it (which it has done when cuLaunchKernel returns, so one buffer serves every launch of a thread)."""

    __slots__ = ("data", "size", "extra", "address")

    def __init__(self):
        self.data = ctypes.create_string_buffer(_ARGS_SPLIT.size)
        self.size = ctypes.c_size_t(_ARGS_SPLIT.size)
        self.extra = (ctypes.c_void_p * 5)(_BUFFER_POINTER, ctypes.addressof(self.data), _BUFFER_SIZE,
                                           ctypes.addressof(self.size), _END)
        self.address = ctypes.addressof(self.extra)


def _arg_buffer() -> _ArgBuffer:
    try:
        return _tls.args
    except AttributeError:
        _tls.args = _ArgBuffer()
        return _tls.args


def _faults() -> tuple:
    cupy = _driver()
    return (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)


# Bound on the first Launch (CuPy is imported only then): the per-call driver and CuPy entry points.
_ctx_current = _ctx_set = _current_stream = _get_device = _launch_kernel = None
_FAULTS: tuple = ()


def _bind() -> None:
    global _ctx_current, _ctx_set, _current_stream, _get_device, _launch_kernel, _FAULTS
    cupy = _driver()
    _ctx_current, _ctx_set = cupy.cuda.driver.ctxGetCurrent, cupy.cuda.driver.ctxSetCurrent
    _current_stream, _get_device = cupy.cuda.get_current_stream, cupy.cuda.runtime.getDevice
    _launch_kernel = cupy.cuda.driver.launchKernel
    _FAULTS = _faults()


class Launch:
    """One product, ready to run on any operands with the same shapes, strides and alignment.

    Everything that depends only on those (the compiled function, grids, strides, launch splits for the
    hardware's grid limits) is computed once; a call packs three pointers and launches. The dispatcher
    keeps these per call signature, which is what keeps a small product's host cost below CuPy's
    (docs/dispatch.md, section 'Per-call cost').

    A Launch may be called from any thread: it runs in the primary context of `device_id` whatever the
    calling thread's current context is, on that thread's current CuPy stream of the device.
    """

    __slots__ = ("name", "device_id", "ctx", "fn", "block", "shared", "chunks")

    def __init__(self, config: KernelConfig, variant: Variant, device_id: int, m: int, n: int, k: int,
                 a_sm: int, a_sk: int, b_sk: int, b_sn: int, c_sm: int, c_sn: int,
                 batch: int, batch_inner: int, batch_strides: tuple[int, int, int, int, int, int], k_total: int = 0):
        if _ctx_current is None:
            _bind()
        self.name = config.name
        self.device_id = device_id
        self.ctx = _context(device_id)
        self.fn = loaded_function(config, variant, device_id)
        self.block = config.block
        self.shared = config.shared_for(k) if config.dynamic_smem else 0
        # Launches needed to cover the grid: more than 65535 row tiles or batch items take several, with
        # A and C offset by whole row blocks and z0 counting batch items already done.
        rows = config.tile[0] * MAX_GRID_Y
        self.chunks = []
        for m0 in range(0, max(m, 1), rows):
            mm = min(m - m0, rows)
            for z0 in range(0, batch, config.batch_per_launch):
                grid = config.grid(mm, n, min(batch - z0, config.batch_per_launch), k)
                args = _ARGS.pack(mm, n, k, 0, a_sm, a_sk, 0, b_sk, b_sn, 0, c_sm, c_sn, z0, batch_inner, k_total,
                                  *batch_strides)
                before_a, _, between_ab, _, between_bc, _, after_c = _ARGS_SPLIT.unpack(args)
                self.chunks.append((*grid, 4 * m0 * a_sm, 4 * m0 * c_sm, before_a, between_ab, between_bc, after_c))

    def __call__(self, a: int, b: int, c: int) -> None:
        """Run on CuPy's current stream; a, b, c are device addresses of the operands and the result."""
        if _ctx_current() != self.ctx:
            return self._elsewhere(a, b, c)
        try:
            self._launch(a, b, c, _current_stream().ptr)
        except _FAULTS as e:
            raise self._fault(e) from None

    def _elsewhere(self, a: int, b: int, c: int) -> None:
        """A call on a thread whose current context is not the device's primary context."""
        current = _ctx_current()
        if current == 0 and _get_device() == self.device_id:
            # A thread that has not used CUDA yet: give it the primary context of its current device, as the
            # CUDA runtime's first call on it would. Nothing to undo.
            _ctx_set(self.ctx)
            return self(a, b, c)
        _ctx_set(self.ctx)
        try:
            self._launch(a, b, c, _current_stream(self.device_id).ptr)
        except _FAULTS as e:
            raise self._fault(e) from None
        finally:
            _ctx_set(current)

    def _launch(self, a: int, b: int, c: int, stream: int) -> None:
        args = _arg_buffer()
        bx, by, bz = self.block
        for gx, gy, gz, da, dc, before_a, between_ab, between_bc, after_c in self.chunks:
            _pack_into(args.data, 0, before_a, a + da, between_ab, b, between_bc, c + dc, after_c)
            _launch_kernel(self.fn, gx, gy, gz, bx, by, bz, self.shared, stream, 0, args.address)

    def _fault(self, error: Exception) -> Exception:
        """The fastmm exception for a failed call (with the device's primary context still current)."""
        grid = tuple(self.chunks[0][:3]) if self.chunks else None
        doing = (f"launching fastmm's kernel {self.name} (grid {grid}, block {self.block}, {self.shared} bytes of "
                 "dynamic shared memory)")
        return _fatal(error, self.device_id, doing) or _errors.LaunchError(
            f"{doing} on CUDA device {self.device_id} failed ({error}); nothing ran and the device is still "
            "usable. Force another kernel for this product (kernel=... or fastmm.use_kernel) and report the shapes "
            "with fastmm.explain(a, b)")
