"""A product across several GPUs, planned without a GPU: the plan's bytes (fastmm/_plan/distributed.py), the Dask
graph that fastmm.dask.matmul builds from it (each task pinned to its GPU's worker; the bytes that cross between
workers counted from the graph itself), and the graph computed on a CPU cluster of NumPy chunks."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from fastmm._plan.distributed import (BlockProduct, Placement, best_assignment, blocks_needed, candidates,
                                      describe_distributed, plan_distributed, received_bytes, resident_bytes)

SQUARE = BlockProduct((8192,) * 4, (8192,) * 4, (8192,) * 4)  # 32768^3 in 8192^2 blocks of 256 MiB
BLOCK = 8192 * 8192 * 4


def test_the_candidates_are_one_gpu_both_1d_splits_and_every_grid():
    kinds = [(c.kind, c.grid) for c in candidates(8)]
    assert kinds == [("one", (1, 1)), ("rows", (1, 1)), ("columns", (1, 1)), ("grid", (2, 4)), ("grid", (4, 2))]
    assert [c.kind for c in candidates(1)] == ["one"]


def test_bytes_moved_match_the_layouts_closed_forms():
    a_bytes = b_bytes = 16 * BLOCK
    assert received_bytes(SQUARE, Placement("one", 4)) == [0, 0, 0, 0]
    # A 2 x 2 grid: each block of A crosses to the one other GPU of its grid row, each block of B likewise.
    grid = received_bytes(SQUARE, Placement("grid", 4, (2, 2)))
    assert sum(grid) == a_bytes * (2 - 1) + b_bytes * (2 - 1) and len(set(grid)) == 1
    # Rows split four ways: A's rows stay home, every block of B goes to the three other GPUs.
    assert sum(received_bytes(SQUARE, Placement("rows", 4))) == b_bytes * 3
    assert sum(received_bytes(SQUARE, Placement("columns", 4))) == a_bytes * 3


def test_the_plan_takes_the_layout_that_moves_least_for_the_time_it_saves():
    assert plan_distributed(SQUARE, 4).placement == Placement("grid", 4, (2, 2))
    tall = BlockProduct((8192,) * 8, (2048,), (4096,))  # A tall, B one small block: B sent to all, A stays home
    assert plan_distributed(tall, 4).placement.kind == "rows"
    wide = BlockProduct((2048,), (8192,) * 8, (4096,))
    assert plan_distributed(wide, 4).placement.kind == "columns"
    small = BlockProduct((256, 256), (256, 256), (256, 256))  # the link would cost more than the GPUs save
    plan = plan_distributed(small, 4, link_bytes_per_s=1e9)
    assert plan.placement.kind == "one" and plan.moved == 0
    assert "all on one GPU: splitting it would not pay" in describe_distributed(plan)


def test_the_plan_says_how_much_crosses_between_gpus():
    text = describe_distributed(plan_distributed(SQUARE, 4))
    assert text.startswith("32768x32768x32768 product of blocks (4 x 4 output blocks, K in 4) on 4 GPUs:")
    assert "a 2 x 2 grid of GPUs (SUMMA's layout)" in text
    assert "moved   8.0 GiB between GPUs, at most 2.0 GiB into one GPU" in text
    # Each GPU of the grid: 4 blocks of A and 4 of B of its own, 8 received, 4 of C; one GPU holds all 48.
    assert "memory  at most 5.0 GiB on one GPU (its blocks, those it receives, its output)" in text
    assert resident_bytes(SQUARE, Placement("one", 4)) == [48 * BLOCK, 0, 0, 0]


GRAM = BlockProduct((8192,) * 4, (8192,) * 4, (8192,) * 4, gram=True)  # x @ x.T, x 32768^2 in 8192^2 blocks


def test_x_times_its_transpose_is_one_set_of_blocks_balanced_across_four_gpus():
    """x @ x.T reads x's blocks alone (B's block (k, j) is x's (j, k), transposed), each received once by a GPU that
    reads it either way. On a 2 x 2 grid the GPUs off its diagonal read all of x; the cross layout gives each GPU a
    quarter of C and at most three quarters of x to read."""
    from collections import Counter

    grid, cross = Placement("grid", 4, (2, 2)), Placement("cross", 4)
    assert set(blocks_needed(GRAM, grid)) == {("a", i, k) for i in range(4) for k in range(4)}
    assert received_bytes(GRAM, grid) == [4 * BLOCK, 12 * BLOCK, 12 * BLOCK, 4 * BLOCK]
    assert received_bytes(GRAM, cross) == [4 * BLOCK, 4 * BLOCK, 8 * BLOCK, 8 * BLOCK]
    for n in (4, 8, 12):
        product = BlockProduct((1024,) * n, (1024,) * n, (512,) * 6, gram=True)
        owners = Counter(cross.owner(i, j, product) for i in range(n) for j in range(n))
        assert owners == {w: n * n // 4 for w in range(4)}
        needs = blocks_needed(product, cross)
        assert all(cross.home(block, product) in needers for block, needers in needs.items())
        assert Counter(cross.home(block, product) for block in needs) == {w: n * 6 // 4 for w in range(4)}
        read = [sum(w in needers for needers in needs.values()) for w in range(4)]
        assert read == [n * 6 // 2, n * 6 // 2, n * 6 * 3 // 4, n * 6 * 3 // 4]
    plan = plan_distributed(GRAM, 4)
    assert plan.placement == cross and max(plan.received) == 8 * BLOCK
    text = describe_distributed(plan)
    assert "quarters" in text and "read transposed" in text and "at most 2.0 GiB into one GPU" in text, text
    # Not a multiple of four row blocks, not four GPUs, or not x @ x.T: no cross layout.
    odd = BlockProduct((8192,) * 5, (8192,) * 5, (8192,) * 4, gram=True)
    assert "cross" not in [c.kind for c in candidates(4, odd) + candidates(8, GRAM) + candidates(4, SQUARE)]
    with pytest.raises(ValueError, match="as many column blocks as row blocks"):
        BlockProduct((8192,) * 4, (8192,) * 2, (8192,) * 4, gram=True)


def test_the_graph_of_x_times_its_transpose_reads_x_alone(rng):
    """fastmm.dask.matmul(x, x.T): no chunk of x.T is made or moved; each GPU fetches each of x's blocks it reads
    once (as A's block and as B's), and the bytes read from the graph are the plan's."""
    x = da.from_array(rng.standard_normal((400, 300)).astype(np.float32), chunks=(100, 75))
    model = {"flops_per_s": 1e3}
    z = fd.matmul(x, x.T, workers=WORKERS, **model)
    plan = fd._plan(x, x.T, len(WORKERS), model)
    assert plan.product.gram and plan.placement.kind == "cross"
    where, deps = _pinned(z.dask)
    assert not any(key[0] == x.T.name for key in where if isinstance(key, tuple))
    fetches = [key for key in where if isinstance(key, tuple) and "-in-" in str(key[0])]
    assert fetches and all(key[0].endswith("-in-a") for key in fetches)
    assert len(fetches) == len({(where[k], *deps[k]) for k in fetches})  # once per GPU and block
    received = {w: set() for w in WORKERS}
    for key, worker in where.items():
        for dep in deps[key]:
            if worker is not None and isinstance(dep, tuple) and dep[0] == x.name and where[dep] != worker:
                received[worker].add(dep)
    assert [len(received[w]) * 100 * 75 * 4 for w in WORKERS] == list(plan.received)
    for row in z.__dask_keys__():
        for key in row:
            assert where[key] == WORKERS[plan.placement.owner(key[1], key[2], plan.product)]


