"""Dask arrays whose chunks are fastmm arrays: matrix products beyond one GPU's memory, and across GPUs.

``dask.array``'s products (``da.matmul``, ``@``, ``da.dot``, ``da.tensordot``, ``da.einsum``) call NumPy's functions
or Dask's per-type lookups on each chunk. With fastmm chunks, ``np.matmul`` reaches fastmm through NumPy's protocols
with nothing to register; ``tensordot`` and ``einsum`` go through Dask's lookup tables, where a fastmm array would
otherwise be handled as the CuPy array it also is (``cupy.tensordot``: cuBLAS, and plain CuPy results). Importing
this module registers fastmm's functions there, and ``concatenate`` and ``empty`` so that assembled results stay
fastmm arrays.

Dask is an optional dependency (``pip install 'fastmm[dask]'``); the rest of fastmm never imports it.

Examples
--------
>>> import numpy as np, fastmm.dask, dask.array as da       # doctest: +SKIP
>>> x = fastmm.dask.from_array(np.random.rand(40000, 20000).astype(np.float32), chunks=(8192, 8192))  # doctest: +SKIP
>>> (x @ x.T).compute()             # chunks uploaded as needed, products on fastmm's kernels  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import threading

import numpy as np

try:
    import dask.array as _da
    from dask.array.dispatch import concatenate_lookup, einsum_lookup, empty_lookup, tensordot_lookup
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("fastmm.dask needs Dask: pip install 'fastmm[dask]' (dask[array], and distributed for a "
                      "cluster)") from e

from . import _array, _dask_host, _serialize, linalg
from ._dask_sends import send_after_default_stream
from ._dispatch import products as _dispatch
from ._runtime import arrays as _arrays
from ._errors import warn_once

__all__ = ["from_array", "meta", "to_host", "store", "matmul", "explain", "send_after_default_stream"]


def meta(dtype=np.float32, ndim: int = 2):
    """An empty fastmm array standing for the chunks' type in Dask's graph (Dask's ``meta``).

    It holds no memory, so a graph of products can be built where no GPU is (a client, a scheduler). A 0-d meta
    needs one element: it is a real one-element array on the current GPU, or NumPy's where there is none.

    Examples
    --------
    >>> import fastmm.dask                       # doctest: +SKIP
    >>> type(fastmm.dask.meta()).__name__        # doctest: +SKIP
    'ndarray'
    """
    if ndim == 0:
        try:
            return _array.asarray(np.zeros((), dtype))
        except Exception:  # noqa: BLE001 - no GPU here: NumPy's meta (Dask's default) rather than none
            return np.zeros((), dtype)
    return _null((0,) * ndim, dtype)


def _null(shape, dtype):
    """A fastmm array of `shape` (with a zero-length axis) over no memory: nothing can ever read it."""
    cp = _dispatch._cupy()
    try:
        device = cp.cuda.runtime.getDevice()
    except cp.cuda.runtime.CUDARuntimeError:  # no GPU here: a graph is built, chunks are computed elsewhere
        device = 0
    none = cp.cuda.memory.MemoryPointer(cp.cuda.memory.UnownedMemory(0, 0, None, device_id=device), 0)
    return _array.ndarray(shape, np.dtype(dtype), memptr=none)


def from_array(x, chunks="auto") -> _da.Array:
    """A Dask array of fastmm chunks from a NumPy array (or memory map), a CuPy or fastmm array, or a Dask array.

    Nothing is copied to the GPU here: each chunk is uploaded when a task needs it, so a host operand larger than
    GPU memory streams through the GPU chunk by chunk (with Dask's threaded scheduler, as many chunks at a time
    as it runs tasks).

    Parameters
    ----------
    x : array_like or dask.array.Array
        The data. A Dask array keeps its chunks (`chunks` is ignored); anything else is cut into `chunks`.
    chunks : int, tuple or "auto", optional
        As for `dask.array.from_array`. Products run best on chunks of a few thousand rows and columns (see the
        Dask page of the documentation).

    Returns
    -------
    dask.array.Array
        Whose chunks, once computed, are fastmm arrays.

    See Also
    --------
    dask.array.from_array : The same for NumPy or CuPy chunks.
    to_host : Back to NumPy chunks.
    """
    if not isinstance(x, _da.Array):
        x = _da.from_array(x, chunks=chunks, asarray=False, meta=getattr(x, "_meta", None))
    return x.map_blocks(_dask_host.to_fastmm, dtype=x.dtype, meta=meta(x.dtype, x.ndim))


def to_host(x: _da.Array) -> _da.Array:
    """The same Dask array with NumPy chunks (each copied to the host when computed)."""
    return x.map_blocks(_dask_host.to_numpy, dtype=x.dtype, meta=np.empty((0,) * x.ndim, x.dtype))


def store(sources, targets, **kwargs):
    """``dask.array.store(sources, targets)`` with the sources' GPU chunks coming down straight into host targets: each
    block is copied into its place in a NumPy array (or memory map) through fastmm's pinned staging, with no host chunk
    made first, and the store's tasks are named without reading the target (Dask hashes a NumPy target's bytes).
    Other host targets (h5py, Zarr) get `to_host`'s copies; CuPy and fastmm targets, device-to-device copies. The
    targets are written by this process: compute with a local scheduler (``scheduler="threads"``). `kwargs` go to
    `dask.array.store`; ``lock`` defaults to False where every target is a NumPy array (blocks write disjoint
    regions), else to Dask's default."""
    many = isinstance(targets, (list, tuple))
    wrapped = [_dask_host.host_target(t) for t in (targets if many else [targets])]
    if all(isinstance(t, _dask_host.HostTarget) and t.direct for t in wrapped):
        kwargs.setdefault("lock", False)
    return _da.store(sources, wrapped if many else wrapped[0], **kwargs)


