"""accelerate_cupy(): float32 products of plain CuPy code on fastmm's kernels, by rebinding CuPy's public names.

Code written against CuPy, and array-API libraries that resolve a CuPy array to CuPy's namespace (scikit-learn
through ``array_api_compat``), call ``cupy.matmul``, ``cupy.tensordot``, ``x @ y`` and so on directly: NumPy's
dispatch protocols are never consulted, and their results are plain ``cupy.ndarray``s. So the hook replaces the
names those calls go through, and nothing else:

* module attributes: ``cupy.matmul``, ``cupy.linalg.matmul``, ``cupy.dot``, ``cupy.inner``, ``cupy.vdot``,
  ``cupy.tensordot``, ``cupy.einsum``: looked up at call time by ``cupy.X(...)`` calls, by
  ``array_api_compat``'s CuPy namespace (``xp.matmul`` is a wrapper that calls ``cupy.matmul``) and by CuPy's
  own Python code (``cupy.linalg.matrix_power``, ``cupy.einsum``'s pairwise products, ``cupy.dot``'s call of
  the ``dot`` method);
* two methods of ``cupy.ndarray`` (a Python class over CuPy's compiled base, so its attributes can be set):
  ``__matmul__`` (``x @ y``, and ``x @= y``, which CuPy computes as ``x = x @ y``) and ``dot``.

Each replacement takes only float32 operands that are ``cupy.ndarray``s (or fastmm arrays, whose results stay fastmm
arrays) on the current device, in the call forms
fastmm's dispatch implements with CuPy's semantics; anything else goes to the original, untouched. A product
that the plan knows to trail cuBLAS (`fastmm._plan.CUBLAS_AHEAD`) is handed to CuPy before any launch, and a
failure inside fastmm is retried by CuPy, with one `PerformanceWarning`; an error CuPy would raise (a shape
mismatch, say) is CuPy's own error, raised by CuPy.

Not covered: names bound before the hook was installed (``from cupy import matmul``; ``cupy.linalg._product``'s
internals), CuPy's compiled internals that call cuBLAS directly (``cupy.linalg.solve``, ``cupy.cublas``), and
``y @ x`` where ``y`` is not a CuPy array (``cupy.ndarray.__rmatmul__``).

This module sits on top of fastmm, beside the array type: it calls the dispatch layer, as `fastmm.matmul` does.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading

import numpy as np

from .._dispatch import products as _dispatch
from .. import _plan
from .._errors import warn_once
from .._runtime import compiling as _compiling
from .._switch import Hook, Switch

__all__ = ["accelerate_cupy", "restore_cupy", "cupy_hook_status"]

_F32 = np.dtype(np.float32)
_ABSENT = object()
_log = logging.getLogger("fastmm")


class _State:
    def __init__(self):
        # (owner, name) -> (what was there, or _ABSENT; what the hook put there)
        self.saved: dict[tuple[object, str], tuple[object, object]] = {}
        self.fastmm = 0      # products fastmm's kernels computed
        self.to_cupy = 0     # products left to CuPy: where cuBLAS is ahead, or forms fastmm does not take
        self.declined = 0    # products CuPy computed after fastmm failed
        self.counting = threading.Lock()
        self.device = _dispatch.current_device  # the current device's id (tests put a stand-in here)

    def count(self, name: str) -> None:
        with self.counting:
            setattr(self, name, getattr(self, name) + 1)


_state = _State()
_on_off = Switch(lambda: _install(), lambda: _uninstall())


# Set while CuPy's original runs a product the hook handed it: CuPy's own code calls rebound names (cupy.dot calls
# the dot method, cupy.einsum calls cupy.matmul), which must then go straight to CuPy rather than try fastmm again.
_in_cupy: contextvars.ContextVar[bool] = contextvars.ContextVar("fastmm_cupy_hook_in_cupy", default=False)


def _takes(*arrays) -> bool:
    """Every argument is a float32 plain CuPy array or fastmm array on the current device (or None, for an absent
    `out`).

    Another library's subclass keeps what CuPy does with it, its own methods included; a fastmm array was made for
    fastmm's kernels, so ``cupy.matmul`` on it (``array_api_compat``'s ``xp.matmul``) runs them too."""
    cp = _dispatch._cupy()
    device = None
    for x in arrays:
        if x is None:
            continue
        if type(x) is not cp.ndarray and _fastmm_result(x) is None or x.dtype != _F32:
            return False
        if device is None:
            device = _state.device()
        if x.data.device_id != device:
            return False
    return True


def _fastmm_result(x):
    """For a fastmm array, what makes a CuPy result one (its type's ``__fastmm_result__``); else None."""
    return getattr(type(x), "__fastmm_result__", None)


def _cupy(cupys):
    token = _in_cupy.set(True)
    try:
        return cupys()
    finally:
        _in_cupy.reset(token)


def _what(name, arrays) -> str:
    """The product a log line names: the rebound name and the operands' shapes (``out`` included)."""
    return f"{name} of {', '.join('x'.join(map(str, x.shape)) for x in arrays if x is not None)}"


def _run(ours, cupys, name="product", arrays=()):
    """`ours()` on fastmm's kernels; CuPy's `cupys()` where the plan yields to cuBLAS or fastmm failed."""
    failure = why = None
    try:
        with _plan.yield_to_cublas(), _compiling.in_background():  # (never a wait for nvcc: cuBLAS answers)
            result = ours()
    except _plan.CublasAhead as e:
        why = f"cuBLAS is ahead: {e}"
    except _compiling.KernelCompiling as e:
        why = str(e)
    except (ValueError, TypeError):
        # fastmm refused the arguments: a form CuPy may accept (then CuPy's result, no failure to report) or
        # refuse (then CuPy's own error, raised by CuPy).
        why = "a call form fastmm does not take"
    except Exception as e:  # noqa: BLE001 - anything else: a failure inside fastmm; CuPy computes the product
        failure = e
        why = f"after fastmm failed: {type(e).__name__}"
    else:
        _state.count("fastmm")
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("cupy hook: %s on fastmm's kernels", _what(name, arrays))
        return result
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("cupy hook: %s left to CuPy (%s)", _what(name, arrays), why)
    # Outside the except blocks, so that CuPy's error (for a call CuPy refuses too) is raised as CuPy raises it.
    result = _cupy(cupys)
    if failure is None:
        _state.count("to_cupy")
        return result
    _state.count("declined")
    warn_once(f"cupy-hook-{type(failure).__name__}",
              f"fastmm's CuPy hook could not run a float32 product on fastmm's kernels, so CuPy computed it "
              f"({type(failure).__name__}: {failure}); later products still try fastmm", stacklevel=4)
    return result


# What each replacement takes: `pick(args, kwargs)` gives the arrays that must all be float32 CuPy arrays on the
# current device for fastmm to take the call (None: a call form left to CuPy); `ours` is fastmm's function of
# the same signature. Only call forms that fastmm's dispatch implements with CuPy's (and NumPy's) semantics.

def _two(args, kwargs):
    """Two positional arrays."""
    return args if len(args) == 2 and not kwargs else None


def _with_out(args, kwargs):
    """Two positional arrays and optionally `out`, positionally or by keyword."""
    if set(kwargs) <= {"out"} and (len(args) == 2 or len(args) == 3 and not kwargs):
        return (*args, *kwargs.values())
    return None


def _with_out_keyword(args, kwargs):
    """Two positional arrays and optionally `out` by keyword (cupy.matmul, a gufunc, takes no positional `out`)."""
    if set(kwargs) <= {"out"} and len(args) == 2:
        return (*args, *kwargs.values())
    return None


def _with_axes(args, kwargs):
    """Two positional arrays and optionally `axes` (not an array), positionally or by keyword."""
    if set(kwargs) <= {"axes"} and (len(args) == 2 or len(args) == 3 and not kwargs):
        return args[:2]
    return None


def _einsum_form(args, kwargs):
    """Two operands, in the subscripts form (``"ij,jk->ik", a, b``) or the sublist form (``a, [0, 1], b, [1, 2]``)."""
    if not set(kwargs) <= {"optimize"}:
        return None
    if len(args) == 3 and isinstance(args[0], str):
        return args[1:]
    if len(args) in (4, 5) and all(isinstance(args[i], (list, tuple)) for i in range(1, len(args), 2)):
        return args[0], args[2]
    return None


_METHOD_FORMS = {
    "__matmul__": (_two, lambda a, b: _dispatch.matmul(a, b)),
    "dot": (_with_out, lambda a, b, out=None: _dispatch.dot(a, b, out=out)),
}
_FUNCTION_FORMS = {
    "matmul": (_with_out_keyword, lambda a, b, out=None: _dispatch.matmul(a, b, out=out)),
    "dot": (_with_out, lambda a, b, out=None: _dispatch.dot(a, b, out=out)),
    "tensordot": (_with_axes, lambda a, b, axes=2: _dispatch.tensordot(a, b, axes)),
    "inner": (_two, lambda a, b: _dispatch.inner(a, b)),
    "vdot": (_two, lambda a, b: _dispatch.vdot(a, b)),
    "einsum": (_einsum_form, lambda *args, **kwargs: _dispatch.einsum(*args, **kwargs)),
}


def _replacement(original, pick, ours):
    def hooked(*args, **kwargs):
        # (Not active: a reference taken while the hook was on, called after restore_cupy.)
        if _on_off.active and not _in_cupy.get():
            arrays = pick(args, kwargs)
            if arrays is not None and _takes(*arrays):
                result = _run(lambda: ours(*args, **kwargs), lambda: original(*args, **kwargs),
                              getattr(original, "__name__", "product"), arrays)
                # Operands that are fastmm arrays give one, as NumPy's functions on them do; an `out` is returned
                # itself, whatever its type, as CuPy returns it.
                wrap = next((w for w in map(_fastmm_result, arrays) if w is not None), None)
                if wrap is None or any(result is x for x in arrays):
                    return result
                return wrap(result)
        return original(*args, **kwargs)
    return hooked


def _entries(cp):
    """(owner, name, (pick, ours)) for everything the hook rebinds, where this CuPy has it."""
    owners = [(cp, _FUNCTION_FORMS), (cp.linalg, {"matmul": _FUNCTION_FORMS["matmul"],
                                                  "tensordot": _FUNCTION_FORMS["tensordot"]}),
              (cp.ndarray, _METHOD_FORMS)]
    return [(owner, name, form) for owner, forms in owners for name, form in forms.items() if hasattr(owner, name)]


def covered() -> list[str]:
    """The names the hook rebinds in this CuPy, as a user would write them."""
    cp = _dispatch._cupy()
    return [f"{'cupy.ndarray' if owner is cp.ndarray else owner.__name__}.{name}" for owner, name, _ in _entries(cp)]


def _install() -> None:
    cp = _dispatch._cupy()
    _dispatch.cupy_own()  # CuPy's own functions, taken before any name is rebound
    made = {}  # one replacement per original: cupy.linalg.matmul stays the same object as cupy.matmul
    try:
        for owner, name, (pick, ours) in _entries(cp):
            original = getattr(owner, name)
            was = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else original
            hooked = made.get(id(original))
            if hooked is None:
                hooked = made[id(original)] = _replacement(original, pick, ours)
                functools.update_wrapper(hooked, original)  # name, docstring, and __wrapped__ for introspection
            setattr(owner, name, hooked)
            _state.saved[(owner, name)] = (was, hooked)  # recorded once it is really there
    except BaseException:
        _uninstall()
        raise


def _uninstall() -> None:
    """Put back what the hook replaced; a name someone else rebound since is theirs, and left as it is."""
    try:
        for (owner, name), (was, hooked) in _state.saved.items():
            if (owner.__dict__ if isinstance(owner, type) else vars(owner)).get(name) is not hooked:
                continue
            if was is _ABSENT:
                delattr(owner, name)  # the type inherits its base's method again
            else:
                setattr(owner, name, was)
    finally:
        _state.saved.clear()


# --------------------------------------------------------------------------------------------------------
# Public
# --------------------------------------------------------------------------------------------------------

class accelerate_cupy(Hook):
    """Run float32 products of plain CuPy code on fastmm's kernels, from now on.

    Rebinds ``cupy.matmul``, ``cupy.linalg.matmul``, ``cupy.dot``, ``cupy.inner``, ``cupy.vdot``,
    ``cupy.tensordot``, ``cupy.einsum`` and the ``@`` operator and ``dot`` method of ``cupy.ndarray`` to
    versions that send products of float32 CuPy arrays through fastmm's dispatch and kernels. Every other dtype,
    call form and function runs CuPy's own code. Array-API libraries that use CuPy's namespace (scikit-learn with
    ``array_api_dispatch=True``) reach fastmm this way. Results are plain ``cupy.ndarray``s, as CuPy's are (fastmm
    arrays where an operand is one).
    Idempotent and thread-safe; `restore_cupy` undoes it. As a context manager (``with fastmm.accelerate_cupy():``)
    it keeps the hook on for the block: blocks in several threads may overlap, and the hook stays on until the
    last one exits, or for good if a plain call turned it on.

    Raises
    ------
    ImportError
        When CuPy is not installed.

    Notes
    -----
    Products where the bench measured cuBLAS ahead of fastmm's kernels (matrix-vector and few-column products,
    long K on few tiles, less than a wave of tiles, unaligned rows: `fastmm.explain` says so for a shape) are
    left to CuPy, so the hook never makes a product slower than CuPy alone. Results match CuPy's to float32
    accuracy (relative error about 1e-6), not bit for bit. A failure inside fastmm (no ``nvcc``, a driver fault)
    never loses a result: CuPy computes it, with one `PerformanceWarning`. Names bound before the hook was
    installed (``from cupy import matmul``) keep CuPy's function: see the hooks page of the documentation.

    See Also
    --------
    restore_cupy : Put CuPy's own functions back.
    cupy_hook_status : Whether the hook is on and what it did.
    accelerate_numpy : The same for plain NumPy code.

    Examples
    --------
    >>> import cupy as cp, fastmm
    >>> with fastmm.accelerate_cupy():                      # doctest: +SKIP
    ...     x = cp.random.rand(4096, 4096, dtype=cp.float32)
    ...     c = x @ x.T                                     # fastmm's kernel; c is a cupy.ndarray
    """

    _switch, _name = _on_off, "CuPy hook"


def restore_cupy() -> None:
    """Put CuPy's own functions and methods back: CuPy is then exactly as it was before `accelerate_cupy`.

    Idempotent and thread-safe. A product already inside a replacement finishes there.

    Returns
    -------
    None

    See Also
    --------
    accelerate_cupy : Turn the hook on.

    Examples
    --------
    >>> import fastmm
    >>> fastmm.restore_cupy()             # nothing to undo: a no-op
    >>> fastmm.cupy_hook_status()["active"]
    False
    """
    _on_off.off()


def cupy_hook_status() -> dict:
    """The state of the CuPy hook: on or off, what it rebinds, and what it did.

    Returns
    -------
    dict
        ``active`` (bool), ``covers`` (the rebound names while active, else an empty list), ``fastmm`` (products
        fastmm's kernels computed), ``left_to_cupy`` (products the plan left to cuBLAS, where it is measured
        ahead) and ``declined_after_failure`` (products CuPy computed because fastmm's path failed).

    See Also
    --------
    accelerate_cupy : Turn the hook on.
    restore_cupy : Turn it off.

    Examples
    --------
    >>> import fastmm
    >>> sorted(fastmm.cupy_hook_status())
    ['active', 'covers', 'declined_after_failure', 'fastmm', 'left_to_cupy']
    """
    with _on_off.lock:
        return {"active": _on_off.active, "covers": covered() if _on_off.active else [], "fastmm": _state.fastmm,
                "left_to_cupy": _state.to_cupy, "declined_after_failure": _state.declined}