def test_the_arrangement_is_the_best_assignment_at_any_size():
    """The places-to-workers assignment maximises the bytes already in place: every permutation compared up to six
    workers, and a hidden best permutation found among sixteen."""
    import itertools

    rng = np.random.default_rng(7)
    for n in range(1, 7):
        for _ in range(20):
            gain = rng.choice([0, 0, 1, 3, 8], (n, n)).tolist()
            order = best_assignment(gain)
            assert sorted(order) == list(range(n))
            best = max(sum(gain[p][w] for p, w in enumerate(perm)) for perm in itertools.permutations(range(n)))
            assert sum(gain[p][w] for p, w in enumerate(order)) == best
    hidden = rng.permutation(16)
    gain = rng.integers(0, 100, (16, 16))
    gain[np.arange(16), hidden] = 10_000
    assert best_assignment(gain.tolist()) == hidden.tolist()


def test_a_bad_worker_count_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one GPU"):
        plan_distributed(SQUARE, 0)


# ---- the Dask graph ------------------------------------------------------------------------------------------

da = pytest.importorskip("dask.array", reason="Dask is not installed: pip install 'fastmm[dask]'")
dask = pytest.importorskip("dask", reason="Dask is not installed: pip install 'fastmm[dask]'")
pytest.importorskip("cupy", reason="fastmm.dask imports fastmm's array type, which needs CuPy (no GPU)")

