"""Launch tvm-dsm's kernels with programmatic dependent launch (PDL, Hopper).

Back to back on a stream, a kernel normally starts only after the previous one has finished
and its CTAs have left: the launch, the CTAs' dispatch and their shared-memory setup all wait.
With ``cudaLaunchAttributeProgrammaticStreamSerialization`` (TVM 0.27's launch tag
``tirx.use_programtic_dependent_launch``) the next kernel launches as soon as every CTA of the
previous one has executed ``griddepcontrol.launch_dependents``, and its threads wait in
``griddepcontrol.wait`` until the previous grid has completed and its memory is visible.

A schedule asks for it with :func:`launch_programmatically` (an annotation of its root block,
so MetaSchedule traces record it); TVM's stock schedules built through the same pipeline are
left as they are. Every kernel of such a function starts with ``griddepcontrol.wait`` (before
any global load or store, so neither a read-after-write nor a write-after-read across kernels
can race) and then lets its dependents launch.

Two exceptions, where it is safe. A kernel after the first may first read a parameter that no
earlier kernel of the function names: every kernel of an earlier function has completed by
then, the function's first kernel waited for it before it let this one launch. And any kernel
may first read a parameter no kernel of the program writes (a model's weight, named by the
function's ``READ_ONLY_PARAMS_KEY`` attribute: :mod:`tvm_dsm.relax_weights`). The TMA
pipeline marks two such reads: an L2 prefetch of every tile it will copy from the parameter
(:data:`tvm_dsm.transform.tma_pipeline.PREFETCH_WINDOW_S`; dropped where not safe) and its
copies of the first pipeline steps' tiles into shared memory (moved after the wait where not
safe). So the second GEMM of an unfused chain, or the fp8 GEMM behind its quantization kernel,
fetches its weight during the previous kernel's tail. A prefetch of a tensor map's descriptor
(``prefetch.tensormap``) reads only the kernel's parameters and may precede them.

A kernel may also say where it waits, marking the statements from there with
``PROGRAMMATIC_WAIT_KEY``: those before read nothing an earlier kernel writes (the decode
attention over a paged KV cache looks up its pages, which the host copies before the step, and
prefetches its first rows into L2, which any write of them reaches).

Measured on the H100 (bench/results/programmatic_launch/latest.json, numbers in
docs/lowering.md): unfused chains and single GEMMs whose grid runs in one wave gain, grids of
several waves lose, also with the trigger at the kernel's end. So the unfused chain asks for it, and a GEMM where its planner expects one wave
(:attr:`tvm_dsm.rules.split_k_gemm.SplitKGemmConfig.programmatic_launch`).

A function whose ``LAUNCH_EARLY_KEY`` attribute is set (what ``relax.get_pipeline("tvm_dsm")``
does to a model's every function unless ``launch_early=False``) has its kernels launched
programmatically whatever schedule wrote them (dlight's, a prescheduled one): a model's every
kernel then launches while the one before it runs.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock
from tvm.script import tirx as T

from ..ir import find_all, is_thread_extent, replace_node
from ..annotations import (EARLY_COPY_KEY, LAUNCH_EARLY_KEY, PDL_LAUNCH_TAG, PROGRAMMATIC_LAUNCH_KEY,
                           PROGRAMMATIC_WAIT_KEY, READ_ONLY_PARAMS_KEY)

#: Statement attribute (node: a parameter) around one thread's L2 prefetch of the tiles
#: a kernel's CTA will copy from that parameter (tvm_dsm.transform.tma_pipeline): issued
#: before the kernel waits for the previous grid when that is safe, else dropped.
L2_PREFETCH_KEY = "tvm_dsm.l2_prefetch"
_LAUNCH_PARAMS_KEY = "tirx.kernel_launch_params"


def launch_programmatically(sch: s_tir.Schedule, enable: bool = True) -> None:
    """Have the kernels of ``sch``'s function launched programmatically (or not)."""
    root = sch.get_sblock("root")
    if enable:
        sch.annotate(root, PROGRAMMATIC_LAUNCH_KEY, 1)
    elif PROGRAMMATIC_LAUNCH_KEY in sch.get(root).annotations:
        sch.unannotate(root, PROGRAMMATIC_LAUNCH_KEY)


def read_only_params(func: tirx.PrimFunc) -> list:
    """The parameters of ``func`` that its ``READ_ONLY_PARAMS_KEY`` attribute names (none
    without it): no kernel of the program writes them."""
    names = func.attrs.get(READ_ONLY_PARAMS_KEY) if func.attrs is not None else None
    return [p for p in func.params if names is not None and p.name in {str(n) for n in names}]


