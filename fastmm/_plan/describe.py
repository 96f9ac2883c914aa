"""What `fastmm.explain` prints for a plan (`describe`), and what a product's plan depends on besides its operands
(`settings`)."""

from __future__ import annotations

import dataclasses

from .cublas_ahead import _yield, cublas_ahead
from .accuracy import serial_run
from .forced import _forced, kernels_on
from .precision import OZAKI_INT8, PRECISIONS, current_precision
from .problem import Choice, Device, Problem
from .table import aligned_copies, choose, interior, split_cut

__all__ = ["describe", "settings", "cublas_ahead_of_parts"]


def settings() -> tuple:
    """What the plan of a product depends on besides its operands, in one call (a small product's replay key reads
    it on every call): the forced kernel, the float32 precision, and whether to yield to cuBLAS."""
    return _forced.get(), current_precision(), _yield.get()


def _edge_problems(peel: tuple[int, int], problem: Problem) -> list[tuple[str, Problem]]:
    """A peeled product's last columns and rows as the products the runtime plans them as: (what, problem)."""
    rows, cols = peel
    edges = []
    if cols:
        edges.append((f"the last {cols} columns", dataclasses.replace(problem, m=problem.m - rows, n=cols)))
    if rows:
        edges.append((f"the last {rows} rows", dataclasses.replace(problem, m=rows)))
    return edges


def _edges(peel: tuple[int, int], problem: Problem, device: Device) -> str:
    """Where a peeled product's last rows and columns run: each edge is planned as a product of its own."""
    edges = _edge_problems(peel, problem)
    return " and ".join(f"{what} on {choose(edge, device, 'auto').name}" for what, edge in edges)


def cublas_ahead_of_parts(problem: Problem, choice: Choice, device: Device) -> str | None:
    """Why cuBLAS is measured ahead of the plan (`cublas_ahead`) or of a part of it that the runtime plans as a product
    of its own (aligned copies, a peeled product's interior and edges): any of them hands the whole product to cuBLAS
    while products yield to it (`accelerate_cupy`); None where none is."""
    why = cublas_ahead(problem, choice, device)
    if why is not None:
        return why
    parts = []
    if choice.pad:
        parts.append(("its aligned copies", aligned_copies(problem)))
    elif choice.peel != (0, 0):
        parts += [("its interior", interior(problem, choice.peel)), *_edge_problems(choice.peel, problem)]
    for what, part in parts:
        why = cublas_ahead_of_parts(part, choose(part, device, "auto"), device)
        if why is not None:
            return f"{what}: {why}"
    return None


def _cut(choice: Choice, problem: Problem) -> str:
    """How `choice` cuts K, as the runtime makes the cut: one batched launch of the slices, then what K leaves over;
    or a cluster's blocks; '' where it does not."""
    if getattr(choice.config, "cluster", 1) > 1:
        return f", K split over a cluster of {choice.config.cluster} blocks that sums it"
    if choice.splits == 1:
        return ""
    depth, full, rest = split_cut(problem.k, choice.splits, choice.config)
    last = problem.k - (full - 1) * depth
    cut = (f", split-K into {full} slices {depth} deep" + (f" (the last {last})" if last < depth else "")
           + (f", the last {rest} of K a launch of its own" if rest else ""))
    return cut + (f" (the batch's {problem.batch} products' slices in one launch where its axes collapse to one)"
                  if problem.batch > 1 else "")


def describe(choice: Choice, problem: Problem, device: Device) -> str:
    """What `fastmm.explain` prints for `choice`: the kernel, the precision mode, the rule and why, the grid."""
    shape = f"{problem.m}x{problem.n}x{problem.k}" + (f", batch {problem.batch}" if problem.batch != 1 else "")
    wide = choice.variant.vec == 4
    layout = (f"A {'m' if problem.a_t else 'k'}-contiguous, B {'k' if problem.b_t else 'n'}-contiguous, "
              f"{'16-byte copies' if wide else 'rows not 16-byte aligned (4-byte copies)'}")
    if choice.pad:
        padded = aligned_copies(problem)
        copies = " and ".join(x for x, ok in (("A", problem.a_aligned), ("B", problem.b_aligned))
                              if not ok or padded.k != problem.k)
        if padded.k != problem.k:
            copies += f", K padded with zeros to {padded.k}"
        inner = choose(padded, device, "auto")
        return (describe(inner, padded, device).replace(" (A ", f" (on aligned copies of {copies}; A ", 1)
                + f"\n  copy    {choice.rule}: {choice.reason}")
    run = serial_run(choice, problem, device)  # (of the interior, for a peeled product)
    splits = choice.splits
    if choice.peel != (0, 0):  # the interior is planned as a product of its own, and may split K
        inside = interior(problem, choice.peel)
        inner = choose(inside, device, "auto")
        split = (f" on the {inside.m}x{inside.n} interior{_cut(inner, inside)}; "
                 + _edges(choice.peel, problem, device))
        problem, splits = inside, inner.splits
    else:
        split = _cut(choice, problem)
    sums = f"\n  sums    at most {run} terms in one FP32 running sum (K = {problem.k})"
    mode = PRECISIONS[choice.config.precision]
    if getattr(choice.config, "f64_sums", False):
        mode = "float64 sums on the SIMT cores (exact products of the float32 operands; C rounded once)"
        sums = f"\n  sums    in float64 (K = {problem.k}); one float32 rounding per element of C"
    if choice.config is OZAKI_INT8:
        mode = "Ozaki scheme II on the INT8 tensor cores (int8 residues of A and B, exact products; FP32 accuracy)"
        sums = "\n  sums    exact in int32 (one product per modulus); one rounding per element of C"
    off = "" if kernels_on() else "\n  note    $FASTMM_KERNELS=off: CuPy (cuBLAS) computes it instead of this kernel"
    return (f"{shape} float32 ({layout}) on {device.name}:\n"
            f"  kernel  {choice.config.binary_name(choice.variant)}{split}\n"
            f"  mode    {choice.config.precision}: {mode}\n"
            f"  rule    {choice.rule}: {choice.reason}\n"
            f"  grid    {problem.blocks(choice.config) * splits} blocks of {choice.config.threads} threads "
            f"for {device.sm_count} SMs{sums}{off}")