import fastmm.dask as fd  # noqa: E402
from fastmm._tools import dask_bench  # noqa: E402

WORKERS = [f"tcp://gpu{i}:1" for i in range(4)]


def _pinned(graph):
    """Every task of the graph with the worker it is pinned to (None: anywhere) and its dependencies."""
    from dask.core import get_dependencies

    where, deps, everything = {}, {}, dict(graph)
    for layer in graph.layers.values():
        workers = (layer.annotations or {}).get("workers")
        for key in layer:
            pinned = workers(key) if callable(workers) else workers  # per key: the operands' chunks
            where[key] = pinned[0] if pinned else None
            deps[key] = get_dependencies(everything, key)
    return where, deps


def test_the_graph_pins_each_task_and_moves_what_the_plan_says(rng):
    a = rng.standard_normal((400, 300)).astype(np.float32)
    b = rng.standard_normal((300, 500)).astype(np.float32)
    x, y = da.from_array(a, chunks=(100, 75)), da.from_array(b, chunks=(75, 125))
    model = {"flops_per_s": 1e3}  # compute made dear: the plan splits even this small product
    z = fd.matmul(x, y, workers=WORKERS, **model)
    plan = fd._plan(x, y, len(WORKERS), model)
    assert plan.placement.kind == "grid"
    where, deps = _pinned(z.dask)
    for row in z.__dask_keys__():
        for key in row:  # each output block on its owner
            assert where[key] == WORKERS[plan.placement.owner(key[1], key[2])]
    # Bytes that cross between workers, read from the graph: a pinned task whose pinned input lives elsewhere (the
    # operands' chunks are made at their homes, and read there as they are).
    size = {}
    for key in where:
        if isinstance(key, tuple) and len(key) == 3 and key[0] == x.name:
            size[key] = x.chunks[0][key[1]] * x.chunks[1][key[2]] * 4
        elif isinstance(key, tuple) and len(key) == 3 and key[0] == y.name:
            size[key] = y.chunks[0][key[1]] * y.chunks[1][key[2]] * 4
    received = {w: set() for w in WORKERS}
    for key, worker in where.items():
        for dep in deps[key]:
            if worker is not None and dep in size and where[dep] != worker:
                received[worker].add(dep)
    assert [sum(size[k] for k in received[w]) for w in WORKERS] == list(plan.received)
    assert "a 2 x 2 grid of GPUs" in fd.explain(x, y, WORKERS, **model)


def test_each_gpu_fetches_its_remote_blocks_at_once_and_sums_its_own_first(rng):
    """A block a GPU needs from another is fetched by a task of its own there, which needs nothing but the block: the
    transfer starts when the block exists, not when the K sum reaches it. Each output block's K sum starts with the
    blocks its GPU holds (as many as any K block offers), and still sums every K block exactly once."""
    x = da.from_array(rng.standard_normal((400, 300)), chunks=(100, 50))
    y = da.from_array(rng.standard_normal((300, 500)), chunks=(50, 125))
    model = {"flops_per_s": 1e3}
    z = fd.matmul(x, y, workers=WORKERS, **model)
    plan = fd._plan(x, y, len(WORKERS), model)
    where, deps = _pinned(z.dask)
    fetches = [key for key in where if key[0].endswith(("-in-a", "-in-b"))]
    assert fetches
    for key in fetches:
        (dep,) = deps[key]  # the operand's chunk alone, made at its home
        assert dep[0] in (x.name, y.name) and where[dep] != where[key] == WORKERS[key[1]]
    assert len(fetches) == len(set((where[k], deps[k].pop()) for k in fetches))  # once per GPU and block
    nk, local_first = len(x.chunks[1]), 0
    acc = next(key[0] for key in where if key[0].endswith("-sum"))
    for i in range(len(x.chunks[0])):
        for j in range(len(y.chunks[1])):
            # (the last sum is the output block's own key)
            steps = [deps[(acc, i, j, step)] for step in range(nk - 1)] + [deps[(z.name, i, j)]]
            a_used = sorted(dep[-1] for d in steps for dep in d if dep[0] == x.name or dep[0].endswith("-in-a"))
            b_used = sorted(dep[-2] for d in steps for dep in d if dep[0] == y.name or dep[0].endswith("-in-b"))
            assert a_used == b_used == list(range(nk))  # every K block once
            # The first product fetches as few operands as any K block would need.
            p, w = plan.placement, plan.placement.owner(i, j)
            fewest = min((p.a_home(i, k, plan.product) != w) + (p.b_home(k, j, plan.product) != w) for k in range(nk))
            local_first += sum(dep[0].endswith(("-in-a", "-in-b")) for dep in steps[0]) == fewest
    assert plan.placement.kind == "grid" and local_first == 16


