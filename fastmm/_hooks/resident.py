"""Operands that stay on the GPU: device copies of NumPy buffers that a program multiplies again unchanged.

Programs multiply the same matrix many times (A in power iteration, the data X of full-batch gradient descent), and
an offloaded product that uploads it every time loses to NumPy. So the hook keeps a device copy of such an operand,
in a cache bounded in bytes (least recently used first out), and uses it while the buffer is unchanged. "Unchanged"
is the allocator's to say (hostalloc.c, section 'Write tracking'): the block holding the operand is made read-only
when it is copied, the first write into it faults and gives it a new generation, and a copy is used only at the
generation it was made at. Views of a copied range (``X.T``, ``A[:, :k]``) are served from it.

When to pay the upload is a rent-or-buy rule (docs/numpy-hook.md, section 'Operands that stay on the GPU'): per
buffer, the seconds the program lost by not having it on the GPU (its uploads, or NumPy's time less the GPU's had it
been there), and the upload once they add up to its cost, so a program never loses more than about twice what
keeping it would have cost. A buffer whose bytes change between products (a sample of them, `_hostmem.fingerprint`)
starts again from zero: it is never made read-only for nothing.

Leaves the loop and the model to `numpy_hook`, the copies to `staged`, the tracking to `hostmem`.
"""

from __future__ import annotations

import collections
import math
import os
import threading

import numpy as np

from . import hostmem as _hostmem

__all__ = ["Resident", "Cache", "CupyDevice", "DEFAULT_SHARE", "cap_bytes", "operand_bytes"]

# By default the cache holds at most a quarter of the GPU memory free when it first copies an operand: the rest is
# left to the products' pieces and to the program's own CuPy work.
DEFAULT_SHARE = 4
_RENTS = 256  # buffers whose losses are counted at once (the least recently seen forgotten first)
_VIEWS = 8  # device views kept per copy (the layouts a program reads it in: A, A.T, a few slices)


class Resident:
    """An operand of a product whose device copy the cache holds: `host`, NumPy's view, and `dev`, the same elements
    on the GPU (same shape and strides)."""

    __slots__ = ("host", "dev")

    def __init__(self, host, dev):
        self.host, self.dev = host, dev

    shape = property(lambda self: self.host.shape)
    strides = property(lambda self: self.host.strides)
    dtype = property(lambda self: self.host.dtype)


class _Bytes:
    """`n` bytes of host memory at `ptr`, as a NumPy array (no copy)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, ptr, n):
        self.__array_interface__ = {"data": (ptr, True), "shape": (n,), "typestr": "|u1", "version": 3}


def span(ptr: int, shape, strides, itemsize: int) -> tuple[int, int] | None:
    """The bytes [lo, hi) that a view's elements lie in; None for an empty view."""
    if 0 in shape:
        return None
    lo = hi = ptr
    for d, s in zip(shape, strides):
        if s > 0:
            hi += s * (d - 1)
        else:
            lo += s * (d - 1)
    return lo, hi + itemsize


class CupyDevice:
    """The GPU through CuPy: copies up through `staged` (directly from page-locked blocks), views by pointer."""

    def free_bytes(self) -> int:
        from .._runtime import arrays as _arrays

        return int(_arrays.cupy().cuda.runtime.memGetInfo()[0])

    def prepare(self, host) -> None:
        # Page-locked before it is made read-only: the driver may refuse to lock read-only pages.
        _hostmem.pinned(host)

    def upload(self, host):
        from . import staged as _staged

        return _staged.to_device(host)

    def view(self, dev, offset: int, shape, strides, dtype):
        from .._runtime import arrays as _arrays

        return _arrays.cupy().ndarray(shape, dtype, memptr=dev.data + offset, strides=strides)


