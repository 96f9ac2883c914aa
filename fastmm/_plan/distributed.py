"""A product of block matrices across several GPUs: which GPU owns which output block, where the input blocks live,
and how many bytes cross between GPUs. Pure Python (no Dask, no CUDA): fastmm.dask builds the graph from it.

The candidates are the ones distributed GEMMs use: everything on one GPU; a 1-D split of the rows of A (and C)
with B's blocks sent to every GPU (or the mirror: columns of B, A sent to all), best when one operand is small; and
a 2-D grid of pr x pc GPUs (SUMMA's layout), where A's block (i, k) lives on grid row i mod pr and is sent along
that row, B's block (k, j) on grid column j mod pc and is sent down that column, so each block crosses to at most
pc - 1 (or pr - 1) other GPUs. For ``x @ x.T`` (B is A's transpose) the operands are one set of blocks, each sent once
to each GPU that reads it, as A's block or, transposed, as B's; on four GPUs a "cross" layout then balances what
each GPU reads (below). Each output block's K sum runs on its owner, in a fixed order. The plan is the
candidate with the least predicted time (compute on the busiest GPU plus its incoming bytes over the link), so a
product that does not pay for the traffic stays on one GPU.
"""

from __future__ import annotations

import dataclasses

__all__ = ["BlockProduct", "Placement", "DistributedPlan", "candidates", "blocks_needed", "received_bytes",
           "held_received", "places_holding", "operand_blocks", "resident_bytes", "plan_distributed",
           "describe_distributed", "best_assignment"]

# Defaults of the time model: an H100's FP32 rate through fastmm's tiles, and the rate at which one transfer brought a
# GPU an operand's block in planned products on four GPUs joined by NVLink, by the cluster's protocol: UCX (12-16 GB/s
# with NVLink mapped; 8-21 through host memory) and TCP (about 1 GB/s). docs/dask.md has the measurements.
FLOPS_PER_S = 50e12
LINK_BYTES_PER_S = {"ucx": 15e9, "tcp": 1e9}


@dataclasses.dataclass(frozen=True)
class BlockProduct:
    """C (M x N) = A (M x K) @ B (K x N), cut into blocks: the sizes of the row blocks of A and C (`rows`), the
    column blocks of B and C (`cols`) and the blocks along K (`depth`). `gram`: B is A's transpose (``x @ x.T``), so
    B's block (k, j) is A's block (j, k), read transposed; `same`: B is A (``x @ x``), B's block (k, j) A's (k, j)."""

    rows: tuple[int, ...]
    cols: tuple[int, ...]
    depth: tuple[int, ...]
    itemsize: int = 4
    gram: bool = False
    same: bool = False

    def __post_init__(self):
        if self.gram and self.cols != self.rows:
            raise ValueError(f"a product of x and x.T has as many column blocks as row blocks, of the same sizes "
                             f"(got rows {self.rows} and columns {self.cols})")
        if self.same and not self.rows == self.depth == self.cols:
            raise ValueError(f"a product of x and itself cuts rows, columns and K alike (got rows {self.rows}, "
                             f"columns {self.cols} and K {self.depth})")

    @property
    def one_operand(self) -> bool:
        """B's blocks are A's (x @ x.T or x @ x): A's blocks are the only operand blocks."""
        return self.gram or self.same

    @property
    def flops(self) -> int:
        return 2 * sum(self.rows) * sum(self.cols) * sum(self.depth)

    def a_bytes(self, i: int, k: int) -> int:
        return self.rows[i] * self.depth[k] * self.itemsize

    def b_bytes(self, k: int, j: int) -> int:
        return self.depth[k] * self.cols[j] * self.itemsize


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each block lives: `kind` is "one", "rows", "columns", "grid" (pr x pc GPUs, numbered row by row) or
    "cross" (``x @ x.T`` on four GPUs).

    "cross" cuts x's block rows into quarters Q0..Q3 (H0 = Q0 + Q1, H1 = Q2 + Q3): GPU 0 computes C's blocks of
    H0 x H0, GPU 1 those of H1 x H1, GPU 2 those of H0 x Q2 and Q2 x H0, GPU 3 those of H0 x Q3 and Q3 x H0. Each
    computes a quarter of C and reads half of x (GPUs 0 and 1) or three quarters (2 and 3), where on a 2 x 2 grid
    two GPUs read all of x."""

    kind: str
    workers: int
    grid: tuple[int, int] = (1, 1)

    def owner(self, i: int, j: int, product: BlockProduct | None = None) -> int:
        """The GPU that computes C's block (i, j), K summed there."""
        if self.kind == "cross":
            if product is None:
                raise ValueError("the cross layout's owner of a block depends on the product: pass it")
            return _cross_owner(i, j, len(product.rows))
        pr, pc = self.grid
        return {"one": 0, "rows": i % self.workers, "columns": j % self.workers,
                "grid": (i % pr) * pc + j % pc}[self.kind]

    def a_home(self, i: int, k: int, product: BlockProduct) -> int:
        if self.kind == "cross":
            # Each GPU keeps a quarter of x, of blocks it reads: Q0 on GPU 0; Q1 halved between GPUs 2 and 3;
            # Q2 between 1 and 2; Q3 between 1 and 3.
            quarter = 4 * i // len(product.rows)
            return ((0, 0), (2, 3), (1, 2), (3, 1))[quarter][(i + k) % 2]
        pr, pc = self.grid
        return {"one": 0, "rows": i % self.workers, "columns": (i * len(product.depth) + k) % self.workers,
                "grid": (i % pr) * pc + k % pc}[self.kind]

    def b_home(self, k: int, j: int, product: BlockProduct) -> int:
        if product.one_operand:  # B's block (k, j) is A's block (j, k), or (k, j)
            return self.a_home(*b_block(product, k, j)[1:], product)
        pr, pc = self.grid
        return {"one": 0, "rows": (k * len(product.cols) + j) % self.workers, "columns": j % self.workers,
                "grid": (k % pr) * pc + j % pc}[self.kind]

    def home(self, block: tuple, product: BlockProduct) -> int:
        """The GPU that keeps operand block ("a", i, k) or ("b", k, j) (see `blocks_needed`)."""
        operand, r, c = block
        return self.a_home(r, c, product) if operand == "a" else self.b_home(r, c, product)


