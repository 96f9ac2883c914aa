"""Launches that hand a kernel tensor maps of its operands (Hopper's TMA engine copies 2-D boxes of them).

A tensor map is 128 opaque bytes that the driver encodes on the host (`cuTensorMapEncodeTiled`) from the operand's
address, shape and row stride; the kernel takes it as a ``__grid_constant__`` parameter after FASTMM_GEMM_PARAMS
(A's map, then B's). Its bytes depend on the operand's address, so a `MappedLaunch` encodes them into the parameter
buffer on every call (a host call of about a microsecond each), where a `Launch` packs three pointers.

One TF32 pass (6_wgmma.cu with A_TMA, B_TMA) uses the map's TFLOAT32 type: the engine rounds each float32 to TF32 as
it copies, which is what the split pass did (docs/kernels/wgmma.md).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

from .. import _errors
from . import cuda as _cuda

__all__ = ["MappedLaunch", "GuardLaunch", "mappable", "operand_map", "encode"]

# cuda.h's enums (CUDA 12 and 13).
_TFLOAT32 = 11  # CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: float32 in memory, rounded to TF32 by the copy
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_256B = 3
_OOB_ZEROS = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: what lies outside the tensor is copied as zeros

_MAP_BYTES = 128
# Parameters a call sets besides the three pointers: the guard's flags (pass_nonfinite_fix.cu), at c_sb1 in the
# product's parameters and at a_sb0 in the guard's.
_ADDRESS = struct.Struct("<q")
_C_SB1, _A_SB0 = _cuda.arg_offset("c_sb1"), _cuda.arg_offset("a_sb0")
# The maps' place in the parameter buffer: after FASTMM_GEMM_PARAMS, at the 64-byte alignment the kernel declares,
# one after the other.
MAP_OFFSET = -(-_cuda._ARGS_SPLIT.size // 64) * 64
_PARAM_BYTES = MAP_OFFSET + 2 * _MAP_BYTES
# Each parameter's offset in the buffer: FASTMM_GEMM_PARAMS (natively aligned, as the kernel's C list), then the maps.
# A mapped kernel is launched with a pointer to each (cuLaunchKernel's kernelParams): handed the same bytes as one
# buffer (its `extra`), the driver refused it with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on an H100.
PARAM_OFFSETS = tuple(struct.calcsize(_cuda._ARG_FORMAT[:i + 1]) - struct.calcsize(_cuda._ARG_FORMAT[i])
                      for i in range(len(_cuda._ARG_FORMAT))) + (MAP_OFFSET, MAP_OFFSET + _MAP_BYTES)

_encode_fn = None
_lock = threading.Lock()
_tls = threading.local()


def _encoder():
    """cuTensorMapEncodeTiled from the driver library (the one CuPy loaded)."""
    global _encode_fn
    with _lock:
        if _encode_fn is None:
            try:
                lib = ctypes.WinDLL("nvcuda.dll") if os.name == "nt" else ctypes.CDLL("libcuda.so.1")
                fn = lib.cuTensorMapEncodeTiled
            except (OSError, AttributeError) as e:  # a driver before CUDA 12: the split path instead
                raise _errors.LaunchError(f"the CUDA driver has no cuTensorMapEncodeTiled ({e})") from None
            u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            fn.restype = ctypes.c_int
            _encode_fn = fn
    return _encode_fn


def mappable(address: int, rows: int, cols: int, row_bytes: int) -> bool:
    """Whether a row-major float32 operand (unit stride along its rows of `cols` values, `row_bytes` between rows)
    can be described by a tensor map: a 16-byte aligned start, a row stride that is a multiple of 16 bytes and
    holds a row, sizes within the map's limits."""
    return (address % 16 == 0 and row_bytes % 16 == 0 and row_bytes >= 4 * cols and row_bytes < 1 << 40
            and 0 < rows <= 1 << 32 and 0 < cols <= 1 << 32)