def _concatenate(arrays, axis=0):
    arrays = list(arrays)
    if all(a.size == 0 for a in arrays):
        # Metas (Dask concatenates them to build a graph): the result's shape, with no GPU work.
        shape = np.concatenate([np.empty(a.shape, a.dtype) for a in arrays], axis=axis).shape
        if 0 in shape:
            return _null(shape, np.result_type(*arrays))
    cp = _dispatch._cupy()
    return _array._wrap(cp.concatenate([_dispatch.plain(a) for a in arrays], axis=axis))


def _einsum(*args, **kwargs):
    kwargs.pop("casting", None)  # Dask passes NumPy's einsum keywords; fastmm's einsum takes CuPy's
    kwargs.pop("order", None)
    return linalg.einsum(*args, **kwargs)


def _empty(*args, **kwargs):
    return _array._wrap(_dispatch._cupy().empty(*args, **kwargs))


concatenate_lookup.register(_array.ndarray, _concatenate)
_serialize.register()  # chunks sent between workers stay fastmm arrays
tensordot_lookup.register(_array.ndarray, linalg.tensordot)
einsum_lookup.register(_array.ndarray, _einsum)
empty_lookup.register(_array.ndarray, _empty)


# --------------------------------------------------------------------------------------------------------
# A product across the GPUs of a cluster, planned to move little (fastmm/_plan/distributed.py)
# --------------------------------------------------------------------------------------------------------

def _workers(workers):
    """The workers' addresses, in a fixed order: as given, or those of the current distributed client."""
    if workers is not None:
        return list(workers)
    try:
        from distributed import get_client
    except ImportError:
        return []
    try:
        client = get_client()
    except ValueError:  # no client: Dask's local scheduler, nothing to place
        return []
    return sorted(client.scheduler_info()["workers"])


# How many steps back a chunk is followed to the one persisted chunk it is made from (x.T, (2 * x).T, ...).
_DERIVED_DEPTH = 4


