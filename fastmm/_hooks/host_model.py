"""When `accelerate_numpy` sends a product to the GPU: a model of both sides (`HostModel`), fitted to this machine by
``python -m fastmm autotune --numpy-hook`` and kept in a file per host; and float64's, derived from float32's on GPUs
whose FP64 runs at full rate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from pathlib import Path

import numpy as np

__all__ = ["HostModel", "model_path", "load_model", "save_model", "blas_name", "float64_model", "complex_model",
           "dtype_models", "FULL_RATE_FP64", "compute_capability"]


# --------------------------------------------------------------------------------------------------------
# When the GPU is worth it: a model of both sides, fitted to measurements on this machine
# --------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HostModel:
    """When `accelerate_numpy` sends a product to the GPU: predicted times on the host and through the GPU.

    A product goes to the GPU when ``overhead + bytes / link + flops / gpu`` is less than ``flops / host``, where
    ``bytes`` counts the operands (a broadcast one once) and the result. The defaults are deliberately unfavourable
    to the GPU (a fast host, a slow link) until ``python -m fastmm autotune --numpy-hook`` measures this machine.

    Parameters
    ----------
    host : float
        NumPy's float32 matmul rate, FLOP/s.
    link : float
        Bytes per second of staging: host to pinned memory to the GPU and back, operands and result together.
    gpu : float
        fastmm's kernel rate, FLOP/s.
    overhead : float
        Seconds of fixed cost per offloaded product (the callback, allocations, synchronisation).
    memory : float
        Bytes per second NumPy's loop reads its operands at, at best: a thin product (matrix times vector) is bound
        by it, not by FLOPs. Used only where an operand stays on the GPU (`bound_seconds`); the default is a
        fast host's, so that the GPU is not credited with more than it wins.
    measured : str
        Where the figures come from: empty for the defaults, else the file that holds them.

    See Also
    --------
    accelerate_numpy : Takes one.

    Examples
    --------
    >>> from fastmm import HostModel
    >>> m = HostModel(host=1e12, link=25e9, gpu=50e12, overhead=100e-6)
    >>> m.offloads(1, 4096, 4096, 4096), m.offloads(1, 8192, 8192, 1)
    (True, False)
    """

    host: float = 1.5e12
    link: float = 8.0e9
    gpu: float = 30.0e12
    overhead: float = 300e-6
    memory: float = 60.0e9
    measured: str = ""  # where the figures come from: "" for the defaults, else the file that holds them
    itemsize: int = 4  # bytes an element: 4 for float32's model, 8 for float64's and complex64's, 16 for complex128's

    def numpy_seconds(self, batch, m, k, n) -> float:
        return 2.0 * batch * m * k * n / self.host

    def bound_seconds(self, batch, m, k, n, a_batch=None, b_batch=None) -> float:
        """NumPy's time, FLOPs or bytes read, whichever takes longer."""
        a_batch = batch if a_batch is None else a_batch
        b_batch = batch if b_batch is None else b_batch
        nbytes = self.itemsize * (a_batch * m * k + b_batch * k * n + batch * m * n)
        return max(self.numpy_seconds(batch, m, k, n), nbytes / self.memory)

    def gpu_seconds(self, batch, m, k, n, a_batch=None, b_batch=None, resident=(False, False)) -> float:
        """The time through the GPU; an operand `resident` there already crosses no link."""
        a_batch = 0 if resident[0] else batch if a_batch is None else a_batch
        b_batch = 0 if resident[1] else batch if b_batch is None else b_batch
        nbytes = self.itemsize * (a_batch * m * k + b_batch * k * n + batch * m * n)
        return self.overhead + nbytes / self.link + 2.0 * batch * m * k * n / self.gpu

    def upload_seconds(self, nbytes) -> float:
        return nbytes / self.link

    def offloads(self, batch, m, k, n, a_batch=None, b_batch=None) -> bool:
        return self.gpu_seconds(batch, m, k, n, a_batch, b_batch) < self.numpy_seconds(batch, m, k, n)

    def min_flops(self) -> float:
        """The fewest FLOPs any offloaded product has: that of the smallest square product the model offloads.

        A square product moves the fewest bytes for its FLOPs, so a product with fewer FLOPs than this one never
        wins; the C loop uses it to decide in nanoseconds without asking Python.
        """
        s = 1.0
        while s < 1e6:
            if self.offloads(1, s, s, s):
                return 2.0 * s ** 3
            s = math.ceil(s * 1.05)
        return math.inf

    def threshold_text(self) -> str:
        flops = self.min_flops()
        side = round((flops / 2) ** (1 / 3)) if math.isfinite(flops) else None
        src = f"measured ({self.measured})" if self.measured else "defaults, not measured on this machine"
        return (f"float32 products of {flops / 1e9:.3g} GFLOP and up (a {side}^3 square product) when the GPU is "
                f"predicted faster; {src}" if side else f"never (the GPU is never predicted faster; {src})")