class _Priorities:
    """A scheduler plugin that keeps each task's priority as the scheduler set it when the graph arrived."""

    name = "test-priorities"

    def __init__(self):
        self.seen = {}

    def update_graph(self, scheduler, *, keys=(), **kwargs):
        self.seen.update({ts.key: ts.priority for ts in scheduler.tasks.values()})


def _seen(dask_scheduler):
    return dask_scheduler.plugins["test-priorities"].seen


def test_each_gpu_fetches_first_the_blocks_its_sums_read_first():
    """A worker takes one block at a time from each other worker, highest priority first: as the scheduler has them,
    a GPU's fetch tasks are ranked by the first step of its K sums that reads the block, and its other tasks keep
    the priority the product was computed with."""
    pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Priorities(_Priorities, SchedulerPlugin):
        pass

    with _four_workers() as (distributed, client, addresses, x, y, model):
        client.register_plugin(Priorities())
        for user in (0, 7):
            z = fd.matmul(x, y, workers=addresses, **model)
            distributed.wait(client.persist(z, priority=user))
            seen = client.run_on_scheduler(_seen)
            tasks = {key: task for layer in z.dask.layers.values() if (layer.annotations or {}).get("priority")
                     for key, task in layer.items()}
            assert len(tasks) > 16
            first = {}
            for key, task in tasks.items():
                step = key[3] if key[0].endswith("-sum") else len(x.chunks[1]) - 1 if key[0] == z.name else None
                for dep in (d for d in task if step is not None and isinstance(d, tuple) and d in tasks):
                    if dep[0].endswith(("-in-a", "-in-b")):  # (not the running sum it adds to)
                        first[dep] = min(first.get(dep, step), step)
            # (a fetch key is (name, GPU, block...): ranks compare within a GPU)
            assert first and any(len({first[k] for k in first if k[1] == w}) > 1 for w in range(4))
            for key in tasks:
                if key in first:  # (the scheduler keeps -priority: lower first)
                    assert seen[key][0] < 0
                    assert all(seen[key][0] < seen[other][0] for other in first
                               if other[1] == key[1] and first[other] > first[key])
                else:
                    assert seen[key][0] == -user


def test_over_tcp_the_plan_keeps_a_product_on_one_gpu_that_ucx_would_split():
    """The link's default rate follows the workers' protocol: blocks between GPUs cost 15 times more through host
    memory (TCP) than device to device (UCX), so 32768^3 in 8192^2 blocks splits over UCX and stays whole over TCP."""
    x = da.zeros((32768, 32768), chunks=8192, dtype=np.float32)
    ucx = fd.explain(x, x.T, [f"ucx://gpu{i}:1" for i in range(4)])
    tcp = fd.explain(x, x.T, WORKERS)
    assert "quarters" in ucx and "15 GB/s into each GPU" in ucx, ucx
    assert "all on one GPU" in tcp and "1 GB/s into each GPU" in tcp, tcp
    assert fd.explain(x, x.T, 4) == ucx  # a cluster not started yet: UCX, the set-up to use


def test_without_a_cluster_each_block_sums_k_in_a_fixed_order(rng):
    """No client: x @ y, each output block's K summed in order into the block (no partial products held side by
    side); ragged chunks, K re-chunked to x's blocks."""
    x = da.from_array(rng.standard_normal((70, 45)), chunks=(16, 10))
    y = da.from_array(rng.standard_normal((45, 33)), chunks=(12, 8))
    z = fd.matmul(x, y)
    assert z.chunks == (x.chunks[0], y.chunks[1])
    want = x.compute() @ y.compute()
    assert np.allclose(z.compute(scheduler="threads"), want)
    assert np.allclose(fd.matmul(x, x.T).compute(scheduler="sync"), x.compute() @ x.compute().T)
    names = {key[0] for key in dict(z.__dask_graph__()) if isinstance(key, tuple)}
    assert not any("sum-aggregate" in n or n.startswith("matmul-") for n in names), names


