"""One PrimFunc of several operators as one function per operator, and back.

TVM's stock GPU schedules (dlight) and tvm-dsm's families each take one operator: a matmul with
its epilogue, a reduction, an elementwise map. A function holding two GEMMs (an FFN that no
family fuses: weights ``[K, N]``, fp32, sizes off the tiles) is split into one function per
operator: a reduction with the elementwise blocks after it (those leading to each output apart,
where it reaches several), or a run of elementwise blocks (``products_together``: a gated
layer's two products, ``silu(X @ Wg^T) * (X @ Wu^T)``, are one operator, which the gated
split-K GEMM and the row GEMV compute in one kernel reading X once). A
buffer passed between operators becomes a parameter of each function that touches it.
:func:`merge_operators` puts the scheduled functions back into one, those buffers allocated in
global memory, so the result is called like the original and runs one kernel (or more) per
operator, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import computed_from, find_all, items, loads, seq, uses


@dataclass
class Operator:
    """One operator of the function: its statements and the function holding only them."""

    func: tirx.PrimFunc
    inputs: list[tirx.Var]
    outputs: list[tirx.Var]
    reduces: bool  # it holds a reduction, not only elementwise maps
    matmul: bool  # that reduction multiplies two tensors over its reduced axis (a GEMM, a BMM)
    products: int = 1  # the matmuls it holds: two for a gated layer's products together
    norm: bool = False  # row statistics and the element-wise map over the rows that reads them


def _block(nest: tirx.Stmt) -> SBlock:
    blocks = [r.block for r in find_all(nest, SBlockRealize)]
    if len(blocks) != 1:
        raise ClusterError("a statement of the function's root holds more than one block")
    return blocks[0]


def _is_reduction(block: SBlock) -> bool:
    return block.init is not None or any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def _reduced_operands(block: SBlock) -> list[tirx.Buffer]:
    """The tensors ``block`` reads along a reduced axis."""
    reduced = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    along = []
    for store in find_all(block.body, tirx.BufferStore):
        for load in loads(store.value):
            if any(uses(i, v) for i in load.indices for v in reduced) and not any(load.source.same_as(b) for b in along):
                along.append(load.source)
    return along


def _is_matmul(block: SBlock) -> bool:
    """A reduction reading two or more tensors along a reduced axis: a matmul (a mean, a
    variance or a norm reads one tensor along it)."""
    return len(_reduced_operands(block)) >= 2


def _second_product(group: list[tirx.Stmt], nest: tirx.Stmt) -> bool:
    """Whether ``nest`` is the second product of a gated layer whose first leads ``group`` (with
    its epilogue): both matmuls over the same spatial extents, sharing one operand, the rows' X
    (not indexed by the output column), each with its own weight."""
    first, second = _block(group[0]), _block(nest)
    if any(_is_reduction(_block(n)) for n in group[1:]) or not (_is_matmul(first) and _is_matmul(second)):
        return False
    a, b = _reduced_operands(first), _reduced_operands(second)
    shared = [x for x in a if any(x.same_as(y) for y in b)]
    if len(shared) != 1 or len(a) != 2 or len(b) != 2 or not _same_extents(_spatial(first), _spatial(second)):
        return False
    column = [iv.var for iv in first.iter_vars if iv.iter_type == tirx.IterVar.DataPar][-1]
    return not any(uses(i, column) for store in find_all(first.body, tirx.BufferStore) for load in loads(store.value)
                   if load.source.same_as(shared[0]) for i in load.indices)


def _spatial(block: SBlock) -> list:
    """The extents of ``block``'s spatial axes (expressions: a row count may be a variable)."""
    return [iv.dom.extent for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]


def _same_extents(a: list, b: list) -> bool:
    analyzer = Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