def _cross_owner(i: int, j: int, n: int) -> int:
    half, three_quarters = n // 2, 3 * n // 4
    if (i < half) == (j < half):
        return 0 if i < half else 1
    return 2 if max(i, j) < three_quarters else 3


def candidates(workers: int, product: BlockProduct | None = None) -> list[Placement]:
    """One GPU, the two 1-D splits, every 2-D grid pr x pc = workers (pr, pc >= 2), and for ``x @ x.T`` on four
    GPUs with x's block rows a multiple of four, the cross layout."""
    if workers <= 1:
        return [Placement("one", 1)]
    grids = [Placement("grid", workers, (pr, workers // pr)) for pr in range(2, workers // 2 + 1)
             if workers % pr == 0]
    cross = ([Placement("cross", 4)] if workers == 4 and product is not None and product.gram
             and len(product.rows) % 4 == 0 else [])
    return [Placement("one", workers), Placement("rows", workers), Placement("columns", workers), *grids, *cross]


def b_block(product: BlockProduct, k: int, j: int) -> tuple:
    """B's block (k, j) as an operand block: ("b", k, j), or A's: ("a", j, k) where B is A's transpose, ("a", k, j)
    where B is A."""
    return ("a", j, k) if product.gram else ("a", k, j) if product.same else ("b", k, j)


def blocks_needed(product: BlockProduct, placement: Placement) -> dict[tuple, set[int]]:
    """{operand block: the GPUs that read it}, for every block of A ("a", i, k) and of B ("b", k, j); for
    ``x @ x.T``, A's blocks alone (a GPU that reads one as A's and as B's block receives it once)."""
    needs: dict[tuple, set[int]] = {}
    depth = range(len(product.depth))
    for i in range(len(product.rows)):
        for j in range(len(product.cols)):
            w = placement.owner(i, j, product)
            for k in depth:
                needs.setdefault(("a", i, k), set()).add(w)
                needs.setdefault(b_block(product, k, j), set()).add(w)
    return needs


def operand_blocks(product: BlockProduct) -> list[tuple]:
    """Every operand block: A's ("a", i, k), then B's ("b", k, j) unless B is A's transpose."""
    rows, cols, depth = range(len(product.rows)), range(len(product.cols)), range(len(product.depth))
    a = [("a", i, k) for i in rows for k in depth]
    return a if product.one_operand else a + [("b", k, j) for k in depth for j in cols]


def block_bytes(product: BlockProduct, block: tuple) -> int:
    operand, r, c = block
    return product.a_bytes(r, c) if operand == "a" else product.b_bytes(r, c)


def places_holding(held: dict, order, block: tuple) -> set[int] | None:
    """The places of a placement whose GPU (place p runs on GPU order[p]) already holds `block` (`held`: {block: the
    GPUs holding it, an empty set where only other workers do}); None where the block is not in memory."""
    if block not in held:
        return None
    return {p for p, gpu in enumerate(order) if gpu in held[block]}


def _living(product: BlockProduct, placement: Placement, held: dict, order, block: tuple) -> set[int]:
    """The places where `block` already is: those holding it, or, where it is not in memory, its home (made there)."""
    holding = places_holding(held, order, block)
    return {placement.home(block, product)} if holding is None else holding


def received_bytes(product: BlockProduct, placement: Placement) -> list[int]:
    """Bytes of input blocks each GPU receives: each block it needs once, unless the block lives there."""
    return held_received(product, placement, {}, range(placement.workers))


def resident_bytes(product: BlockProduct, placement: Placement, held: dict | None = None, order=None) -> list[int]:
    """Bytes each place holds at most during the product: the input blocks that live there (with `held` and `order`
    as for `held_received`: those its GPU already holds, and those held nowhere whose home it is), those it receives
    (each fetched as soon as it exists, kept until its last product there) and its output blocks."""
    held, order = held or {}, order or range(placement.workers)
    total = held_received(product, placement, held, order)
    for block in blocks_needed(product, placement):
        for p in _living(product, placement, held, order, block):
            total[p] += block_bytes(product, block)
    for i, m in enumerate(product.rows):
        for j, n in enumerate(product.cols):
            total[placement.owner(i, j, product)] += m * n * product.itemsize
    return total


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    placement: Placement
    product: BlockProduct
    received: tuple[int, ...]  # bytes into each place of the placement
    compute_seconds: float  # on the busiest GPU
    seconds: float  # predicted: compute plus the busiest GPU's incoming bytes over the link
    one_gpu_seconds: float
    link_bytes_per_s: float
    order: tuple[int, ...] = ()  # the GPU of each place of the placement (held operands); () where none is held
    held: dict = dataclasses.field(default_factory=dict)  # {block: GPUs that already hold it} (`plan_distributed`)

    @property
    def moved(self) -> int:
        return sum(self.received)

    @property
    def held_bytes(self) -> int:  # (on the plan's GPUs)
        return sum(block_bytes(self.product, block) for block, gpus in self.held.items() if gpus)

    def holding(self, block: tuple) -> set[int] | None:
        """The places whose GPU already holds `block`; None where it is not in memory (`places_holding`)."""
        return places_holding(self.held, self.order or range(self.placement.workers), block)


def _compute_seconds(product: BlockProduct, placement: Placement, flops_per_s: float) -> float:
    work = [0] * placement.workers
    depth = sum(product.depth)
    for i, m in enumerate(product.rows):
        for j, n in enumerate(product.cols):
            work[placement.owner(i, j, product)] += 2 * m * n * depth
    return max(work) / flops_per_s


def held_received(product: BlockProduct, placement: Placement, held: dict, order) -> list[int]:
    """`received_bytes` where some operand blocks are already in memory (`held`: {block: the GPUs holding it, an
    empty set where only others do}) and place p of the placement runs on GPU order[p]: a held block moves from
    where it is to each place that reads it and does not hold it; a block not in memory is made at its home, as
    `received_bytes` counts."""
    received = [0] * placement.workers
    for block, needers in blocks_needed(product, placement).items():
        for p in needers - _living(product, placement, held, order, block):
            received[p] += block_bytes(product, block)
    return received


def _held_order(product: BlockProduct, placement: Placement, held: dict) -> list[int]:
    """The GPU of each place: the assignment under which the most bytes each place reads are already held by that
    place's GPU (`best_assignment`); in order where nothing is held."""
    n = placement.workers
    gain = [[0] * n for _ in range(n)]  # gain[p][w]: bytes GPU w holds that place p reads
    for block, needers in blocks_needed(product, placement).items():
        for w in held.get(block, ()):
            for p in needers:
                gain[p][w] += block_bytes(product, block)
    return best_assignment(gain) if any(map(any, gain)) else list(range(n))


def plan_distributed(product: BlockProduct, workers: int, *, flops_per_s: float = FLOPS_PER_S,
                     link_bytes_per_s: float = LINK_BYTES_PER_S["ucx"], held: dict | None = None) -> DistributedPlan:
    """The candidate placement with the least predicted time (the fewest bytes moved on a tie).

    `held`: {operand block ("a", i, k) or ("b", k, j): the GPUs (0 .. workers - 1) that already hold it, an empty
    set where only other workers do}, for operands in a cluster's memory. Each candidate's places then go to the
    GPUs that hold most of what each reads (the plan's `order`), and the bytes it must still move decide between the
    candidates: keeping a product on one GPU is not free when its operands are spread over several."""
    if workers < 1:
        raise ValueError(f"a distributed product needs at least one GPU (got workers={workers})")
    held = {block: set(gpus) for block, gpus in (held or {}).items()}
    one = product.flops / flops_per_s
    plans = []
    for placement in candidates(workers, product):
        order = _held_order(product, placement, held)  # (in order where nothing is held)
        received = held_received(product, placement, held, order)
        compute = _compute_seconds(product, placement, flops_per_s)
        plans.append(DistributedPlan(placement, product, tuple(received), compute,
                                     compute + max(received) / link_bytes_per_s, one, link_bytes_per_s,
                                     tuple(order) if held else (), held))
    return min(plans, key=lambda p: (p.seconds, p.moved))


def best_assignment(gain: list[list[int]]) -> list[int]:
    """The assignment p -> w (a permutation) with the largest total gain[p][w] (fastmm.dask gives each place of a plan
    the worker that already holds the most of what it needs): the Hungarian method with potentials, O(n^3) for n
    places and n workers (costs are -gain). On a tie, it is the first found, in a fixed order."""
    n = len(gain)
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    match = [0] * (n + 1)  # match[w] = place (1-based) assigned to worker w, 0: none yet
    for p in range(1, n + 1):
        match[0], w0 = p, 0
        least, way, used = [inf] * (n + 1), [0] * (n + 1), [False] * (n + 1)
        while match[w0]:
            used[w0] = True
            p0, delta, w1 = match[w0], inf, 0
            for w in range(1, n + 1):
                if not used[w]:
                    cost = -gain[p0 - 1][w - 1] - u[p0] - v[w]
                    if cost < least[w]:
                        least[w], way[w] = cost, w0
                    if least[w] < delta:
                        delta, w1 = least[w], w
            for w in range(n + 1):
                if used[w]:
                    u[match[w]] += delta
                    v[w] -= delta
                else:
                    least[w] -= delta
            w0 = w1
        while w0:
            w1 = way[w0]
            match[w0] = match[w1]
            w0 = w1
    order = [0] * n
    for w in range(1, n + 1):
        order[match[w] - 1] = w - 1
    return order


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def describe_distributed(plan: DistributedPlan) -> str:
    """The plan in `fastmm.explain`'s words: the layout, the bytes between GPUs, the predicted gain."""
    p, pl = plan.product, plan.placement
    blocks = f"{len(p.rows)} x {len(p.cols)} output blocks, K in {len(p.depth)}"
    head = (f"{sum(p.rows)}x{sum(p.cols)}x{sum(p.depth)} product of blocks ({blocks}) on {pl.workers} GPU"
            f"{'s' if pl.workers > 1 else ''}:")
    layout = {
        "one": "all on one GPU: splitting it would not pay for the bytes it moves between GPUs",
        "rows": "A's rows (and C's) split across the GPUs, B's blocks sent to every GPU once",
        "columns": "B's columns (and C's) split across the GPUs, A's blocks sent to every GPU once",
        "grid": (f"a {pl.grid[0]} x {pl.grid[1]} grid of GPUs (SUMMA's layout): A's blocks sent along grid rows, "
                 "B's down grid columns"),
        "cross": ("x's block rows in quarters Q0-Q3: GPU 0 computes H0 x H0 (H0 = Q0 + Q1), GPU 1 H1 x H1, "
                  "GPU 2 H0 x Q2 and Q2 x H0, GPU 3 H0 x Q3 and Q3 x H0, so no GPU reads all of x"),
    }[pl.kind]
    if p.same:
        layout += "; B is A: each of A's blocks sent once to each GPU that reads it"
    if p.gram:
        layout += "; B is A's transpose: each of A's blocks sent once to each GPU that reads it, and read transposed"
    per = max(plan.received)
    gain = plan.one_gpu_seconds / plan.seconds if plan.seconds else 1.0
    held = max(resident_bytes(p, pl, plan.held, plan.order))
    where = (f" ({_size(plan.held_bytes)} of the operands already on the GPUs, each place on the GPU holding most of "
             "what it reads)" if plan.held else "")
    return (f"{head}\n  layout  {layout}; each output block's K summed on its owner, its own blocks first\n"
            f"  moved   {_size(plan.moved)} between GPUs, at most {_size(per)} into one GPU{where}\n"
            f"  memory  at most {_size(held)} on one GPU (its blocks, those it receives, its output)\n"
            f"  model   {gain:.2f}x one GPU's speed: {plan.compute_seconds * 1e3:.1f} ms of compute on the busiest GPU "
            f"and {per / plan.link_bytes_per_s * 1e3:.1f} ms to receive its inputs "
            f"(assumed: {FLOPS_PER_S / 1e12:.0f} TFLOP/s a GPU, {plan.link_bytes_per_s / 1e9:.0f} GB/s into each GPU)")