def test_operands_that_cannot_multiply_are_numpys_error():
    x = da.ones((4, 3), chunks=2)
    with pytest.raises(ValueError, match="mismatch in its core dimension 0"):
        fd.matmul(x, x)
    with pytest.raises(ValueError, match="2-D Dask arrays"):
        fd.matmul(da.ones((2, 4, 3), chunks=2), x.T)


def test_on_a_cluster_each_block_is_computed_where_the_plan_put_it(rng):
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    a = rng.standard_normal((300, 200))
    b = rng.standard_normal((200, 250))
    x = da.from_array(a, chunks=((100, 200), (50, 150)))  # ragged blocks; B re-chunked along K to A's
    y = da.from_array(b, chunks=(100, 125))
    with distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        addresses = sorted(client.scheduler_info()["workers"])
        model = {"flops_per_s": 1e3}
        z = fd.matmul(x, y, **model)
        placement = fd._plan(*fd._operands(x, y), len(addresses), model).placement
        assert placement.kind != "one"
        z = client.persist(z)
        distributed.wait(z)
        who = client.who_has(z)
        for row in z.__dask_keys__():
            for key in row:
                assert list(who[key]) == [addresses[placement.owner(key[1], key[2])]]
        assert np.allclose(z.compute(), a @ b, rtol=1e-12, atol=1e-10)


def _dies_once(block, flag=None, block_info=None):
    """The block as it is, except that the first call for block (1, 0) kills its worker's process (a GPU lost, an
    out-of-memory kill): `flag` records that it happened, for the retry on another worker to pass."""
    import os

    if block_info[None]["chunk-location"] == (1, 0) and not os.path.exists(flag):
        open(flag, "w").close()
        os._exit(1)
    return block


def _slow_first_row(seed, block_info=None):
    """A chunk made from nothing, the first row of chunks slowly: its worker falls behind while the others idle."""
    import time

    i, j = block_info[None]["chunk-location"]
    time.sleep(0.4 if i == 0 else 0.02)
    return np.random.default_rng((seed, i, j)).random(block_info[None]["chunk-shape"])


def test_work_stealing_moves_no_planned_task():
    """One worker behind (its chunks slow to make), stealing on and quick: Dask would move its tasks to the idle
    workers, each then fetching its operands again (25-27% more bytes here); the plugin keeps every marked task on its
    worker, so no task is stolen and what moves is the plan's, registered once however many products."""
    with _four_workers() as (distributed, client, addresses, _, y, model):
        x = da.map_blocks(_slow_first_row, 1, chunks=((100,) * 4, (75,) * 4), dtype=float, meta=np.empty((0, 0)))
        plan = fd._plan(*fd._operands(x, y), len(addresses), model)
        dask_bench.clear_moved(client)
        z = client.persist(fd.matmul(x, y, workers=addresses, **model))
        again = fd.matmul(x, y, workers=addresses, **model)  # a second product: the plugin is not registered again
        distributed.wait(z, timeout=60)
        assert "stealing" in client.cluster.scheduler.extensions and dask_bench.steals(client) == 0
        assert dask_bench.moved(client)[0] == sum(plan.received)
        assert client.run_on_scheduler(lambda dask_scheduler: [p for p in dask_scheduler.plugins
                                                               if p.startswith("fastmm")]) == ["fastmm-pins"]
        assert np.allclose(z.compute(), x.compute() @ y.compute())
        marked = [layer for layer in again.dask.layers.values() if (layer.annotations or {}).get("workers")]
        assert marked and all(layer.annotations[fd._PINNED] for layer in marked)
    from fastmm import _dask_pins

    assert fd._PINNED == _dask_pins.MARK


def _slowly(block):
    import time

    time.sleep(0.05)
    return block


