"""FuseCascadedReductions: RedFuser's rewrite as a TVM pass over s_tir PrimFuncs.

Each cascade (tvm_dsm.fusion.cascade) that is proven separable becomes one incremental loop
(tvm_dsm.fusion.rewrite). A function with nothing it can fuse is returned unchanged (the same
object); the reasons are logged on the ``tvm_dsm.fusion`` logger and returned by
:func:`fuse_cascaded_reductions`. Rounding casts (fp16/fp8) inside a level make the fused result
differ from the unfused one: such cascades are only rewritten with ``allow_approximate=True``.
"""

from __future__ import annotations

import logging

import tvm
from tvm import tirx

from ..fusion.cascade import (GroupReport, element_producers, find_cascades, inline_elementwise, prove,
                              refuse_approximate)
from ..fusion.rewrite import splice
from ..fusion.symbolic import Unsupported
from ..hardware import MAX_CTA_THREADS
from ..ir import root_blocks

LOG = logging.getLogger("tvm_dsm.fusion")


def fuse_cascaded_reductions(
    func: tirx.PrimFunc, *, allow_approximate: bool = False, parts: int = 1, vector: int = 1,
    lanes: int = 1, ranks: int = 1, shuffle: bool = False, copy_stages: int = 0, rows_per_cta: int = 1,
) -> tuple[tirx.PrimFunc, list[GroupReport]]:
    """The rewritten function (or ``func`` itself) and one report per cascade found.

    ``parts`` > 1 splits each row's reduction axis into that many strided parts (a child block a
    schedule binds to threads) whose partial states are merged by the same corrections. With
    ``vector`` > 1 each part reads chunks of that many consecutive elements, every row read whole
    loaded by one vectorized copy per chunk (at most 16 bytes: 8 fp16 elements). ``vector`` must divide
    the reduction extent, into at least ``parts`` chunks; where the parts do not divide the
    chunks, the last step of some parts is predicated off (with an element producer, ``parts *
    vector`` must divide the extent).

    A sum over another axis that a level reads one element at a time (decode attention's
    scores, ``s[row, k] = sum_d q[row, d] key[row, k, d]``) is computed inside the loop as each
    element is reached (an element producer), never stored. With ``lanes`` > 1 each part is that
    many threads of one warp sharing every element: each lane sums its slice of the producer's
    inner axis (then a warp-shuffle butterfly, so the function is CUDA-only) and keeps its slice
    of each level's last extra axis (16-byte loads per lane). ``ranks`` > 1 stops the merge tree
    at that many partials, which ``*_final`` merges: parts spread over the CTAs of a cluster
    (part p on rank p % ranks) then meet once, through DSM (tvm_dsm.rules.fused_rows). With
    ``shuffle`` the parts whose threads share a warp merge first by warp shuffles, in registers
    (CUDA only; part p's threads are ``(p // ranks) * lanes`` + lane, as fused_rows binds them).
    ``copy_stages`` = S >= 2 (with ``lanes`` > 1) brings the lanes' moving slices through a
    ring of S chunks in shared memory filled by ``cp.async`` (CUDA only): S - 1 chunks in flight
    per thread without holding them in registers. ``rows_per_cta`` > 1 (with ``shuffle``, one
    rank, and a row's parts and lanes within one warp) puts that many rows' threads in one CTA,
    so that a row of fewer than 32 threads does not leave the rest of its warp empty: the warp
    merge leaves every part with the row's state, each keeps its own partial state in registers,
    and nothing of a row lives in shared memory but its outputs.
    """
    inlined = inline_elementwise(func)
    fused, reports = inlined, []
    for group in find_cascades(inlined):
        report = prove(group) if allow_approximate else refuse_approximate(prove(group))
        if report.fusible and parts & (parts - 1):
            report.fusible = False
            report.reason = f"parts={parts}: the parts merge in a tree, so a power of two"
        if report.fusible and (group[0].extent % vector or group[0].extent < parts * vector):
            report.fusible = False
            report.reason = (f"{vector}-element chunks, at least one for each of {parts} parts, do "
                             f"not divide the reduction extent {group[0].extent}")
        if report.fusible:
            between = _reader_between_levels(inlined, group)
            if between:
                report.fusible = False
                report.reason = (f"{between} reads a level's result between the levels "
                                 f"{group[0].block} and {group[-1].block}: the fused loop writes it last")
        producers = element_producers(inlined, group) if report.fusible else {}
        if producers and group[0].extent % (parts * vector):
            report.fusible = False
            report.reason = (f"{parts} parts of {vector}-element chunks do not divide the reduction extent "
                             f"{group[0].extent} (a cascade with an element producer splits evenly)")
        problem = (_check_split(group, producers, parts, lanes, ranks, copy_stages, shuffle, rows_per_cta)
                   if report.fusible else None)
        if problem:
            report.fusible, report.reason = False, problem
        if report.fusible and producers:
            report.details += [f"{p.block}: computed per element inside the loop (sum over "
                               f"{p.extent})" for p in producers.values()]
        if report.fusible:
            try:
                fused = splice(fused, group, parts, vector, lanes, ranks, producers, shuffle, copy_stages,
                               rows_per_cta)
            except (KeyError, Unsupported) as err:  # a form the proof accepts but the rewrite cannot write
                report.fusible = False
                report.reason = (f"levels {', '.join(l.block for l in group)}: the rewrite cannot express "
                                 f"this cascade ({type(err).__name__}: {err})")
        reports.append(report)
    for report in reports:
        LOG.info("%s", report)
    return (fused if any(r.fusible for r in reports) else func), reports


