"""The scheduler's side of `fastmm.dask.matmul`'s placement: a Dask scheduler plugin, shipped to the scheduler by value
(so it imports nothing of fastmm's).

The planned product's tasks name their GPU's worker as a preference (``allow_other_workers``), so that Dask can run them
elsewhere when that worker leaves. Two things go wrong with a preference alone:

- Dask's work stealing may move such a task to another worker while its own is busy; the task then fetches its operand
  blocks (256 MiB each at 8192^2) again. With stealing on, the planned graph moved 25-27% more bytes than planned on
  CPU workers, and 26.3 GiB where 18 were planned on four GPUs.
- When every worker a task names has left (a nanny's restart gives a new address), Dask's fallback to other workers
  does not pick the task up again: it waits in ``no-worker`` for an address that never returns.

`Pins` makes the marked tasks unstealable while they run on a worker they name (the stealing extension's one gate,
``steal_time_ratio``, answers "never" for them, as it does for its own fast tasks), and drops the names of marked tasks
whose workers have all left, sending those already waiting to be placed again. Without the plugin (say, an asynchronous
client), the tasks behave as Dask's preferences do.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["MARK", "Pins"]

MARK = "fastmm_pinned"  # the annotation that marks a planned task


def _orphaned(scheduler, ts) -> bool:
    """A marked task whose workers have all left the cluster."""
    return bool(ts.annotations and ts.annotations.get(MARK) and ts.worker_restrictions
                and not any(address in scheduler.workers for address in ts.worker_restrictions))


def _free(ts) -> None:
    # Not only loose: a loose task naming a gone address is skipped when a worker joins (it has no valid workers).
    ts.worker_restrictions = None
    ts.loose_restrictions = True


class Pins(SchedulerPlugin):
    """Marked tasks: never stolen from a worker they name; free to run anywhere once all those workers have left."""

    name = "fastmm-pins"
    idempotent = True  # registered by every planned product: once per scheduler

    def __init__(self):
        self.freed = 0  # tasks whose workers had all left (for tests and logs)

    async def start(self, scheduler):
        stealing = scheduler.extensions.get("stealing")
        if stealing is None or getattr(stealing.steal_time_ratio, "fastmm", False):
            return
        ratio = stealing.steal_time_ratio

        def steal_time_ratio(ts):
            on, named = ts.processing_on, ts.worker_restrictions or ()
            if ts.annotations and ts.annotations.get(MARK) and on is not None and on.address in named:
                return None, None  # never in the stealable sets
            return ratio(ts)

        steal_time_ratio.fastmm = True
        stealing.steal_time_ratio = steal_time_ratio

    def update_graph(self, scheduler, *, annotations=None, **kwargs):
        # After the graph's annotations are applied, before its first transitions: a graph planned for a worker that has
        # since left is freed before it can wait for it.
        for key in (annotations or {}).get(MARK, ()):
            ts = scheduler.tasks.get(key)
            if ts is not None and _orphaned(scheduler, ts):
                _free(ts)
                self.freed += 1

    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs):
        # After the worker's tasks were rescheduled (those naming only it now wait in no-worker): free them and place
        # them again, in priority order (transitions take recommendations last first).
        waiting = []
        for ts in scheduler.tasks.values():
            if _orphaned(scheduler, ts):
                _free(ts)
                self.freed += 1
                if ts.state == "no-worker":
                    waiting.append(ts)
        if waiting:
            waiting.sort(key=lambda ts: ts.priority, reverse=True)
            scheduler.transitions({ts.key: "processing" for ts in waiting}, stimulus_id=f"fastmm-pins-{stimulus_id}")
