"""fastmm.dask on the GPU: products of fastmm chunks on Dask's threaded scheduler (ragged chunks, a transposed
operand, batches, tensordot and einsum) against cupy.matmul, streamed from host memory, and on two GPUs."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
da = pytest.importorskip("dask.array", reason="Dask is not installed: pip install 'fastmm[dask]'")
cp = pytest.importorskip("cupy", reason="GPU tests need CuPy")

import fastmm  # noqa: E402
import fastmm.dask as fd  # noqa: E402


def _close(got, want, tol=1e-5):
    got, want = cp.asarray(got, cp.float64), cp.asarray(want, cp.float64)
    assert got.shape == want.shape
    err = float(cp.linalg.norm(got - want) / cp.linalg.norm(want))
    assert err < tol, err


@pytest.mark.parametrize("chunks", [(300, 250), (512, 512), (1000, 77)], ids=str)
def test_chunked_products_on_the_threaded_scheduler(chunks, rng, launches):
    a = rng.standard_normal((1000, 700)).astype(np.float32)
    b = rng.standard_normal((900, 700)).astype(np.float32)
    x, y = fd.from_array(a, chunks=chunks), fd.from_array(b, chunks=chunks)
    want = cp.matmul(cp.asarray(a), cp.asarray(b).T)
    for name, expr in (("@", x @ y.T), ("matmul", da.matmul(x, y.T)), ("dot", da.dot(x, y.T)),
                       ("tensordot", da.tensordot(x, y, axes=([1], [1]))), ("einsum", da.einsum("ik,jk->ij", x, y))):
        assert type(expr._meta) is fastmm.ndarray, name
        launches.clear()
        got = expr.compute(scheduler="threads")
        assert launches, f"{name}: no fastmm kernel ran"
        assert type(got) is fastmm.ndarray, name
        _close(got, want)


def test_chunked_products_from_host_memory_on_a_busy_gpu(rng):
    """Chunks uploaded while the GPU is still busy with earlier work: each upload reuses memory that CuPy's pool
    freed under products still queued, so it must wait for them (it did not, and results came out wrong whenever
    the GPU lagged behind the host: under another process's load, or behind a long kernel as here)."""
    a = rng.standard_normal((1000, 700)).astype(np.float32)
    b = rng.standard_normal((700, 900)).astype(np.float32)
    want = cp.matmul(cp.asarray(a), cp.asarray(b))
    x, y = fd.from_array(a, chunks=(200, 100)), fd.from_array(b, chunks=(100, 300))
    big = cp.ones((4096, 4096), cp.float32)
    for _ in range(3):
        for _ in range(8):  # ~10 ms of queued work ahead of the graph's products
            cp.matmul(big, big)
        _close((x @ y).compute(scheduler="threads"), want)


@pytest.mark.parametrize("workers", [1, 3])
def test_the_one_gpu_product_sums_each_block_in_order_from_host_chunks(workers, rng):
    """fastmm.dask.matmul without a cluster, from host chunks on the threaded scheduler (an out-of-core product's
    graph): each block's K summed in order into it (no partial products side by side), ragged chunks, K re-chunked
    to x's blocks, a transposed operand, GPU work queued ahead of the graph; results to the host through to_host,
    right to float32 products; fastmm.dask.store's blocks straight into a strided host view."""
    a = rng.standard_normal((1100, 900)).astype(np.float32)
    b = rng.standard_normal((700, 900)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    x, y = fd.from_array(a, chunks=(300, 250)), fd.from_array(b, chunks=(256, 400))
    big = cp.ones((4096, 4096), cp.float32)
    product = fd.matmul(x, y.T)
    names = {key[0] for key in dict(product.__dask_graph__()) if isinstance(key, tuple)}
    assert not any("sum-aggregate" in name or name.startswith("matmul-") for name in names), names
    for direct in (False, True):
        for _ in range(8):  # ~10 ms of queued work ahead of the graph's products
            cp.matmul(big, big)
        wide = np.full((want.shape[0], 2 * want.shape[1]), np.nan, np.float32)
        out = wide[:, 1::2]
        if direct:
            fd.store(product, out, scheduler="threads", num_workers=workers)
        else:
            da.store(fd.to_host(product), out, scheduler="threads", num_workers=workers, lock=False)
        _close(out, want)
        assert np.isnan(wide[:, ::2]).all()
    on_gpu = cp.full(want.shape, cp.nan, cp.float32)  # a device target: device-to-device copies
    fd.store(product, on_gpu, scheduler="threads", num_workers=workers)
    _close(on_gpu, want)


def test_batched_product_and_results_to_the_host(rng):
    a = rng.standard_normal((6, 200, 150)).astype(np.float32)
    b = rng.standard_normal((6, 150, 170)).astype(np.float32)
    x, y = fd.from_array(a, chunks=(2, 100, 75)), fd.from_array(b, chunks=(3, 75, 85))
    got = fd.to_host(x @ y).compute(scheduler="threads")
    assert type(got) is np.ndarray
    _close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)))


