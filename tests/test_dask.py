"""fastmm.dask without a GPU: the optional import, the graph's chunk type, and Dask's lookup tables.

Graphs are built here on a machine with no GPU (as a Dask client or scheduler may be): nothing is uploaded until
a task runs. Computing them is tested in test_gpu_dask.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest


def test_without_dask_the_import_error_names_the_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["dask"] = None          # as if Dask were not installed
        import fastmm                       # the core package never needs it
        try:
            import fastmm.dask
        except ImportError as e:
            assert "pip install 'fastmm[dask]'" in str(e), e
            print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


da = pytest.importorskip("dask.array", reason="Dask is not installed: pip install 'fastmm[dask]'")
pytest.importorskip("cupy", reason="fastmm arrays need CuPy installed (no GPU needed to build a graph)")

import fastmm  # noqa: E402
import fastmm.dask as fd  # noqa: E402
from fastmm import linalg  # noqa: E402


def test_meta_is_an_empty_fastmm_array_that_needs_no_gpu():
    m = fd.meta(np.float64, 3)
    assert type(m) is fastmm.ndarray and m.shape == (0, 0, 0) and m.dtype == np.float64


@pytest.mark.parametrize("source", ["numpy", "memmap", "dask"])
def test_from_array_builds_a_graph_of_fastmm_chunks(source, tmp_path):
    host = np.arange(100 * 80, dtype=np.float32).reshape(100, 80)
    if source == "memmap":
        mm = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.float32, shape=host.shape)
        mm[...] = host
        x = fd.from_array(mm, chunks=(30, 40))
    elif source == "dask":
        x = fd.from_array(da.from_array(host, chunks=(30, 40)))
    else:
        x = fd.from_array(host, chunks=(30, 40))
    assert type(x._meta) is fastmm.ndarray and x.dtype == np.float32
    assert x.chunks == ((30, 30, 30, 10), (40, 40))
    y = x @ x.T  # a graph: nothing runs, nothing is uploaded (there is no GPU here)
    assert y.shape == (100, 100) and y.numblocks == (4, 4)
    assert type(fd.to_host(y)._meta) is np.ndarray


def test_dasks_lookups_hand_fastmm_chunks_to_fastmm():
    from dask.array.dispatch import concatenate_lookup, einsum_lookup, empty_lookup, tensordot_lookup

    assert tensordot_lookup.dispatch(fastmm.ndarray) is linalg.tensordot
    assert concatenate_lookup.dispatch(fastmm.ndarray) is fd._concatenate
    assert einsum_lookup.dispatch(fastmm.ndarray) is fd._einsum
    assert empty_lookup.dispatch(fastmm.ndarray) is fd._empty
    import cupy

    assert tensordot_lookup.dispatch(cupy.ndarray) is cupy.tensordot  # plain CuPy chunks stay CuPy's


def test_graphs_concatenate_metas_without_a_gpu():
    x = fd.from_array(np.ones((100, 80), np.float32), chunks=(30, 40))
    both = da.concatenate([x, x], axis=1)
    assert type(both._meta) is fastmm.ndarray and both.shape == (100, 160)
    assert fd._concatenate([fd.meta(), fd.meta()], axis=1).shape == (0, 0)


def test_a_0d_meta_is_never_a_fastmm_array_over_no_memory():
    m = fd.meta(np.float32, 0)
    assert m.shape == () and (type(m) is np.ndarray or m.data.ptr != 0)


def test_dask_bench_measures_one_two_four_and_all_gpus():
    from fastmm._tools.dask_bench import KINDS, gpu_counts

    assert gpu_counts(1) == [1] and gpu_counts(2) == [1, 2] and gpu_counts(4) == [1, 2, 4]
    assert gpu_counts(6) == [1, 2, 4, 6] and gpu_counts(8) == [1, 2, 4, 8]
    assert KINDS == ("fastmm", "cupy", "planned", "planned-cupy")


def test_dask_bench_names_a_protocol_it_cannot_use():
    from fastmm._tools.dask_bench import protocol_missing

    assert protocol_missing("tcp") is None
    assert "valid: tcp, ucx" in protocol_missing("inproc")
    try:
        import distributed_ucxx  # noqa: F401
    except ImportError:
        assert "pip install 'fastmm[ucx]'" in protocol_missing("ucx")
    else:
        assert protocol_missing("ucx") is None


def test_dask_bench_counts_the_bytes_that_cross_between_workers():
    """What `bench --dask` reports as moved between GPUs: the workers' own transfer logs, reset before a run."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    import dask.array as da

    from fastmm._tools.dask_bench import clear_moved, moved

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        a, b = client.scheduler_info()["workers"]
        x = client.persist(da.random.random((1000, 100), chunks=(500, 100)), workers=[a])
        distributed.wait(x)
        clear_moved(client)
        assert moved(client) == (0, 0.0)
        total = client.submit(lambda blocks: sum(block.sum() for block in blocks), distributed.futures_of(x),
                              workers=[b])
        assert total.result() > 0
        nbytes, rate = moved(client)
        assert nbytes == 1000 * 100 * 8 and rate > 0  # both chunks, from a to b


