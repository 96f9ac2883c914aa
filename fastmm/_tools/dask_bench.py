"""``python -m fastmm bench --dask``: Dask arrays of fastmm chunks, in one run.

1. One GPU, in memory: ``fastmm.matmul`` on device operands of the largest size asked for, the reference rate.
2. One GPU, out of core: the same product from host operands through a Dask graph of fastmm chunks, with CuPy's
   memory pool capped below what operands and result need together (``--dask-gpu-limit``, GiB): the product cannot
   be held on the GPU at once, and chunks stream through it.
3. One GPU, two, four ... all on a local cluster (one worker per GPU: dask-cuda's ``LocalCUDACluster`` when
   installed, else one ``distributed`` nanny per GPU with ``CUDA_VISIBLE_DEVICES`` set as it sets it), data
   created on the workers' GPUs: Dask's own graph with fastmm chunks and with plain CuPy chunks (cuBLAS) as the
   reference, and ``fastmm.dask.matmul``'s planned graph; the scaling efficiency is (rate on g GPUs) / (g x rate on
   one).

Times are wall-clock seconds of the whole graph (what a user waits for), after a warm-up run of the same graph;
results are checked against a float64 product on a sample of rows.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

import numpy as np


# Tasks at once in the out-of-core product: one more than two lets a chunk's copies overlap two others' products
# (0.69x -> 0.81x the in-memory rate at 32768^3 on an H200, docs/dask.md), within a 10 GiB pool.
OOC_WORKERS = 3


# The cluster's products: Dask's own graph (da.matmul) on fastmm chunks and on CuPy chunks (cuBLAS), and
# fastmm.dask.matmul's planned graph on fastmm chunks and on CuPy chunks (the same graph, cuBLAS's products).
KINDS = ("fastmm", "cupy", "planned", "planned-cupy")


def parse_kinds(text: str) -> tuple[str, ...]:
    """--dask-kinds's graphs; ValueError naming the valid ones for any other."""
    kinds = tuple(k for k in text.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"--dask-kinds: unknown graph kind(s) {unknown or [text]}; valid: {', '.join(KINDS)}")
    return kinds