def test_streaming_a_host_memmap_through_the_gpu(rng, tmp_path):
    """Out of core in miniature: operands in memory-mapped files, the result stored chunk by chunk to another."""
    n = 2048
    a = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.float32, shape=(n, n))
    a[...] = rng.standard_normal((n, n)).astype(np.float32)
    out = np.lib.format.open_memmap(tmp_path / "c.npy", mode="w+", dtype=np.float32, shape=(n, n))
    x = fd.from_array(a, chunks=512)
    da.store(fd.to_host(x @ x.T), out, scheduler="threads", num_workers=4)
    _close(np.asarray(out), a.astype(np.float64) @ a.astype(np.float64).T)


def test_a_chunk_reuses_memory_only_after_the_kernels_that_read_its_last_owner(rng):
    """A product queued behind busy work still reads the chunk it was given, though the chunk is freed and another
    uploaded (most likely into its memory) before the product runs."""
    a, b = (rng.standard_normal((4096, 4096)).astype(np.float32) for _ in range(2))
    big = fastmm.asarray(rng.standard_normal((8192, 8192)).astype(np.float32))
    for _ in range(4):
        x = fd._dask_host.to_fastmm(a)
        for _ in range(3):
            big @ big  # the GPU busy for tens of milliseconds
        out = x @ x  # queued behind them, reading x
        del x
        y = fd._dask_host.to_fastmm(b)  # freed x's memory, most likely
        _close(out, a.astype(np.float64) @ a.astype(np.float64))
        _close(y, b)


def test_a_planned_task_reads_operands_still_queued_and_returns_its_result_finished(rng):
    """fastmm.dask.matmul's tasks on a cluster run on a non-blocking stream of their own (so that the workers'
    transfers, which wait for the legacy default stream, do not wait for queued products) and return finished:
    an operand whose kernels are still queued on the legacy stream is read complete, and the result is done."""
    a = fastmm.asarray(cp.zeros((2048, 2048), cp.float32))
    b = fastmm.asarray(rng.standard_normal((2048, 2048)).astype(np.float32))
    streams = []

    def product(x, y):
        streams.append(cp.cuda.get_current_stream())
        return x @ y

    big = cp.ones((4096, 4096), cp.float32)
    # ~180 ms of kernels queued ahead on the legacy stream, then those that make a (with 8, ~20 ms, a busy host's 200
    # launches below outlasted them once)
    for _ in range(64):
        cp.matmul(big, big)
    for _ in range(200):
        a += 1.0 / 200
    assert not cp.cuda.Stream.null.done  # still queued when the task starts
    got = fd._finished(product, a, b)
    (stream,) = streams
    assert stream.ptr != 0 and stream.done and stream is fd._task_stream()
    assert type(got) is fastmm.ndarray
    want = b.astype(cp.float64).sum(axis=0)  # every row of a is one
    _close(got[0], want, tol=1e-4)
    _close(got[-1], want, tol=1e-4)
    host = rng.standard_normal((3, 3))
    assert np.array_equal(fd._finished(np.matmul, host, host), host @ host)  # host chunks: NumPy's, as called


def test_a_planned_task_that_fails_leaves_nothing_queued_and_the_next_one_runs(rng):
    """A task whose product fails after queueing work (an out-of-memory midway, say) raises that error, with its
    stream drained (nothing of it left to read memory that Dask then frees); the worker's next task runs as usual."""
    a = fastmm.asarray(rng.standard_normal((1024, 1024)).astype(np.float32))
    streams = []

    def fails(x, y):
        streams.append(cp.cuda.get_current_stream())
        for _ in range(50):
            x @ y  # queued on the task's stream
        assert not streams[0].done  # still running when the error comes
        raise cp.cuda.memory.OutOfMemoryError(1 << 40, 0)

    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        fd._finished(fails, a, a)
    assert streams[0].done
    got = fd._finished(fd._first_sum, a, a)
    _close(got, a.astype(cp.float64) @ a.astype(cp.float64))


