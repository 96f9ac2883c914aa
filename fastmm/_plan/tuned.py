"""Autotuned entries, written by ``python -m fastmm autotune`` (fastmm/_tools/autotune.py) and only read here;
and the memo of decisions, which a new entry clears."""

from __future__ import annotations

from typing import Callable

from .problem import Choice, Device, Problem

__all__ = ["tune_bucket", "tune_cache_path", "tuned_entries", "reload_tuned", "on_reload"]

# --------------------------------------------------------------------------------------------------------
# Autotuned entries: written by fastmm/_tools/autotune.py (which times candidates on the GPU), only read here.
# --------------------------------------------------------------------------------------------------------

def _size_class(x: int) -> int:
    """x rounded up to the grid 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and the halfway 1.5x steps).

    Powers of two alone put 768 with 1024, where the best tile differs (measured: 64x64 wins at 768^3 by 5%).
    """
    p = 1 << max(0, (x - 1).bit_length())
    return p * 3 // 4 if p >= 4 and x <= p * 3 // 4 else p


def tune_bucket(problem: Problem) -> str:
    """The class of problems one tuned entry stands for: sizes rounded up to `_size_class`, batched or not,
    and the layout variant (nn/tn/nt/tt, v4/v1)."""
    p = problem
    return (f"{_size_class(p.m)}x{_size_class(p.n)}x{_size_class(p.k)}{'_batched' if p.batch > 1 else ''}"
            f"_{p.variant.suffix}")


def tune_cache_path(device: Device):
    """Per GPU model, driver and fastmm version, under the user's cache directory ($FASTMM_CACHE_DIR too)."""
    import re

    from .._version import __version__
    from ..kernels.build import cache_dir

    slug = re.sub(r"[^A-Za-z0-9]+", "-", device.name).strip("-")
    return cache_dir().parent / "autotune" / f"{slug}-{device.arch}-drv{device.driver_version}-fastmm{__version__}.json"


_tuned: dict[Device, dict] = {}
_reload_hooks: list[Callable[[], None]] = []


def tuned_entries(device: Device) -> dict:
    """The autotune cache for `device` (read once per process; empty when absent or unreadable)."""
    entries = _tuned.get(device)
    if entries is None:
        import json

        try:
            entries = json.loads(tune_cache_path(device).read_text()).get("entries", {})
        except (OSError, ValueError):
            entries = {}
        _tuned[device] = entries
    return entries


def reload_tuned() -> None:
    """Forget cached decisions after the autotune cache changed (the dispatcher's replays too)."""
    _tuned.clear()
    _memo.clear()
    for hook in _reload_hooks:
        hook()


def on_reload(hook: Callable[[], None]) -> None:
    _reload_hooks.append(hook)


_memo: dict[tuple, Choice] = {}