def test_when_every_worker_leaves_the_product_finishes_on_those_that_replace_them(rng):
    """All the workers gone mid-graph and others started at new addresses (a cluster's restart): the planned tasks
    naming the old addresses run on the new workers, where Dask's own fallback would wait for the old ones."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    import time

    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 240))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        x = da.from_array(a, chunks=100).map_blocks(_slowly, dtype=a.dtype)
        y = da.from_array(b, chunks=(100, 120))
        z = fd.matmul(x, y, flops_per_s=1e3)
        before = set(client.scheduler_info()["workers"])
        future = client.compute(z)
        time.sleep(0.3)
        c.scale(0)
        while client.scheduler_info()["workers"]:
            time.sleep(0.05)
        c.scale(2)
        result = future.result(timeout=60)
        assert not before & set(client.scheduler_info()["workers"])
        assert np.allclose(result, a @ b)


def test_a_worker_that_dies_mid_graph_costs_a_retry_not_the_result(rng, tmp_path):
    """The plan pins each task to a worker while that worker lives: where one dies (its nanny restarts it at a new
    address), Dask runs its tasks on the others and the product is still right, instead of waiting forever."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    a = rng.standard_normal((300, 200))
    b = rng.standard_normal((200, 240))
    flag = str(tmp_path / "died")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        x = da.from_array(a, chunks=100).map_blocks(_dies_once, flag=flag, dtype=a.dtype)
        y = da.from_array(b, chunks=(100, 120))
        z = fd.matmul(x, y, flops_per_s=1e3)  # compute made dear: the plan splits even this product
        assert fd._plan(*fd._operands(x, y), 2, {"flops_per_s": 1e3}).placement.kind != "one"
        result = client.compute(z).result(timeout=120)
    import os

    assert os.path.exists(flag)  # a worker did die
    assert np.allclose(result, a @ b, rtol=1e-12, atol=1e-10)


@contextlib.contextmanager
def _four_workers():
    """A 4-worker CPU cluster, work stealing on and quick (fastmm's scheduler plugin keeps the planned tasks from it),
    two random operands and a time model that makes compute dear, so the plan splits even this product:
    (distributed, client, the workers' addresses, x, y, model)."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    x = da.random.RandomState(1).random_sample((400, 300), chunks=(100, 75))
    y = da.random.RandomState(2).random_sample((300, 500), chunks=(75, 125))
    with dask.config.set({"distributed.scheduler.work-stealing-interval": "100ms"}), \
            distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        yield distributed, client, sorted(client.scheduler_info()["workers"]), x, y, {"flops_per_s": 1e3}


def test_on_a_cluster_the_bytes_that_move_are_the_plans():
    """Counted on the workers themselves: each operand chunk is made where the plan keeps it and each output block
    computed where its inputs meet, so the bytes each worker receives are exactly those `explain` states."""
    with _four_workers() as (distributed, client, addresses, x, y, model):
        plan = fd._plan(*fd._operands(x, y), len(addresses), model)
        assert plan.placement.kind == "grid"
        z = client.persist(fd.matmul(x, y, workers=addresses, **model))
        distributed.wait(z)
        got = client.run(dask_bench._incoming)
        assert [got[a][0] for a in addresses] == list(plan.received)
        assert np.allclose(z.compute(), x.compute() @ y.compute(), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_x_times_itself_reads_each_block_once_per_gpu(workers):
    """x @ x: B's block (k, j) is A's (k, j): fetched once by each GPU that reads it either way, with a fetch task
    of its own (before, B's homes were planned apart from A's, and sums read remote chunks directly); the bytes
    moved on a cluster are the plan's and the product is x @ x."""
    with _four_workers() as (distributed, client, addresses, _, _y, model):
        x = da.random.RandomState(4).random_sample((400, 400), chunks=100)
        addresses = addresses[:workers]
        plan = fd._plan(x, x, workers, model)
        assert plan.product.same and plan.placement.kind != "one"
        z = fd.matmul(x, x, workers=addresses, **model)
        where, deps = _pinned(z.dask)
        fetches = [k for k in where if isinstance(k, tuple) and "-in-" in str(k[0])]
        assert fetches and all(k[0].endswith("-in-a") for k in fetches)
        for key, worker in where.items():  # every remote read goes through a fetch task
            for dep in deps[key]:
                if worker is not None and isinstance(dep, tuple) and dep[0] == x.name:
                    assert where[dep] == worker or key[0].endswith("-in-a"), (key, dep)
        dask_bench.clear_moved(client)
        z = client.persist(z)
        distributed.wait(z)
        got = client.run(dask_bench._incoming)
        assert [got[a][0] for a in addresses] == list(plan.received)
        host = x.compute()
        assert np.allclose(z.compute(), host @ host, rtol=1e-12, atol=1e-10)
    with pytest.raises(ValueError, match="cuts rows, columns and K alike"):
        BlockProduct((4, 4), (4, 4), (8,), same=True)