def launched_programmatically(func: tirx.PrimFunc) -> bool:
    """Whether ``func``'s schedule asked for programmatic launch (a root-block annotation, or
    the attribute lowering leaves of it) or its ``LAUNCH_EARLY_KEY`` attribute does."""
    return (bool(func.attrs is not None and func.attrs.get(LAUNCH_EARLY_KEY, False))
            or bool(find_all(func.body, tirx.AttrStmt, _is_marker))
            or bool(find_all(func.body, SBlock, lambda b: PROGRAMMATIC_LAUNCH_KEY in b.annotations)))


def _is_marker(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == PROGRAMMATIC_LAUNCH_KEY


def programmatic_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Each kernel of ``func`` (its outermost ``blockIdx`` launches) waits for the previous
    grid, then lets the next one launch; ``func`` requests the launch attribute. A kernel issues
    its L2 prefetches and early copies (``L2_PREFETCH_KEY``, ``EARLY_COPY_KEY``) before it
    waits (see :func:`_wait_after_early`) where they read a parameter no kernel writes
    (:func:`read_only_params`) or, in a kernel after the first, one no earlier kernel of
    ``func`` mentions; every other prefetch is dropped, every other early copy issued after the
    wait."""
    if not launched_programmatically(func):  # a kernel's own wait marks go: it waits for nothing
        return func.with_body(_without_waits(func.body, []))
    kernels = _kernels(func.body)
    wait = [tirx.Evaluate(T.ptx.griddepcontrol.wait()),
            tirx.Evaluate(T.ptx.griddepcontrol.launch_dependents())]
    buffers = _Buffers(func.body)
    read_only = read_only_params(func)
    bodies, named = [], []
    for kernel in kernels:
        if find_all(kernel.body, tirx.AttrStmt, _is_wait):  # it says where it waits; marked prefetches go
            bodies.append(_unmark(_without_waits(kernel.body, wait)))
            named += buffers.named_in(kernel)
            continue
        early = [m for m in find_all(kernel.body, tirx.AttrStmt, _is_early)
                 if any(buffers.root(m.node).same_as(b) for b in read_only)
                 or (named and not any(buffers.root(m.node).same_as(b) for b in named))]
        body = _wait_after_early(kernel.body, early, wait) if early else None
        bodies.append(body if body is not None else tirx.SeqStmt([*wait, _unmark(kernel.body)]))
        named += buffers.named_in(kernel)
    body = _replace_kernels(func.body, kernels, bodies)
    body = tvm_ffi.structural_map(body, [(tirx.AttrStmt, lambda s: s.body if _is_marker(s) else s)])
    params = list(func.attrs.get(_LAUNCH_PARAMS_KEY, [])) if func.attrs is not None else []
    return func.with_body(body).with_attr(_LAUNCH_PARAMS_KEY, [*params, PDL_LAUNCH_TAG])


def _is_wait(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == PROGRAMMATIC_WAIT_KEY


def _without_waits(body, wait: list):
    """``body`` with each ``PROGRAMMATIC_WAIT_KEY`` mark replaced by ``wait`` (statements, none
    where the kernel does not wait) before the statements it marks."""
    def unmark(stmt):
        if not _is_wait(stmt):
            return stmt
        return tirx.SeqStmt([*wait, stmt.body]) if wait else stmt.body

    return tvm_ffi.structural_map(body, [(tirx.AttrStmt, unmark)])


def _is_kernel_launch(stmt) -> bool:
    return is_thread_extent(stmt, "blockIdx")


def _kernels(body) -> list:
    """The kernel launches of ``body``: its outermost ``blockIdx`` attributes."""
    launches = find_all(body, tirx.AttrStmt, _is_kernel_launch)
    inner = [n for launch in launches for n in find_all(launch.body, tirx.AttrStmt, _is_kernel_launch)]
    return [launch for launch in launches if not any(launch.same_as(n) for n in inner)]


def _replace_kernels(body, kernels: list, bodies: list):
    def swap(stmt):
        index = next((i for i, k in enumerate(kernels) if stmt.same_as(k)), None)
        if index is None:
            return stmt
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, bodies[index])

    return tvm_ffi.structural_map(body, [(tirx.AttrStmt, swap)], order="pre")


def _is_prefetch(stmt) -> bool:
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == L2_PREFETCH_KEY


def _is_early(stmt) -> bool:
    """An L2 prefetch or an early copy: may run before the kernel waits, if safe."""
    return isinstance(stmt, tirx.AttrStmt) and stmt.attr_key in (L2_PREFETCH_KEY, EARLY_COPY_KEY)


def _unmark(body):
    """``body`` without the L2 prefetches left (dropped: they only warm L2) and with the early
    copies left unmarked (kept where they are, after the wait: the pipeline needs them)."""
    def drop(stmt):
        items = [s for s in stmt.seq if not _is_prefetch(s)]
        return stmt if len(items) == len(stmt.seq) else tirx.SeqStmt(items)

    def unwrap(stmt):
        return stmt.body if stmt.attr_key == EARLY_COPY_KEY else stmt

    return tvm_ffi.structural_map(body, [(tirx.SeqStmt, drop), (tirx.AttrStmt, unwrap)])


def _wait_after_early(body, early: list, wait: list):
    """``body`` with ``wait`` right after those ``early`` statements that share a sequence
    with the first of them (the kernel's other L2 prefetches dropped, its other early copies
    issued after the wait), or None where that would not be safe: the sequence must be reached
    from the kernel's top through attributes and sequences only (every thread passes there
    once), and nothing else before the last of them but prefetches and early copies may name
    global memory (a parameter, a global buffer, a tensor map)."""
    paths = [p for p in (_path(body, m) for m in early)
             if p is not None and len(p) >= 2 and isinstance(p[-2], tirx.SeqStmt)]
    if not paths:
        return None
    seq = paths[0][-2]  # the first main loop's (a second one's run after the wait, unmarked)
    chosen = [any(s.same_as(p[-1]) for p in paths if p[-2].same_as(seq)) for s in seq.seq]
    last = max(i for i, c in enumerate(chosen) if c)
    path = next(p for p in paths if p[-1].same_as(seq.seq[last]))
    if not all(isinstance(s, (tirx.AttrStmt, tirx.SeqStmt)) for s in path[:-1]):
        return None
    for parent, child in zip(path, path[1:]):
        if isinstance(parent, tirx.SeqStmt):
            before = list(parent.seq)[:next(i for i, s in enumerate(parent.seq) if s.same_as(child))]
            if any(_names_global(s) for s in before if not _is_early(s)):
                return None
    head = [s.body if c else s for s, c in zip(seq.seq[:last + 1], chosen) if c or not _is_early(s)]
    held = [s for s, c in zip(seq.seq[:last + 1], chosen) if not c and _is_early(s)]
    return _unmark(replace_node(body, seq, tirx.SeqStmt([*head, *wait, *held, *seq.seq[last + 1:]])))


def _path(stmt, target) -> list | None:
    """The statements from ``stmt`` down to ``target`` through attributes and sequences."""
    if stmt.same_as(target):
        return [stmt]
    children = list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else (
        [stmt.body] if isinstance(stmt, tirx.AttrStmt) else [])
    for child in children:
        rest = _path(child, target)
        if rest is not None:
            return [stmt, *rest]
    return None


def _names_global(stmt) -> bool:
    """Whether ``stmt`` names global memory other than to prefetch a tensor map's descriptor
    (which reads the kernel's parameters, not the tensor)."""
    def skip(evaluate):
        call = evaluate.value
        is_prefetch = (isinstance(call, tvm.ir.Call) and call.op.name == "tirx.ptx.prefetch"
                       and any(isinstance(a, tvm.ir.StringImm) and a.value == "tensormap" for a in call.args))
        return tirx.Evaluate(0) if is_prefetch else evaluate

    return bool(find_all(tvm_ffi.structural_map(stmt, [(tirx.Evaluate, skip)]), tirx.Var, _is_global))


def _is_global(var) -> bool:
    """A buffer or handle in global memory (a tensor map included)."""
    ty = var.data.ty if hasattr(var, "data") else var.ty
    return isinstance(ty, tvm.ir.PointerType) and str(ty.storage_scope) in ("global", "")


class _Buffers:
    """Which buffer of the function a buffer in its body is: a declared view (``A_1 =
    A.view(..)``, how lowering flattens parameters) is the buffer whose data it declares."""

    def __init__(self, body):
        self.views = [(d.buffer, d.data) for d in find_all(body, tirx.DeclBuffer)]
        calls = find_all(body, tvm.ir.Call, lambda c: c.op.name == "tirx.tvm_call_packed"
                         and str(c.args[0].value) == "runtime.cuTensorMapEncodeTiled")
        self.tensor_maps = [(c.args[1], c.args[4]) for c in calls]  # (tensor map, source data)

    def root(self, node):
        """The declared buffer behind ``node`` (a buffer, its data, or a tensor map)."""
        node = next((src for tm, src in self.tensor_maps if tm.same_as(node)), node)
        if isinstance(node, tvm.ir.Call) and node.op.name == "tirx.buffer_data":
            node = node.args[0]
        data = next((d for view, d in self.views if view.same_as(node)), None)
        return node if data is None else self.root(data)

    def named_in(self, kernel) -> list:
        """Every global buffer ``kernel`` names (through a tensor map included)."""
        return [self.root(var) for var in find_all(kernel, tirx.Var, _is_global)]


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.ProgrammaticLaunch")
def ProgrammaticLaunch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`programmatic_launch` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: programmatic_launch(f) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs)
