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

from ..fusion.cascade import GroupReport, find_cascades, inline_elementwise, prove
from ..fusion.rewrite import splice

LOG = logging.getLogger("tvm_dsm.fusion")


def fuse_cascaded_reductions(
    func: tirx.PrimFunc, *, allow_approximate: bool = False, parts: int = 1, vector: int = 1
) -> tuple[tirx.PrimFunc, list[GroupReport]]:
    """The rewritten function (or ``func`` itself) and one report per cascade found.

    ``parts`` > 1 splits each row's reduction axis into that many strided parts (a child block a
    schedule binds to threads) whose partial states are merged by the same corrections. With
    ``vector`` > 1 each part reads chunks of that many consecutive elements, every row read whole
    loaded by one vectorized copy per chunk (16 bytes: 8 for fp16 data). ``parts * vector`` must
    divide the reduction extent.
    """
    inlined = inline_elementwise(func)
    fused, reports = inlined, []
    for group in find_cascades(inlined):
        report = prove(group)
        if report.fusible and report.approximate and not allow_approximate:
            report.fusible = False
            report.reason = "approximate: a rounding cast inside a level (pass allow_approximate=True)"
        if report.fusible and parts & (parts - 1):
            report.fusible = False
            report.reason = f"parts={parts}: the parts merge in a tree, so a power of two"
        if report.fusible and group[0].extent % (parts * vector):
            report.fusible = False
            report.reason = (f"{parts} parts of {vector}-element chunks do not divide the "
                             f"reduction extent {group[0].extent}")
        reports.append(report)
        if report.fusible:
            fused = splice(fused, group, parts, vector)
    for report in reports:
        LOG.info("%s", report)
    return (fused if any(r.fusible for r in reports) else func), reports


def FuseCascadedReductions(allow_approximate: bool = False, parts: int = 1, vector: int = 1) -> tvm.transform.Pass:  # noqa: N802
    """The pass form (TVM naming): rewrite every fusible cascade of every PrimFunc."""

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.FuseCascadedReductions")
    def _pass(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
        return fuse_cascaded_reductions(func, allow_approximate=allow_approximate, parts=parts,
                                        vector=vector)[0]

    return _pass
