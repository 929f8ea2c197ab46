"""L2 prefetches of weights that later kernels read, issued by a function's last kernel as its
CTAs finish (the function's ``PREFETCH_AHEAD_KEY`` attribute, written by
:mod:`tvm_dsm.relax_prefetch_ahead`: {parameter name: bytes from its start}).

Each kernel that ends a path through the function (:func:`tail_kernels`: the last of a sequence
of kernels, in each branch of a dispatch over row counts) gets, after everything its threads do, one thread of each
CTA issuing ``cp.async.bulk.prefetch.L2`` of the CTA's share of every named weight: CTA ``b`` of
``G`` (its linear index over the ``blockIdx`` axes) takes elements ``[b * c, (b + 1) * c)`` of the
first ``bytes`` of each, ``c`` the 16-byte multiple that splits them over ``G``; with the
``PREFETCH_AHEAD_KEPT_KEY`` attribute the lines are marked evict-last. The copies only warm L2:
HBM streams them while the kernels after this one run.
"""

from __future__ import annotations

import functools

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ..annotations import PREFETCH_AHEAD_KEPT_KEY, PREFETCH_AHEAD_KEY
from ..ir import find_all, is_thread_extent, replace_node
from .buffers import element_bytes
from .programmatic_launch import kernel_launches, replace_kernel_bodies

#: A bulk prefetch's size and address are multiples of 16 bytes.
BULK_BYTES = 16
#: The most bytes one prefetch request names (the ISA sets no limit; CUTLASS's are a tile's).
_REQUEST_BYTES = 64 * 1024
#: The L2 cache policy of an evict-last access (the encoding CUDA's own libraries pass as a
#: ``.L2::cache_hint`` operand).
_EVICT_LAST_POLICY = 0x14F0000000000000


def tail_kernels(stmt, kernels: list) -> list:
    """Those of ``kernels`` (kernel launches of ``stmt``) that run last on some path through
    ``stmt``: the last launch of a sequence, and the one before where the last may not run (in
    a branch without an else, in a loop of a variable count); the last of each branch. A kernel
    in a loop is one that runs last on every iteration."""
    return _tails(stmt, kernels)[0]


def _tails(stmt, kernels: list) -> tuple[list, bool]:
    """(:func:`tail_kernels` of ``stmt``, whether every path through it launches one)."""
    if any(stmt.same_as(k) for k in kernels):
        return [stmt], True
    if isinstance(stmt, tirx.SeqStmt):
        tails = []
        for child in reversed(list(stmt.seq)):
            found, certain = _tails(child, kernels)
            tails += found
            if certain:
                return tails, True
        return tails, False
    if isinstance(stmt, tirx.IfThenElse):
        then, then_certain = _tails(stmt.then_case, kernels)
        other, other_certain = _tails(stmt.else_case, kernels) if stmt.else_case is not None else ([], False)
        return then + other, then_certain and other_certain
    body = getattr(stmt, "body", None)
    if not isinstance(body, tirx.Stmt):
        return [], False
    tails, certain = _tails(body, kernels)
    runs = not isinstance(stmt, (tirx.For, tirx.While)) or (
        isinstance(stmt, tirx.For) and isinstance(stmt.extent, tirx.IntImm) and int(stmt.extent) > 0)
    return tails, certain and runs


def _share(weight, nbytes: int, cta, ctas, kept: bool = False):
    """The statement prefetching CTA ``cta``'s share (of ``ctas``) of ``weight``'s first
    ``nbytes`` bytes (a multiple of 16), in requests of at most :data:`_REQUEST_BYTES`
    (``kept``: evict-last)."""
    size = element_bytes(weight)
    total, vector, request = nbytes // size, BULK_BYTES // size, _REQUEST_BYTES // size
    ty = cta.ty
    chunk = tirx.truncdiv(total + ctas * vector - 1, ctas * vector) * vector  # elements a CTA, whole vectors
    start = cta * chunk
    count = tirx.min(chunk, tirx.const(total, ty) - start)
    i = tirx.Var("request", ty)
    args = [weight.access_ptr("r", offset=start + i * request),
            tirx.Cast("uint32", tirx.min(count - i * request, request) * size)]
    if kept:
        issue = tirx.Evaluate(T.ptx["cp.async.bulk.prefetch.L2.global.L2::cache_hint"](
            *args, tirx.const(_EVICT_LAST_POLICY, "uint64")))
    else:
        issue = tirx.Evaluate(T.ptx["cp.async.bulk.prefetch.L2.global"](*args))
    requests = tirx.For(i, tirx.const(0, ty), tirx.truncdiv(count + request - 1, request), tirx.ForKind.SERIAL, issue)
    return tirx.IfThenElse(start < tirx.const(total, ty), requests, None)


def _ending_with_prefetches(kernel: tirx.AttrStmt, weights: list[tuple], kept: bool):
    """``kernel``'s body, its innermost thread binding ending with one thread of each CTA
    prefetching its share of each of ``weights`` ((parameter, bytes); ``kept``: evict-last)."""
    blocks = [kernel, *find_all(kernel.body, tirx.AttrStmt, lambda s: is_thread_extent(s, "blockIdx"))]
    threads = find_all(kernel, tirx.AttrStmt, lambda s: is_thread_extent(s, "threadIdx"))
    if not threads:
        return kernel.body
    ty = blocks[0].node.var.ty
    cta, ctas = tirx.const(0, ty), tirx.const(1, ty)
    for block in blocks:  # a linear index over the blockIdx axes
        cta = cta + tirx.Cast(ty, block.node.var) * ctas
        ctas = ctas * tirx.Cast(ty, block.value)
    leader = functools.reduce(tirx.And, [tirx.EQ(t.node.var, tirx.const(0, t.node.var.ty)) for t in threads])
    shares = [_share(w, n, cta, ctas, kept) for w, n in weights]
    issue = tirx.IfThenElse(leader, shares[0] if len(shares) == 1 else tirx.SeqStmt(shares), None)
    innermost = next(t for t in threads
                     if not find_all(t.body, tirx.AttrStmt, lambda s: is_thread_extent(s, "threadIdx")))
    ended = tirx.AttrStmt(innermost.node, innermost.attr_key, innermost.value, tirx.SeqStmt([innermost.body, issue]))
    return replace_node(kernel.body, innermost, ended)


def prefetch_ahead(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the prefetches its ``PREFETCH_AHEAD_KEY`` attribute names (module
    docstring) at the end of its tail kernels; a function without the attribute is returned as
    it is."""
    wanted = func.attrs.get(PREFETCH_AHEAD_KEY) if func.attrs is not None else None
    if not wanted:
        return func
    by_name = {p.name: p for p in func.params}
    weights = [(by_name[str(name)], int(nbytes)) for name, nbytes in wanted.items()]
    for weight, nbytes in weights:
        if nbytes % BULK_BYTES or tvm.DataType(str(weight.ty.dtype)).bits % 8:
            raise ValueError(f"prefetch ahead of {weight.name}: {nbytes} bytes of {weight.ty.dtype}, not whole "
                             f"{BULK_BYTES}-byte pieces of whole-byte elements")
    kept = bool(func.attrs.get(PREFETCH_AHEAD_KEPT_KEY, False))
    tails = tail_kernels(func.body, kernel_launches(func.body))
    return func.with_body(replace_kernel_bodies(func.body, tails,
                                                [_ending_with_prefetches(k, weights, kept) for k in tails]))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.IssuePrefetchesAhead")
def IssuePrefetchesAhead(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`prefetch_ahead` on every PrimFunc of ``mod``."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc):
            mod[gv] = prefetch_ahead(func)
    return mod