def _who_has(arrays) -> dict:
    """For the chunks of `arrays` already in a cluster's memory (persisted operands), the addresses of the workers
    that hold each; {} where there is no client or nothing is held.

    A chunk made from one chunk alone, itself held or made so (``x.T`` of a persisted ``x``, ``(2 * x).T``, up to
    `_DERIVED_DEPTH` steps), counts as held where that chunk is: made there, it moves nowhere, where the plan's home
    for it would first fetch its source."""
    try:
        from distributed import futures_of, get_client

        client = get_client()
    except (ImportError, ValueError):
        return {}
    persisted = [(array, futures_of(array)) for array in arrays]
    futures = [f for _, fs in persisted for f in fs]
    if not futures:
        return {}
    who = {key: list(holders) for key, holders in client.who_has(futures).items() if holders}
    from dask.core import get_dependencies

    graphs = [array.__dask_graph__() for array, fs in persisted if fs]
    unheld = set()

    def holders(key, depth: int = 0):
        if key in who or key in unheld or depth == _DERIVED_DEPTH:
            return who.get(key)
        graph = next((g for g in graphs if key in g), None)
        sources = get_dependencies(graph, key) if graph is not None else ()
        if len(sources) != 1:  # made from several chunks, or from none
            unheld.add(key)
            return None
        found = holders(next(iter(sources)), depth + 1)
        if found:
            who[key] = found
        return found

    for array in arrays:
        for key in _flat_keys(array):
            holders(key)
    return who


def _operand_key(x, y, block: tuple) -> tuple:
    """The Dask key of the plan's operand block ("a", i, k) (x's chunk) or ("b", k, j) (y's)."""
    operand, r, c = block
    return ((x if operand == "a" else y).name, r, c)


def _held(x, y, product, addresses: list[str], who: dict) -> dict:
    """{operand block: the indices in `addresses` of the workers holding its chunk, an empty set where only other
    workers do} for the blocks in memory (`who`: see _who_has)."""
    from ._plan.distributed import operand_blocks

    index = {address: w for w, address in enumerate(addresses)}
    keys = {block: _operand_key(x, y, block) for block in operand_blocks(product)}
    return {block: {index[a] for a in who[key] if a in index} for block, key in keys.items() if who.get(key)}


def _flat_keys(array) -> list:
    from dask.core import flatten

    return list(flatten(array.__dask_keys__()))


def _operands(x, y):
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"fastmm.dask.matmul multiplies 2-D Dask arrays (got {x.ndim}-D and {y.ndim}-D); "
                         "for stacks of matrices use x @ y")
    if x.shape[1] != y.shape[0]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {y.shape[0]} is different from {x.shape[1]})")
    if x.chunks[1] != y.chunks[0]:  # K cut the same way in both: B re-chunked along K to A's blocks
        y = y.rechunk((x.chunks[1], y.chunks[1]))
    return x, y


def _block_product(x, y):
    from ._plan.distributed import BlockProduct

    # gram: y is x.T, the very graph (x @ x.T), unless y alone is in memory (x.T.persist()); same: y is x. x's chunks
    # alone are made and moved (read transposed as y's for x @ x.T).
    gram = y.name == x.T.name and not (_persisted(y) and not _persisted(x))
    return BlockProduct(tuple(x.chunks[0]), tuple(y.chunks[1]), tuple(x.chunks[1]),
                        np.result_type(x.dtype, y.dtype).itemsize, gram=gram, same=y.name == x.name)


def _persisted(array) -> bool:
    try:
        from distributed import futures_of
    except ImportError:
        return False
    return bool(futures_of(array))


def _link_rate(addresses: list[str]) -> float:
    """The time model's rate into each GPU for the cluster's protocol: UCX's where every worker talks it, else
    TCP's (through host memory); UCX's for a cluster not yet started (a number of GPUs)."""
    from ._plan.distributed import LINK_BYTES_PER_S

    tcp = addresses and not all(a.startswith("ucx") for a in addresses)
    return LINK_BYTES_PER_S["tcp" if tcp else "ucx"]