def _groups(nests: list[tirx.Stmt], products_together: bool, norms_together: bool = False) -> list[list[tirx.Stmt]]:
    """Each reduction with the elementwise nests after it over the same spatial extents (an
    epilogue); other elementwise nests (padding, slicing) in groups of their own;
    ``products_together``: a gated layer's second product in its first one's group;
    ``norms_together``: a norm in one group (:func:`_joins_norm`)."""
    groups: list[list[tirx.Stmt]] = []
    for nest in nests:
        block = _block(nest)
        if groups and not _is_reduction(block) and _same_extents(_spatial(block), _spatial(_block(groups[-1][0]))):
            groups[-1].append(nest)
        elif groups and products_together and _second_product(groups[-1], nest):
            groups[-1].append(nest)
        elif groups and norms_together and _joins_norm(groups[-1], block):
            groups[-1].append(nest)
        else:
            groups.append([nest])
    return groups


def _is_norm(nests: list[tirx.Stmt]) -> bool:
    """Whether ``nests`` are statistics of rows (no matmul) and a map over those rows and more."""
    first = _block(nests[0])
    return (_is_reduction(first) and not _is_matmul(first)
            and any(len(_spatial(_block(n))) > len(_spatial(first)) for n in nests))


def _joins_norm(group: list[tirx.Stmt], block: SBlock) -> bool:
    """Whether ``block`` continues a norm that ``group`` began: after statistics (reductions of
    one tensor, no matmul, over the rows of the group's first), another statistic of those rows
    or an element-wise map over those rows and one more axis (the normalization), and after
    that map, element-wise maps over the same axes (a cast)."""
    first = _block(group[0])
    rows = _spatial(first)
    if not _is_reduction(first) or _is_matmul(first):
        return False
    mapped = [b for b in map(_block, group) if not _is_reduction(b) and len(_spatial(b)) == len(rows) + 1]
    if _is_reduction(block):
        return not mapped and not _is_matmul(block) and _same_extents(_spatial(block), rows)
    spatial = _spatial(block)
    if mapped:
        return _same_extents(spatial, _spatial(mapped[0]))
    return len(spatial) == len(rows) + 1 and _same_extents(spatial[:-1], rows)


def _one_output_each(group: list[tirx.Stmt], params: list) -> list[list[tirx.Stmt]]:
    """``group`` (a reduction and its epilogue) as the reduction alone, then its epilogue's runs
    each ending at an output, where its epilogue writes more than one of the function's outputs
    (``cast(y)`` and ``cast(gelu(y))``: no schedule takes a product to two outputs); else
    ``group`` itself."""
    def writes_output(nest) -> bool:
        return any(w.source.same_as(p) for w in _block(nest).writes for p in params)

    if not _is_reduction(_block(group[0])):
        return [group]
    # what each epilogue block writes (one buffer each), with whether it is computed from the product
    written = computed_from([_block(group[0]).writes[0].source], [_block(n) for n in group[1:]])[1:]
    if sum(bool(of) and writes_output(nest) for (_, of), nest in zip(written, group[1:])) < 2:
        return [group]
    parts, run = [group[:1]], []
    for nest in group[1:]:
        run.append(nest)
        if writes_output(nest):
            parts.append(run)
            run = []
    return parts + ([run] if run else [])


def _outputs(used: list[tuple[list, list]], i: int, params: list) -> list[tirx.Buffer]:
    """What group ``i`` writes (``used``: each group's :func:`_buffers`) that a parameter holds
    or a later group reads or writes."""
    later = [b for r, w in used[i + 1:] for b in r + w]
    return [b for b in used[i][1] if any(b.same_as(p) for p in params) or any(b.same_as(x) for x in later)]


def _combined_products(groups: list[list[tirx.Stmt]], params: list) -> list[list[tirx.Stmt]]:
    """``groups`` with each pair of products split apart again unless the group combines them
    into one output computed from both (a gated layer's H; not two projections of one X, each
    its own output)."""
    result, used = [], [_buffers(g) for g in groups]
    for i, group in enumerate(groups):
        second = [j for j, n in enumerate(group) if j and _is_reduction(_block(n))]
        outputs = _outputs(used, i, params)
        if second and not (len(outputs) == 1 and _computed_from_both(group, second[0], outputs[0])):
            result += [group[:second[0]], group[second[0]:]]
        else:
            result.append(group)
    return result


