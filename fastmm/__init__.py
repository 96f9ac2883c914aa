"""fastmm: NumPy's matrix products on the GPU, through fastmm's own SGEMM kernels.

>>> import numpy as np, fastmm                                  # doctest: +SKIP
>>> a = fastmm.asarray(np.random.rand(1024, 1024).astype(np.float32))
>>> c = a @ a                 # fastmm's kernel; np.matmul(a, a), np.dot(a, a) too
>>> print(fastmm.explain(a, a))

Planning (`explain`, `kernel_names`, `use_kernel`) works without a GPU; arrays need CuPy and a GPU.
"""

from __future__ import annotations

from ._errors import (CompileError, CUDAError, CUDAUnavailableError, DeviceFaultError, KernelLoadError, LaunchError,
                      NvccNotFoundError, OutOfMemoryError, PerformanceWarning)
from ._plan import kernel_names, use_kernel

__version__ = "0.1.0"

__all__ = [
    "ndarray", "asarray", "asnumpy",
    "matmul", "dot", "inner", "vdot", "tensordot", "einsum", "matvec", "vecmat", "vecdot",
    "explain", "use_kernel", "kernel_names",
    "CompileError", "CUDAError", "CUDAUnavailableError", "DeviceFaultError", "KernelLoadError", "LaunchError",
    "NvccNotFoundError", "OutOfMemoryError", "PerformanceWarning",
]

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


def explain(a, b, kernel=None) -> str:
    """Say which kernel ``matmul(a, b)`` runs, by which rule of the heuristic table, and why.

    `a` and `b` may be arrays (fastmm, CuPy, NumPy) or shapes (tuples), in which case C-ordered float32
    operands are assumed. Without a GPU the plan assumes an H100/H200.
    """
    import numpy as np

    from . import _dispatch, _plan

    if isinstance(a, tuple):
        a = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), a, (0,) * len(a))
    if isinstance(b, tuple):
        b = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), b, (0,) * len(b))
    device = _plan.Device()
    try:
        import cupy

        if cupy.cuda.is_available():
            from . import _cuda

            device = _cuda.device(cupy.cuda.Device().id)
    except Exception:  # no CuPy, no GPU or no PyCUDA: plan for the assumed device
        pass
    planned = _dispatch.plan_matmul(a, b, device, kernel)
    if isinstance(planned, str):
        return planned
    problem, choice, notes = planned
    return choice.explain(problem, device) + "".join(f"\n  note    {n}" for n in notes)