def _plan(x, y, count: int, model: dict, addresses: list[str] = (), who: dict | None = None):
    """The plan for `count` GPUs; with the workers' `addresses` and `who` holds the operands' chunks (_who_has),
    one that counts the chunks where they already are."""
    from ._plan.distributed import plan_distributed

    product = _block_product(x, y)
    model = {"link_bytes_per_s": _link_rate(list(addresses)), **model}
    held = _held(x, y, product, list(addresses), who) if who and addresses else None
    return plan_distributed(product, count, held=held, **model)


def explain(x, y, workers=None, **model) -> str:
    """How `matmul` would place ``x @ y`` on the cluster's GPUs, and how many bytes would cross between them.

    `workers` is as for `matmul`, or a number of GPUs; `model` as for `matmul`."""
    from ._plan.distributed import describe_distributed

    x, y = _operands(x, y)
    addresses = [] if isinstance(workers, int) else _workers(workers)
    count = workers if isinstance(workers, int) else max(1, len(addresses))
    return describe_distributed(_plan(x, y, count, model, addresses, _who_has((x, y)) if addresses else None))


def _keep_placement(dsk, keys, **kwargs):
    """The graph culled to what the keys need, and not otherwise optimized: Dask's fusions (low-level, blockwise,
    roots) rebuild layers without their annotations, which would drop where each task is planned to run."""
    from dask.core import flatten

    keys = list(flatten(keys if isinstance(keys, (list, set)) else [keys]))
    return dsk.cull(set(keys))


class _Placed(_da.Array):
    """The product `matmul` planned: computing or persisting it keeps each task on its planned GPU."""

    __slots__ = ()
    __dask_optimize__ = staticmethod(_keep_placement)


def _made_at(layer, name: str, addresses: list[str], home):
    """A copy of the layer that makes an operand's chunks, each chunk's task preferring the worker `home(i, j)` names
    (a preference, as for the product's own tasks: see `matmul`); the layer's other keys are left to Dask."""
    def workers(key):
        if isinstance(key, tuple) and len(key) == 3 and key[0] == name and home(key[1], key[2]) >= 0:
            return [addresses[home(key[1], key[2])]]
        return None

    pinned = copy.copy(layer)
    pinned.annotations = {**(layer.annotations or {}), "workers": workers, "allow_other_workers": True, _PINNED: True}
    return pinned


_PINNED = "fastmm_pinned"  # (`_dask_pins.MARK`, which imports distributed)
_pinned_schedulers: set = set()


def _pin_on_scheduler() -> None:
    """The scheduler plugin that keeps planned tasks on their workers (`fastmm._dask_pins`), registered once per client
    and scheduler (idempotent there: another client of the same scheduler registers it again harmlessly); without one
    (no client, an asynchronous one, a refusal) the tasks are Dask's preferences alone."""
    from distributed import get_client

    try:
        client = get_client()
    except ValueError:  # no client: the graph is computed by one the product cannot see
        return
    try:
        # (This client and its scheduler's address: no round trip to the scheduler, which every product would pay.)
        key = (client.id, client.scheduler.address)
        if key in _pinned_schedulers or client.asynchronous:
            return
        import cloudpickle

        from . import _dask_pins

        cloudpickle.register_pickle_by_value(_dask_pins)  # the scheduler need not import fastmm
        client.register_plugin(_dask_pins.Pins())
        _pinned_schedulers.add(key)
    except Exception as e:  # noqa: BLE001 - the product stays right without it
        warn_once("dask-pins", f"fastmm.dask.matmul could not register its scheduler plugin ({type(e).__name__}: "
                  f"{e}): work stealing may move planned tasks, and they fetch their operands again", stacklevel=4)


def _multiply_add(c, a, b):
    # The running sum has one reader, this task: added to in place, one block fewer in GPU memory per step.
    c += np.matmul(a, b)
    return c


def _identity(x):
    return x


_streams = threading.local()


def _task_stream():
    """This thread's non-blocking stream on the current GPU (made once per thread and GPU)."""
    cp = _dispatch._cupy()
    by_device = _streams.__dict__.setdefault("by_device", {})
    device = cp.cuda.runtime.getDevice()
    if device not in by_device:
        by_device[device] = cp.cuda.Stream(non_blocking=True)
    return by_device[device]


