"""Turn a configuration into CUDA source and a cubin with nvcc: the one compile path.

Used by the runtime (fastmm/_cuda.py, which loads the cubin with PyCUDA) and by ``python -m fastmm compile``
(which only reads ptxas' resource report). Neither needs a GPU to compile: only nvcc.

Compiled cubins are cached on disk, keyed on the full source text (macros included), the nvcc options,
the target architecture and the identity of the nvcc binary, so a second process loads a kernel in
milliseconds instead of recompiling it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .configs import Variant, _Config

__all__ = ["CompileError", "NvccNotFoundError", "Compiled", "source_for", "compile_cubin", "find_nvcc", "cache_dir"]

# -lineinfo costs nothing at run time and lets compute-sanitizer and ncu point at source lines.
NVCC_OPTIONS = ("-O3", "-lineinfo", "-std=c++17")


class CompileError(RuntimeError):
    """nvcc failed; the message carries nvcc's own log."""


class NvccNotFoundError(RuntimeError):
    """No CUDA compiler: fastmm compiles its kernels at run time and needs nvcc from a CUDA toolkit."""


@dataclasses.dataclass(frozen=True)
class Compiled:
    name: str
    arch: str
    cubin: bytes
    registers: int
    smem_bytes: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    log: str


@lru_cache(maxsize=None)
def _read_source(filename: str) -> str:
    return resources.files(__package__).joinpath(filename).read_text()


def source_for(config: _Config, variant: Variant) -> str:
    """Full source of one binary: -D style macros as #defines, the shared header, the family's file."""
    defines = "".join(f"#define {k} {v}\n" for k, v in config.macros(variant).items())
    return defines + _read_source("common.cuh") + "\n" + _read_source(config.source)


def find_nvcc() -> str:
    """nvcc from $CUDA_HOME/$CUDA_PATH, then PATH, then /usr/local/cuda."""
    candidates = [os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if v in os.environ]
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise NvccNotFoundError(
        "fastmm compiles its CUDA kernels at run time and could not find nvcc: install a CUDA toolkit "
        "(matching your driver) and put its bin/ on PATH, or set CUDA_HOME"
    )


def cache_dir() -> Path:
    base = os.environ.get("FASTMM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fastmm")
    return Path(base) / "kernels"


_PTXAS_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "smem_bytes": re.compile(r"(\d+) bytes smem"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
}


def _parse_ptxas(log: str) -> dict[str, int]:
    return {k: int(m.group(1)) if (m := r.search(log)) else 0 for k, r in _PTXAS_RE.items()}


def _nvcc_identity(nvcc: str) -> str:
    st = os.stat(nvcc)
    return f"{os.path.realpath(nvcc)}:{st.st_size}:{st.st_mtime_ns}"


def compile_cubin(config: _Config, variant: Variant = Variant(), arch: str = "sm_90",
                  *, use_cache: bool = True) -> Compiled:
    """Compile one binary with ``nvcc -cubin -Xptxas -v``; return the cubin and ptxas' resource figures."""
    nvcc = find_nvcc()
    source = source_for(config, variant)
    options = [*NVCC_OPTIONS, f"-arch={arch}", "-Xptxas", "-v"]
    key = hashlib.sha256("\0".join([source, *options, _nvcc_identity(nvcc)]).encode()).hexdigest()[:32]
    name = config.binary_name(variant)
    cached = cache_dir() / f"{name}-{arch}-{key}"
    if use_cache and cached.with_suffix(".cubin").exists() and cached.with_suffix(".log").exists():
        log = cached.with_suffix(".log").read_text()
        return Compiled(name, arch, cached.with_suffix(".cubin").read_bytes(), **_parse_ptxas(log), log=log)

    with tempfile.TemporaryDirectory(prefix="fastmm-nvcc-") as tmp:
        src = Path(tmp) / f"{name}.cu"
        out = Path(tmp) / f"{name}.cubin"
        src.write_text(source)
        proc = subprocess.run([nvcc, "-cubin", *options, "-o", str(out), str(src)],
                              capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed to compile {name} for {arch} (exit {proc.returncode}):\n{log}")
        cubin = out.read_bytes()

    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            # Write-then-rename so a concurrent process never reads half a file.
            for suffix, data in ((".log", log.encode()), (".cubin", cubin)):
                tmp_path = cached.with_suffix(suffix + f".{os.getpid()}.tmp")
                tmp_path.write_bytes(data)
                os.replace(tmp_path, cached.with_suffix(suffix))
        except OSError:
            pass  # a read-only cache only costs recompiles
    return Compiled(name, arch, cubin, **_parse_ptxas(log), log=log)