def model_path() -> Path:
    """Where `autotune --numpy-hook` keeps this machine's figures: one JSON file per host CPU, BLAS and GPU."""
    from ..kernels.build import cache_dir

    return cache_dir().parent / "numpy_hook" / f"{_host_key()}.json"


def _host_key() -> str:
    import hashlib

    cpu = platform.processor() or platform.machine()
    ident = f"{platform.node()}|{cpu}|{os.cpu_count()}|numpy {np.__version__}|{blas_name()}|{_gpu_name()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def blas_name() -> str:
    """The BLAS NumPy was built with (name and version), which sets the host's side of the model."""
    try:
        deps = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{deps.get('name', '?')} {deps.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older NumPy: the key only gets less specific
        return "unknown BLAS"


def _gpu_name() -> str:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())["name"].decode()
    except Exception:  # noqa: BLE001 - no GPU: the figures would be of no use anyway
        return "no gpu"


_LATER = {"memory"}  # figures that files written before them lack: the default then


def load_model() -> HostModel:
    """This machine's measured model, or the defaults (also when the file is unreadable: never an error)."""
    path = model_path()
    try:
        fields = json.loads(path.read_text())["model"]
        return HostModel(**{f.name: float(fields[f.name]) for f in dataclasses.fields(HostModel)
                            if f.name not in ("measured", "itemsize") and (f.name in fields or f.name not in _LATER)},
                         measured=str(path))
    except (OSError, ValueError, KeyError, TypeError):
        return HostModel()


def save_model(model: HostModel, measurements: list[dict]) -> Path:
    path = model_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"model": {f.name: getattr(model, f.name) for f in dataclasses.fields(HostModel)
                      if f.name not in ("measured", "itemsize")},
            "measurements": measurements}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    return path


# GPUs whose FP64 runs at full rate (compute capability): P100, V100, A100, H100/H200, B200. Elsewhere FP64 runs
# at 1/32-1/64 of FP32, no faster than a many-core host's DGEMM, and float64 products stay NumPy's.
FULL_RATE_FP64 = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}


def compute_capability() -> tuple[int, int] | None:
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        return int(props["major"]), int(props["minor"])
    except Exception:  # noqa: BLE001 - no GPU
        return None


def float64_model(model: HostModel, capability: tuple[int, int] | None) -> HostModel | None:
    """float64's model, from float32's: NumPy's DGEMM at half its SGEMM rate, the GPU's FP64 (cuBLAS) at half of
    fastmm's FP32 rate on full-rate FP64 GPUs, eight bytes an element; None (float64 stays NumPy's) on the others.
    An estimate, not a measurement of this machine."""
    if capability not in FULL_RATE_FP64:
        return None
    return dataclasses.replace(model, host=model.host / 2, gpu=model.gpu / 2, itemsize=8, measured="")


def complex_model(model: HostModel) -> HostModel:
    """A complex dtype's model from its real dtype's (complex64 from float32's, complex128 from float64's): a complex
    multiply-add is four real ones, so both sides run a quarter as many of the model's (2 M N K) FLOPs a second, on
    elements twice the size; NumPy's CGEMM/ZGEMM and cuBLAS's run at about their real rates. An estimate, not a
    measurement of this machine."""
    return dataclasses.replace(model, host=model.host / 4, gpu=model.gpu / 4, itemsize=2 * model.itemsize, measured="")


def dtype_models(model: HostModel, model64: HostModel | None) -> dict:
    """Each dtype's model from float32's and float64's (None: float64 and complex128 stay NumPy's)."""
    return {"float32": model, "float64": model64, "complex64": complex_model(model),
            "complex128": model64 and complex_model(model64)}