def _first_sum(a, b, out=None):
    """A block's first product (into `out`): the running sum that the block's later products add to in place."""
    return np.matmul(a, b, out=out)


def _first_sum_t(a, bt, out=None):  # (x @ x.T: B's block is x's, read transposed)
    return _first_sum(a, bt.T, out)


def _multiply_add_t(c, a, bt):
    return _multiply_add(c, a, bt.T)


_TRANSPOSED = {_first_sum_t: _first_sum, _multiply_add_t: _multiply_add}


def _finished(fn, *args):
    """fn(*args), its GPU work done when the task returns, on a stream of the task's own.

    A planned product's tasks end with their result computed, not queued: distributed sends a finished task's
    device result to other workers at once. Queued on the legacy stream, a worker's products held every transfer
    from or to it until the queue drained (UCX waits for that stream first); on a non-blocking stream they hold
    none where the workers' wait is for the default stream (`send_after_default_stream`; docs/dask.md). The stream
    first waits, on the GPU, for what the legacy stream has queued (operands made there by other tasks).

    Memory that outlives the task (a block's running sum: `_first_sum`'s result, given to it as `out`) is taken on
    the legacy stream before that wait. CuPy's pool (and RMM's) hands a freed block out again in the order of the
    stream it was taken on: from this task's stream, a block freed by Dask while another thread's task still read it
    on the legacy stream could be written here before that read ran. The task's temporaries come from its stream:
    freed as the task queues its work, from the legacy stream they could go to another thread while this stream still
    used them."""
    if not any(hasattr(a, "__cuda_array_interface__") for a in args):  # host chunks: NumPy's product, as called
        return fn(*args)
    if fn in _TRANSPOSED:  # its last operand read transposed
        fn, args = _TRANSPOSED[fn], (*args[:-1], args[-1].T)
    cp = _dispatch._cupy()
    if fn is _first_sum:
        a, b = args
        with cp.cuda.Stream.null:  # (fastmm's error where memory is short)
            out = _arrays.empty((a.shape[0], b.shape[1]), np.result_type(a.dtype, b.dtype))
        # Of the operands' kind: fastmm's for fastmm chunks, CuPy's (whose products are cuBLAS's) for CuPy chunks.
        args = (a, b, _array._wrap(out) if isinstance(a, _array.ndarray) else out)
    stream = _task_stream()
    stream.wait_event(cp.cuda.Stream.null.record())
    try:
        with stream:
            result = fn(*args)
    except BaseException:
        try:  # nothing of the task's left queued on memory Dask may free
            stream.synchronize()
        except Exception:  # noqa: BLE001 - a broken context: the task's own error is the one to report
            pass
        raise
    stream.synchronize()
    return result


def _fetch_first(tasks: dict, name: str, nk: int):
    """The priority of a GPU's fetches: the order its sums first read their blocks in (a worker takes one block at a
    time from each other worker, highest first), above the default 0; None (the graph's own) for its other tasks."""
    first, fetch = {}, f"{name}-in-"
    for key, task in tasks.items():
        step = nk - 1 if key[0] == name else key[3] if key[0] == f"{name}-sum" else None  # (last sum: block key)
        for arg in task if step is not None else ():
            if isinstance(arg, tuple) and str(arg[0]).startswith(fetch) and arg in tasks:
                first[arg] = min(first.get(arg, step), step)
    last = max(first.values(), default=0) + 1
    return lambda key: last - first[key] if key in first else None


def _k_order(nk: int, local=lambda k: 0, start: int = 0) -> list[int]:
    """The order in which an output block sums its K blocks: those whose operands its GPU holds first (`local(k)`:
    how many of the two), so that its first products need no transfer while the others arrive, then from `start`
    on, so that blocks sharing a GPU do not all wait for the same remote block at once. It follows from the plan
    and from where persisted chunks are: the same product of the same persisted operands gives the same bits."""
    return sorted(range(nk), key=lambda k: (-local(k), (k - start) % nk))


