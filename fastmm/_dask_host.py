"""Chunks between host memory and the GPU for `fastmm.dask`: up as a task needs them, and down either as new NumPy
chunks or straight into the place of a host array that receives the result (`fastmm.dask.store`)."""

from __future__ import annotations

import uuid

import numpy as np

from . import _array
from ._dispatch import products as _dispatch
from ._hooks import staged as _staged


def to_fastmm(block):
    # Host float32 chunks go up through fastmm's pinned staging (the link's full speed: an out-of-core product
    # uploads every chunk once per use), anything else as fastmm.asarray does.
    if isinstance(block, np.ndarray) and block.ndim >= 1 and _staged.stages(block):
        return _array._wrap(_staged.to_device(block))
    return _array.asarray(block)


def to_numpy(block):
    # Float32 chunks come down through fastmm's staging threads (pinned memory, streams of their own), as they went
    # up: a download waits for the kernels queued before it, not for those other tasks queue while it copies, and
    # moves at the link's speed rather than that of copies into ordinary memory.
    return _staged.to_host(block) if isinstance(block, _dispatch._cupy().ndarray) else _array.asnumpy(block)


def host_target(target):
    """What `fastmm.dask.store` hands to `dask.array.store` for `target`: a CuPy (or fastmm) array as it is (Dask
    copies device to device), anything else wrapped in a `HostTarget`."""
    return target if isinstance(target, _dispatch._cupy().ndarray) else HostTarget(target)


class HostTarget:
    """Where `dask.array.store` writes a block: a device block comes down straight into its region of a NumPy array
    (or memory map), with no new host array made and copied there after (a page-faulted allocation and a second pass
    over the block's bytes); into other targets (h5py, Zarr) as a NumPy block."""

    def __init__(self, target):
        self.target = target
        self.shape, self.dtype, self.ndim = target.shape, target.dtype, len(target.shape)
        # NumPy's own arrays alone: a subclass (a masked array, say) has a setitem of its own to go through.
        self.direct = type(target) in (np.ndarray, np.memmap)
        self.token = uuid.uuid4().hex

    def __getitem__(self, index):  # (store's return_stored=True)
        return self.target[index]

    def __dask_tokenize__(self):
        # The store's task names: Dask hashes a NumPy target's bytes (or pickles an object holding one) each time a
        # store is built; for a result of 32768^2 float32 that took longer than a fifth of the product. One token per
        # target object: two stores are never the same.
        return type(self).__name__, self.token

    def __reduce__(self):
        raise TypeError("fastmm.dask.store writes into this process's memory, and its target cannot be sent to "
                        "another process: compute it with a local scheduler (scheduler='threads'), or store "
                        "fastmm.dask.to_host(x) with dask.array.store into a file-backed target")

    def __setitem__(self, index, block) -> None:
        cp = _dispatch._cupy()
        if isinstance(block, cp.ndarray) and self.direct:
            region = self.target[index]
            if (region.shape == block.shape and region.dtype == block.dtype and _staged.comes_down(block)
                    and np.may_share_memory(region, self.target)):
                _staged.to_region(block, region)
                return
        self.target[index] = to_numpy(block) if isinstance(block, cp.ndarray) else block