class _Entry:
    __slots__ = ("lo", "hi", "generation", "fingerprint", "dev", "views")

    def __init__(self, lo, hi, generation, fingerprint, dev):
        self.lo, self.hi, self.generation, self.fingerprint, self.dev = lo, hi, generation, fingerprint, dev
        self.views: dict = {}  # (pointer, shape, strides, dtype) -> the device view handed out for it

    def view(self, device, ptr, shape, strides, dtype):
        """The device view of the elements NumPy sees at `ptr`: made once per layout and handed out again, read-only,
        to any thread (a CuPy view takes about 10 us to make, which every hit paid)."""
        key = (ptr, shape, strides, dtype)
        view = self.views.get(key)
        if view is None:
            if len(self.views) >= _VIEWS:
                self.views.clear()
            view = self.views[key] = device.view(self.dev, ptr - self.lo, shape, strides, dtype)
        return view

    def current(self) -> bool:
        """The copy still holds the buffer's bytes: no write faulted since it was made, and a sample of the bytes is
        the same (a device or a network card writing into page-locked memory bypasses the page protection; the
        sample catches a write that replaces the buffer, not one of a few bytes between the sampled places)."""
        return (_hostmem.generation(self.lo) == self.generation
                and _hostmem.fingerprint(self.lo, self.hi - self.lo) == self.fingerprint)


class _Rent:
    __slots__ = ("lost", "fingerprint", "unchanged")

    def __init__(self, fingerprint):
        self.lost, self.fingerprint, self.unchanged = 0.0, fingerprint, False


def cap_bytes(given: int | None) -> int | None:
    """The cache's cap: `given` (accelerate_numpy's cache_bytes), else $FASTMM_NUMPY_CACHE, else None (a share of the
    GPU's free memory)."""
    if given is not None:
        if given < 0:
            raise ValueError(f"cache_bytes must be 0 or more, not {given}")
        return int(given)
    given_text = os.environ.get("FASTMM_NUMPY_CACHE", "").strip()
    text = given_text.upper()
    if not text:
        return None
    if text in ("OFF", "NO", "FALSE"):
        return 0
    if len(text) > 2 and text.endswith("B") and text[-2] in "KMG":  # 512MB as 512M
        text = text[:-1]
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    try:
        nbytes = float(text[:-1] if scale > 1 else text) * scale
        if not 0 <= nbytes < math.inf:  # (NaN, infinities and negative sizes too)
            raise ValueError
        return int(nbytes)
    except ValueError:
        raise ValueError(f"$FASTMM_NUMPY_CACHE must be a number of bytes (4G, 512M, 0), not {given_text!r}") from None


def operand_bytes(m: int, k: int, n: int, a_batch: int, b_batch: int, itemsize: int) -> tuple[int, int]:
    """The bytes of a product's operands as they cross the link: A's (a_batch x m x k) and B's (b_batch x k x n)."""
    return a_batch * m * k * itemsize, b_batch * k * n * itemsize


