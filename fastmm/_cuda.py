"""PyCUDA runtime: CuPy's primary context, loading compiled kernels, launching them on CuPy's stream.

PyCUDA is imported lazily (it cannot even be built without a CUDA driver), so importing fastmm, planning and
compiling work on any machine.

Context: fastmm shares CuPy's context. CuPy uses the CUDA runtime, whose context is the device's primary
context; we retain that same context through the driver API and push it once per launching thread.
(``pycuda.autoinit`` would create a second context, in which CuPy's pointers are invalid.)

Streams: CuPy's default stream is the legacy null stream, which PyCUDA's ``stream=None`` also means, so the
common case costs nothing. PyCUDA cannot launch on a stream handle it did not create, so when CuPy's current
stream is another one, fastmm launches on a PyCUDA stream of its own that is ordered after CuPy's stream by
an event and before it by a second event: results stay correct and the host never waits.
"""

from __future__ import annotations

import atexit
import struct
import threading
from typing import Any

from . import _errors
from ._plan import Device, validated
from .kernels import build
from .kernels.configs import MAX_GRID_Y, MAX_GRID_Z, Variant, _Config

__all__ = ["device", "Launch", "loaded_function"]

_tls = threading.local()        # per thread: {device id: pushed context}, bridge streams
_lock = threading.Lock()
_functions: dict[tuple[int, str], Any] = {}
_devices: dict[int, Device] = {}


def _driver():
    try:
        import pycuda.driver as drv
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise _errors.CUDAUnavailableError(
            "fastmm launches its kernels through PyCUDA, which is not installed (or failed to load: "
            f"{e}); on a machine with a CUDA toolkit: pip install 'fastmm[cuda13]'") from e
    return drv


def _context(device_id: int):
    """Make CuPy's (primary) context of `device_id` current on this thread, once per thread and device."""
    pushed = getattr(_tls, "pushed", None)
    if pushed is None:
        pushed = _tls.pushed = {}
    ctx = pushed.get(device_id)
    current = getattr(_tls, "current", None)
    if ctx is not None and current == device_id:
        return ctx
    drv = _driver()
    with _lock:
        drv.init()
    if current is not None:
        drv.Context.pop()  # another device was current on this thread: swap, do not nest
    if ctx is None:
        ctx = pushed[device_id] = drv.Device(device_id).retain_primary_context()
    ctx.push()
    _tls.current = device_id
    if threading.current_thread() is threading.main_thread():
        # PyCUDA aborts the interpreter if a context is still on the main thread's stack when it shuts down.
        # Registered after PyCUDA's own exit hook, so it runs first.
        atexit.register(_pop_main_thread)
    return ctx


def _pop_main_thread() -> None:
    if getattr(_tls, "current", None) is not None:
        try:
            _driver().Context.pop()
        except Exception:  # pragma: no cover - CUDA already torn down
            pass
        _tls.current = None


def device(device_id: int) -> Device:
    """The plan's view of a GPU, queried once per process."""
    dev = _devices.get(device_id)
    if dev is None:
        _context(device_id)
        drv = _driver()
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


# Kernel parameters, in the order of FASTMM_GEMM_PARAMS (fastmm/kernels/common.cuh).
_ARG_FORMAT = "iiiPqqPqqPqqii" + "q" * 6


def loaded_function(config: _Config, variant: Variant, device_id: int):
    """Compile (or take from the disk cache), load and prepare one kernel binary; once per process."""
    key = (device_id, config.binary_name(variant))
    fn = _functions.get(key)
    if fn is not None:
        return fn
    dev = device(device_id)
    compiled = build.compile_cubin(config, variant, dev.arch)
    drv = _driver()
    with _lock:
        module = drv.module_from_buffer(compiled.cubin)
        fn = module.get_function(f"fastmm_{config.family}")
        fn._fastmm_module = module  # the function must not outlive its module
        # The registers the loaded kernel really uses, checked against the device before the first launch.
        validated(config, dev, regs_per_thread=fn.get_attribute(drv.function_attribute.NUM_REGS))
        if config.dynamic_smem and config.smem_bytes > dev.max_smem_per_block:
            # Beyond the default per-block limit a kernel must opt in to its dynamic shared memory, once per
            # loaded function.
            fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, config.smem_bytes)
        _functions[key] = fn
    return fn


def _bridge_stream(device_id: int):
    streams = getattr(_tls, "streams", None)
    if streams is None:
        streams = _tls.streams = {}
    pair = streams.get(device_id)
    if pair is None:
        import cupy

        s = _driver().Stream()
        pair = streams[device_id] = (s, _cupy_view_of(cupy, s.handle, device_id))
    return pair


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


_ARGS = struct.Struct(_ARG_FORMAT)  # native alignment: the same layout as the kernel's C parameter list


class Launch:
    """One product, ready to run on any operands with the same shapes, strides and alignment.

    Everything that depends only on those (the compiled function, grids, strides, launch splits for the
    hardware's grid limits) is computed once; a call packs three pointers and launches. The dispatcher
    keeps these per call signature, which is what keeps a small product's host cost near CuPy's.
    """

    __slots__ = ("name", "device_id", "fn", "block", "shared", "chunks", "_cupy")

    def __init__(self, config: _Config, variant: Variant, device_id: int, m: int, n: int, k: int,
                 a_sm: int, a_sk: int, b_sk: int, b_sn: int, c_sm: int, c_sn: int,
                 batch: int, batch_inner: int, batch_strides: tuple[int, int, int, int, int, int]):
        import cupy

        _context(device_id)
        self._cupy = cupy
        self.name = config.name
        self.device_id = device_id
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
                grid = config.grid(mm, n, min(batch - z0, MAX_GRID_Z))
                self.chunks.append((grid, 4 * m0 * a_sm, 4 * m0 * c_sm,
                                    (mm, n, k), (a_sm, a_sk), (b_sk, b_sn), (c_sm, c_sn, z0, batch_inner,
                                                                             *batch_strides)))

    def __call__(self, a: int, b: int, c: int) -> None:
        """Run on CuPy's current stream; a, b, c are device addresses of the operands and the result."""
        if getattr(_tls, "current", None) != self.device_id:
            _context(self.device_id)
        user_stream = self._cupy.cuda.get_current_stream()
        if user_stream.ptr == 0:
            self._launch(a, b, c, None)
            return
        stream, ext = _bridge_stream(self.device_id)
        ready = self._cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(user_stream)
        ext.wait_event(ready)
        self._launch(a, b, c, stream)
        done = self._cupy.cuda.Event(block=False, disable_timing=True)
        done.record(ext)
        user_stream.wait_event(done)

    def _launch(self, a, b, c, stream) -> None:
        # Function._launch_kernel is what PyCUDA's prepared_async_call ends in; calling it with a buffer
        # packed by a precompiled Struct skips that wrapper's per-call argument handling.
        for grid, da, dc, mnk, a_s, b_s, tail in self.chunks:
            self.fn._launch_kernel(grid, self.block, _ARGS.pack(*mnk, a + da, *a_s, b, *b_s, c + dc, *tail),
                                   self.shared, stream)