def parse_stealing(text: str) -> tuple[bool, ...]:
    """--dask-stealing: "on", "off" or "on,off" (each cluster measured both ways)."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    bad = sorted(set(words) - {"on", "off"})
    if bad or not words:
        raise ValueError(f"--dask-stealing takes on, off or on,off (got {text!r})")
    return tuple(dict.fromkeys(w == "on" for w in words))


WAITS = ("stream", "tasks", "device")


def parse_waits(text: str) -> tuple[str, ...]:
    """--dask-ucx-wait: any of stream, tasks and device, comma-separated (each UCX cluster measured each way)."""
    words = tuple(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
    if not words or set(words) - set(WAITS):
        raise ValueError(f"--dask-ucx-wait takes {', '.join(WAITS)} or several of them, comma-separated (got {text!r})")
    return words


def gpu_counts(most: int) -> list[int]:
    """1, 2, 4, ... up to `most` GPUs, and `most` itself."""
    return sorted({1 << i for i in range(most.bit_length()) if 1 << i <= most} | {most})


def protocol_missing(protocol: str) -> str | None:
    """Why the cluster cannot talk `protocol` here ("tcp" always can; "ucx" needs distributed-ucxx), or None."""
    if protocol == "tcp":
        return None
    if protocol != "ucx":
        return f"unknown protocol {protocol!r}; valid: tcp, ucx"
    try:
        import distributed_ucxx  # noqa: F401
    except ImportError:
        return "UCX needs distributed-ucxx: pip install 'fastmm[ucx]'"
    return None


def host_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (all of the host's when it is unset)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import cupy as cp

    return [str(d) for d in range(cp.cuda.runtime.getDeviceCount())]


def visible_devices(i: int, host: list[str]) -> str:
    """CUDA_VISIBLE_DEVICES for the worker of GPU i, as dask-cuda sets it: every GPU of the host, its own first. The
    worker's current device is its own, and UCX can still map the others' memory (CUDA IPC over NVLink); a worker
    that sees only its own GPU receives every chunk through host memory."""
    return ",".join(host[(i + d) % len(host)] for d in range(len(host)))


# UCX as dask-cuda's LocalCUDACluster(enable_nvlink=True) sets it up: each worker's CUDA context made before UCX starts,
# so that UCX finds the GPUs and maps the others' memory over NVLink (cuda_ipc); left to its defaults, UCX started
# without a context and device chunks crossed through host memory (docs/dask.md).
UCX_NVLINK = {"create-cuda-context": True, "nvlink": True, "tcp": True, "cuda-copy": True}


def ucx_environment() -> dict[str, str]:
    """UCX_NVLINK as the environment variables a worker process reads (Dask's DASK_ prefix, __ between levels)."""
    return {f"DASK_DISTRIBUTED_UCXX__{k.upper().replace('-', '_')}": str(v) for k, v in UCX_NVLINK.items()}


def _cluster(gpus: int, protocol: str = "tcp", threads: int = 1, stealing: bool = True):
    """A local cluster with one worker per GPU, of `threads` threads (dask-cuda's default: one), talking `protocol`
    (tcp, or ucx over NVLink), its scheduler stealing work between workers or not (`stealing`)."""
    import dask

    # The scheduler reads these as it starts (in this process, as both kinds of cluster start it): stealing, and how
    # many events a topic its log keeps (1000 by default), where `steals` counts the stolen tasks.
    dask.config.set({"distributed.scheduler.work-stealing": stealing,
                     "distributed.admin.low-level-log-length": 1 << 20})
    ucx = protocol == "ucx"
    if ucx:
        # This process's UCX (the scheduler's and the client's) starts once, with the first cluster over UCX: set
        # for good, as a dask-cuda cluster would set it, rather than only while this one is built.
        dask.config.set({f"distributed-ucxx.{k}": v for k, v in UCX_NVLINK.items()})
    try:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=gpus, threads_per_worker=threads, protocol=protocol,
                                **({"enable_nvlink": True, "enable_tcp_over_ucx": True} if ucx else {}))
    except Exception as e:  # noqa: BLE001 - not installed, or a version that does not start here: said, then the same
        if not isinstance(e, ImportError):
            print(f"  dask-cuda's LocalCUDACluster did not start ({type(e).__name__}: {e}); one distributed nanny "
                  "per GPU instead", flush=True)
        from distributed import Nanny, Scheduler, SpecCluster

        # memory_limit=0: Dask counts a CuPy chunk's device bytes as the worker's memory, and against the host's
        # limit (7.9 GiB per worker on our GPU host) spilled 32768^3's chunks to disk (2 TFLOP/s); LocalCUDACluster
        # sets its own device-aware limits.
        host = host_gpus()
        workers = {i: {"cls": Nanny, "options": {"nthreads": threads, "memory_limit": 0,
                                                 "env": {"CUDA_VISIBLE_DEVICES": visible_devices(i, host),
                                                         **(ucx_environment() if ucx else {})}}}
                   for i in range(gpus)}
        for spec in workers.values():
            spec["options"]["protocol"] = protocol
        return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None,
                                                                                    "protocol": protocol}})


# Over NVLink, UCX maps each device allocation it sends into the receiving process once (cuda_ipc), which costs up to
# hundreds of milliseconds; CuPy's pool makes one allocation per chunk, so every new chunk paid it. An RMM pool as
# CuPy's allocator is one allocation, mapped once (as LocalCUDACluster(rmm_pool_size=...) sets it up).
RMM_POOL_SHARE = 0.8  # of a worker's free GPU memory


def _rmm_pool(share: float) -> str:
    """On a worker: an RMM pool of `share` of the free GPU memory as CuPy's allocator; what was set up, or why not."""
    import cupy as cp

    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
    except Exception as e:  # noqa: BLE001 - not installed, or built for another CUDA: the bench says so and goes on
        return f"no RMM pool ({type(e).__name__}: {e})"
    size = int(cp.cuda.runtime.memGetInfo()[0] * share) // 256 * 256
    rmm.reinitialize(pool_allocator=True, initial_pool_size=size)
    cp.cuda.set_allocator(rmm_cupy_allocator)
    return f"RMM pool of {size / 2**30:.0f} GiB"