def test_the_wait_before_a_ucx_transfer_covers_the_default_and_blocking_streams_only():
    """fastmm.dask.send_after_default_stream's wait (fastmm/_dask_sends.py): the work queued on the legacy default
    stream and on blocking streams is done when it returns; work on a non-blocking stream (a planned task's
    products, finished by their own task) is not waited for."""
    from fastmm import _dask_sends

    big = cp.ones((4096, 4096), cp.float32)
    own = cp.cuda.Stream(non_blocking=True)
    with own:
        for _ in range(64):  # ~180 ms
            cp.matmul(big, big)
    _dask_sends.wait_for_default_stream()
    assert not own.done
    own.synchronize()
    blocking = cp.cuda.Stream()
    with blocking:
        for _ in range(16):
            cp.matmul(big, big)
    _dask_sends.wait_for_default_stream()  # nothing queued on the legacy stream itself
    assert blocking.done
    for _ in range(16):
        cp.matmul(big, big)  # the legacy stream
    _dask_sends.wait_for_default_stream()
    assert cp.cuda.Stream.null.done


def test_with_finish_tasks_a_task_returns_with_its_gpu_work_done():
    """send_after_default_stream(finish_tasks=True) on a one-GPU cluster: a task's CuPy work runs on a non-blocking
    stream of its thread's own, and is done when the task's result is there (nothing left on the legacy stream
    either); Dask's own graph of fastmm chunks still gives the right product."""
    pytest.importorskip("distributed", reason="distributed is not installed: pip install 'fastmm[dask]'")
    from dask.distributed import Client

    from fastmm._tools.dask_bench import _cluster

    def busy():  # (nested: sent to the worker by value)
        import cupy

        big = cupy.ones((4096, 4096), cupy.float32)
        for _ in range(64):  # ~180 ms on CuPy's current stream
            r = big @ big
        return cupy.cuda.get_current_stream().ptr, r[:1, :1].copy()

    def streams_idle():
        import threading

        import cupy

        own = [t.fastmm_task_stream for t in threading.enumerate() if getattr(t, "fastmm_task_stream", None)]
        return cupy.cuda.Stream.null.done, bool(own) and all(s.done for s in own)

    with _cluster(1) as cluster, Client(cluster) as client:
        assert fd.send_after_default_stream(client, finish_tasks=True)
        ptr, corner = client.submit(busy, pure=False).result()
        assert ptr != 0 and float(corner[0, 0]) == 4096.0
        (legacy, own), = client.run(streams_idle).values()
        assert legacy and own
        a = np.random.default_rng(3).standard_normal((3000, 2000)).astype(np.float32)
        x = fd.from_array(a, chunks=(1000, 700))
        got = client.compute(fd.to_host(x @ x.T)).result()
    _close(got, a.astype(np.float64) @ a.astype(np.float64).T)


@pytest.mark.parametrize("task", ["first", "add"])
def test_a_planned_task_never_reuses_memory_another_thread_still_reads(task, rng, monkeypatch):
    """With two threads a worker runs two tasks at once: another task may queue a read of a block on the legacy
    stream after this task's stream has waited for that stream, and Dask may free the block meanwhile. Neither the
    running sum a task keeps (taken on the legacy stream before the wait) nor its temporaries (taken on its own
    stream, whose blocks only its own finished tasks freed) can then be that block: the read sees the block's values
    (small integers: every sum is exact). Here the other task runs exactly after this one's wait."""
    import threading

    n = 2048

    def ints():
        return fastmm.asarray(rng.integers(-3, 4, (n, n)).astype(np.float32))

    a, b, c, d = ints(), ints(), ints(), ints()
    want = (300 * (a.astype(cp.float64) @ b.astype(cp.float64))).astype(cp.float32)
    cp.get_default_memory_pool().free_all_blocks()
    held = {"z": fd._finished(fd._first_sum, a, b)}  # a block a finished task made
    acc = cp.zeros((n, n), cp.float32)
    big = cp.ones((4096, 4096), cp.float32)

    def other_task():  # reads the block on the legacy stream, behind ~10 ms of queued work, and lets it go
        with cp.cuda.Stream.null:
            for _ in range(8):
                cp.matmul(big, big)
            for _ in range(300):
                cp.add(acc, held["z"], out=acc)
        del held["z"]

    real = fd._task_stream()

    class AfterTheWait:  # the task's stream, the other task running right after this task's wait
        def wait_event(self, event):
            real.wait_event(event)
            other = threading.Thread(target=other_task)
            other.start()
            other.join()

        def __enter__(self):
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

        def synchronize(self):
            real.synchronize()

    monkeypatch.setattr(fd, "_task_stream", AfterTheWait)
    if task == "first":
        got = fd._finished(fd._first_sum, c, d)
        want_got = c.astype(cp.float64) @ d.astype(cp.float64)
    else:
        total = fastmm.asarray(cp.zeros((n, n), cp.float32))
        got = fd._finished(fd._multiply_add, total, c, d)  # its temporary is the block's size
        want_got = c.astype(cp.float64) @ d.astype(cp.float64)
    cp.cuda.Device().synchronize()
    assert bool((acc == want).all())
    assert bool((got == want_got).all())


