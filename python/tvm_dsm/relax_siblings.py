"""Sibling projections as one kernel: GEMMs of one input by weights of one shape (a layer's q, k
and v, as torch's ``nn.Linear`` layers and BERT write them; k and v of a grouped-query layer),
each with an epilogue and output of its own.

Relax legalizes each projection to a kernel of its own: three launches that each read the same
activation, each with too few output tiles to fill the GPU at a few thousand rows (BERT-base's
1024 x 768 x 768 is 48 tiles of 128 x 128 for 132 SMs). :func:`FuseSiblingProjections` finds,
after Relax has fused each product with its epilogue (bias, cast), the ``call_tir`` of such
GEMMs that read one variable, and replaces them with one call of a function computing them all:
the split-K GEMM family then computes every product on each output tile, reading the input's
tile once for all of them (:class:`tvm_dsm.rules.split_k_gemm.GemmShape`'s sibling products).
The weights stay where they are (no concatenation at each call, as TVM's
``CombineParallelMatmul`` would make, nor a changed calling convention).

A group is merged only where the family takes the merged function and predicts it faster than
the products one after the other; calls whose other arguments are computed after the group's
first call are left alone, and so are products of a symbolic row count (a kernel per range of
rows, the fewest on the row GEMV, which takes one product or a gated pair).
"""

from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir.schedule.schedule import ScheduleError

from .driver import plan
from .errors import ClusterError
from .ir import items, substitute, with_block_fields, writes_parameter
from .rules.split_k_gemm import MAX_SIBLINGS, find_gemm, find_gemm_operands
from .transform.reductions_first import reductions_first

LOG = logging.getLogger("tvm_dsm.relax")

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_RENEW_DEFS = tvm_ffi.get_global_func("s_tir.RenewDefs")
_SPLIT_K_GEMM = "split_k_gemm"


def merge_siblings(funcs: list[tirx.PrimFunc], inputs: list[int]) -> tirx.PrimFunc:
    """One function computing every one of ``funcs`` (each a product with its epilogue), whose
    parameters ``inputs`` (by position) are the one input they share: that input, then each
    function's other inputs, then each one's output. Its root holds every product first, then
    each epilogue in turn (the order the split-K GEMM family reads)."""
    x = funcs[0].params[inputs[0]]
    funcs = [funcs[0], *(_own_definitions(f, i, x, n) for n, (f, i) in enumerate(zip(funcs, inputs)) if n)]
    others = [[p for n, p in enumerate(f.params) if n != i] for f, i in zip(funcs, inputs)]
    products, epilogues, allocated = [], [], []
    for func in funcs:
        root = func.body.block
        nests = items(root.body)
        products.append(nests[0])
        epilogues += nests[1:]
        allocated += list(root.alloc_buffers)
    params = [x, *(p for own in others for p in own[:-1]), *(own[-1] for own in others)]
    body = SBlockRealize([], True, SBlock([], [], [], "root", tirx.SeqStmt([*products, *epilogues]),
                                          alloc_buffers=allocated))
    return tirx.PrimFunc(params, body, funcs[0].ret_type, funcs[0].attrs)


def _own_definitions(func: tirx.PrimFunc, input_position: int, x: tirx.Buffer, n: int) -> tirx.PrimFunc:
    """``func`` (one call's function, perhaps the same as another's) with variables and buffers
    of its own, its parameters named apart (suffix ``_n``: the pipeline tells weights by name),
    and its blocks (s_tir finds blocks by name), and its parameter ``input_position`` replaced by
    the shared input ``x`` (its extent variables by x's)."""
    func = _RENEW_DEFS(func)
    func = func.specialize({func.params[input_position]: x})  # its extent variables bound to x's
    renamed = [x if k == input_position else tirx.decl_buffer(p.ty.shape, p.ty.dtype, name=f"{p.name}_{n}")
               for k, p in enumerate(func.params)]
    body = tvm_ffi.structural_map(substitute(func.body, list(zip(func.params, renamed))), [
        (SBlock, lambda b: b if b.name_hint == "root" else with_block_fields(b, name_hint=f"{b.name_hint}_{n}"))])
    return tirx.PrimFunc(renamed, body, func.ret_type, func.attrs)


