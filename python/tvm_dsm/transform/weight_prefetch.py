"""An L2 prefetch of the rows of a weight each CTA streams, issued before a kernel launched
programmatically waits for the previous grid.

A GEMV at one row (:mod:`tvm_dsm.rules.row_gemv`) reads each of its CTA's rows of W once, from
HBM; the kernels before it in a decode step (a norm, rotary embedding, attention) are latency
bound and leave HBM idle. Launched programmatically, the GEMV's CTAs are resident while the
previous kernel runs: one thread of each issues ``cp.async.bulk.prefetch.L2`` of its CTA's rows
(contiguous: whole rows of a row-major W), so they stream into L2 during that kernel and the
GEMV's loads after the wait hit L2.

The schedule marks its root block with ``PREFETCH_ROWS_KEY`` (a pragma: it survives
LowerOpaqueBlock as an attribute), its value the rows of W a CTA reads. This pass, run on the
lowered (still multi-dimensional) body, finds each load of a two-dimensional parameter whose row
follows ``blockIdx.x``, and puts at the top of the kernel, marked ``L2_PREFETCH_KEY``, the
prefetch of the CTA's rows from its first one (the row index with every other variable at 0).
:func:`tvm_dsm.transform.programmatic_launch.programmatic_launch` issues it before the wait where
the parameter is read-only (a model's weight) and drops it otherwise; a function not launched
programmatically gets none.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T
from tvm.sym import Analyzer

from ..annotations import PREFETCH_ROWS_KEY
from ..ir import find_all, is_thread_extent, substitute, uses
from .buffers import element_bytes
from .programmatic_launch import L2_PREFETCH_KEY, launched_programmatically


def _is_mark(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == PREFETCH_ROWS_KEY


def prefetch_weight_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each kernel under a ``PREFETCH_ROWS_KEY`` mark prefetching its CTA's rows
    of every two-dimensional parameter it reads by ``blockIdx.x`` (see the module docstring); the
    mark removed."""
    marks = find_all(func.body, tirx.AttrStmt, _is_mark)
    if not marks:
        return func
    programmatic = launched_programmatically(func)

    def rewrite(mark):
        body = mark.body
        if programmatic:
            for kernel in find_all(body, tirx.AttrStmt, lambda s: is_thread_extent(s, "blockIdx.x")):
                body = _prefetched(body, kernel, int(mark.value), list(func.params))
        return body

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, lambda s: rewrite(s) if _is_mark(s) else s)]))


def _prefetched(body, kernel: tirx.AttrStmt, rows: int, params: list):
    """``body`` with ``kernel``'s innermost thread binding's body led by the prefetches."""
    block = kernel.node.var
    threads = find_all(kernel, tirx.AttrStmt, lambda s: is_thread_extent(s, "threadIdx"))
    if not threads:
        return body
    prefetches, seen = [], []
    analyzer = Analyzer()
    leader = tirx.all(*(tirx.EQ(t.node.var, tirx.const(0, t.node.var.ty)) for t in threads))  # one thread a CTA issues them
    for load in find_all(kernel.body, tvm.ir.TensorLoad, lambda ld: len(ld.indices) == 2 and uses(ld.indices[0], block)):
        weight = next((p for p in params if p.same_as(load.source)), None)
        if weight is None:
            continue
        others = [v for v in find_all(load.indices[0], tirx.Var) if not v.same_as(block)]
        first = analyzer.simplify(substitute(load.indices[0], [(v, tirx.const(0, v.ty)) for v in others]))
        if any(w.same_as(weight) and tvm_ffi.structural_equal(f, first) for w, f in seen):
            continue
        seen.append((weight, first))
        k = weight.shape[1]
        size = rows * k * element_bytes(weight)
        issue = tirx.Evaluate(T.ptx["cp.async.bulk.prefetch.L2.global"](
            weight.access_ptr("r", offset=first * k), tirx.const(int(size), "uint32")))
        prefetches.append(tirx.AttrStmt(weight, L2_PREFETCH_KEY, 0, tirx.IfThenElse(leader, issue, None)))
    if not prefetches:
        return body
    innermost = next(t for t in threads if not find_all(t.body, tirx.AttrStmt, lambda s: is_thread_extent(s, "threadIdx")))
    led = tirx.AttrStmt(innermost.node, innermost.attr_key, innermost.value,
                        tirx.SeqStmt([*prefetches, innermost.body]))
    return tvm_ffi.structural_map(body, [(tirx.AttrStmt, lambda s: led if s.same_as(innermost) else s)], order="pre")


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.PrefetchWeightRows")
def PrefetchWeightRows(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`prefetch_weight_rows` on every PrimFunc of ``mod``."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc):
            mod[gv] = prefetch_weight_rows(func)
    return mod
