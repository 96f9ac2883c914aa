"""The NumPy hook's replacement for np.matmul's inner loop, and NumPy's table of loops it goes into.

The loop is a small C file (hostloop.c, compiled on first use with the machine's C compiler) that asks fastmm's side
(`numpy_hook._offload`, a ctypes callback) only about products with enough work, or a ctypes callback where no
compiler exists (the same behaviour, about a microsecond more per small product).
"""

from __future__ import annotations

import _thread
import ctypes
import math
import threading
import time

import numpy as np

from . import hostmem as _hostmem
from .host_model import HostModel

# NumPy's type numbers of float32, float64, complex64 and complex128 (stable since NumPy 1.0)
_NPY_FLOAT, _NPY_DOUBLE, _NPY_CFLOAT, _NPY_CDOUBLE = 11, 12, 14, 15
_ARGS = ctypes.POINTER(ctypes.c_void_p)
_INTS = ctypes.POINTER(ctypes.c_ssize_t)
_LOOP = ctypes.CFUNCTYPE(None, _ARGS, _INTS, _INTS, ctypes.c_void_p)
_OFFLOAD = ctypes.CFUNCTYPE(ctypes.c_int, _ARGS, _INTS, _INTS)
# PYFUNCTYPE: called with the GIL held, so no NumPy call runs its loop setup while the pointer is swapped.
_REPLACE = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_void_p))
_REPLACE_INDEX = 30  # PyUFunc_ReplaceLoopBySignature's slot in NumPy's ufunc C-API table (numpy/__ufunc_api.h)
_DECLINED, _DONE, _INTERRUPTED = 0, 1, 2  # what fastmm's part of the loop did (as in hostloop.c)


# --------------------------------------------------------------------------------------------------------
# NumPy's loop table
# --------------------------------------------------------------------------------------------------------