def _computed_from_both(group: list[tirx.Stmt], second: int, output: tirx.Buffer) -> bool:
    """Whether ``output`` of ``group`` is computed (through its elementwise blocks) from both
    products, the first leading the group and the second at ``second``."""
    products = [_block(group[0]).writes[0].source, _block(group[second]).writes[0].source]
    elementwise = [_block(n) for n in group if not _is_reduction(_block(n))]
    return any(buffer.same_as(output) and of == {0, 1} for buffer, of in computed_from(products, elementwise))


def _one_row_product(block: SBlock, operands: list[tirx.Buffer]) -> bool:
    """Whether ``block`` is a matmul computing one row: reading each of ``operands`` along its
    reduced axis, every spatial axis that indexes none of them of extent 1 (a GEMV)."""
    if not _is_matmul(block) or not all(any(o.same_as(r) for r in _reduced_operands(block)) for o in operands):
        return False
    indices = [i for store in find_all(block.body, tirx.BufferStore) for load in loads(store.value)
               if any(load.source.same_as(o) for o in operands) for i in load.indices]
    rows = [iv.dom.extent for iv in block.iter_vars
            if iv.iter_type == tirx.IterVar.DataPar and not any(uses(i, iv.var) for i in indices)]
    return all(isinstance(e, tirx.IntImm) and int(e) == 1 for e in rows)


def _operand_stages_joined(groups: list[list[tirx.Stmt]], params: list) -> list[list[tirx.Stmt]]:
    """``groups`` with each run of elementwise nests whose results only the next group reads,
    where that group opens with a one-row product reading them along its reduced axis (a
    weight unpacked before a decode step's GEMV, in one nest or several), joined to that group:
    written out, the unpacked weight costs its bytes twice more than the codes it came from (a
    3-bit GEMV of 4096 x 4096 took 67 us as two kernels, dlight's one kernel over the codes 7.6,
    H100)."""
    groups = list(groups)
    used = [_buffers(g) for g in groups]
    joined: list[list[tirx.Stmt]] = []
    for i, group in enumerate(groups):
        if i + 1 < len(groups) and not any(_is_reduction(_block(n)) for n in group):
            written = used[i][1]
            elsewhere = [b for j, (r, w) in enumerate(used) if j not in (i, i + 1) for b in r + w]
            results = [b for b in written if any(b.same_as(r) for r in used[i + 1][0])]  # the next reads
            stage = (results and not any(b.same_as(p) for b in written for p in params)
                     and not any(b.same_as(x) for b in written for x in elsewhere)
                     and _one_row_product(_block(groups[i + 1][0]), results))
            if stage:
                groups[i + 1] = group + groups[i + 1]
                used[i + 1] = _buffers(groups[i + 1])
                continue
        joined.append(group)
    return joined


def _buffers(nests: list[tirx.Stmt]) -> tuple[list[tirx.Var], list[tirx.Var]]:
    """(read before written, written) by ``nests``, each in order of first appearance."""
    read, written = [], []
    for nest in nests:
        block = _block(nest)
        for region in block.reads:
            if not any(region.source.same_as(b) for b in read + written):
                read.append(region.source)
        for region in block.writes:
            if not any(region.source.same_as(b) for b in written):
                written.append(region.source)
    return read, written