def operand_map(address: int, rows: int, cols: int, row_stride: int, col_stride: int, box: tuple[int, int]):
    """The map (box rows, box columns, rows, columns, bytes between rows) of an operand of `rows` x `cols` float32
    values (strides in elements) if a tensor map can read it row by row, K along its rows; else None."""
    if not (col_stride == 1 or cols == 1):
        return None
    row_bytes = 4 * row_stride if rows > 1 else -(-cols // 4) * 16  # (one row: any multiple of 16 that holds it)
    return (*box, rows, cols, row_bytes) if mappable(address, rows, cols, row_bytes) else None


def encode(into: int, address: int, rows: int, cols: int, row_bytes: int, box_rows: int, box_cols: int) -> None:
    """Write the TFLOAT32 tensor map of the (rows, cols) operand at `address` into the 64-byte aligned memory at
    `into`: boxes of box_rows x box_cols values, in the 128-byte swizzle, zeros past its edges."""
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    unit = (ctypes.c_uint32 * 2)(1, 1)
    status = _encoder()(into, _TFLOAT32, 2, address, dims, strides, box, unit, _INTERLEAVE_NONE, _SWIZZLE_128B,
                        _L2_256B, _OOB_ZEROS)
    if status != 0:
        raise _errors.LaunchError(
            f"the CUDA driver would not describe a {rows} x {cols} float32 operand at {address:#x} (rows "
            f"{row_bytes} bytes apart) as a tensor map (CUresult {status}); force another kernel for this product "
            "(kernel=... or fastmm.use_kernel) and report the shapes with fastmm.explain(a, b)")


class _MapBuffer:
    """A thread's parameter buffer for launches with `count` maps: FASTMM_GEMM_PARAMS, then the maps 64-byte aligned
    (the driver encodes into aligned memory, and the kernel reads them at those offsets of its parameters). With
    maps, `params` is the address of a pointer to each parameter (cuLaunchKernel's kernelParams) and `extra` is 0;
    without, `params` is 0 and `extra` the address of the packed buffer's description, as a `Launch` passes."""

    __slots__ = ("raw", "base", "size", "words", "params", "extra")

    def __init__(self, count: int):
        self.raw = ctypes.create_string_buffer(_PARAM_BYTES + 64)
        self.base = -(-ctypes.addressof(self.raw) // 64) * 64
        self.size = ctypes.c_size_t(MAP_OFFSET + count * _MAP_BYTES if count else _cuda._ARGS_SPLIT.size)
        if count:
            offsets = PARAM_OFFSETS[:len(_cuda._ARG_FORMAT) + count]
            self.words = (ctypes.c_void_p * len(offsets))(*(self.base + at for at in offsets))
            self.params, self.extra = ctypes.addressof(self.words), 0
        else:
            self.words = (ctypes.c_void_p * 5)(_cuda._BUFFER_POINTER, self.base, _cuda._BUFFER_SIZE,
                                               ctypes.addressof(self.size), _cuda._END)
            self.params, self.extra = 0, ctypes.addressof(self.words)


def _map_buffer(count: int) -> _MapBuffer:
    buffers = getattr(_tls, "buffers", None)
    if buffers is None:
        buffers = _tls.buffers = {}
    buffer = buffers.get(count)
    if buffer is None:
        buffer = buffers[count] = _MapBuffer(count)
    return buffer


class _Flagged(_cuda.Launch):
    """A `Launch` also called with the address of the guard's flags, which its `_launch` packs (this thread's call)."""

    __slots__ = ()

    def __call__(self, a: int, b: int, c: int, flags: int | None = None) -> None:  # noqa: D102
        if flags is not None:  # (None: Launch's own call again, on a thread given the context: the same flags)
            _tls.flags = flags  # (this thread's call: read by _launch below)
        super().__call__(a, b, c)


class MappedLaunch(_Flagged):
    """A `Launch` whose kernel also takes tensor maps, encoded per call from the operands' addresses: `maps` holds,
    for A's map and then B's (either may be None), (box rows, box columns, the operand's rows, its columns, bytes
    between its rows), A row-major with K along its rows, B as B^T row-major. Called with (A, B, C, flags): flags
    the address of an int per block tile that the kernel sets to the product's mark (a_sb1) where it stores a
    non-finite value. `a_along_m`: A's map is of its K x M view (rows along M, copied into registers: A_RS), whose
    columns a chunk of A's rows narrows."""

    __slots__ = ("maps", "rows", "a_along_m")

    def __init__(self, config, variant, device_id: int, *, maps, a_along_m: bool = False, **shape):
        super().__init__(config, variant, device_id, **shape)
        self.maps, self.a_along_m = tuple(maps), a_along_m
        m, step = shape["m"], config.tile[0] * _cuda.MAX_GRID_Y
        self.rows = [min(m - m0, step) for m0 in range(0, max(m, 1), step)
                     for _ in range(0, shape["batch"], config.batch_per_launch)]  # (Launch's chunks, in order)

    def _launch(self, a: int, b: int, c: int, stream: int) -> None:
        a_map, b_map = self.maps
        args = _map_buffer((a_map is not None) + (b_map is not None))
        bx, by, bz = self.block
        buffer = (ctypes.c_char * _PARAM_BYTES).from_address(args.base)
        for (gx, gy, gz, da, dc, before_a, between_ab, between_bc, after_c), rows in zip(self.chunks, self.rows):
            _cuda._pack_into(buffer, 0, before_a, a + da, between_ab, b, between_bc, c + dc, after_c)
            _ADDRESS.pack_into(buffer, _C_SB1, _tls.flags)
            at = args.base + MAP_OFFSET
            if a_map is not None:  # (a chunk of rows: A's map starts at its first row)
                box_rows, box_cols, map_rows, cols, row_bytes = a_map
                if self.a_along_m:  # (K x the chunk's rows)
                    cols = rows
                else:
                    map_rows = rows
                encode(at, a + da, map_rows, cols, row_bytes, box_rows, box_cols)
                at += _MAP_BYTES
            if b_map is not None:
                encode(at, b, *b_map[2:], *b_map[:2])
            _cuda._launch_kernel(self.fn, gx, gy, gz, bx, by, bz, self.shared, stream, args.params, args.extra)


class GuardLaunch(_Flagged):
    """The guard after a mapped product (pass_nonfinite_fix.cu): a `Launch` called with (A, B, C, flags), the flags'
    address packed where the kernel reads it (a_sb0)."""

    __slots__ = ()

    def _launch(self, a: int, b: int, c: int, stream: int) -> None:
        args = _map_buffer(0)
        bx, by, bz = self.block
        buffer = (ctypes.c_char * _PARAM_BYTES).from_address(args.base)
        for gx, gy, gz, da, dc, before_a, between_ab, between_bc, after_c in self.chunks:
            _cuda._pack_into(buffer, 0, before_a, a + da, between_ab, b, between_bc, c + dc, after_c)
            _ADDRESS.pack_into(buffer, _A_SB0, _tls.flags)
            _cuda._launch_kernel(self.fn, gx, gy, gz, bx, by, bz, self.shared, stream, args.params, args.extra)