def _replace_loop(new: int, type_num: int = _NPY_FLOAT) -> int:
    """Put `new` in np.matmul's loop slot for `type_num` (one of the hook's dtypes); return what was there."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as umath
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = ctypes.cast(get(umath._UFUNC_API, None), ctypes.POINTER(ctypes.c_void_p))
    replace = _REPLACE(table[_REPLACE_INDEX])
    signature = (ctypes.c_int * 3)(type_num, type_num, type_num)
    old = ctypes.c_void_p()
    if replace(np.matmul, new, signature, ctypes.byref(old)) != 0 or not old.value:
        raise RuntimeError("NumPy refused to replace an np.matmul loop (PyUFunc_ReplaceLoopBySignature "
                           f"failed on NumPy {np.__version__}); fastmm's NumPy hook cannot work with this NumPy")
    return old.value


# --------------------------------------------------------------------------------------------------------
# The loop: C where a compiler exists, ctypes otherwise; both kept for the life of the process
# --------------------------------------------------------------------------------------------------------

class Shim:
    """The replacement loop and its settings. Never freed: a thread inside NumPy may still call it after an
    uninstall (it read the loop's address before), and then finds NumPy's loop through it.

    NumPy's own loop is learnt from the first install (the slot's previous content), and the loop waits for it in
    the microseconds between that swap and `set_numpy_loop`, should another thread arrive then.
    """

    def __init__(self, offload, lock):
        self.numpy_loop = None
        self._offload = offload  # fastmm's side, for this loop's dtype
        self._installing = lock  # held by the hook's switch while it installs the loop
        self.offload = _OFFLOAD(self._offload)
        self.lib = compile_c_loop()  # a library of its own: each dtype's loop has its own statics
        if self.lib is not None:
            self.kind = "C"
            self.lib.fastmm_configure.argtypes = [ctypes.c_void_p, ctypes.c_double]
            self.lib.fastmm_set_numpy_loop.argtypes = [ctypes.c_void_p]
            self.lib.fastmm_set_python_api.argtypes = [ctypes.c_void_p] * 5
            api = ctypes.pythonapi
            self.lib.fastmm_set_python_api(
                *(ctypes.cast(f, ctypes.c_void_p) for f in (api.PyGILState_Ensure, api.PyGILState_Release,
                                                             api.PyErr_Occurred, api.PyErr_SetNone)),
                ctypes.c_void_p.in_dll(api, "PyExc_KeyboardInterrupt"))
            self.address = ctypes.cast(self.lib.fastmm_matmul_loop, ctypes.c_void_p).value
            self.lib.fastmm_below_threshold.restype = ctypes.c_longlong
            self.lib.fastmm_loop_times.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
            self.lib.fastmm_configure_resident.argtypes = [ctypes.c_void_p] + [ctypes.c_double] * 4
        else:
            self.kind = "ctypes"
            self._numpy = None
            self._loop = _LOOP(self._python_loop)
            self.address = ctypes.cast(self._loop, ctypes.c_void_p).value
        self.min_flops = math.inf
        self.on = False
        self._below = 0  # the ctypes loop's count of products below the threshold (the C loop keeps its own)
        self._times = [0] * 5  # the ctypes loop's times, as the C loop's (fastmm_loop_times)
        self._times_lock = threading.Lock()

    def below_threshold(self) -> int:
        """Products the loop left to NumPy without asking fastmm: too little work for the GPU."""
        return self.lib.fastmm_below_threshold() if self.lib is not None else self._below

    def _add(self, *deltas: int) -> None:
        """The ctypes loop's counters (threads multiply at once): gpu ns and products, numpy ns and products,
        declined ns, as fastmm_loop_times orders them."""
        with self._times_lock:
            for i, d in enumerate(deltas):
                self._times[i] += d

    def times(self) -> dict:
        """Seconds and products, since the first install: on fastmm's path (the GPU, staging included), in NumPy's
        own loop, and in fastmm's part for products it then declined."""
        if self.lib is not None:
            raw = (ctypes.c_longlong * 5)()
            self.lib.fastmm_loop_times(raw)
        else:
            raw = self._times
        return {"gpu_seconds": raw[0] * 1e-9, "gpu_products": raw[1], "numpy_seconds": raw[2] * 1e-9,
                "numpy_products": raw[3], "declined_seconds": raw[4] * 1e-9}

    def set_numpy_loop(self, address: int) -> None:
        self.numpy_loop = address
        if self.lib is not None:
            self.lib.fastmm_set_numpy_loop(address)
        else:
            self._numpy = _LOOP(address)

    def configure(self, on: bool, min_flops: float) -> None:
        self.on, self.min_flops = on, min_flops
        if self.lib is not None:
            self.lib.fastmm_configure(ctypes.cast(self.offload, ctypes.c_void_p) if on else None,
                                      min_flops if math.isfinite(min_flops) else 1e300)

    def configure_resident(self, candidate: int | None, model: HostModel) -> None:
        """Below the threshold, ask fastmm about products that read a block of its allocator (`candidate`: hostalloc.c's
        check) and that NumPy takes at least 4 overheads for: with an operand on the GPU they may win there; the
        question (microseconds) then costs NumPy's loop about a percent at most. None: never (the cache is off)."""
        if self.lib is not None:
            self.lib.fastmm_configure_resident(candidate, model.host, model.memory, float(model.itemsize),
                                               4 * model.overhead)

    def _python_loop(self, args, dims, steps, data):
        if self._numpy is None:  # the first install's swap is still finishing (see the class docstring)
            with self._installing:
                pass
        outcome = _DECLINED
        start = asked = time.perf_counter_ns()
        if self.on and 2.0 * dims[0] * dims[1] * dims[2] * dims[3] >= self.min_flops:
            outcome = self._offload(args, dims, steps)
            asked = time.perf_counter_ns()
        elif self.on:
            self._below += 1
        if outcome == _DONE:
            self._add(asked - start, 1)
        else:
            self._numpy(args, dims, steps, data)
            self._add(0, 0, time.perf_counter_ns() - asked, 1, asked - start)
        if outcome == _INTERRUPTED:
            # A ctypes callback cannot leave an exception for NumPy to raise, as the C loop does: the interrupt is
            # simulated, and reaches the main thread at its next check for signals. The result is whole either way.
            _thread.interrupt_main()


def compile_c_loop():
    """fastmm/_hooks/hostloop.c built and loaded (once per process), or None where it cannot be."""
    return _hostmem.compile_c("hostloop.c", "fastmm's NumPy hook runs NumPy's loop through a ctypes callback, which "
                              "adds about a microsecond to every matmul of the dtypes it takes")