def _chunk_on_device(nbytes: int, seed: int):
    import cupy as cp

    return cp.random.default_rng(seed).standard_normal(nbytes // 4, dtype=cp.float32)


def _device_bytes(x) -> int:
    import cupy as cp

    cp.cuda.Device().synchronize()
    return x.nbytes


def link_rate(client, nbytes: int = 256 << 20, trials: int = 4) -> float:
    """Bytes per second of one chunk sent from the first worker to the second, median of `trials` fresh chunks (each
    time including Dask's task round trip, a few milliseconds)."""
    from distributed import wait

    a, b = list(client.scheduler_info()["workers"])[:2]
    chunks = [client.submit(_chunk_on_device, nbytes, seed, workers=[a], pure=False) for seed in range(trials + 1)]
    wait(chunks)
    client.submit(_device_bytes, chunks[0], workers=[b], pure=False).result()  # connection and mapping set up
    times = []
    for chunk in chunks[1:]:
        t0 = time.perf_counter()
        client.submit(_device_bytes, chunk, workers=[b], pure=False).result()
        times.append(time.perf_counter() - t0)
    client.cancel(chunks)
    return nbytes / sorted(times)[len(times) // 2]


def _on_gpus(n: int, chunk: int, seed: int, name: str | None = None):
    """An (n, n) float32 Dask array of CuPy chunks made on the workers' GPUs (its keys named `name`: a graph made
    again under the keys of one just cancelled is cancelled with it)."""
    import cupy as cp
    import dask.array as da

    def block(block_info=None):
        info = block_info[None]
        (r0, r1), (c0, c1) = info["array-location"]
        rng = cp.random.default_rng(seed + r0 * 7919 + c0)
        return rng.standard_normal((r1 - r0, c1 - c0), dtype=cp.float32)

    meta = cp.empty((0, 0), cp.float32) if cp.cuda.is_available() else None
    return da.map_blocks(block, chunks=((chunk,) * (n // chunk), (chunk,) * (n // chunk)), dtype=np.float32,
                         meta=meta, name=name)


def _clear_log(dask_worker) -> None:
    dask_worker.transfer_incoming_log.clear()


def _incoming(dask_worker) -> tuple[int, float]:
    log = dask_worker.transfer_incoming_log
    return sum(entry["total"] for entry in log), sum(entry["duration"] for entry in log)


def clear_moved(client) -> None:
    """Forget the transfers the workers have logged (their log is bounded; a run's own transfers fit in it)."""
    client.run(_clear_log)


def moved(client) -> tuple[int, float]:
    """Bytes the workers received from each other since `clear_moved` (what crossed between GPUs), and the rate of
    those transfers (bytes over the seconds each took, transfers in parallel counted apart)."""
    logs = client.run(_incoming).values()
    total, seconds = sum(b for b, _ in logs), sum(s for _, s in logs)
    return total, total / seconds if seconds > 0 else 0.0


def _confirmed_steals(dask_scheduler) -> int:
    return sum(1 for _, msg in dask_scheduler.get_events("stealing") if isinstance(msg, tuple) and msg[0] == "confirm")


def steals(client) -> int:
    """Tasks the scheduler's work stealing has moved from the worker it had sent them to, so far (its log's confirmed
    moves): a planned task moved so fetches its operands again."""
    return client.run_on_scheduler(_confirmed_steals)


def _same(chunk):
    return chunk


def _union(intervals) -> float:
    """Seconds covered by the (start, stop) intervals, overlaps counted once."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total


def timeline(records, t0: float) -> list[dict]:
    """Per worker, from Dask's task stream of one run (`t0`: the run's start by the workers' clock, time.time()):
    seconds from the start to its first task's start and to its last task's end, the seconds its tasks computed
    (overlapping tasks of several threads counted once) and received data, and its tasks. With the planned product,
    whose tasks finish their kernels, the compute seconds are the GPU's busy time as Dask sees it; Dask's own graph's
    tasks end when their kernels are queued."""
    workers: dict = {}
    for task in records:
        w = workers.setdefault(task["worker"], {"compute": [], "transfer": []})
        for ss in task.get("startstops", ()):
            if ss["action"] in w:
                w[ss["action"]].append((ss["start"] - t0, ss["stop"] - t0))
    out = []
    for worker, w in sorted(workers.items()):
        c = w["compute"]
        out.append({"worker": worker, "tasks": len(c), "first": min((s for s, _ in c), default=0.0),
                    "last": max((e for _, e in c), default=0.0), "compute": _union(c),
                    "transfer": _union(w["transfer"])})
    return out


def _synchronize():
    import cupy as cp

    cp.cuda.Device().synchronize()


def _timed(fn, warm_up: bool = True) -> float:
    if warm_up:
        fn()  # kernels compiled and loaded, pools filled
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(n_in: int, n_ooc: int, n_cluster: list[int], chunk: int, gpu_limit: float, max_gpus: int,
        protocols: tuple[str, ...] = ("tcp",), kinds: tuple[str, ...] = KINDS, threads: int = 1,
        stealing: tuple[bool, ...] = (True,), repeat: int = 1, timelines: bool = False,
        waits: tuple[str, ...] = ("tasks",)) -> list[dict]:
    import cupy as cp

    import fastmm
    import fastmm.dask as fd

    rows = []

    def add(row):  # each row printed as soon as it is measured: a run cut short keeps what it has
        row["tflops"] = 2 * row["n"] ** 3 / row["seconds"] / 1e12
        rows.append(row)
        moved_ = (f"  {row['moved'] / 2**30:6.2f} GiB between GPUs, {row['stolen']} tasks stolen"
                  if row.get("gpus", 1) > 1 and "moved" in row else "")
        print(f"  {row['what']:62s} {row['seconds']:8.2f} s  {row['tflops']:7.1f} TFLOP/s{moved_}", flush=True)

    # 1. In memory, one GPU (--dask-n-memory 0: skipped).
    if n_in > 0:
        rng = cp.random.default_rng(0)
        a = rng.standard_normal((n_in, n_in), dtype=cp.float32)
        fa = fastmm.asarray(a)
        secs = _timed(lambda: (fa @ fa.T, cp.cuda.Device().synchronize()))
        add({"what": f"in memory, 1 GPU, {n_in}^3", "gpus": 1, "n": n_in, "seconds": secs})
        secs = _timed(lambda: (a @ a.T, cp.cuda.Device().synchronize()))
        add({"what": f"in memory, 1 GPU, {n_in}^3, cuBLAS", "gpus": 1, "n": n_in, "seconds": secs})
        a = fa = None  # freed before the next part
        cp.get_default_memory_pool().free_all_blocks()

    # 2. Out of core: host operands, a capped pool (--dask-n-ooc 0: skipped).
    if n_ooc > 0:
        host = np.random.default_rng(1).standard_normal((n_ooc, n_ooc), dtype=np.float32)
        out = np.empty((n_ooc, n_ooc), np.float32)
        pool = cp.get_default_memory_pool()
        need = 3 * 4 * n_ooc ** 2 / 2 ** 30
        pool.set_limit(size=int(gpu_limit * 2 ** 30))
        try:
            x = fd.from_array(host, chunks=chunk)
            rows_, cols = (np.sort(np.random.default_rng(s).choice(n_ooc, 64, replace=False)) for s in (2, 3))
            ref = host[rows_].astype(np.float64) @ host[cols].astype(np.float64).T  # a 64 x 64 sample of the result
            # Dask's own graph, and fastmm.dask.matmul's (each block's K summed in order into it); a few tasks at a
            # time, so that a few chunks at a time are resident on the GPU.
            for graph, product in (("x @ x.T", lambda: x @ x.T), ("fastmm.dask.matmul", lambda: fd.matmul(x, x.T))):
                def store():
                    fd.store(product(), out, scheduler="threads", num_workers=OOC_WORKERS)

                what = f"out of core, 1 GPU ({gpu_limit:g} GiB pool; {need:.0f} GiB needed), {n_ooc}^3, {graph}"
                try:
                    store()  # warm-up
                    out[...] = np.nan  # the timed run must write every block it is checked on
                    secs = _timed(store, warm_up=False)
                except fastmm.OutOfMemoryError:  # Dask's graph holds each block's partial products side by side
                    cp.cuda.Device().synchronize()
                    pool.free_all_blocks()
                    print(f"  {what:62s} out of GPU memory at {OOC_WORKERS} tasks at once", flush=True)
                    continue
                err = float(np.linalg.norm(out[np.ix_(rows_, cols)] - ref) / np.linalg.norm(ref))
                add({"what": what, "gpus": 1, "n": n_ooc, "seconds": secs, "rel_error": err})
        finally:
            pool.set_limit(size=0)
        host = out = None

    # 3. A local cluster: one GPU and up to max_gpus, fastmm chunks and CuPy chunks (--dask-n "": skipped).
    if not n_cluster:
        return rows
    from distributed import Client, get_task_stream, wait

    for protocol, gpus, steal, wait_ in ((p, g, s, w) for p in protocols for g in gpu_counts(max_gpus)
                                         for s in stealing for w in (waits if p == "ucx" else ("device",))):
        missing = protocol_missing(protocol)
        if missing:
            print(f"  cluster over {protocol}: not measured ({missing})", flush=True)
            continue
        if gpus == 1 and (not steal and True in stealing or protocol == "ucx" and wait_ != waits[0]):
            continue  # one worker steals nothing and sends nothing: measured once
        where = protocol if len(stealing) == 1 else f"{protocol}, stealing {'on' if steal else 'off'}"
        if protocol == "ucx" and len(waits) > 1 and gpus > 1:
            where += f", waits: {wait_}"
        with _cluster(gpus, protocol, threads, steal) as cluster, Client(cluster) as client:
            if protocol == "ucx" and wait_ != "device":  # (docs/dask.md: UCX's wait before device transfers)
                fd.send_after_default_stream(client, finish_tasks=wait_ == "tasks")
            pools = set(client.run(_rmm_pool, RMM_POOL_SHARE).values()) if protocol == "ucx" else set()
            waits_for = {"stream": ", waits for the default stream before a transfer",
                         "tasks": ", waits for the default stream before a transfer, tasks finish their GPU work",
                         "device": ", waits for the device before a transfer"}[wait_] if protocol == "ucx" else ""
            print(f"  {type(cluster).__name__}, {gpus} worker(s) of {threads} thread(s), {protocol}{waits_for}, work "
                  f"stealing {'on' if steal else 'off'}{'; ' if pools else ''}{'; '.join(sorted(pools))}", flush=True)
            if gpus > 1:
                rate = link_rate(client)
                print(f"  {protocol}: one 256 MiB chunk from worker to worker at {rate / 1e9:.1f} GB/s", flush=True)
                rows.append({"what": f"link ({protocol})", "protocol": protocol, "gpus": gpus, "link": rate})
            for n in n_cluster:
                for kind in kinds:
                    x = _on_gpus(n, chunk, seed=3, name=f"fastmm-bench-operand-{protocol}-{gpus}-{n}-{kind}")
                    if not kind.endswith("cupy"):
                        x = fd.from_array(x)
                    x = x.persist()
                    wait(x)

                    def operand(run):
                        # Keys of its own per run, persisted before the clock starts (the same chunks, where x's
                        # are): a second persist of the same graph would be served from the first one's results,
                        # still in the workers' memory (it read 0.01 s at 16384^3).
                        xi = x.map_blocks(_same, name=f"fastmm-bench-{kind}-{n}-{run}", meta=x._meta,
                                          dtype=x.dtype).persist()
                        wait(xi)
                        return xi

                    def product(xi):
                        y = (fd.matmul(xi, xi.T) if kind.startswith("planned") else xi @ xi.T).persist()
                        wait(y)
                        client.run(_synchronize)  # a task is done when its kernels are queued, not run
                        return y  # (released after the clock stops: the product is done here)

                    runs, lines = [], []
                    plan = None
                    for run_ in range(repeat + 1):  # run 0: the warm-up
                        xi = operand(run_)
                        if timelines and run_ == 1 and kind.startswith("planned") and gpus > 1:
                            plan = fd.explain(xi, xi.T)  # (the operand where this run's is: the plan it gets)
                        streamed = timelines and run_ > 0
                        with get_task_stream(client) if streamed else contextlib.nullcontext() as stream:
                            t0, t0_wall = time.perf_counter(), time.time()
                            y = product(xi)
                            seconds = time.perf_counter() - t0
                        client.cancel(y)
                        client.cancel(xi)  # (after its product: one call for both trips distributed's scheduler)
                        if run_ == 0:
                            clear_moved(client)
                            stolen = steals(client)
                            continue
                        runs.append(seconds)
                        if stream is not None:
                            lines.append(timeline(stream.data, t0_wall))
                    total, rate = moved(client)
                    row = {"what": f"cluster ({where}), {gpus} GPU(s), {n}^3, {kind}", "gpus": gpus, "n": n,
                           "kind": kind, "protocol": where, "seconds": statistics.median(runs), "runs": runs,
                           "moved": total / repeat, "link": rate, "stolen": (steals(client) - stolen) / repeat}
                    if plan:
                        row["plan"] = plan
                    if lines:  # the run nearest the median's
                        row["timeline"] = lines[min(range(len(runs)), key=lambda i: abs(runs[i] - row["seconds"]))]
                    add(row)
                    client.cancel(x)
    return rows


def print_table(rows) -> None:
    print("fastmm.dask: wall-clock seconds of the whole graph after a warm-up (on a cluster, the median of "
          "--dask-repeat runs, each listed); TFLOP/s = 2 n^3 / seconds")
    for r in rows:
        if "seconds" not in r:  # a link measurement
            print(f"  {r['what']:62s} {r['link'] / 1e9:8.1f} GB/s, one chunk from worker to worker")
            continue
        err = f"  rel error {r['rel_error']:.1e}" if "rel_error" in r else ""
        moved_ = (f"  {r['moved'] / 2**30:6.2f} GiB between GPUs at {r.get('link', 0) / 1e9:5.1f} GB/s a transfer, "
                  f"{r.get('stolen', 0)} tasks stolen" if r.get("gpus", 1) > 1 and "moved" in r else "")
        runs = f"  runs {', '.join(f'{t:.2f}' for t in r['runs'])} s" if len(r.get("runs", ())) > 1 else ""
        print(f"  {r['what']:62s} {r['seconds']:8.2f} s  {r['tflops']:7.1f} TFLOP/s{err}{moved_}{runs}")
        for line in r.get("plan", "").splitlines()[1:]:  # (--dask-timeline: the planned graphs' own plan)
            print(f"    plan {line.strip()}")
        for w in r.get("timeline", ()):
            print(f"    {w['worker']:>28s}: {w['tasks']:4d} tasks, first start {w['first'] * 1e3:6.0f} ms, last end "
                  f"{w['last'] * 1e3:6.0f} ms, computing {w['compute'] * 1e3:6.0f} ms, "
                  f"receiving {w['transfer'] * 1e3:6.0f} ms")
    for r in rows:
        if r.get("gpus", 1) > 1 and "seconds" in r:
            # Against the same graph on one GPU, same protocol.
            one = next((o for o in rows if o.get("kind") == r["kind"] and o["n"] == r["n"] and o["gpus"] == 1
                        and o.get("protocol", "").split(",")[0] == r.get("protocol", "").split(",")[0]), None)
            if one:
                eff = r["tflops"] / (r["gpus"] * one["tflops"])
                print(f"  scaling, {r['n']}^3 {r['kind']} over {r.get('protocol')}: {r['gpus']} GPUs "
                      f"{r['tflops'] / one['tflops']:.2f}x one, {eff:.0%} efficiency")


def main(args) -> int:
    try:
        import distributed  # noqa: F401

        import fastmm.dask  # noqa: F401
    except ImportError as e:
        print(f"bench --dask needs Dask and distributed ({e}): pip install 'fastmm[dask]'", file=sys.stderr)
        return 2
    import cupy as cp

    from .timing import no_gpu

    kinds = parse_kinds(args.dask_kinds)
    stealing = parse_stealing(args.dask_stealing)
    waits = parse_waits(args.dask_ucx_wait)
    if no_gpu("bench --dask"):
        return 2
    gpus = cp.cuda.runtime.getDeviceCount() if args.dask_gpus is None else args.dask_gpus
    with contextlib.redirect_stderr(open(os.devnull, "w")) if args.no_progress else contextlib.nullcontext():
        rows = run(args.dask_n_memory, args.dask_n_ooc, [int(n) for n in args.dask_n.split(",") if n], args.dask_chunk,
                   args.dask_gpu_limit, gpus, tuple(args.dask_protocol.split(",")), kinds, args.dask_threads,
                   stealing, args.dask_repeat, args.dask_timeline, waits)
    print_table(rows)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r["what"] for r in rows if not r.get("rel_error", 0.0) < 1e-5]
    if bad:
        print(f"wrong results (relative error >= 1e-5): {bad}", file=sys.stderr)
        return 1
    return 0
