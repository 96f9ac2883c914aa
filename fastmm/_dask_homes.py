"""Where `fastmm.dask.matmul` keeps each operand chunk (its home) when one operand's chunks are made from the other's.

In ``x @ x.T`` (or ``x @ f(x).T``, any chain of single-chunk steps) each chunk of B is made from one chunk of A. The
plan treats them as two blocks with homes of their own; in the graph, B's chunk is made wherever its task runs, from
A's chunk wherever that was made. A persisted chunk held by a GPU that needs it only as B's counted as held there,
but A's copy of it was made at A's home: it went there and came back for the transpose (4 block moves where the
plan, plus one for the chunk not held by a GPU that needs it as A, counts 3). B's chunk is now made at A's chunk's
home where it is needed there, and A's home may be a GPU that needs it both as A and as B, where that sends no more
into the busiest GPU.
"""

from __future__ import annotations

# How many steps back a chunk is followed to the chunk of A it is made from (as fastmm.dask._DERIVED_DEPTH).
DEPTH = 4


def made_from(x, y) -> dict:
    """{(k, j): (i, k')} for each chunk (k, j) of y made from chunk (i, k') of x alone, up to DEPTH steps back (y's
    chunk being x's own where y is x)."""
    from dask.core import flatten, get_dependencies

    graph = y.__dask_graph__()
    found = {}
    for key in flatten(y.__dask_keys__()):
        step = key
        for _ in range(DEPTH + 1):
            if isinstance(step, tuple) and len(step) == 3 and step[0] == x.name:
                found[key[1:]] = step[1:]
                break
            sources = get_dependencies(graph, step) if step in graph else ()
            if len(sources) != 1:
                break
            (step,) = sources
    return found


def choose(x, y, product, placement, held: dict) -> tuple[dict, dict]:
    """(a_homes, b_homes): the plan place of each chunk of A ((i, k) -> place) and of B ((k, j) -> place).

    `held`: {key: places of the workers holding it} for persisted chunks (and those made from one). A chunk held by a
    place that needs it stays there; otherwise its home is the plan's, or, for a chunk of A from which chunks of B are
    made, possibly a place that needs it both as A and as B: of the two choices, the one whose busiest GPU receives
    least, then that moves least (for fresh operands on a 2 x 2 grid, meeting moves the plan's 72 blocks where the
    plan's homes move 90, but sends 36 into each of two GPUs and none into the others, where they send 27 at most:
    the plan's homes are kept). A chunk of B made from one of A is made at that chunk's home where it is needed there,
    else at the plan's home for it."""
    derived = made_from(x, y)
    options = [_homes(x, y, product, placement, held, derived, meet) for meet in ((False, True) if derived else
                                                                                    (False,))]
    return min(options, key=lambda homes: _score(product, placement, held, derived, x, y, *homes))


def _homes(x, y, product, placement, held, derived, meet: bool) -> tuple[dict, dict]:
    rows, cols, nk = range(len(product.rows)), range(len(product.cols)), len(product.depth)
    b_needers = {(k, j): {placement.owner(i, j) for i in rows} for k in range(nk) for j in cols}
    also_b: dict = {}  # A's chunk -> the places that need a chunk of B made from it
    for b, a in derived.items():
        also_b.setdefault(a, set()).update(b_needers[b])
    a_homes = {}
    for i in rows:
        for k in range(nk):
            needers, planned = {placement.owner(i, j) for j in cols}, placement.a_home(i, k, product)
            keep = next((w for w in held.get((x.name, i, k), ()) if w in needers), None)
            both = sorted(needers & also_b.get((i, k), set())) if meet else []
            a_homes[i, k] = keep if keep is not None else planned if planned in both or not both else both[0]
    b_homes = {}
    for (k, j), needers in b_needers.items():
        planned = placement.b_home(k, j, product)
        if (k, j) in derived:
            made = a_homes[derived[k, j]]
            b_homes[k, j] = made if made in needers else planned
        else:
            b_homes[k, j] = next((w for w in held.get((y.name, k, j), ()) if w in needers), planned)
    return a_homes, b_homes


def received(product, placement, held: dict, derived: dict, x, y, a_homes: dict, b_homes: dict) -> list[int]:
    """Bytes each plan place receives in the graph these homes give: a chunk's source fetched to its home where no
    worker there holds it (for a chunk of B made from one of A: from A's home), then the chunk sent to each other
    place that needs it."""
    rows, cols = range(len(product.rows)), range(len(product.cols))
    got = [0] * placement.workers
    for (i, k), home in a_homes.items():
        nbytes, source = product.a_bytes(i, k), held.get((x.name, i, k))
        got[home] += nbytes if source and home not in source else 0
        for w in {placement.owner(i, j) for j in cols} - {home}:
            got[w] += nbytes
    for (k, j), home in b_homes.items():
        nbytes = product.b_bytes(k, j)
        source = [a_homes[derived[k, j]]] if (k, j) in derived else held.get((y.name, k, j))
        got[home] += nbytes if source and home not in source else 0
        for w in {placement.owner(i, j) for i in rows} - {home}:
            got[w] += nbytes
    return got


def _score(product, placement, held, derived, x, y, a_homes, b_homes) -> tuple[int, int]:
    got = received(product, placement, held, derived, x, y, a_homes, b_homes)
    return max(got), sum(got)
