"""Exceptions and warnings fastmm raises, so that callers can catch them by name.

Every failure of the GPU runtime reaches the user as one of these, never as a raw CuPy or driver
exception: each subclasses the builtin a caller would already catch (RuntimeError, MemoryError), and each
message ends with what to change.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

__all__ = ["CUDAError", "CUDAUnavailableError", "CompileError", "NvccNotFoundError", "KernelLoadError",
           "LaunchError", "DeviceFaultError", "OutOfMemoryError", "PerformanceWarning", "warn_once"]


class CUDAError(RuntimeError):
    """A CUDA operation fastmm needed failed; the subclasses say which kind."""


class CUDAUnavailableError(CUDAError):
    """No usable CUDA device, driver or CuPy."""


class CompileError(RuntimeError):
    """nvcc failed; the message carries nvcc's own log."""


class NvccNotFoundError(RuntimeError):
    """No CUDA compiler: fastmm compiles its kernels at run time and needs nvcc from a CUDA toolkit."""


class KernelLoadError(CUDAError):
    """A compiled kernel could not be loaded onto the GPU, even freshly compiled."""


class LaunchError(CUDAError):
    """The driver refused to launch a kernel. Nothing ran, and the device stays usable."""


class DeviceFaultError(CUDAError):
    """The device's CUDA context is broken by an earlier fault (e.g. an illegal memory access).

    CUDA cannot recover such a context inside the process: every later GPU call on that device fails
    until the process is restarted.
    """


class OutOfMemoryError(MemoryError):
    """The GPU has no room for an operand, the result or a kernel."""


class PerformanceWarning(UserWarning):
    """A product ran on a slower path than its shape would allow (a copy, a fallback, a recompile)."""


_warned: set[str] = set()


def warn_once(key: str, message: str, stacklevel: int = 4) -> None:
    """Say once per process that a fallback costs speed; never silently, never on every call."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, PerformanceWarning, stacklevel=stacklevel)


def format_shape(shape: Sequence[Any]) -> str:
    """NumPy's way of printing a shape in error messages: (2,3), (3,), ()."""
    items = ",".join(str(s) for s in shape)
    return f"({items},)" if len(shape) == 1 else f"({items})"