def _sum_over_k(tasks: dict, name: str, acc: str, i: int, j: int, order: list[int], a, b, run=(),
                transposed: bool = False) -> None:
    """Output block (i, j)'s tasks: its K summed into the block in `order`, ``a(i, k) @ b(k, j)`` for k in `order`
    (a and b give the operands' keys; `transposed`: b's keys are of blocks to read transposed), the last sum named
    (name, i, j). `run` = (_finished,) runs each product on a stream of the task's own, finished when the task
    returns (a cluster's workers); () as called (one process, where the threaded scheduler's tasks share CuPy's
    stream and its memory pool)."""
    first, add = (_first_sum_t, _multiply_add_t) if transposed else (_first_sum, _multiply_add)
    # The last sum is the output block's own key: an identity task after it cost each block one more scheduler
    # round trip before its result was there.
    keys = [(acc, i, j, step) for step in range(len(order) - 1)] + [(name, i, j)]
    tasks[keys[0]] = (*run, first, a(i, order[0]), b(order[0], j))
    for step, k in enumerate(order[1:], 1):
        tasks[keys[step]] = (*run, add, keys[step - 1], a(i, k), b(k, j))


def _chained(x, y) -> _da.Array:
    """``x @ y`` on one GPU (or Dask's local scheduler), each output block's K summed in a fixed order, one block
    product after another into the block: Dask's own graph makes all of a block's partial products side by side
    and then adds them, which holds K / chunk of them in GPU memory at once (an out-of-core product's budget)."""
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    name = "fastmm-matmul-" + tokenize(x, y)
    acc, nk = name + "-sum", len(x.chunks[1])
    tasks: dict = {}
    for i in range(len(x.chunks[0])):
        for j in range(len(y.chunks[1])):
            _sum_over_k(tasks, name, acc, i, j, list(range(nk)), lambda i, k: (x.name, i, k),
                        lambda k, j: (y.name, k, j))
    graph = HighLevelGraph.from_collections(name, tasks, dependencies=[x, y])
    return _da.Array(graph, name, chunks=(x.chunks[0], y.chunks[1]), dtype=np.result_type(x.dtype, y.dtype),
                     meta=getattr(x, "_meta", None))


