"""Forced kernels: what ``kernel=`` and `use_kernel` accept, and whether a GPU can run a configuration."""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from typing import Callable, Iterator

from ..kernels.configs import BY_NAME, CONFIGS, FAMILIES, KernelConfig, current_name, validate
from .problem import Device, Problem
from .tiles import (NAIVE, TF32_TILES, TF32_WG, TF32X3_TILES, TF32X3_WG, _fill, _fill_from, _fill_regtile,
                    _few_columns_for, _smem_for)

__all__ = ["OZAKI", "kernel_names", "use_kernel", "forced_kernel", "invalid", "validated", "kernels_on"]

def _kernels_from_environment() -> bool:
    """$FASTMM_KERNELS: "off" runs every float32 product on CuPy (cuBLAS) instead of fastmm's kernels, for a quick
    comparison of a whole program with and without them; "on" (or unset) is the default. Read once, at import."""
    value = os.environ.get("FASTMM_KERNELS", "").strip().lower()
    if value in ("", "on"):
        return True
    if value == "off":
        return False
    warnings.warn(f"FASTMM_KERNELS={value!r} is neither 'on' nor 'off'; fastmm's kernels stay on", RuntimeWarning,
                  stacklevel=2)
    return True


_KERNELS_ON = _kernels_from_environment()


def kernels_on() -> bool:
    """False where $FASTMM_KERNELS=off: float32 products run on CuPy (cuBLAS), as every other dtype does."""
    return _KERNELS_ON


# `kernel="ozaki"`: float32 products by Ozaki scheme II on the INT8 tensor cores (fastmm/_plan/ozaki.py), at any
# size (the plan takes it for 'high' only above a threshold); Hopper only.
OZAKI = "ozaki"

# What `kernel="<family>"` means: the table restricted to one family.
_FAMILY_DEFAULT: dict[str, Callable[[Problem, Device], str]] = {
    "naive": lambda p, d: NAIVE,
    "smem": _smem_for,
    "regtile": _fill_regtile,
    "warptile": _fill,
    "tf32x3": _fill_from(TF32X3_TILES),
    "tf32": _fill_from(TF32_TILES),
    "tf32x3wg": lambda p, d: TF32X3_WG,
    "tf32wg": lambda p, d: TF32_WG,
    "fewcol": _few_columns_for,
}


def kernel_names() -> list[str]:
    """Every name ``kernel=`` and `use_kernel` accept.

    Returns
    -------
    list of str
        ``"auto"`` (the heuristic table, or an autotuned entry), then the kernel families (``"naive"``,
        ``"smem"``, ``"regtile"``, ``"warptile"``: the table restricted to that family, tile chosen for the
        shape), ``"ozaki"`` (Ozaki scheme II on the INT8 tensor cores, Hopper only), then every kernel configuration
        by name.

    See Also
    --------
    use_kernel, explain

    Notes
    -----
    The configurations are described in the kernel ladder (docs/kernels/index.md); ``python -m fastmm compile``
    lists their ptxas resources. NumPy has no counterpart.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.kernel_names()[:5]
    ['auto', 'naive', 'smem', 'regtile', 'warptile']
    >>> "regtile_128x128x8_8x8" in fastmm.kernel_names()
    True
    """
    return ["auto", *FAMILIES, OZAKI, *(c.name for c in CONFIGS)]


_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("fastmm_forced_kernel", default=None)


def _check_name(name: str) -> str:
    """`name`, checked (KeyError with the valid names) and in this version's spelling (see `current_name`)."""
    current = current_name(name)
    if current not in ("auto", OZAKI) and current not in FAMILIES and current not in BY_NAME:
        raise KeyError(f"unknown kernel {name!r}; valid names: {', '.join(kernel_names())}")
    return current


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    """Force one kernel (a family or a configuration name) for every float32 product inside the block.

    A context manager. Products of other dtypes are unaffected, and a ``kernel=`` argument to a product
    still wins over it. Blocks nest (the innermost wins) and are local to the thread or asyncio task that
    enters them (a `contextvars.ContextVar`): another thread's products keep their own choice.

    Parameters
    ----------
    name : str
        ``"auto"``, a family (``"naive"``, ``"smem"``, ``"regtile"``, ``"warptile"``) or a configuration
        name, as listed by `kernel_names`.

    Raises
    ------
    KeyError
        On entering the block, for an unknown name; the message lists the valid ones.

    See Also
    --------
    kernel_names, explain
    matmul : Its ``kernel=`` keyword forces a kernel for one product.

    Notes
    -----
    NumPy has no counterpart. The name is checked when the block is entered, before any product runs.

    Examples
    --------
    >>> import fastmm
    >>> with fastmm.use_kernel("regtile"):
    ...     print(fastmm.explain((1024, 1024), (1024, 1024)))  # doctest: +ELLIPSIS
    1024x1024x1024 float32 ...
      kernel  regtile_...
      rule    forced: kernel family 'regtile' was requested; tile chosen for the shape
      grid    ...
    >>> with fastmm.use_kernel("fastest"):
    ...     pass
    Traceback (most recent call last):
        ...
    KeyError: "unknown kernel 'fastest'; valid names: auto, naive, smem, regtile, warptile, ..."

    On a GPU machine every float32 product inside the block runs the shared-memory kernel:

    >>> import numpy as np
    >>> a = fastmm.asarray(np.ones((256, 256), np.float32))   # doctest: +SKIP
    >>> with fastmm.use_kernel("smem"):
    ...     c = a @ a                                          # doctest: +SKIP
    """
    token = _forced.set(_check_name(name))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_kernel() -> str | None:
    return _forced.get()


def invalid(config: KernelConfig, device: Device) -> str | None:
    """Why `device` cannot run `config` (`validated`'s message), or None where it can."""
    try:
        validated(config, device)
    except ValueError as e:
        return str(e)
    return None


def validated(config: KernelConfig, device: Device, regs_per_thread: int | None = None) -> KernelConfig:
    """`config`, after checking it against `device` (and its compiled register count, when known)."""
    validate(config, max_threads=device.max_threads_per_block, max_smem=device.max_smem_per_block,
             max_smem_optin=device.max_smem_optin, max_regs_per_block=device.max_regs_per_block,
             regs_per_thread=regs_per_thread, compute_capability=device.compute_capability)
    return config