class Cache:
    """Device copies of operand byte ranges, at most `cap` bytes (None: a DEFAULT_SHARE-th of the GPU's free memory,
    decided at the first copy), and the losses of the buffers not copied yet. Thread-safe."""

    def __init__(self, device, cap: int | None = None):
        self.device, self.cap = device, cap
        self._entries: collections.OrderedDict = collections.OrderedDict()  # (lo, hi) -> _Entry, oldest use first
        self._rents: collections.OrderedDict = collections.OrderedDict()  # (base, serial, lo, hi) -> _Rent
        self._lock = threading.Lock()
        self._closed = False  # cleared: a product that took the cache before then copies nothing more
        self.bytes = 0
        self.hits = self.saved_bytes = self.uploads = self.uploaded_bytes = self.invalidated = self.evicted = 0
        self.fast_hits = 0  # products served from copies that took the fast path (fastpath.matmul)

    # ---- the copies -------------------------------------------------------------------------------------

    def _find(self, lo: int, hi: int) -> _Entry | None:
        """(lock held) A current copy holding [lo, hi); copies found stale on the way are dropped."""
        for key, entry in list(self._entries.items()):
            if entry.lo <= lo and hi <= entry.hi:
                if not entry.current():
                    self._drop(key, stale=True)
                    continue
                self._entries.move_to_end(key)
                return entry
        return None

    def _drop(self, key, stale: bool) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.hi - entry.lo
        if stale:
            self.invalidated += 1
        else:
            self.evicted += 1
        if not any(_same_block(entry.lo, e.lo) for e in self._entries.values()):
            _hostmem.untrack(entry.lo)  # no copy of it left: writes need not fault any more

    def _buy(self, lo: int, hi: int) -> _Entry | None:
        """(lock held) Copy [lo, hi) up and keep it, or None where it cannot be (too large, not trackable, written
        while it was copied)."""
        nbytes = hi - lo
        if self._closed:  # the hook went off meanwhile: every block was made writable, and must stay so
            return None
        if self.cap is None:
            self.cap = self.device.free_bytes() // DEFAULT_SHARE
        if nbytes > self.cap:
            return None
        # Room first: dropping a copy untracks its block when no other copy of it is left, which would undo the
        # tracking below where that block is this one.
        for key, entry in list(self._entries.items()):  # stale copies first, then the least recently used
            if not entry.current():
                self._drop(key, stale=True)
        while self._entries and self.bytes + nbytes > self.cap:
            self._drop(next(iter(self._entries)), stale=False)
        host = np.asarray(_Bytes(lo, nbytes))
        self.device.prepare(host)
        generation = _hostmem.track(lo)
        if not generation:
            return None
        kept = False
        try:
            sample = _hostmem.fingerprint(lo, nbytes)
            dev = self.device.upload(host)
            if _hostmem.generation(lo) != generation:  # written while it went up
                self.invalidated += 1
                return None
            kept = True
        finally:
            if not kept and not any(_same_block(lo, e.lo) for e in self._entries.values()):
                _hostmem.untrack(lo)  # no copy of it: not left read-only for nothing
        entry = self._entries[(lo, hi)] = _Entry(lo, hi, generation, sample, dev)
        self.bytes += nbytes
        self.uploads += 1
        self.uploaded_bytes += nbytes
        return entry

    def set_cap(self, cap: int) -> None:
        """At most `cap` bytes from now on: the least recently used copies dropped down to it."""
        with self._lock:
            self.cap = cap
            while self._entries and self.bytes > cap:
                self._drop(next(iter(self._entries)), stale=False)

    def clear(self) -> None:
        """Every copy dropped, for good: the cache copies nothing after this (the hook makes its blocks writable)."""
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._rents.clear()
            self.bytes = 0

    # ---- the decision -----------------------------------------------------------------------------------

    def decide(self, model, batch, m, k, n, operands, dtype) -> tuple[bool, list]:
        """Whether the product goes to the GPU, and for each operand (a, b) the device view to use instead of
        uploading it, or None. `operands`: (pointer, shape, strides, batch items it has) of a and b, as NumPy's
        loop sees them (3-D, batch first), of `dtype`."""
        with self._lock:
            if self._entries:
                _hostmem.guard()  # (another SIGSEGV handler installed since the last copy: ours on top again)
            spans = [span(ptr, shape, strides, model.itemsize) for ptr, shape, strides, _ in operands]
            entries = [self._find(*s) if s and _unit_axis(op[1], op[2], model.itemsize) else None
                       for s, op in zip(spans, operands)]
            a_batch, b_batch = operands[0][3], operands[1][3]
            sizes = operand_bytes(m, k, n, a_batch, b_batch, model.itemsize)

            def offloads(resident):
                gpu = model.gpu_seconds(batch, m, k, n, a_batch, b_batch, resident)
                host = (model.bound_seconds(batch, m, k, n, a_batch, b_batch) if any(resident)
                        else model.numpy_seconds(batch, m, k, n))  # nothing resident: the hook's rule as before
                return gpu < host, gpu, host

            resident = tuple(e is not None for e in entries)
            offload, _, _ = offloads(resident)
            for i, s in enumerate(spans):
                if entries[i] is not None or s is None:
                    continue
                if offload:
                    lost = model.upload_seconds(sizes[i])
                else:
                    with_it = tuple(r or j == i for j, r in enumerate(resident))
                    _, gpu, _ = offloads(with_it)
                    lost = max(0.0, model.bound_seconds(batch, m, k, n, a_batch, b_batch) - gpu)
                if self._rent(operands[i][0], s, lost, model.upload_seconds(s[1] - s[0])):
                    try:
                        entries[i] = self._buy(*s)
                    finally:  # bought, or failed (out of memory, say): renting again before the next try
                        self._rents.pop(self._rent_key(operands[i][0], s), None)
                    if entries[i] is not None:
                        resident = tuple(e is not None for e in entries)
                        offload, _, _ = offloads(resident)
            views = [None, None]
            if offload:
                for i, (ptr, shape, strides, _) in enumerate(operands):
                    if entries[i] is not None:
                        views[i] = entries[i].view(self.device, ptr, shape, strides, dtype)
            return offload, views

    def count_served(self, views, nbytes) -> None:
        """A product computed from the copies in `views` (decide's), each saving the upload of its operand's
        `nbytes` (`operand_bytes`; counted once the product is done: one left to NumPy served nothing)."""
        with self._lock:
            for view, size in zip(views, nbytes):
                if view is not None:
                    self.hits += 1
                    self.saved_bytes += size

    def count_fast(self) -> None:
        """A product served from a copy took the fast path."""
        with self._lock:
            self.fast_hits += 1

    @staticmethod
    def _rent_key(ptr, s):
        block = _hostmem.block(ptr)
        return None if block is None else (block[0], block[2], s[0], s[1])

    def _rent(self, ptr, s, lost: float, cost: float) -> bool:
        """(lock held) Add `lost` seconds to the buffer's losses; whether they now pay for its upload (`cost`) and
        its bytes looked unchanged since the last product that read it."""
        key = self._rent_key(ptr, s)
        if key is None:
            return False  # not a block of fastmm's allocator: its writes cannot be tracked
        fingerprint = _hostmem.fingerprint(s[0], s[1] - s[0])
        rent = self._rents.get(key)
        if rent is None:
            rent = self._rents[key] = _Rent(fingerprint)
            while len(self._rents) > _RENTS:
                self._rents.popitem(last=False)
        elif rent.fingerprint != fingerprint:
            rent.lost, rent.fingerprint, rent.unchanged = 0.0, fingerprint, False  # rewritten: renting is right
        else:
            rent.unchanged = True
        self._rents.move_to_end(key)
        rent.lost += lost
        return rent.unchanged and rent.lost >= cost

    def stats(self) -> dict:
        with self._lock:
            tracking = _hostmem.tracking_stats()
            return {"bytes_cap": self.cap, "entries": len(self._entries), "bytes": self.bytes, "hits": self.hits,
                    "fast_hits": self.fast_hits,
                    "saved_upload_bytes": self.saved_bytes, "uploads": self.uploads,
                    "uploaded_bytes": self.uploaded_bytes, "invalidated_by_writes": self.invalidated,
                    "evicted": self.evicted, "write_faults": tracking["write_faults"],
                    "tracked_blocks": tracking["tracked_blocks"]}


def _unit_axis(shape, strides, itemsize: int) -> bool:
    """Whether the kernels read a view in place: one of its two core axes has unit stride (else they would copy it,
    with a warning, where an upload gathers it for free)."""
    (rows, cols), (sr, sc) = shape[-2:], strides[-2:]
    return sc == itemsize or cols == 1 or sr == itemsize or rows == 1


def _same_block(p: int, q: int) -> bool:
    block = _hostmem.block(p)
    return block is not None and block[0] <= q < block[0] + max(block[1], 1)
