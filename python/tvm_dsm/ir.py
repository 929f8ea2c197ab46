"""Small IR helpers over TVM 0.27's tvm-ffi structural walkers (buffers are Vars there)."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock
from tvm.tirx.buffer import BufferType

from .errors import ClusterError


def per_function(transform: Callable[[tirx.PrimFunc], tirx.PrimFunc]) -> Callable[[tirx.PrimFunc], tirx.PrimFunc]:
    """``transform`` (a pure function of one PrimFunc to another) computed once per function
    object: the families' recognizers each normalize the function they are offered the same way
    (every plan of a model offers each function to every family). The last
    :data:`PER_FUNCTION_KEPT` results are kept with their functions, so an address is not reused
    while it is a key."""
    kept: OrderedDict = OrderedDict()

    @functools.wraps(transform)
    def memo(func: tirx.PrimFunc) -> tirx.PrimFunc:
        key = func.__chandle__()
        if key in kept:
            kept.move_to_end(key)
            return kept[key][1]
        result = transform(func)
        kept[key] = (func, result)
        if len(kept) > PER_FUNCTION_KEPT:
            kept.popitem(last=False)
        return result

    return memo


#: Results :func:`per_function` keeps per transform.
PER_FUNCTION_KEPT = 256


def nest_realize(stmt):
    """The realize of the one block ``stmt`` (a top-level loop nest) computes, else None."""
    from tvm.s_tir import SBlockRealize

    realizes = find_all(stmt, SBlockRealize)
    return realizes[0] if len(realizes) == 1 else None


def nest_block(stmt) -> SBlock | None:
    """The one block ``stmt`` (a top-level loop nest) computes, else None."""
    realize = nest_realize(stmt)
    return None if realize is None else realize.block


def root_blocks(func: tirx.PrimFunc) -> list[SBlock]:
    """The blocks right under ``func``'s root block, in program order: what
    ``Schedule(func).get_child_blocks(root)`` lists, without building a schedule's state."""
    from tvm.s_tir import SBlockRealize

    found: list = []

    def visit(stmt) -> None:
        if isinstance(stmt, SBlockRealize):
            found.append(stmt.block)
        elif isinstance(stmt, tirx.SeqStmt):
            for item in stmt.seq:
                visit(item)
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case)
            if stmt.else_case is not None:
                visit(stmt.else_case)
        elif isinstance(stmt, (tirx.For, tirx.While, tirx.AttrStmt)):  # statements with a body in TVM 0.27
            visit(stmt.body)

    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    if root is None:
        raise ClusterError("the function has no root block")
    visit(root.body)
    return found


def find_all(root, node_type, pred: Callable = lambda _node: True) -> list:
    """Every node of ``node_type`` under ``root`` for which ``pred`` holds, in walk order."""
    found: list = []
    tvm_ffi.structural_walk(root, [(node_type, lambda n: found.append(n) if pred(n) else None)])
    return found


def loads(expr) -> list:
    """Every buffer load in ``expr``."""
    return find_all(expr, tvm.ir.TensorLoad)


def uses(expr, var: tirx.Var) -> bool:
    """Whether ``expr`` mentions ``var``."""
    return bool(find_all(expr, tirx.Var, lambda v: v.same_as(var)))


def substitute(node, mapping: list[tuple[tirx.Var, tvm.ir.PrimExpr]]):
    """``node`` with each variable of ``mapping`` replaced (by identity, not by name)."""

    def remap(var):
        return next((new for old, new in mapping if var.same_as(old)), var)

    return tvm_ffi.structural_map(node, [(tirx.Var, remap)])


def fresh_definitions(stmt):
    """``stmt`` with each variable its blocks, loops and ``Let`` expressions define replaced by a new
    one of its name and type: two schedules of one function placed side by side in one function
    (a branch per range of rows) may not define the same variables."""
    defined = [iv.var for block in find_all(stmt, SBlock) for iv in block.iter_vars]
    defined += [let.var for let in find_all(stmt, tirx.Let)]
    defined += [loop.loop_var for loop in find_all(stmt, tirx.For)]
    found: dict = {}
    for var in defined:
        found.setdefault(var, tirx.Var(var.name, str(var.ty)))
    return substitute(stmt, list(found.items()))


def seq(stmts: list):
    """``stmts`` as one statement: the statement itself where there is one."""
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def items(stmt) -> list:
    """The statements of ``stmt`` in order: a sequence's, or ``stmt`` alone (:func:`seq`'s inverse)."""
    return list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]