def test_on_a_cluster_x_times_its_transpose_moves_the_plans_bytes():
    """x @ x.T computed on four workers: each worker receives exactly the bytes `explain` states for the cross
    layout, and the product is x @ x.T's."""
    with _four_workers() as (distributed, client, addresses, x, _, model):
        x = da.random.RandomState(3).random_sample((400, 150), chunks=(100, 75))  # 4 x 2 chunks
        plan = fd._plan(x, x.T, len(addresses), model)
        assert plan.placement.kind == "cross"
        dask_bench.clear_moved(client)
        z = client.persist(fd.matmul(x, x.T, workers=addresses, **model))
        distributed.wait(z)
        got = client.run(dask_bench._incoming)
        assert [got[a][0] for a in addresses] == list(plan.received)
        host = x.compute()
        assert np.allclose(z.compute(), host @ host.T, rtol=1e-12, atol=1e-10)


def test_persisted_operands_move_only_to_the_workers_that_need_them():
    """Chunks already in the workers' memory stay where they are when that worker needs them (no move to the plan's
    home first), and a chunk on a worker that does not need it moves from there: the bytes that move are exactly
    those the plan counts for where Dask put the chunks."""
    with _four_workers() as (distributed, client, addresses, x, y, model):
        x, y = client.persist(x), client.persist(y)
        distributed.wait([x, y])
        dask_bench.clear_moved(client)
        ops = fd._operands(x, y)
        plan = fd._plan(*ops, len(addresses), model, addresses, fd._who_has(ops))
        assert plan.held_bytes == (400 * 300 + 300 * 500) * 8  # every chunk of both operands held
        z = client.persist(fd.matmul(x, y, workers=addresses, **model))
        distributed.wait(z)
        moved, _ = dask_bench.moved(client)
        assert moved == sum(plan.received)
        assert np.allclose(z.compute(), x.compute() @ y.compute(), rtol=1e-12, atol=1e-10)


