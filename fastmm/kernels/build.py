"""Turn a configuration into CUDA source and a cubin with nvcc: the one compile path.

Used by the runtime (fastmm/_runtime/cuda.py, which loads the cubin through the CUDA driver) and by ``python -m fastmm compile``
(which only reads ptxas' resource report). Neither needs a GPU to compile: only nvcc.

Compiled cubins are cached on disk, keyed on the full source text (macros included), the nvcc options,
the target architecture and the identity of the nvcc binary, so a second process loads a kernel in
milliseconds instead of recompiling it. The cache can never poison a process: the driver loads a cubin
from a bare pointer (no length), so a truncated or damaged file would crash it. Each entry is therefore one
file holding a SHA-256 digest of its contents, written to a temporary name and renamed into place; a read
that fails the digest or a structural check of the cubin counts as a miss (recompiled and replaced), and a
directory that cannot be written (read-only, full) only costs recompiles, said once per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .._errors import CompileError, NvccNotFoundError, warn_once
from .configs import KernelConfig, Variant

_log = logging.getLogger("fastmm")

__all__ = ["CompileError", "NvccNotFoundError", "Compiled", "source_for", "compile_cubin", "cached_cubin",
           "cache_writable", "find_nvcc", "cache_dir", "cache_path", "is_cubin"]

# -lineinfo costs nothing at run time and lets compute-sanitizer and ncu point at source lines.
NVCC_OPTIONS = ("-O3", "-lineinfo", "-std=c++17")


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
    cached: bool = False  # read from the disk cache (rather than compiled by this call)


@lru_cache(maxsize=None)
def _read_source(filename: str) -> str:
    return resources.files(__package__).joinpath(filename).read_text()


def source_for(config: KernelConfig, variant: Variant) -> str:
    """Full source of one binary: -D style macros as #defines, the shared headers, the family's file."""
    defines = "".join(f"#define {k} {v}\n" for k, v in config.macros(variant).items())
    return defines + "\n".join(_read_source(f) for f in ("common.cuh", *config.headers, config.source))


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


def _options(arch: str) -> list[str]:
    return [*NVCC_OPTIONS, f"-arch={arch}", "-Xptxas", "-v"]


def cache_path(config: KernelConfig, variant: Variant = Variant(), arch: str = "sm_90") -> Path:
    """The cache entry of one binary: its name, architecture and a hash of everything that shapes it."""
    arch += config.arch_suffix
    nvcc = find_nvcc()
    key = hashlib.sha256("\0".join([source_for(config, variant), *_options(arch), _nvcc_identity(nvcc)]).encode())
    return cache_dir() / f"{config.binary_name(variant)}-{arch}-{key.hexdigest()[:32]}.entry"


# ELF64 file header after e_ident: type, machine, version, entry, phoff, shoff, flags, ehsize, phentsize,
# phnum, shentsize, shnum, shstrndx. Section header: name, type, flags, addr, offset, size, ...
_ELF_HEADER = struct.Struct("<HHIQQQIHHHHHH")
_ELF_SECTION = struct.Struct("<IIQQQQ")
_EM_CUDA = 190
_SHT_NOBITS = 8