def binds_threads(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` already binds its loops to threads (a kernel written with TVM's IR
    builder, such as TOPI's GPU scatter and sort): scheduled as written, no block to schedule."""
    return bool(find_all(func.body, tirx.AttrStmt, lambda s: s.attr_key == "thread_extent"))


def is_thread_extent(stmt, tag: str) -> bool:
    """Whether ``stmt`` is a thread binding (a ``thread_extent`` attribute) whose tag is ``tag``
    or starts with it (``"threadIdx"``: any of x, y, z)."""
    return (isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent"
            and str(stmt.node.thread_tag).startswith(tag))


def replace_node(root, old, new):
    """``root`` with the node ``old`` (by identity) replaced by ``new``."""
    return tvm_ffi.structural_map(root, [(type(old), lambda n: new if n.same_as(old) else n)], order="pre")


def point_region(buffer, indices: list) -> tirx.BufferRegion:
    """The one element of ``buffer`` at ``indices``, each extent 1 in its index's type (an int64
    index with an int32 extent compares unequal to the same region written by legalization)."""
    return tirx.BufferRegion(buffer, [tvm.ir.Range.from_min_extent(i, tirx.const(1, str(i.ty))) for i in indices])


def element_nest(axes: list, name: str, out: tirx.Buffer, store: Callable[[list], tuple[list, tvm.ir.PrimExpr]]
                 ) -> tirx.Stmt:
    """A loop nest over ``axes`` (a block's iterators) whose one block, ``name``, iterates them
    as spatial axes and stores into ``out`` what ``store(mapping)`` answers, ``(indices, value)``:
    ``mapping`` takes the axes' variables to the new block's. The new block reads each element
    its value loads and writes the one it stores."""
    from tvm.s_tir import SBlockRealize

    loops = [tirx.Var(f"{iv.var.name}_e", str(iv.var.ty)) for iv in axes]
    block_vars = [tirx.IterVar(iv.dom, tirx.Var(f"v_{iv.var.name}", str(iv.var.ty)), tirx.IterVar.DataPar)
                  for iv in axes]
    indices, value = store([(iv.var, bv.var) for iv, bv in zip(axes, block_vars)])
    reads = [point_region(ld.source, ld.indices) for ld in loads(value)]
    new = SBlock(block_vars, reads, [point_region(out, indices)], name, tirx.BufferStore(out, value, indices))
    stmt: tirx.Stmt = SBlockRealize(loops, True, new)
    for loop, iv in reversed(list(zip(loops, axes))):
        stmt = tirx.For(loop, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def spatial_nest(block: SBlock, name: str, out: tirx.Buffer,
                 value: Callable[[list, list], tvm.ir.PrimExpr]) -> tirx.Stmt:
    """An :func:`element_nest` over ``block``'s spatial axes writing ``out`` where ``block``
    writes its output, the value ``value(mapping, indices)``."""
    def store(mapping):
        indices = [substitute(r.min, mapping) for r in block.writes[0].region]
        return indices, value(mapping, indices)

    return element_nest([iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar], name, out, store)


def rewrite_nests(func: tirx.PrimFunc, rewrite: Callable) -> tirx.PrimFunc | None:
    """``func`` (one root block over loop nests) with each nest of one block for which
    ``rewrite(nest, block)`` answers ``(nests, buffers)`` replaced by those nests, the buffers
    allocated in the root block; None where it answers None for every nest."""
    from tvm.s_tir import SBlockRealize

    if not isinstance(func.body, SBlockRealize):
        return None
    root = func.body.block
    out_nests, added = [], []
    for nest in items(root.body):
        blocks = [r.block for r in find_all(nest, SBlockRealize)]
        rewritten = rewrite(nest, blocks[0]) if len(blocks) == 1 else None
        if rewritten is None:
            out_nests.append(nest)
            continue
        out_nests += rewritten[0]
        added += rewritten[1]
    if not added:
        return None
    body = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(out_nests), root.init,
                  list(root.alloc_buffers) + added, root.match_buffers, root.annotations)
    return tirx.PrimFunc(func.params, SBlockRealize([], True, body), func.ret_type, func.attrs)


def with_block_fields(block: SBlock, **fields) -> SBlock:
    """``block`` with the named fields (``iter_vars``, ``reads``, ``body``, ...) in place of its
    own."""
    names = ("iter_vars", "reads", "writes", "name_hint", "body", "init", "alloc_buffers", "match_buffers",
             "annotations")
    unknown = set(fields) - set(names)
    if unknown:
        raise TypeError(f"SBlock has no field {sorted(unknown)}")
    values = {name: fields[name] if name in fields else getattr(block, name) for name in names}
    values["alloc_buffers"] = list(values["alloc_buffers"])
    return SBlock(*(values[name] for name in names))


def with_block_body(block: SBlock, body, alloc_buffers=None) -> SBlock:
    """``block`` with ``body`` (and ``alloc_buffers``, if given) in place of its own."""
    if alloc_buffers is None:
        return with_block_fields(block, body=body)
    return with_block_fields(block, body=body, alloc_buffers=alloc_buffers)


def block_allocations(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the buffers its root block's body allocates as statements
    (``T.alloc_buffer`` written outside a block) allocated by the root block instead, as
    ``T.sblock_alloc_buffer`` writes them: s_tir's primitives and dlight's rules take a
    statement's buffer for an output, which no schedule may inline or move."""
    from tvm.s_tir import SBlockRealize

    if not isinstance(func.body, SBlockRealize):
        return func
    root = func.body.block
    stmts = items(root.body)
    allocated = [s.buffer for s in stmts if isinstance(s, tirx.AllocBuffer)]
    if not allocated:
        return func
    body = seq([s for s in stmts if not isinstance(s, tirx.AllocBuffer)])
    block = with_block_body(root, body, [*root.alloc_buffers, *allocated])
    return func.with_body(SBlockRealize(func.body.iter_values, func.body.predicate, block))


def without_unit_iter_vars(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each block's spatial iterators of extent 1 that index only what the block
    writes replaced by their one value: a reduction that keeps its reduced dimension
    (``keepdims``, ``[rows, 1]`` results) iterates over its rows alone, as one written without it
    does. (An iterator of extent 1 that reads an input, the one row of ``[1, width]``, stays.)"""
    from tvm.s_tir import SBlockRealize

    def rewrite(realize):
        block = realize.block
        written = [w.source for w in block.writes]
        read_indices = [i for ld in loads(block.body) if not any(ld.source.same_as(w) for w in written)
                        for i in ld.indices]

        def is_unit(iv) -> bool:
            return (iv.iter_type == tirx.IterVar.DataPar and isinstance(iv.dom.extent, tirx.IntImm)
                    and iv.dom.extent.value == 1 and not any(uses(i, iv.var) for i in read_indices))

        keep = [n for n, iv in enumerate(block.iter_vars) if not is_unit(iv)]
        if len(keep) == len(block.iter_vars):
            return realize
        units = [(iv.var, iv.dom.min) for iv in block.iter_vars if is_unit(iv)]
        kept = with_block_fields(block, iter_vars=[block.iter_vars[n] for n in keep])
        return SBlockRealize([realize.iter_values[n] for n in keep], realize.predicate, substitute(kept, units))

    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlockRealize, rewrite)]))


def largest_power_of_two(extent: int, most: int) -> int:
    """The largest power of two that divides ``extent`` and is at most ``most``."""
    power = 1
    while power * 2 <= most and extent % (power * 2) == 0:
        power *= 2
    return power


def computed_from(products: list, blocks: list[SBlock]) -> list[tuple]:
    """Each of the buffers ``products``, and each buffer the (elementwise) ``blocks`` write in
    order, with the indices of the products it is computed from (through the blocks before it)."""
    sources = [(buffer, {i}) for i, buffer in enumerate(products)]
    for block in blocks:
        found = {i for region in block.reads for buffer, of in sources if region.source.same_as(buffer) for i in of}
        sources += [(region.source, found) for region in block.writes]
    return sources


def writes_parameter(func: tirx.PrimFunc, block: SBlock) -> bool:
    """Whether ``block`` writes one of ``func``'s parameters (an output of the function)."""
    return any(block.writes[0].source.same_as(p) for p in func.params)


def product_outputs(products: list, blocks: list[SBlock]) -> list[int]:
    """For each of the buffers ``products``, the position in ``blocks`` (elementwise, one write
    each, in order) of the last block computed from it alone: its epilogue's output where each
    product has an epilogue of its own."""
    found = computed_from(products, blocks)[len(products):]
    return [max(n for n, (_, of) in enumerate(found) if of == {i}) for i in range(len(products))]


#: TVM 0.27's ``if_then_else`` call, which evaluates only the branch its condition chooses.
IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def is_zero(expr) -> bool:
    """Whether ``expr`` is the constant zero, integer or floating."""
    return isinstance(expr, (tirx.IntImm, tirx.FloatImm)) and expr.value == 0


def block_analyzer(block: SBlock) -> tvm.sym.Analyzer:
    """An analyzer that knows ``block``'s iterator ranges (simplifies and proves within them)."""
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    return analyzer


def is_reduction(block: tirx.SBlock) -> bool:
    """Whether ``block`` reduces over one of its iterators."""
    return any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in block.iter_vars)


def is_barrier(stmt) -> bool:
    """Whether ``stmt`` is a CTA barrier (``tvm_storage_sync``, ``__syncthreads``)."""
    return (isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call)
            and stmt.value.op.name == "tirx.tvm_storage_sync")


def tree_reduce(op: Callable, values: list):
    """``values`` combined by ``op`` as a balanced tree: independent operations, not one long
    dependent chain (a kernel's per-thread row max or sum)."""
    while len(values) > 1:
        values = [op(*values[i:i + 2]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def branch_on(var: tirx.Var, kernels: list[tuple[int | None, tirx.PrimFunc]]) -> tirx.Stmt:
    """The bodies of ``kernels`` (each with the largest ``var`` it takes, in increasing order;
    the last, None, takes the rest) behind ``if var <= bound`` tests in that order, tested on
    the host before the launch (the tests are thread-invariant); nothing where ``var`` is 0 (an
    empty batch: a grid of no CTAs is a launch error)."""
    body = kernels[-1][1].body
    for bound, kernel in reversed(kernels[:-1]):
        body = tirx.IfThenElse(on_host(var <= bound), kernel.body, body)
    return tirx.IfThenElse(on_host(var > 0), body, None)


def reduced_values(sch, block) -> list:
    """The values ``block``'s reduced iterators are bound to in schedule ``sch``: expressions of
    the loops around it (its innermost loop holds it)."""
    realize = sch.get(sch.get_loops(block)[-1]).body
    return [value for iv, value in zip(realize.block.iter_vars, realize.iter_values)
            if int(iv.iter_type) == tirx.IterVar.CommReduce]


def declares(stmt) -> bool:
    """Whether ``stmt`` only declares (a buffer allocated or viewed, a variable bound): no kernel."""
    return isinstance(stmt, (tirx.AllocBuffer, tirx.DeclBuffer, tirx.Bind))


def on_host(test):
    """``test`` marked thread-invariant: TVM keeps a branch on it on the host, before launches."""
    return tirx.call_intrin("bool", "tirx.tvm_thread_invariant", test)


def shuffle_xor(value, mask: int):
    """``value`` of the lane whose index differs from this one's by xor ``mask``, over a full
    warp (every lane must take part)."""
    return tirx.op.tvm_warp_shuffle_xor(tirx.const(0xFFFFFFFF, "uint32"), value, mask, 32, 32)


def shuffle_reduce(op: Callable, value, lanes: int):
    """``value`` combined by ``op`` over ``lanes`` (a power of two) adjacent lanes of a full warp,
    by xor shuffles; every lane ends with the result."""
    mask = 1
    while mask < lanes:
        value = op(value, shuffle_xor(value, mask))
        mask *= 2
    return value


def fast_exp(call):
    """fp32 ``exp`` on the SFU (``__expf``: ex2.approx of x·log2 e). Its relative error is at
    most 2 + 1.16|x| ulp, under 6.2e-6 wherever the result is a normal float, inside the 1e-5
    the kernels are held to; CUDA's ``expf`` costs ~5x the instructions, which made the sum of
    a 4096-wide row most of the top-k rows kernel's issue slots."""
    if call.op.name == "tirx.exp" and str(call.ty.dtype) == "float32":
        return tirx.call_pure_extern("float32", "__expf", call.args[0])
    return call


#: Float types a kernel evaluates in fp32 (:func:`in_fp32`).
NARROW_FLOATS = ("float16", "bfloat16")
_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Min, tirx.Max)
_COMPARISONS = (tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE)
#: Calls whose fp32 form is the same function of widened arguments.
_MATH_CALLS = {f"tirx.{name}" for name in ("exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
                                           "tanh", "sigmoid", "erf", "fabs", "pow", "floor", "ceil", "round",
                                           "nearbyint", "trunc", "sin", "cos", "if_then_else")}


def _narrow(expr) -> bool:
    return str(expr.ty.dtype) in NARROW_FLOATS


def in_fp32(expr):
    """``expr`` with its fp16 and bf16 arithmetic evaluated in fp32: its 16-bit loads and
    constants widened, each operation, math call and ``if_then_else`` over them in fp32, casts
    to a 16-bit type dropped (the value stays fp32); an fp32 value where ``expr`` is a 16-bit
    float, its own type otherwise. What a kernel computes so is closer to the exact values than
    the function's roundings, never further: torch's 16-bit softmax and norms compute in fp32
    likewise, while Relax's legalized bf16 softmax rounds its exponentials and their sum to 8
    bits each."""
    if isinstance(expr, _COMPARISONS) and _narrow(expr.a):
        return type(expr)(in_fp32(expr.a), in_fp32(expr.b))
    if isinstance(expr, (tirx.And, tirx.Or)):
        return type(expr)(in_fp32(expr.a), in_fp32(expr.b))
    if isinstance(expr, tirx.Not):
        return tirx.Not(in_fp32(expr.a))
    if not _narrow(expr):
        return expr
    if isinstance(expr, tirx.FloatImm):
        return tirx.const(expr.value, "float32")
    if isinstance(expr, tirx.Cast):
        inner = expr.value
        return in_fp32(inner) if _narrow(inner) or str(inner.ty.dtype) == "float32" else tirx.Cast("float32", inner)
    if isinstance(expr, _ARITHMETIC):
        return type(expr)(in_fp32(expr.a), in_fp32(expr.b))
    if isinstance(expr, tirx.Select):
        return tirx.Select(in_fp32(expr.condition), in_fp32(expr.true_value), in_fp32(expr.false_value))
    if isinstance(expr, tvm.ir.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in _MATH_CALLS:
        return tirx.call_intrin("float32", expr.op, *[in_fp32(a) for a in expr.args])
    return tirx.Cast("float32", expr)  # a load, or what is evaluated as written, then widened


def narrow_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` indexed in int32 (Relax legalizes with int64 extents; tvm-dsm's kernels index in
    int32), or as it is where TVM's narrowing refuses it: a function with an int64 tensor (a
    mask built from ``arange``) keeps its int64 indices, for a family to refuse or take as
    they are."""
    if any(isinstance(p.ty, BufferType) and str(p.ty.dtype) == "int64" for p in func.params):
        return func
    return tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]


def extent_variables(func: tirx.PrimFunc) -> list[tirx.Var]:
    """The variables among the extents of ``func``'s parameters, in the order they first appear;
    ClusterError where an extent is an expression of one."""
    found: list[tirx.Var] = []
    for param in func.params:
        for extent in getattr(param.ty, "shape", None) or ():
            if isinstance(extent, tirx.IntImm):
                continue
            if not isinstance(extent, tirx.Var):
                raise ClusterError(f"{param.name}: the extent {extent} is an expression; tvm-dsm takes "
                                   "a symbolic extent that is a variable")
            if not any(extent.same_as(var) for var in found):
                found.append(extent)
    return found


def row_variable(func: tirx.PrimFunc) -> tirx.Var | None:
    """The variable among the extents of ``func``'s parameters, None where all are constants;
    ClusterError where there are several (:func:`extent_variables`), or an extent is an
    expression of one."""
    found = extent_variables(func)
    if len(found) > 1:
        raise ClusterError(f"tvm-dsm takes one symbolic extent per function; got {sorted(v.name for v in found)}")
    return found[0] if found else None


def specialized(func: tirx.PrimFunc, var: tirx.Var, rows: int) -> tirx.PrimFunc:
    """``func`` with ``var`` bound to ``rows``."""
    buffers = {}
    for param in func.params:
        shape = getattr(param.ty, "shape", None)
        if shape is not None and any(isinstance(d, tirx.Var) and d.same_as(var) for d in shape):
            fixed = [tirx.IntImm(str(var.ty), rows) if isinstance(d, tirx.Var) and d.same_as(var) else d
                     for d in shape]
            buffers[param] = tirx.decl_buffer(fixed, param.ty.dtype, name=param.name,
                                              elem_offset=param.ty.elem_offset)
    return func.specialize(buffers)