def test_dask_bench_turns_work_stealing_off_and_counts_the_tasks_stolen():
    """--dask-stealing off: the setting the scheduler reads as it starts (a planned task that is stolen fetches its
    operands again); the count of stolen tasks is the scheduler's log of confirmed moves."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    import dask

    from fastmm._tools.dask_bench import _confirmed_steals, parse_stealing, steals

    assert parse_stealing("on") == (True,) and parse_stealing("on,off") == (True, False)
    assert parse_stealing("off, off") == (False,)
    with pytest.raises(ValueError, match=r"--dask-stealing takes on, off or on,off \(got 'maybe'\)"):
        parse_stealing("maybe")
    for on in (True, False):
        with dask.config.set({"distributed.scheduler.work-stealing": on}), \
                distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as c, \
                distributed.Client(c) as client:
            assert ("stealing" in c.scheduler.extensions) == on
            assert steals(client) == 0

    class Log:
        def get_events(self, topic):
            assert topic == "stealing"
            return [(0.0, ("request", [])), (1.0, ("confirm", "k", "memory", "a", "b", "s")),
                    (2.0, ("already-computing", "k2")), (3.0, ("confirm", "k3", "memory", "b", "a", "s"))]

    assert _confirmed_steals(Log()) == 2


def test_ucx_workers_wait_for_the_default_stream_once_asked(monkeypatch):
    """fastmm.dask.send_after_default_stream: every worker's distributed-ucxx wait before a device transfer becomes
    fastmm's (the default stream's), once, and a worker without distributed-ucxx is left as it is; the bench's
    --dask-ucx-wait names both ways."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    import types

    from fastmm import _dask_sends
    from fastmm._tools.dask_bench import parse_waits

    assert parse_waits("stream") == ("stream",) and parse_waits("stream, device,stream") == ("stream", "device")
    assert parse_waits("tasks,device") == ("tasks", "device")
    with pytest.raises(ValueError, match=r"--dask-ucx-wait takes stream, tasks, device or several .*\(got 'host'\)"):
        parse_waits("host")
    plugin = _dask_sends.SendAfterDefaultStream()
    monkeypatch.setitem(sys.modules, "distributed_ucxx", None)  # not installed
    plugin.setup()
    assert plugin.replaced is None

    def device_wide(stream=None):  # distributed-ucxx's own: cudaDeviceSynchronize
        raise AssertionError("the whole device was waited for")

    comm = types.ModuleType("distributed_ucxx.ucxx")
    comm.synchronize_stream = device_wide
    package = types.ModuleType("distributed_ucxx")
    package.ucxx = comm
    monkeypatch.setitem(sys.modules, "distributed_ucxx", package)
    monkeypatch.setitem(sys.modules, "distributed_ucxx.ucxx", comm)
    with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        assert fastmm.dask.send_after_default_stream(client)
        replaced = comm.synchronize_stream  # (fastmm's, shipped by value: a copy)
        assert replaced.__name__ == "wait_for_default_stream" and replaced.fastmm
        name = _dask_sends.SendAfterDefaultStream.name
        plugins = client.run(lambda dask_worker: id(dask_worker.plugins[name]))
        assert fastmm.dask.send_after_default_stream()  # again (the current client): not set up again
        assert client.run(lambda dask_worker: id(dask_worker.plugins[name])) == plugins
        assert comm.synchronize_stream is replaced
        fastmm.dask.send_after_default_stream(client, finish_tasks=True)  # a second plugin of fastmm's
        client.unregister_worker_plugin(name)
        assert comm.synchronize_stream is replaced  # still fastmm's, for the other plugin
        client.unregister_worker_plugin(f"{name}-finish-tasks")  # the last: distributed-ucxx's own wait again
        assert comm.synchronize_stream is device_wide