def _reader_between_levels(func: tirx.PrimFunc, group) -> str | None:
    """The first block other than a level that sits between the cascade's first and last levels
    and reads a level's result (the fused block replaces the last level, so it would read the
    result before the fused loop writes it), if any."""
    blocks = root_blocks(func)
    names = [b.name_hint for b in blocks]
    levels = {lvl.block for lvl in group}
    positions = [names.index(n) for n in levels if n in names]
    results = [buf for lvl in group for buf in lvl.results]
    for block in blocks[min(positions) + 1:max(positions)]:
        if block.name_hint not in levels and any(r.source.same_as(b) for r in block.reads for b in results):
            return block.name_hint
    return None


def _check_split(group, producers: dict, parts: int, lanes: int, ranks: int,
                 copy_stages: int = 0, shuffle: bool = False, rows_per_cta: int = 1) -> str | None:
    """Why the lanes / ranks split (or the copy stages, or the rows per CTA) cannot apply to this
    group, or None."""
    if rows_per_cta > 1 and not (shuffle and ranks == 1 and parts * lanes <= 32):
        return (f"rows_per_cta={rows_per_cta}: a row's parts must merge inside one warp (shuffle, "
                f"one rank, parts * lanes <= 32; here {parts} x {lanes}, ranks={ranks})")
    if rows_per_cta < 1 or rows_per_cta & (rows_per_cta - 1) or rows_per_cta * parts // ranks * lanes > MAX_CTA_THREADS:
        return f"rows_per_cta={rows_per_cta}: a power of two, at most {MAX_CTA_THREADS} threads per CTA"
    if copy_stages and (copy_stages < 2 or lanes < 2):
        return (f"copy_stages={copy_stages}: a ring of at least 2 chunks, for the slices of "
                "lanes > 1")
    if lanes & (lanes - 1) or not 1 <= lanes <= 32:
        return f"lanes={lanes}: lanes share a warp through shuffles, so a power of two up to 32"
    if ranks & (ranks - 1) or parts % ranks:
        return f"ranks={ranks}: a power of two dividing parts={parts}"
    if lanes > 1 and any(lvl.top_k for lvl in group):
        return "lanes > 1 with a top-k level: a top-k keeps whole pairs per thread"
    if ranks > 1 and any(lvl.form == "split" for lvl in group):
        # TVM 0.27's transform_layout fails (an internal check) on its float64 partial sums
        return "ranks > 1 with a split level (a sum of separable terms, e.g. a variance): not supported"
    for lvl in group:
        extra = [int(s) for s in lvl.output.ty.shape[len(group[0].spatial):]]
        if lanes > 1 and not lvl.top_k and extra and extra[-1] % lanes:
            return f"lanes={lanes} do not divide {lvl.block}'s last axis ({extra[-1]})"
    for prod in producers.values():
        if prod.extent % lanes:
            return f"lanes={lanes} do not divide the inner axis of {prod.block} ({prod.extent})"
    return None


def FuseCascadedReductions(allow_approximate: bool = False, parts: int = 1, vector: int = 1,  # noqa: N802
                           lanes: int = 1, ranks: int = 1, shuffle: bool = False,
                           copy_stages: int = 0, rows_per_cta: int = 1) -> tvm.transform.Pass:
    """The pass form (TVM naming): rewrite every fusible cascade of every PrimFunc."""

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.FuseCascadedReductions")
    def _pass(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
        return fuse_cascaded_reductions(func, allow_approximate=allow_approximate, parts=parts,
                                        vector=vector, lanes=lanes, ranks=ranks, shuffle=shuffle,
                                        copy_stages=copy_stages, rows_per_cta=rows_per_cta)[0]

    return _pass