def test_operands_held_by_a_worker_outside_the_product_move_as_counted():
    """Chunks persisted on a fifth worker, the product on the other four: every byte must move, and the plan counts
    it (a chunk held elsewhere is not made at its home for free), as the workers' own logs do."""
    distributed = pytest.importorskip("distributed", reason="needs distributed: pip install 'fastmm[dask]'")
    x = da.random.RandomState(1).random_sample((400, 300), chunks=(100, 75))
    y = da.random.RandomState(2).random_sample((300, 500), chunks=(75, 125))
    with distributed.LocalCluster(n_workers=5, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        addresses = sorted(client.scheduler_info()["workers"])
        x, y = client.persist(x, workers=addresses[4]), client.persist(y, workers=addresses[4])
        distributed.wait([x, y])
        planned = addresses[:4]
        free = fd._plan(x, y, 4, {"flops_per_s": 1e30}, planned, fd._who_has((x, y)))  # compute free: bytes decide
        assert free.moved >= (400 * 300 + 300 * 500) * 8  # each block at least once (before: 0 B on one GPU)
        assert "moved   0 B" not in fd.explain(x, y, planned, flops_per_s=1e30)
        model = {"flops_per_s": 1e3}
        plan = fd._plan(x, y, 4, model, planned, fd._who_has((x, y)))
        dask_bench.clear_moved(client)
        z = client.persist(fd.matmul(x, y, workers=planned, **model))
        distributed.wait(z)
        got = client.run(dask_bench._incoming)
        assert [got[a][0] for a in planned] == list(plan.received) and got[addresses[4]][0] == 0
        assert np.allclose(z.compute(), x.compute() @ y.compute(), rtol=1e-12, atol=1e-10)


def test_a_chunk_made_from_one_persisted_chunk_lives_where_that_chunk_is():
    """x @ x.T with x persisted: each chunk of x.T (a transpose of one of x's) counts as held by x's chunk's worker,
    so the plan makes it there instead of first moving x's chunk to the plan's home for it; a chunk made from two
    does not."""
    with _four_workers() as (distributed, client, addresses, x, y, model):
        x = client.persist(x)
        distributed.wait(x)
        xt, mixed = x.T, x[:300, :300] + x.T[:300, :300]
        held = client.who_has(x)
        for operands in ((x, xt, mixed), (mixed, xt, x), ((2 * x).T,)):  # in any order, a few steps back
            who = fd._who_has(operands)
            for (name, k, j) in fd._flat_keys(operands[-2] if len(operands) > 1 else operands[0]):
                assert who[(name, k, j)] == list(held[(x.name, j, k)])
        who = fd._who_has((x, xt, mixed))
        assert all(key in who for key in fd._flat_keys(x))
        assert not any(key in who for key in fd._flat_keys(mixed))
        z = client.persist(fd.matmul(x, xt, workers=addresses, **model))
        assert np.allclose(z.compute(), x.compute() @ x.compute().T, rtol=1e-12, atol=1e-10)
        # x.T persisted with x not: its chunks in memory are read as they are (x is not computed again for them)
        fresh = da.random.RandomState(9).random_sample((400, 300), chunks=(100, 75))
        t = client.persist(fresh.T)
        distributed.wait(t)
        assert fd._plan(fresh, t, 4, model).product.gram is False
        assert fd._plan(fresh, fresh.T, 4, model).product.gram
        host = fresh.compute()
        assert np.allclose(client.persist(fd.matmul(fresh, t, workers=addresses, **model)).compute(), host @ host.T)


def test_each_place_of_the_plan_goes_to_the_gpu_holding_most_of_what_it_reads():
    """Operand blocks spread at random: each candidate's places go to the GPUs so that the bytes already held by a
    GPU that reads them are the most any arrangement gives, and the bytes the plan counts are those that must still
    move from where the blocks are; in order where nothing is held."""
    import itertools

    from fastmm._plan.distributed import held_received, operand_blocks

    product = BlockProduct((100,) * 4, (100,) * 4, (100,) * 4, itemsize=8)
    assert plan_distributed(product, 4, flops_per_s=1e3).order == ()
    blocks = operand_blocks(product)
    for seed in range(5):
        held = {b: {int(w)} for b, w in zip(blocks, np.random.default_rng(seed).integers(0, 4, len(blocks)))}
        plan = plan_distributed(product, 4, flops_per_s=1e3, held=held)
        needs = blocks_needed(product, plan.placement)

        def held_by_a_reader(order):
            return sum(100 * 100 * 8 for b, places in needs.items() if {order[p] for p in places} & held[b])

        assert sorted(plan.order) == [0, 1, 2, 3]
        assert held_by_a_reader(plan.order) == max(map(held_by_a_reader, itertools.permutations(range(4))))
        for p in range(4):  # a block moves into a place that reads it and whose GPU does not hold it
            want = sum(100 * 100 * 8 for b, places in needs.items() if p in places and plan.order[p] not in held[b])
            assert plan.received[p] == want
        assert list(plan.received) == held_received(product, plan.placement, held, plan.order)


def test_a_product_on_one_gpu_is_not_free_where_its_operands_are_spread():
    """Over a slow link, 32768^3 with every block at its home stays on one GPU; with the operands already spread over
    the four GPUs, one GPU would first receive three quarters of them, and the plan splits the product instead.
    With them all on one GPU, it stays there and nothing moves."""
    from fastmm._plan.distributed import operand_blocks

    tcp = {"link_bytes_per_s": 1e9}
    assert plan_distributed(GRAM, 4, **tcp).placement.kind == "one"
    spread = {b: {i % 4} for i, b in enumerate(operand_blocks(GRAM))}
    plan = plan_distributed(GRAM, 4, held=spread, **tcp)
    assert plan.placement.kind != "one" and max(plan.received) < 12 * BLOCK
    assert "already on the GPUs" in describe_distributed(plan)
    # What each GPU holds: its blocks (each already on one GPU), those it receives, its quarter of C.
    assert resident_bytes(GRAM, plan.placement, spread, plan.order) == [
        r + 4 * BLOCK + 4 * BLOCK for r in plan.received]
    one = plan_distributed(GRAM, 4, held={b: {3} for b in operand_blocks(GRAM)}, **tcp)
    assert one.placement.kind == "one" and one.order[0] == 3 and one.moved == 0


def test_a_product_kept_on_one_gpu_runs_where_its_operands_already_are():
    """Where splitting does not pay (compute made cheap here), the one GPU is the worker holding the persisted
    operands: nothing moves, where the first worker would have received them all."""
    with _four_workers() as (distributed, client, addresses, x, y, _):
        model = {"flops_per_s": 1e18}
        x, y = client.persist(x, workers=[addresses[2]]), client.persist(y, workers=[addresses[2]])
        distributed.wait([x, y])
        assert fd._plan(*fd._operands(x, y), len(addresses), model).placement.kind == "one"
        dask_bench.clear_moved(client)
        z = client.persist(fd.matmul(x, y, workers=addresses, **model))
        distributed.wait(z)
        assert dask_bench.moved(client) == (0, 0.0)
        assert {tuple(who) for who in client.who_has(z).values()} == {(addresses[2],)}
        assert np.allclose(z.compute(), x.compute() @ y.compute(), rtol=1e-12, atol=1e-10)