def _executor_type(dask_worker):
    return type(dask_worker.executors["default"]).__name__


def test_finish_tasks_runs_every_task_through_a_finishing_thread_pool(monkeypatch):
    """send_after_default_stream(finish_tasks=True): each worker's default executor runs every task through
    `finishing` (a stream of the thread's own, finished when the task returns; as it is where there is no GPU), under
    a type name distributed still runs as a thread pool; taken down with the plugin."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    import dask.array as da

    from fastmm import _dask_sends

    import threading
    import types

    monkeypatch.setitem(sys.modules, "distributed_ucxx", None)  # the executor alone

    def through_finishing():  # (the thread's stream, None without a GPU, is set by `finishing` before the task runs)
        return hasattr(threading.current_thread(), "fastmm_task_stream")

    with distributed.LocalCluster(n_workers=2, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        before = client.run(_executor_type)
        assert not client.submit(through_finishing, pure=False).result()
        assert fastmm.dask.send_after_default_stream(client, finish_tasks=True)
        assert set(client.run(_executor_type).values()) == {"FinishingThreadPoolExecutor"}
        assert all(client.gather([client.submit(through_finishing, pure=False, workers=[w]) for w in before]))
        x = da.arange(1000, chunks=100)
        assert int((x * 2).sum().compute()) == 999000
        client.unregister_worker_plugin(f"{_dask_sends.SendAfterDefaultStream.name}-finish-tasks")
        assert client.run(_executor_type) == before


    class ProcessPoolExecutor:  # (a worker whose tasks run in other processes: their functions must pickle)
        pass

    worker = types.SimpleNamespace(executors={"default": ProcessPoolExecutor()}, plugins={})
    _dask_sends.SendAfterDefaultStream(finish_tasks=True).setup(worker)
    assert type(worker.executors["default"]) is ProcessPoolExecutor


def test_fastmm_arrays_have_serializers_of_their_own():
    """Chunks sent between workers must arrive as fastmm arrays (CuPy's deserializer, found through the base class,
    makes plain CuPy arrays, whose products are cuBLAS's); registered by fastmm.dask, and by fastmm itself in a
    process already running distributed (a worker), as its first unpickling of a fastmm array's type imports it."""
    pytest.importorskip("distributed")
    from distributed.protocol import cuda_deserialize, cuda_serialize, dask_deserialize, dask_serialize

    from fastmm import _serialize

    for family in (cuda_serialize, cuda_deserialize, dask_serialize, dask_deserialize):
        assert family.dispatch(fastmm.ndarray).__module__ == "fastmm._serialize"
    code = ("import pickle, distributed.protocol as p, fastmm._array as a\n"
            "from distributed.protocol import dask_deserialize as d\n"
            "print(d.dispatch(a.ndarray).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fastmm._serialize", out.stderr


def test_dask_bench_refuses_an_unknown_graph_kind_before_any_work():
    code = ("import sys, runpy; sys.argv = ['fastmm', 'bench', '--dask', '--dask-kinds', 'planned,foo']; "
            "runpy.run_module('fastmm', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert "--dask-kinds: unknown graph kind(s) ['foo']; valid: fastmm, cupy, planned, planned-cupy" in out.stderr, out.stderr
    bad = code.replace("'--dask-kinds', 'planned,foo'", "'--dask-stealing', 'maybe'")
    out = subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True)
    assert out.returncode == 2 and "--dask-stealing takes on, off or on,off (got 'maybe')" in out.stderr, out.stderr
    code = code.replace("'--dask-kinds', 'planned,foo'", "'--dask-threads', '0'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and "--dask-threads must be at least 1 (got 0)" in out.stderr, out.stderr
    code = code.replace("'--dask-threads', '0'", "'--dask-repeat', '0'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and "--dask-repeat must be at least 1 (got 0)" in out.stderr, out.stderr


def test_each_bench_worker_sees_every_gpu_its_own_first(monkeypatch):
    """As dask-cuda sets CUDA_VISIBLE_DEVICES: the worker's current device is its GPU, and UCX can map the others'
    memory over NVLink (a worker that sees one GPU receives chunks through host memory)."""
    from fastmm._tools.dask_bench import host_gpus, visible_devices

    assert [visible_devices(i, ["0", "1", "2", "3"]) for i in range(4)] == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, 7")
    assert host_gpus() == ["5", "7"] and visible_devices(1, host_gpus()) == "7,5"


def test_bench_workers_start_ucx_as_dask_cuda_does_for_nvlink():
    """Read back through Dask's own environment parsing: each worker makes its CUDA context before UCX starts and asks
    for NVLink (cuda_ipc), TCP and cuda_copy, the keys distributed-ucxx reads."""
    dask = pytest.importorskip("dask")
    from fastmm._tools.dask_bench import UCX_NVLINK, ucx_environment

    seen = dask.config.collect_env(ucx_environment())
    for key, value in UCX_NVLINK.items():
        assert dask.config.get(f"distributed-ucxx.{key}", config=seen) is value


def test_fastmm_arrays_travel_with_cupys_header():
    """A process where fastmm's serializers are not registered (a client that imported fastmm before distributed and
    never fastmm.dask) reads them with CuPy's deserializer, which needs CuPy's header: shape, typestr, strides."""
    pytest.importorskip("distributed")
    from distributed.protocol import serialize

    x = fd._null((0, 4), np.float32)
    header, frames = serialize(x, serializers=("cuda",))
    assert header["serializer"] == "cuda" and len(frames) == 1
    assert header["sub-header"] == {"shape": (0, 4), "typestr": "<f4", "strides": tuple(x.strides)}


def test_bench_table_prints_the_link_rate_beside_the_products(capsys):
    from fastmm._tools.dask_bench import print_table

    rows = [{"what": "link (ucx)", "protocol": "ucx", "gpus": 2, "link": 80e9},
            {"what": "one", "gpus": 1, "n": 1024, "kind": "planned", "protocol": "ucx", "seconds": 1.0, "tflops": 1.0},
            {"what": "two", "gpus": 2, "n": 1024, "kind": "planned", "protocol": "ucx", "seconds": 0.5, "tflops": 2.0,
             "moved": 2 ** 30, "link": 40e9,
             "plan": "1024x1024x1024 product ...:\n  layout  rows split\n  moved   1 GiB"}]
    print_table(rows)
    out = capsys.readouterr().out
    assert "    plan layout  rows split\n    plan moved   1 GiB\n" in out  # (--dask-timeline: the plan of the run)
    assert "80.0 GB/s, one chunk from worker to worker" in out
    assert "1.00 GiB between GPUs at  40.0 GB/s a transfer" in out
    assert "2 GPUs 2.00x one, 100% efficiency" in out


def test_dask_bench_timeline_reads_each_workers_task_stream():
    """--dask-timeline: per worker, first start and last end from the run's start, the seconds its tasks computed
    (two threads' overlapping tasks counted once) and received data."""
    from fastmm._tools.dask_bench import _union, timeline

    assert _union([(0, 1), (0.5, 2), (3, 4)]) == 3 and _union([]) == 0
    t0 = 100.0
    records = [
        {"worker": "w1", "startstops": [{"action": "transfer", "start": 100.0, "stop": 100.2},
                                        {"action": "compute", "start": 100.2, "stop": 100.5}]},
        {"worker": "w1", "startstops": [{"action": "compute", "start": 100.4, "stop": 100.9}]},
        {"worker": "w0", "startstops": [{"action": "deserialize", "start": 100.0, "stop": 100.1},
                                        {"action": "compute", "start": 100.1, "stop": 100.3}]},
    ]
    w0, w1 = timeline(records, t0)
    assert (w0["worker"], w0["tasks"], round(w0["first"], 6), round(w0["last"], 6)) == ("w0", 1, 0.1, 0.3)
    assert round(w0["compute"], 6) == 0.2 and w0["transfer"] == 0
    assert (w1["tasks"], round(w1["first"], 6), round(w1["last"], 6), round(w1["compute"], 6)) == (2, 0.2, 0.9, 0.7)
    assert round(w1["transfer"], 6) == 0.2


def test_store_writes_each_block_into_its_region_of_a_host_array(tmp_path):
    """fastmm.dask.store on host chunks (the CPU's case: a plain write), into a memory map and into a strided view;
    an h5py-like target without NumPy's views gets each block by assignment."""
    import dask.array as da

    rng = np.random.default_rng(0)
    a = rng.standard_normal((90, 70)).astype(np.float32)
    x = da.from_array(a, chunks=(40, 30))
    c = fd.matmul(x, x.T)
    want = a.astype(np.float64) @ a.astype(np.float64).T
    mm = np.lib.format.open_memmap(tmp_path / "c.npy", mode="w+", dtype=np.float32, shape=(90, 90))
    wide = np.full((90, 180), np.nan, np.float32)

    class Setter:  # what h5py and Zarr datasets offer: shape, dtype, setitem
        def __init__(self):
            self.data, self.shape, self.dtype = np.full((90, 90), np.nan, np.float32), (90, 90), np.float32

        def __setitem__(self, index, value):
            self.data[index] = value

    setter = Setter()
    for target in (mm, wide[:, ::2], setter):
        fd.store(c, target, scheduler="threads")
    for got in (np.asarray(mm), wide[:, ::2], setter.data):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.isnan(wide[:, 1::2]).all()


def test_store_takes_lists_locks_where_a_target_is_not_numpys_and_never_ships_its_target(monkeypatch):
    """fastmm.dask.store as dask.array.store: lists of sources and targets; lock=False by default only where every
    target is a NumPy array (a chunked store such as Zarr reads, modifies and writes back its own chunks); each store
    named apart; a target never pickled to another process (its writes would land in a copy)."""
    import pickle

    import dask.array as da

    from fastmm import _dask_host

    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = da.from_array(a, chunks=4)
    one, two = np.zeros_like(a), np.zeros_like(a)
    fd.store([x, 2 * x], [one, two], scheduler="threads")
    np.testing.assert_array_equal(one, a)
    np.testing.assert_array_equal(two, 2 * a)

    seen = {}
    monkeypatch.setattr(da, "store", lambda sources, targets, **kw: seen.update(kw))
    fd.store(x, one)
    assert seen["lock"] is False
    seen.clear()

    class Chunked:  # a Zarr-like target: shape, dtype, setitem, no NumPy views
        shape, dtype = a.shape, a.dtype

        def __setitem__(self, index, value):
            pass

    fd.store(x, Chunked())
    assert "lock" not in seen  # Dask's default: a lock
    fd.store([x, x], [one, np.ma.masked_all(a.shape, a.dtype)])
    assert "lock" not in seen or seen["lock"] is not False

    t = _dask_host.HostTarget(one)
    from dask.base import tokenize

    assert tokenize(t) != tokenize(_dask_host.HostTarget(one)) and tokenize(t) == tokenize(t)
    with pytest.raises(TypeError, match="scheduler='threads'"):
        pickle.dumps(t)