def _in_dataflow_order(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its product first (:func:`reductions_first`): Relax fuses a bias widened to
    fp32 as a block ahead of the product, where :func:`merge_siblings` reads the product first."""
    return reductions_first(func) or func


def _one_product(func: tirx.PrimFunc) -> tuple[int, tuple] | None:
    """(the position of its input X among ``func``'s parameters, the product's shape key) where
    ``func`` (in dataflow order) is one GEMM with an epilogue and one output, the form
    :func:`merge_siblings` takes."""
    func = _in_dataflow_order(func)
    if not isinstance(func.body, SBlockRealize):
        return None
    try:
        sch = s_tir.Schedule(func)
        blocks, _, shape = find_gemm(sch)
    except (ClusterError, ScheduleError, tvm.error.InternalError):
        return None
    writers = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))
               if writes_parameter(func, sch.get(b))]
    if shape.products != 1 or len(writers) != 1 or not writers[0].writes[0].source.same_as(func.params[-1]):
        return None
    x = find_gemm_operands(sch.get(blocks[0]))[1][0]
    position = next(n for n, p in enumerate(func.params) if p.same_as(x))
    return position, (shape.n, shape.k, shape.dtype, shape.weight_nk)


class _Merger:
    """Finds and merges sibling calls, function by function; keeps each PrimFunc's analysis and
    each merged group's function."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self.builder = relax.BlockBuilder(mod)
        self.products: dict[str, tuple[int, tuple] | None] = {}
        self.predicted: dict[str, float | None] = {}
        self.merged: dict[tuple, tvm.ir.GlobalVar | None] = {}

    def _product(self, gv: tvm.ir.GlobalVar):
        if gv.name_hint not in self.products:
            func = self.mod[gv]
            self.products[gv.name_hint] = _one_product(func) if isinstance(func, tirx.PrimFunc) else None
        return self.products[gv.name_hint]

    def _predicted(self, name: str, func: tirx.PrimFunc) -> float | None:
        """The split-K GEMM family's predicted time of ``func``, None where another family (or
        none) takes it."""
        if name not in self.predicted:
            try:
                ranking = plan(func)
                self.predicted[name] = ranking.best.predicted_us if ranking.family.name == _SPLIT_K_GEMM else None
            except ClusterError:
                self.predicted[name] = None
        return self.predicted[name]

    def _candidate(self, binding) -> tuple | None:
        """(callee, arguments, X's position) of a binding calling a one-product GEMM."""
        value = binding.value if isinstance(binding, relax.VarBinding) else None
        if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR) and len(value.args) == 2
                and isinstance(value.args[0], tvm.ir.GlobalVar) and isinstance(value.args[1], relax.Tuple)
                and isinstance(value.ty, relax.TensorType)):
            return None
        found = self._product(value.args[0])
        if found is None or not isinstance(value.args[1].fields[found[0]], relax.Var):
            return None
        x = value.args[1].fields[found[0]].ty
        if x.shape is None or not all(isinstance(d, tirx.IntImm) for d in x.shape.values):
            # a symbolic row count is a kernel per range of rows, the row GEMV's at the fewest,
            # which computes products one at a time
            return None
        return value.args[0], list(value.args[1].fields), found

    def _groups(self, bindings: list) -> list[list[tuple[int, tuple]]]:
        """Each group of sibling calls in ``bindings``, as (position, :meth:`_candidate`) of each
        member: one input, one shape, every other argument bound before the group's first call."""
        groups: list[tuple[relax.Var, tuple, list[tuple[int, tuple]]]] = []
        for n, binding in enumerate(bindings):
            found = self._candidate(binding)
            if found is None:
                continue
            _, args, (position, key) = found
            x = args[position]
            group = next((g for g in groups if g[0].same_as(x) and g[1] == key and len(g[2]) < MAX_SIBLINGS), None)
            if group is None:
                groups.append((x, key, [(n, found)]))
            else:
                group[2].append((n, found))
        result = []
        for _, _, members in groups:
            later = [b.var for b in bindings[members[0][0]:]]
            ready = [(m, found) for m, found in members if not any(a.same_as(v) for a in found[1] for v in later)]
            if len(ready) > 1:
                result.append(ready)
        return result

    def _merged_callee(self, calls: list[tuple]) -> tvm.ir.GlobalVar | None:
        """The merged function of ``calls`` ((callee, args, (X's position, key)) each), added to
        the module where the family takes it and predicts it faster than the calls alone."""
        key = tuple(callee.name_hint for callee, _, _ in calls)
        if key in self.merged:
            return self.merged[key]
        funcs = [_in_dataflow_order(self.mod[callee]) for callee, _, _ in calls]
        merged = merge_siblings(funcs, [position for _, _, (position, _) in calls])
        name = "siblings_" + "_".join(dict.fromkeys(key))
        alone = [self._predicted(callee.name_hint, f) for (callee, _, _), f in zip(calls, funcs)]
        together = self._predicted(name, merged)
        if together is None or None in alone or together >= sum(alone):
            LOG.info("%s not merged: predicted %s us together, %s alone", key, together, alone)
            self.merged[key] = None
            return None
        gv = self.builder.add_func(merged, name)
        self.builder.update_func(gv, merged.with_attr("global_symbol", gv.name_hint))
        LOG.info("%s: one kernel, predicted %.1f us (%.1f one after the other)", name, together, sum(alone))
        self.merged[key] = gv
        return gv

    def rewrite_block(self, block: relax.DataflowBlock) -> relax.DataflowBlock:
        bindings = list(block.bindings)
        replaced: dict[int, list] = {}
        for group in self._groups(bindings):
            members, calls = [m for m, _ in group], [found for _, found in group]
            callee = self._merged_callee(calls)
            if callee is None:
                continue
            args = [calls[0][1][calls[0][2][0]]]
            args += [a for _, own, (position, _) in calls for n, a in enumerate(own) if n != position]
            outs = [bindings[m].var.ty for m in members]
            results = relax.DataflowVar("siblings", relax.TupleType(outs))
            call = relax.call_tir(callee, args, outs)
            for n, m in enumerate(members):
                item = relax.VarBinding(bindings[m].var, relax.TupleGetItem(results, n))
                replaced[m] = ([relax.VarBinding(results, call)] if n == 0 else []) + [item]
        if not replaced:
            return block
        rewritten = [b for n, binding in enumerate(bindings) for b in replaced.get(n, [binding])]
        return relax.DataflowBlock(rewritten)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FuseSiblingProjections")
def FuseSiblingProjections(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function of ``mod`` with its sibling projections one call each (see the module
    docstring)."""
    merger = _Merger(mod)
    rewritten = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks = [merger.rewrite_block(b) if isinstance(b, relax.DataflowBlock) else b for b in func.body.blocks]
        if any(not b.same_as(o) for b, o in zip(blocks, func.body.blocks)):
            body = relax.SeqExpr(blocks, func.body.body)
            rewritten[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    for gv, func in rewritten.items():
        merger.builder.update_func(gv, func)
    return merger.builder.get()
