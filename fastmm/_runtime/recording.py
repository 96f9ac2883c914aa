"""Recording a product's launches, and replaying them: a product's launches depend only on shapes, strides,
alignment, device and forced kernel, so the steps of one call are recorded and later calls with the same signature
replay them with new pointers (gemm.py keeps the replays)."""

from __future__ import annotations

import functools

__all__ = ["Recorder", "replay"]


class Recorder(list):
    """The steps of one product, kept so that later products of the same signature can replay them.

    Steps are (Launch, a offset, b offset, c offset), offsets in bytes from the data pointers `base` of the
    top-level a, b and c, or a `_SplitKReplay` or `_SwappedReplay`. A None step means the product went through a
    copy or a temporary whose address changes per call: such a product is not replayed.
    """

    def __init__(self, a_ptr: int, b_ptr: int, c_ptr: int):
        super().__init__()
        self.base = (a_ptr, b_ptr, c_ptr)

    def launch(self, prepared, pa: int, pb: int, pc: int, swapped: bool = False) -> None:
        """A launch on pointers pa, pb, pc; `swapped`: of the transposed product, whose A is the caller's B."""
        if swapped:
            self.append(_SwappedReplay(prepared, pa - self.base[1], pb - self.base[0], pc - self.base[2]))
        else:
            self.append((prepared, pa - self.base[0], pb - self.base[1], pc - self.base[2]))


class _SwappedReplay:
    """Replay of a launch on the transposed product C^T = B^T A^T (few rows on the few-column kernel)."""

    __slots__ = ("prepared", "db", "da", "dc")

    def __init__(self, prepared, db: int, da: int, dc: int):
        self.prepared, self.db, self.da, self.dc = prepared, db, da, dc

    def __call__(self, pa: int, pb: int, pc: int):
        self.prepared(pb + self.db, pa + self.da, pc + self.dc)


def replay(steps, a, b, c) -> None:
    _replay(steps, a.data.ptr, b.data.ptr, c.data.ptr)


def _runner(steps):
    """One callable that replays `steps` on (pa, pb, pc): the step itself where there is one and it needs no offsets
    (a single launch on the operands' own addresses, or a single replay object: every small product), else
    `_replay` over the steps. A replay then makes one call (the first is the same call `_replay` would make)."""
    if len(steps) == 1:
        (step,) = steps
        if type(step) is not tuple:
            return step
        prepared, da, db, dc = step
        if da == db == dc == 0:
            return prepared
    return functools.partial(_replay, steps)


def _replay(steps, pa: int, pb: int, pc: int) -> None:
    for step in steps:
        if type(step) is tuple:
            prepared, da, db, dc = step
            prepared(pa + da, pb + db, pc + dc)
        else:
            step(pa, pb, pc)