def is_cubin(data: bytes) -> bool:
    """Whether `data` is a whole CUDA ELF image: header, and every section and program header inside it.

    The driver reads a cubin through a bare pointer, so a truncated one makes it read past the buffer; this
    check is what keeps a damaged binary from ever reaching it.
    """
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit, little-endian
        return False
    (_, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = _ELF_HEADER.unpack_from(data, 16)
    if machine != _EM_CUDA or shnum == 0 or shentsize < _ELF_SECTION.size:
        return False
    if shoff + shnum * shentsize > len(data) or phoff + phnum * phentsize > len(data):
        return False
    for i in range(shnum):
        _, kind, _, _, offset, size = _ELF_SECTION.unpack_from(data, shoff + i * shentsize)
        if kind != _SHT_NOBITS and offset + size > len(data):
            return False
    return True


# One cache entry, one file: magic line, "<sha256 of the rest> <log bytes> <cubin bytes>" line, log, cubin.
_MAGIC = b"fastmm kernel cache entry 1\n"


def _entry_bytes(log: str, cubin: bytes) -> bytes:
    body = log.encode() + cubin
    header = f"{hashlib.sha256(body).hexdigest()} {len(body) - len(cubin)} {len(cubin)}\n".encode()
    return _MAGIC + header + body


def _read_entry(path: Path) -> tuple[str, bytes] | None:
    """(log, cubin) of a cache entry, or None when it is absent, unreadable or fails any check."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC):
        return None
    end = data.find(b"\n", len(_MAGIC))
    if end < 0:
        return None
    try:
        digest, n_log, n_cubin = data[len(_MAGIC):end].decode("ascii").split()
        n_log, n_cubin = int(n_log), int(n_cubin)
    except (UnicodeDecodeError, ValueError):
        return None
    body = data[end + 1:]
    if len(body) != n_log + n_cubin or hashlib.sha256(body).hexdigest() != digest:
        return None
    cubin = body[n_log:]
    if not is_cubin(cubin):
        return None
    try:
        return body[:n_log].decode(), cubin
    except UnicodeDecodeError:
        return None


_unwritable: set[Path] = set()  # cache directories this process failed to write an entry into


def cache_writable() -> bool:
    """False once this process failed to write an entry into the disk cache's directory (read-only, full): each
    compile then lasts only as long as the process."""
    return cache_dir() not in _unwritable


def _write_entry(path: Path, log: str, cubin: bytes) -> None:
    """Write-then-rename, so that a concurrent reader sees the old entry, the new one or none, never a part."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(_entry_bytes(log, cubin))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        _unwritable.add(path.parent)
        warn_once("kernel-cache-write",
                  f"fastmm could not write its kernel cache in {path.parent} ({e.strerror or e}); it compiles its "
                  "kernels again in every process until it can: free space there, make it writable, or point "
                  "FASTMM_CACHE_DIR at a writable directory", stacklevel=5)


def cached_cubin(config: KernelConfig, variant: Variant = Variant(), arch: str = "sm_90") -> Compiled | None:
    """The disk cache's binary of `config` and `variant` for `arch`, or None where it holds no sound one (never
    compiles)."""
    try:
        path = cache_path(config, variant, arch)
    except NvccNotFoundError:  # (the key names the nvcc binary: without one, nothing could have been cached)
        return None
    return _cached_at(path, config, variant, arch)


def _cached_at(path: Path, config: KernelConfig, variant: Variant, arch: str) -> Compiled | None:
    entry = _read_entry(path)
    if entry is None:
        return None
    log, cubin = entry
    return Compiled(config.binary_name(variant), arch + config.arch_suffix, cubin, **_parse_ptxas(log), log=log,
                    cached=True)


def _prioritised(command: list[str], low: bool) -> tuple[list[str], dict]:
    """`command` and `subprocess.run`'s arguments for a process group of its own (Ctrl-C in a terminal or a
    notebook, sent to the foreground group, interrupts the program, not a compile on fastmm's thread that the
    program did not ask for), at the lowest CPU priority where `low`.

    ``nice -n 19`` passes on to nvcc's children (cicc, ptxas); ``preexec_fn`` is unsafe beside other threads. The
    group stays in the program's session: Linux's autogroup scheduling shares the CPU between sessions first, so
    a niced nvcc in a session of its own would still take a whole core from the program's threads.
    """
    if os.name == "nt":
        flags = subprocess.CREATE_NEW_PROCESS_GROUP | (subprocess.IDLE_PRIORITY_CLASS if low else 0)
        return command, {"creationflags": flags}
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    nice = shutil.which("nice") if low else None
    return ([nice, "-n", "19", *command] if nice else command), group


def compile_cubin(config: KernelConfig, variant: Variant = Variant(), arch: str = "sm_90",
                  *, use_cache: bool = True, refresh: bool = False, low_priority: bool = False) -> Compiled:
    """Compile one binary with ``nvcc -cubin -Xptxas -v``; return the cubin and ptxas' resource figures.

    Parameters
    ----------
    use_cache : bool
        Read and write the disk cache (`cache_dir`). A damaged entry is never returned: it is recompiled and
        replaced.
    refresh : bool
        Compile even when the cache holds an entry, and replace it (the runtime's answer to a cached cubin
        that passed every check but that the driver would not load).
    low_priority : bool
        Run nvcc at the lowest CPU priority, for a compile nobody waits for (fastmm's compile thread): one busy
        core slows a multithreaded BLAS call of the program by up to the time that core's share takes.
    """
    nvcc = find_nvcc()
    name = config.binary_name(variant)
    path = cache_path(config, variant, arch)
    if use_cache and not refresh:
        compiled = _cached_at(path, config, variant, arch)  # (the key hashed once: `path`)
        if compiled is not None:
            return compiled
    arch += config.arch_suffix  # sm_90 -> sm_90a for kernels that need Hopper's own instructions

    started = time.perf_counter()
    # mkdtemp, not TemporaryDirectory: the latter's finaliser deletes the directory at interpreter exit, under an
    # nvcc still running on fastmm's compile thread (fastmm/_runtime/compiling.py), which the exit waits for.
    tmp = tempfile.mkdtemp(prefix="fastmm-nvcc-")
    try:
        src = Path(tmp) / f"{name}.cu"
        out = Path(tmp) / f"{name}.cubin"
        src.write_text(source_for(config, variant))
        # (an interrupted call still kills its nvcc: subprocess.run does on any exception)
        command, group = _prioritised([nvcc, "-cubin", *_options(arch), "-o", str(out), str(src)], low_priority)
        proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **group)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed to compile {name} for {arch} (exit {proc.returncode}):\n{log}")
        cubin = out.read_bytes()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not is_cubin(cubin):
        raise CompileError(f"nvcc compiled {name} for {arch} but wrote no complete cubin ({len(cubin)} bytes); "
                           f"check the disk space of {tempfile.gettempdir()} and the CUDA toolkit ({nvcc}):\n{log}")
    if use_cache:
        _write_entry(path, log, cubin)
    _log.info("compiled %s for %s in %.2f s (nvcc %s)", name, arch, time.perf_counter() - started, nvcc)
    return Compiled(name, arch, cubin, **_parse_ptxas(log), log=log)
