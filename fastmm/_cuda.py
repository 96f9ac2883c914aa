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

import threading
from typing import Any

from . import _errors
from ._plan import Device
from .kernels import build
from .kernels.configs import MAX_GRID_Y, MAX_GRID_Z, Variant, _Config

__all__ = ["device", "launch", "loaded_function"]

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
    return ctx


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
            max_regs_per_block=d.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
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
        fn.prepare(_ARG_FORMAT)
        fn._fastmm_module = module  # the function must not outlive its module
        # The registers the loaded kernel really uses, checked against the device before the first launch.
        from .kernels.configs import validate

        validate(config, max_threads=dev.max_threads_per_block, max_smem=dev.max_smem_per_block,
                 max_regs_per_block=dev.max_regs_per_block,
                 regs_per_thread=fn.get_attribute(drv.function_attribute.NUM_REGS))
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
        pair = streams[device_id] = (s, cupy.cuda.ExternalStream(s.handle, device_id))
    return pair


def launch(config: _Config, variant: Variant, device_id: int, m: int, n: int, k: int,
           a: int, a_sm: int, a_sk: int, b: int, b_sk: int, b_sn: int, c: int, c_sm: int, c_sn: int,
           batch: int, batch_inner: int, batch_strides: tuple[int, int, int, int, int, int]) -> None:
    """Launch one product on CuPy's current stream. Pointers are device addresses of float32 data."""
    import cupy

    _context(device_id)
    fn = loaded_function(config, variant, device_id)
    user_stream = cupy.cuda.get_current_stream()
    if user_stream.ptr == 0:
        stream = None
    else:
        stream, ext = _bridge_stream(device_id)
        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(user_stream)
        ext.wait_event(ready)

    bm = config.tile[0]
    rows_per_launch = bm * MAX_GRID_Y
    block = config.block
    for m0 in range(0, max(m, 1), rows_per_launch):
        mm = min(m - m0, rows_per_launch)
        for z0 in range(0, batch, MAX_GRID_Z):
            grid = config.grid(mm, n, min(batch - z0, MAX_GRID_Z))
            fn.prepared_async_call(grid, block, stream, mm, n, k,
                                   a + 4 * m0 * a_sm, a_sm, a_sk, b, b_sk, b_sn, c + 4 * m0 * c_sm, c_sm, c_sn,
                                   z0, batch_inner, *batch_strides)

    if stream is not None:
        done = cupy.cuda.Event(block=False, disable_timing=True)
        done.record(ext)
        user_stream.wait_event(done)