def matmul(x, y, workers=None, **model):
    """``x @ y`` for 2-D Dask arrays, with each output block computed on a planned GPU of a distributed cluster.

    The plan (see `explain`) puts each input block on one GPU and computes each output block, K summed in a fixed
    order (the blocks its GPU holds first), on the GPU that holds its inputs' rows or columns; each block a GPU needs
    from another is fetched as soon as it exists, and each product runs on a stream of the task's own and is finished
    when its task returns (docs/dask.md, "What keeps the GPUs busy"): a 2-D grid of GPUs, a 1-D split with the smaller
    operand sent to every GPU once, or one GPU where splitting would not pay for the bytes it moves. Without a
    distributed client (Dask's local scheduler, an out-of-core product on one GPU), or with one worker, it is
    ``x @ y`` with each output block's K summed in a fixed order into the block, one block product at a time, where
    Dask's own graph holds all of a block's partial products at once.

    Parameters
    ----------
    x, y : dask.array.Array
        2-D operands; chunks of fastmm arrays run fastmm's kernels (see `from_array`), NumPy or CuPy chunks their
        own products. ``y`` is re-chunked along K to ``x``'s blocks if they differ.
    workers : list of str, optional
        The workers' addresses, one per GPU (dask-cuda's LocalCUDACluster starts one worker per GPU). Default: the
        current distributed client's workers.
    flops_per_s, link_bytes_per_s : float, optional
        The time model's rate of one GPU, and the rate at which a GPU takes in blocks from the others (defaults: an
        H100's FP32 rate through fastmm's kernels; 15 GB/s where the workers talk UCX, 1 GB/s over TCP, as measured
        on four GPUs joined by NVLink); set them to your GPUs' and interconnect's.

    Returns
    -------
    dask.array.Array
        The product, chunked as ``x``'s rows and ``y``'s columns. Computing or persisting it keeps each block on its
        planned GPU; an array built on it (``(x @ y).sum()``) is optimized as a whole by Dask, which may move the
        product's tasks: persist the product first to keep the plan.
    """
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from ._plan.distributed import b_block, blocks_needed

    x, y = _operands(x, y)
    addresses = _workers(workers)
    if len(addresses) < 2:
        return _chained(x, y)
    plan = _plan(x, y, len(addresses), model, addresses, _who_has((x, y)))
    product, placement = plan.product, plan.placement
    # Each place of the plan (the one GPU, a row of the split, a place of the grid) on the worker that already holds
    # most of what it reads (persisted operands), as the plan chose them.
    addresses = [addresses[w] for w in plan.order] if plan.order else addresses
    name = "fastmm-matmul-" + tokenize(x, y, addresses)
    acc = name + "-sum"
    tasks: list[dict] = [{} for _ in addresses]
    nk, rows, cols = len(product.depth), range(len(product.rows)), range(len(product.cols))
    # A chunk already held by a worker that needs it (a persisted operand) stays there: it moves to the others that
    # need it as it would from the plan's home, and not first to that home. (-1: held only by workers that do not
    # read it, from where every reader fetches it.)
    homes = {b: placement.home(b, product) if plan.holding(b) is None else min(needers & plan.holding(b), default=-1)
             for b, needers in blocks_needed(product, placement).items()}
    # An operand's chunk is made at its home (`_made_at`) or already held there, and read there as it is. Each block
    # a GPU needs from another is fetched by a task of its own there, ready as soon as the block exists, so that its
    # transfer overlaps the products (docs/dask.md); for x @ x.T one fetch serves both reads, as A's and as B's.

    def on(w, block):  # operand block `block`'s key on GPU w: its own at its home, else that of w's fetch of it
        key = _operand_key(x, y, block)
        if homes[block] == w:
            return key
        fetch = (f"{name}-in-{block[0]}", w, *block[1:])
        tasks[w].setdefault(fetch, (_identity, key))
        return fetch

    for i in rows:
        for j in cols:
            w = placement.owner(i, j, product)  # K summed on the block's owner, its own blocks first
            order = _k_order(nk, lambda k: (homes["a", i, k] == w) + (homes[b_block(product, k, j)] == w),
                             start=i + j)
            _sum_over_k(tasks[w], name, acc, i, j, order, lambda i, k: on(w, ("a", i, k)),
                        lambda k, j: on(w, b_block(product, k, j)), run=(_finished,), transposed=product.gram)
    operands = (x,) if product.one_operand else (x, y)
    layers, deps = {}, {}
    for operand in operands:
        layers |= dict(operand.dask.layers)
        deps |= dict(operand.dask.dependencies)
    # Each operand chunk made where the plan keeps it (a chunk already in memory stays where it is).
    layers[x.name] = _made_at(layers[x.name], x.name, addresses, lambda i, k: homes["a", i, k])
    if not product.one_operand:
        layers[y.name] = _made_at(layers[y.name], y.name, addresses, lambda k, j: homes["b", k, j])
    # The plan's worker, as a restriction that holds while that worker runs (never stolen from it: `_dask_pins`):
    # where it dies (or its nanny restarts it at a new address), its tasks run on the others.
    _pin_on_scheduler()
    for w, address in enumerate(addresses):
        if tasks[w]:
            pin = {"workers": [address], "allow_other_workers": True, _PINNED: True,
                   "priority": _fetch_first(tasks[w], name, nk)}
            layers[f"{name}-{w}"] = MaterializedLayer(tasks[w], annotations=pin)
            deps[f"{name}-{w}"] = {operand.name for operand in operands}
    owners = {f"{name}-{w}" for w in range(len(addresses)) if tasks[w]}
    layers[name], deps[name] = MaterializedLayer({}), owners
    return _Placed(HighLevelGraph(layers, deps), name, chunks=(x.chunks[0], y.chunks[1]),
                   dtype=np.result_type(x.dtype, y.dtype), meta=getattr(x, "_meta", None))
