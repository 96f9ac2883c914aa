"""fastmm: NumPy's matrix products on the GPU, through fastmm's own SGEMM kernels.

`fastmm.asarray` makes a GPU array (a subclass of ``cupy.ndarray``) on which NumPy's matrix products,
``np.matmul``, ``@``, ``np.dot``, ``np.einsum`` and the others, run fastmm's float32 kernels; other dtypes and
everything else run on CuPy. Planning (`explain`, `kernel_names`, `use_kernel`) and the exceptions work
without CuPy or a GPU; arrays and products need CuPy and a CUDA GPU.

Examples
--------
Planning and the exceptions need no GPU:

>>> import fastmm
>>> "warptile" in fastmm.kernel_names()
True
>>> issubclass(fastmm.OutOfMemoryError, MemoryError), issubclass(fastmm.CompileError, RuntimeError)
(True, True)

On a GPU machine:

>>> import numpy as np
>>> a = fastmm.asarray(np.random.rand(1024, 1024).astype(np.float32))   # doctest: +SKIP
>>> c = a @ a                   # fastmm's kernel; np.matmul(a, a), np.dot(a, a) too  # doctest: +SKIP
>>> print(fastmm.explain(a, a))                                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging

from ._errors import (CompileError, CUDAError, CUDAUnavailableError, DeviceFaultError, KernelLoadError, LaunchError,
                      NvccNotFoundError, OutOfMemoryError, PerformanceWarning)
from ._hooks.cupy_hook import accelerate_cupy, cupy_hook_status, restore_cupy
from ._hooks.numpy_hook import HostModel, accelerate_numpy, numpy_hook_status, restore_numpy
from ._version import __version__ as __version__
from ._plan import get_float32_matmul_precision, kernel_names, matmul_precision, set_float32_matmul_precision, use_kernel


# fastmm logs through the standard logging module, logger "fastmm" (compiles, plans, hook decisions), opt-in.
logging.getLogger("fastmm").addHandler(logging.NullHandler())

__all__ = [
    "ndarray", "asarray", "asnumpy",
    "matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot",
    "explain", "use_kernel", "kernel_names",
    "set_float32_matmul_precision", "get_float32_matmul_precision", "matmul_precision",
    "accelerate_numpy", "restore_numpy", "numpy_hook_status", "HostModel",
    "accelerate_cupy", "restore_cupy", "cupy_hook_status",
    "CompileError", "CUDAError", "CUDAUnavailableError", "DeviceFaultError", "KernelLoadError", "LaunchError",
    "NvccNotFoundError", "OutOfMemoryError", "PerformanceWarning",
]

# In a process already running Dask's distributed (a worker, which imports fastmm when it first unpickles a fastmm
# array's type), chunks received from other workers arrive as fastmm arrays (fastmm/_serialize.py).
if "distributed.protocol" in __import__("sys").modules:
    from . import _serialize

    _serialize.register()

_ARRAY_NAMES = {"ndarray", "asarray", "asnumpy"}
_LINALG_NAMES = {"matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot"}


def __getattr__(name):
    # The array type needs CuPy: import it on first use so that planning works where CuPy is absent.
    if name in _ARRAY_NAMES:
        from . import _array

        return getattr(_array, name)
    if name in _LINALG_NAMES:
        from . import linalg

        return getattr(linalg, name)
    raise AttributeError(f"module 'fastmm' has no attribute {name!r}")


def __dir__():
    # The lazily imported names too, so that completion finds asarray and matmul.
    return sorted(set(globals()) | _ARRAY_NAMES | _LINALG_NAMES)


def explain(a, b, kernel=None, precision=None) -> str:
    """Say which kernel ``matmul(a, b)`` runs, by which rule of the heuristic table, and why.

    Nothing is computed: the product is planned as `matmul` would plan it, on the current GPU when CuPy
    and a GPU are available, else for an assumed H100/H200.

    Parameters
    ----------
    a, b : array_like or tuple of int
        The operands (fastmm, CuPy or NumPy arrays, whose dtypes, strides and alignment count), or their
        shapes, which stand for C-ordered float32 operands.
    kernel : str, optional
        Plan as if ``kernel=`` were passed to `matmul`. By default the kernel an enclosing `use_kernel`
        forces, else ``"auto"``.
    precision : {"highest", "high", "medium"}, optional
        Plan as if ``precision=`` were passed to `matmul`. By default the current precision
        (`get_float32_matmul_precision`).

    Returns
    -------
    str
        For a float32 product, lines naming the problem (sizes, layouts, alignment, device), the kernel (and
        split-K slices), the rule of the table with its reason, the launch grid, and the longest run of terms
        added into one FP32 sum (the plan's side of accuracy). For other dtypes, one
        line saying which CuPy path runs. The ``mode`` line names the arithmetic (the precision mode).

    Raises
    ------
    ValueError
        When the shapes cannot be multiplied (NumPy's error).
    KeyError
        For an unknown `kernel` name.

    See Also
    --------
    use_kernel, kernel_names
    matmul : Runs the planned product.

    Notes
    -----
    ``python -m fastmm explain M N K`` prints the same text. NumPy has no counterpart.

    Examples
    --------
    >>> import numpy as np, fastmm
    >>> print(fastmm.explain(np.ones((3, 4)), np.ones((4, 5))))
    float64 product: CuPy (cuBLAS); fastmm's own kernels are float32
    >>> print(fastmm.explain((1024, 1024), (1024, 1024), kernel="regtile_128x128x8_8x8"))  # doctest: +ELLIPSIS
    1024x1024x1024 float32 (A k-contiguous, B n-contiguous, 16-byte copies) on ...
      kernel  regtile_128x128x8_8x8_nn_v4
      mode    highest: FP32 FMAs ...
      rule    forced: kernel 'regtile_128x128x8_8x8' was requested
      grid    64 blocks of 256 threads for ... SMs
      sums    at most 1024 terms in one FP32 running sum (K = 1024)
    """
    import numpy as np

    from ._dispatch import products as _dispatch
    from . import _plan

    if isinstance(a, tuple):
        a = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), a, (0,) * len(a))
    if isinstance(b, tuple):
        b = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), b, (0,) * len(b))
    device = _plan.Device()
    try:
        import cupy

        if cupy.cuda.is_available():
            from ._runtime import cuda as _cuda

            device = _cuda.device(cupy.cuda.Device().id)
    except Exception:  # no CuPy or no GPU: plan for the assumed device
        pass
    # In `precision`'s block, as `matmul(precision=...)` runs: the parts planned on their own (a peeled product's
    # interior and edges, aligned copies) take it too.
    with _plan.matmul_precision(precision) if precision is not None else contextlib.nullcontext():
        planned = _dispatch.plan_matmul(a, b, device, kernel, precision)
        if isinstance(planned, str):
            return planned
        problem, choice, notes = planned
        ahead = _plan.cublas_ahead_of_parts(problem, choice, device)
        if ahead is not None:
            notes.append(f"under accelerate_cupy(), plain CuPy arrays leave this product to cuBLAS ({ahead})")
        return _plan.describe(choice, problem, device) + "".join(f"\n  note    {n}" for n in notes)