@pytest.mark.parametrize("gpus", [2, 4])
def test_products_on_a_local_cluster_of_gpus(gpus, rng):
    """One worker per GPU (dask-cuda's LocalCUDACluster, or the same made of distributed's nannies): Dask's own graph
    and the planned product, ragged chunks, a transposed operand."""
    if cp.cuda.runtime.getDeviceCount() < gpus:
        pytest.skip(f"needs {gpus} GPUs; this machine has {cp.cuda.runtime.getDeviceCount()}")
    pytest.importorskip("distributed", reason="distributed is not installed: pip install 'fastmm[dask]'")
    from dask.distributed import Client

    from fastmm._tools.dask_bench import _cluster

    a = rng.standard_normal((4000, 2000)).astype(np.float32)
    b = rng.standard_normal((3000, 2000)).astype(np.float32)
    with _cluster(gpus) as cluster, Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == gpus
        x = fd.from_array(a, chunks=(1000, 700))  # K in 700, 700, 600; y.T's columns in 900 x 3 and 300
        y = fd.from_array(b, chunks=(900, 700))
        got = client.compute(fd.to_host(x @ y.T)).result()
        # The planned product: operand chunks come from other workers, and arrive as fastmm arrays
        # (fastmm/_serialize.py), so its output chunks are fastmm's products, fastmm arrays again.
        blocks = client.compute(fd.matmul(x, y.T).to_delayed().tolist(), sync=True)
        # x @ x.T: x's chunks alone travel, read transposed as B's (on 4 GPUs: the cross layout, 4 row blocks);
        # compute made dear in the time model, so that even this small product is split
        dear = {"flops_per_s": 1e3}
        plan = fd._plan(x, x.T, gpus, dear)
        assert plan.product.gram and plan.placement.kind == ("cross" if gpus == 4 else "rows"), plan.placement
        gram = client.compute(fd.to_host(fd.matmul(x, x.T, **dear))).result()
    want = a.astype(np.float64) @ b.astype(np.float64).T
    _close(gram, a.astype(np.float64) @ a.astype(np.float64).T)
    _close(got, want)
    assert {type(blk) for row in blocks for blk in row} == {fastmm.ndarray}
    _close(np.block([[cp.asnumpy(blk) for blk in row] for row in blocks]), want)


@pytest.mark.parametrize("family", ["dask", "cuda"])
@pytest.mark.parametrize("case", ["float32", "fortran", "strided", "float64", "int8", "large", "empty", "vector"])
def test_fastmm_arrays_cross_between_workers_as_fastmm_arrays(family, case, rng):
    """distributed's serialization of a chunk (host frames for TCP, a device frame for UCX) gives back a fastmm
    array equal to it, in any layout and dtype."""
    pytest.importorskip("distributed", reason="distributed is not installed: pip install 'fastmm[dask]'")
    from distributed.protocol import deserialize, serialize

    shape = {"large": (9000, 8000), "empty": (0, 7), "vector": (1001,)}.get(case, (300, 200))  # large: CuPy's copies
    dtype = {"float64": np.float64, "int8": np.int8}.get(case, np.float32)
    x = fastmm.asarray((rng.standard_normal(shape) * 50).astype(dtype))
    if case == "fortran":
        x = fastmm.asarray(cp.asfortranarray(x))
    elif case == "strided":
        x = x[::2, 3:]
    header, frames = serialize(x, serializers=(family,))
    assert header["serializer"] == family
    y = deserialize(header, frames, deserializers=(family,))
    assert type(y) is fastmm.ndarray and y.dtype == x.dtype and y.shape == x.shape
    assert bool((y == x).all())
    if case == "fortran":
        assert y.flags.f_contiguous
    # The header is CuPy's: a process where fastmm's serializers are not registered reads it with CuPy's own.
    try:
        from distributed.protocol import cupy as cupy_serializers
    except ImportError:  # CuPy's serializers need numba or rmm
        return
    plain = {"cuda": cupy_serializers.cuda_deserialize_cupy_ndarray,
             "dask": cupy_serializers.dask_deserialize_cupy_ndarray}[family](header["sub-header"], frames)
    assert bool((fastmm.asarray(plain) == x).all())
