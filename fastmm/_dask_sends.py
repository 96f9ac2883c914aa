"""The workers' side of device transfers over UCX: wait for the work that can touch a chunk, not for the whole GPU.

distributed-ucxx (0.52) waits before it sends or receives a device frame, in the worker's event loop, and that wait is
for the whole device (``cudaDeviceSynchronize``): every kernel queued on any stream of the worker's GPU. Its own
comment states the intent, the default stream ("this is only sufficient if the memory being sent is not currently in
use on non-blocking CUDA streams"). Under `fastmm.dask.matmul`, a worker's products run on non-blocking streams of
their tasks' own and are finished when their tasks return, so every transfer from or to a busy GPU waited for the
products in flight there (up to two at 8192^2 with two threads: tens of milliseconds each time, with the worker's
event loop stopped meanwhile).

`SendAfterDefaultStream` replaces that wait, on each worker, by one for what the default (legacy) stream has queued:
the work of the legacy stream and, through its implicit ordering, of every blocking stream (CuPy's default, streams
made without ``non_blocking``, a per-thread default stream). Only work on non-blocking streams is no longer waited
for, which is distributed-ucxx's own stated contract. `send_after_default_stream` registers it (``fastmm.dask``).

With ``finish_tasks=True`` it also makes every task of the worker meet that contract: each runs with CuPy's current
stream a non-blocking stream of its thread's own (which first waits, on the GPU, for the legacy stream's work) and
returns once that stream's work is done (`FinishingThreadPoolExecutor`). Dask's own graphs then queue nothing on the
legacy stream, and a transfer waits for no task's kernels, as `fastmm.dask.matmul`'s tasks already arrange.
Shipped to the workers by value: it imports nothing of fastmm's.
"""

from __future__ import annotations

import threading

try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # (without distributed there is no cluster to register it with)
    WorkerPlugin = object

__all__ = ["SendAfterDefaultStream", "FinishingThreadPoolExecutor", "send_after_default_stream",
           "wait_for_default_stream"]


def wait_for_default_stream(stream=None) -> None:
    """Wait until the work queued so far on device 0's legacy default stream (and, ordered before it, on every
    blocking stream) is done: an event recorded there, then waited for. (Device 0 is the worker's own GPU, as
    dask-cuda orders CUDA_VISIBLE_DEVICES; distributed-ucxx's wait names it too.)"""
    import cupy

    with cupy.cuda.Device(0):
        event = cupy.cuda.Event(disable_timing=True)
        event.record(cupy.cuda.Stream.null)
        event.synchronize()


wait_for_default_stream.fastmm = True

def _thread_stream():
    """This thread's non-blocking stream on device 0, or None where there is no GPU (checked once per thread; kept
    on the thread itself, as the module travels to the workers by value and a thread-local would not pickle)."""
    thread = threading.current_thread()
    stream = getattr(thread, "fastmm_task_stream", False)
    if stream is False:
        stream = None
        try:
            import cupy

            if cupy.cuda.is_available():
                with cupy.cuda.Device(0):
                    stream = cupy.cuda.Stream(non_blocking=True)
        except Exception:  # noqa: BLE001 - no CuPy or no GPU here: tasks run as they are
            stream = None
        thread.fastmm_task_stream = stream
    return stream


def finishing(fn):
    """fn, run with its thread's non-blocking stream as CuPy's current stream (after a GPU-side wait for the legacy
    stream's work: operands made there), and returning once that stream's work is done, raised errors included."""
    def run(*args, **kwargs):
        stream = _thread_stream()
        if stream is None:
            return fn(*args, **kwargs)
        import cupy

        with cupy.cuda.Device(0):
            stream.wait_event(cupy.cuda.Stream.null.record())
            try:
                with stream:
                    return fn(*args, **kwargs)
            finally:
                stream.synchronize()

    return run


class FinishingThreadPoolExecutor:
    """A worker's thread pool whose tasks each run by `finishing`. (distributed runs a task through its executor's
    thread machinery where the executor's type name says ThreadPoolExecutor.)"""

    def __init__(self, inner):
        self.inner = inner

    def submit(self, fn, /, *args, **kwargs):
        return self.inner.submit(finishing(fn), *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class SendAfterDefaultStream(WorkerPlugin):
    """On each worker: distributed-ucxx's wait before device transfers is `wait_for_default_stream`."""

    name = "fastmm-ucx-default-stream"
    idempotent = True

    def __init__(self, finish_tasks: bool = False):
        self.finish_tasks = finish_tasks
        if finish_tasks:  # (a plugin of its own: registered after the plain one, it still wraps the executor)
            self.name = f"{SendAfterDefaultStream.name}-finish-tasks"
        self.replaced = None  # whether this worker's wait is fastmm's (None: no distributed-ucxx there)
        self._executor = None

    def setup(self, worker=None):
        executors = getattr(worker, "executors", {})
        # (a thread pool's alone: distributed runs a process pool's tasks otherwise, and they must pickle)
        if self.finish_tasks and "ThreadPoolExecutor" in str(type(executors.get("default"))) \
                and self._executor is None:
            self._executor = executors["default"]
            executors["default"] = FinishingThreadPoolExecutor(self._executor)
        try:
            from distributed_ucxx import ucxx as comm
        except ImportError:  # no UCX on this worker: nothing to replace
            return
        original = getattr(comm, "synchronize_stream", None)
        if original is None:  # a distributed-ucxx that waits otherwise: left as it is
            self.replaced = False
            return
        if not getattr(original, "fastmm", False):
            comm.fastmm_device_wait = original  # (on the module: whichever of fastmm's plugins goes last restores it)
            comm.synchronize_stream = wait_for_default_stream
        self.replaced = True

    def teardown(self, worker=None):
        if self._executor is not None:
            worker.executors["default"], self._executor = self._executor, None
        others = [n for n in getattr(worker, "plugins", {}) if n.startswith(SendAfterDefaultStream.name) and
                  n != self.name]
        if self.replaced and not others:  # (fastmm's last plugin removed: distributed-ucxx's own wait again)
            from distributed_ucxx import ucxx as comm

            comm.synchronize_stream = getattr(comm, "fastmm_device_wait", comm.synchronize_stream)


def send_after_default_stream(client=None, *, finish_tasks: bool = False) -> bool:
    """Have the workers of `client` (default: the current one) wait, before each device transfer over UCX, for their
    GPU's default stream rather than for the whole GPU (see the module's docstring, and the Dask page of the
    documentation for what it changes). Workers that join later get it too.

    Call it once per cluster, where every task that returns a device array has finished the work on non-blocking
    streams that writes it (as `fastmm.dask.matmul`'s tasks do, and tasks that use CuPy's default stream need not):
    a transfer no longer waits for such work. With ``finish_tasks=True``, every task runs on a non-blocking stream
    of its worker thread's own (CuPy's current stream) and returns once its GPU work is done, so that transfers do
    not wait for the products of Dask's own graphs either; a worker's GPU then idles while its thread moves from one
    task to the next, which costs where tasks are short. Returns False where distributed is not installed.

    Examples
    --------
    >>> from dask_cuda import LocalCUDACluster                     # doctest: +SKIP
    >>> client = Client(LocalCUDACluster(protocol="ucx"))          # doctest: +SKIP
    >>> fastmm.dask.send_after_default_stream(client)              # doctest: +SKIP
    True
    """
    if WorkerPlugin is object:
        return False
    import sys

    import cloudpickle

    if client is None:
        from distributed import get_client

        client = get_client()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import fastmm
    client.register_plugin(SendAfterDefaultStream(finish_tasks))
    return True
