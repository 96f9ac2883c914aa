"""Exceptions and warnings fastmm raises, so that callers can catch them by name."""

from __future__ import annotations

import warnings

from .kernels.build import CompileError, NvccNotFoundError

__all__ = ["CUDAUnavailableError", "CompileError", "NvccNotFoundError", "OutOfMemoryError",
           "PerformanceWarning", "warn_once"]


class CUDAUnavailableError(RuntimeError):
    """No usable CUDA device, driver or PyCUDA."""


class OutOfMemoryError(MemoryError):
    """The GPU has no room for an operand or the result."""


class PerformanceWarning(UserWarning):
    """A product ran on a slower path than its shape would allow (a copy, a fallback)."""


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Say once per process that a fallback costs speed; never silently, never on every call."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, PerformanceWarning, stacklevel=4)