def _input_maps_inlined(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each element-wise map of one parameter (TOPI's ``rms_norm`` casts its input
    and weight to fp32 and squares the input in blocks of their own) inlined into the blocks
    reading it, where none of those is a matmul: a norm's statistics and its normalization
    then follow one another, and a map of the weight over the normalized axis no longer stands
    between them as an operator of its own. The values are the same (each reader computes the
    map itself); a map a matmul reads stays for the GEMM families, and a map of two tensors (a
    residual sum) stays an operator: inlined, a statistic would read two tensors along its
    axis, as a matmul does."""
    sch = s_tir.Schedule(func)
    params = list(func.params)
    changed = False
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        readers = sch.get_consumers(rv)
        if (_is_reduction(block) or not readers or any(_is_matmul(sch.get(r)) for r in readers)
                or len(block.reads) != 1 or not any(block.reads[0].source.same_as(p) for p in params)):
            continue
        try:
            sch.compute_inline(rv)
            changed = True
        except s_tir.ScheduleError:
            continue
    return sch.mod["main"] if changed else func


def split_operators(func: tirx.PrimFunc, products_together: bool = False, norms_together: bool = False
                    ) -> list[Operator]:
    """``func`` as one function per operator (ClusterError if it is not a sequence of loop nests
    of one block each under its root block, the form TE and Relax legalization produce);
    ``products_together``: a gated layer's two products one operator; ``norms_together``: a
    norm's statistics and normalization one operator, the element-wise maps of its inputs
    computed where they are read (:func:`_input_maps_inlined`). The unpacking of a one-row
    product's operand is in the product's operator (:func:`_operand_stages_joined`)."""
    if not isinstance(func.body, SBlockRealize):
        raise ClusterError("splitting into operators needs an s_tir function (one root block)")
    if norms_together:
        func = _input_maps_inlined(func)
    root = func.body.block
    nests = items(root.body)
    params = list(func.params)
    groups = [part for group in _groups(nests, products_together, norms_together)
              for part in ([group] if _is_norm(group) else _one_output_each(group, params))]
    if products_together:
        groups = _combined_products(groups, params)
    groups = _operand_stages_joined(groups, params)
    used = [_buffers(g) for g in groups]
    operators = []
    for i, (nests_i, (read, written)) in enumerate(zip(groups, used)):
        outputs = _outputs(used, i, params)
        local = [b for b in written if not any(b.same_as(o) for o in outputs)]
        inputs = [b for b in read if not any(b.same_as(w) for w in written)]
        body = SBlockRealize([], True, SBlock([], [], [], "root", seq(nests_i), alloc_buffers=local))
        sub = tirx.PrimFunc(inputs + outputs, body)
        sub = sub.with_attr({"global_symbol": "main", "tirx.noalias": True, "s_tir": True})
        try:
            s_tir.Schedule(sub)  # checks it is well formed: no buffer declared outside its nests
        except tvm.error.InternalError as err:
            raise ClusterError(f"operator {i} reads a buffer the function declares outside its loop nests") from err
        first = next((b for b in map(_block, nests_i) if _is_reduction(b)), _block(nests_i[0]))
        operators.append(Operator(sub, inputs, outputs, _is_reduction(first), _is_matmul(first),
                                  sum(_is_matmul(_block(n)) for n in nests_i), _is_norm(nests_i)))
    return operators


def merge_operators(func: tirx.PrimFunc, scheduled: list[tirx.PrimFunc]) -> tirx.PrimFunc:
    """``func`` with its operators replaced by ``scheduled`` (:func:`split_operators`'s
    functions after scheduling, in order): buffers between them in global memory."""
    root = func.body.block
    parts = []
    for i, sub in enumerate(scheduled):
        # a schedule may declare views of its buffers ahead of its root block (a norm over
        # several axes reads its input as rows): they go with the operator's part
        *declared, realize = items(sub.body)
        inner = realize.block
        parts.append(seq([*declared, SBlockRealize([], True, SBlock([], [], [], f"operator_{i}", inner.body,
                                                                    alloc_buffers=list(inner.alloc_buffers),
                                                                    annotations=inner.annotations))]))
    passed = [b for b in root.alloc_buffers if any(b.same_as(p) for sub in scheduled for p in sub.params)]
    body = SBlockRealize([], True, SBlock([], [], [], "root", seq(parts), alloc_buffers=passed))
    return tirx.PrimFunc(func.params, body, func.ret_type, func.attrs)
