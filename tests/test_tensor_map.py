"""The tensor-map launch's host side: where the map sits among the kernel's parameters, and which operands a map
can describe (the encoding itself needs the CUDA driver: tests/test_gpu_tf32.py)."""

from __future__ import annotations

import ctypes
import re
import struct
import subprocess

import pytest

from fastmm._runtime import cuda, tensor_map
from fastmm.kernels import build
from fastmm.kernels.configs import TF32_WG_MAPS, Variant

_SIZES = {"u32": 4, "s32": 4, "u64": 8, "s64": 8}


@pytest.mark.nvcc
@pytest.mark.parametrize("config", TF32_WG_MAPS, ids=lambda c: c.name)
def test_the_maps_sit_where_the_kernel_reads_them(config, tmp_path):
    """The parameter buffer's layout (FASTMM_GEMM_PARAMS, then A's map and B's, 128 bytes each from MAP_OFFSET)
    against the PTX parameter list nvcc gives each mapped kernel."""
    src = tmp_path / "k.cu"
    src.write_text(build.source_for(config, Variant()))
    ptx = tmp_path / "k.ptx"
    subprocess.run([build.find_nvcc(), "-ptx", "-arch=sm_90a", "-o", str(ptx), str(src)], check=True,
                   capture_output=True)
    params = re.findall(r"\.param (?:\.align (\d+) )?\.(\w+) fastmm_wgmma_param_(\d+)(\[(\d+)\])?", ptx.read_text())
    offset, where = 0, {}
    for align, kind, index, _, count in params:
        size = int(count) if count else _SIZES[kind]
        align = int(align) if align else size
        offset = -(-offset // align) * align
        where[int(index)] = (offset, size, align)
        offset += size
    maps = len(config.maps)
    count = len(cuda._ARG_NAMES)  # FASTMM_GEMM_PARAMS
    assert len(where) == count + maps
    assert where[count - 1][0] + 8 == cuda._ARGS_SPLIT.size  # the last of FASTMM_GEMM_PARAMS ends the packed struct
    # The guard's flags: c_sb1 of the product's parameters, a_sb0 of the guard's (the same FASTMM_GEMM_PARAMS)
    assert (where[count - 1][0], where[cuda._ARG_NAMES.index("a_sb0")][0]) == (tensor_map._C_SB1, tensor_map._A_SB0)
    for i in range(maps):
        assert where[count + i] == (tensor_map.MAP_OFFSET + 128 * i, 128, 64)
    # (a mapped launch points at each parameter: the offsets it uses are the PTX's)
    assert [where[i][0] for i in range(count + maps)] == list(tensor_map.PARAM_OFFSETS[:count + maps])
    assert tensor_map._MapBuffer(maps).size.value == offset


@pytest.mark.parametrize("maps", [1, 2])
def test_a_thread_s_buffer_holds_the_maps_64_byte_aligned(maps):
    buffer = tensor_map._MapBuffer(maps)
    assert buffer.base % 64 == 0 and (buffer.base + tensor_map.MAP_OFFSET) % 64 == 0
    assert buffer.size.value == tensor_map.MAP_OFFSET + 128 * maps
    assert buffer.base + buffer.size.value <= ctypes.addressof(buffer.raw) + ctypes.sizeof(buffer.raw)


@pytest.mark.parametrize("strides,shape,mapped", [
    ((1536, 1), (1024, 1536), True),      # rows along K
    ((1, 1024), (1024, 1536), False),     # a transposed operand: K across its rows
    ((1537, 1), (1024, 1536), False),     # rows 6148 bytes apart
    ((7, 3), (1, 1536), False),           # one row, but not contiguous along it
    ((7, 1), (1, 1536), True),            # one row: its own stride does not matter
])
def test_which_operands_go_through_a_map(strides, shape, mapped):
    got = tensor_map.operand_map(0x2000, *shape, *strides, (128, 32))
    assert (got is not None) is mapped
    if mapped:
        assert got[:4] == (128, 32, *shape) and got[4] % 16 == 0 and got[4] >= 4 * shape[1]


@pytest.mark.parametrize("address,rows,cols,row_bytes,ok", [
    (0x1000, 1024, 1536, 1536 * 4, True),
    (0x1000, 1000, 1000, 1004 * 4, True),       # a view of wider rows, 16-byte aligned
    (0x100c, 1024, 1536, 1536 * 4, False),      # a start 12 bytes past alignment
    (0x1000, 1000, 333, 333 * 4, False),        # rows 1332 bytes apart: not a multiple of 16
    (0x1000, 10, 64, 32 * 4, False),            # rows overlapping: the stride does not hold a row
    (0x1000, 0, 64, 64 * 4, False),
])
def test_which_operands_a_tensor_map_describes(address, rows, cols, row_bytes, ok):
    assert tensor_map.mappable(address, rows, cols, row_bytes) is ok


@pytest.mark.parametrize("along_m", [False, True])
def test_a_mapped_launch_packs_its_pointers_flags_and_maps(along_m, monkeypatch):
    """MappedLaunch's parameter buffer, with the driver replaced: FASTMM_GEMM_PARAMS with this call's pointers and
    flags (c_sb1), then A's map encoded from A's address at the chunk's first row and B's from B's, each chunk of
    rows its own launch. An A along M (A_RS) has a map of its K x M view: a chunk of rows narrows its columns."""
    seen, encoded = [], []

    def encode(into, address, rows, cols, row_bytes, box_rows, box_cols):
        encoded.append((address, rows, cols, row_bytes, box_rows, box_cols))
        ctypes.memmove(into, struct.pack("<4q", address, rows, cols, row_bytes), 32)

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert extra == 0  # (a pointer to each parameter, kernelParams: no packed `extra` buffer)
        pointers = (ctypes.c_void_p * len(tensor_map.PARAM_OFFSETS)).from_address(params)
        base = pointers[0]
        assert [p - base for p in pointers] == list(tensor_map.PARAM_OFFSETS)
        seen.append(((gx, gy, gz), ctypes.string_at(base, tensor_map.MAP_OFFSET + 2 * 128)))

    monkeypatch.setattr(tensor_map, "encode", encode)
    monkeypatch.setattr(cuda, "_launch_kernel", launch)
    fixed = cuda._ARGS.pack(300, 200, 64, 0, 64, 1, 0, 0, 0, 0, 200, 1, 0, 1, 0, 0, 0, 0, 0, 2, 0)
    before_a, _, between_ab, _, between_bc, _, after_c = cuda._ARGS_SPLIT.unpack(fixed)
    run = object.__new__(tensor_map.MappedLaunch)
    run.fn, run.block, run.shared = 0, (384, 1, 1), 0
    # Two chunks of rows (as a grid past 65535 blocks of rows would give): 256 rows, then 44 rows 256 rows on.
    a_at = 4 * 256 if along_m else 4 * 256 * 64  # (the second chunk's A: 256 rows on)
    run.chunks = [(2, 2, 1, 0, 0, before_a, between_ab, between_bc, after_c),
                  (2, 1, 1, a_at, 4 * 256 * 200, before_a, between_ab, between_bc, after_c)]
    run.rows = [256, 44]
    a_map = (32, 32, 64, 300, 1200) if along_m else (128, 32, 300, 64, 256)  # (K x M: 64 rows of 300, or M x K)
    run.maps, run.a_along_m = (a_map, (256, 32, 200, 64, 256)), along_m
    tensor_map._tls.flags = 0xF1A6
    run._launch(0xA000, 0xB000, 0xC000, 0)
    a_first, a_second = (((64, 256, 1200, 32, 32), (64, 44, 1200, 32, 32)) if along_m else
                         ((256, 64, 256, 128, 32), (44, 64, 256, 128, 32)))
    assert encoded == [(0xA000, *a_first), (0xB000, 200, 64, 256, 256, 32),
                       (0xA000 + a_at, *a_second), (0xB000, 200, 64, 256, 256, 32)]
    for (grid, params), da, dc in zip(seen, (0, a_at), (0, 4 * 256 * 200)):
        assert len(params) == tensor_map.MAP_OFFSET + 2 * 128
        values = cuda._ARGS.unpack(params[:cuda._ARGS.size])
        assert (values[3], values[6], values[9]) == (0xA000 + da, 0xB000, 0xC000 + dc)
        assert values[-1] == 0xF1A6 and values[-2] == 2  # the flags, and the tiles in a row
        assert struct.unpack_from("<q", params, tensor_map.MAP_OFFSET)[0] == 0xA000 + da
        assert struct.unpack_from("<q", params, tensor_map.MAP_OFFSET + 128)[0] == 0xB000


def test_the_guard_launch_packs_its_flags_where_the_guard_reads_them(monkeypatch):
    seen = []

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * 5).from_address(extra)
        seen.append(ctypes.string_at(pointers[1], ctypes.c_size_t.from_address(pointers[3]).value))

    monkeypatch.setattr(cuda, "_launch_kernel", launch)
    fixed = cuda._ARGS.pack(300, 200, 64, 0, 64, 1, 0, 200, 1, 0, 200, 1, 0, 1, 0, 0, 2, 0, 0, 0, 0)
    before_a, _, between_ab, _, between_bc, _, after_c = cuda._ARGS_SPLIT.unpack(fixed)
    run = object.__new__(tensor_map.GuardLaunch)
    run.fn, run.block, run.shared = 0, (256, 1, 1), 0
    run.chunks = [(1, 3, 1, 0, 0, before_a, between_ab, between_bc, after_c)]
    tensor_map._tls.flags = 0xF1A6
    run._launch(0xA000, 0xB000, 0xC000, 0)
    (params,) = seen
    assert len(params) == cuda._ARGS.size
    values = cuda._ARGS.unpack(params)
    a_sb0 = cuda._ARG_NAMES.index("a_sb0")
    assert (values[3], values[6], values[9], values[a_sb0], values[a_sb0 + 1]) == (0xA000, 0xB000, 0xC000, 0xF1A6, 2)
