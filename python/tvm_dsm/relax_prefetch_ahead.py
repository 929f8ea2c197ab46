"""Weights fetched into L2 ahead of the kernels that read them, while the KV cache's attention
leaves HBM idle.

A decode step alternates kernels that stream weights from HBM (the projections) with kernels
that barely touch it: between a layer's QKV projection and its output projection, ``nn.llm``'s
KV cache applies RoPE, appends the new keys and values and runs decode attention, which at small
batches reads kilobytes to a few megabytes in several microseconds. A kernel launched
programmatically prefetches its own weight while the kernel before it runs
(:mod:`tvm_dsm.transform.weight_prefetch`), one kernel ahead only: the gate/up projection, the
layer's largest weight, starts streaming after the output projection.

:func:`prefetch_ahead` gives the last kernel that reads a weight before each of the KV cache's
attention calls (or a kernel of an attention family, as a torch model's decode attention over
its static cache is) the weights of the kernels after that call, in the order they read them up to
the next such call, as extra parameters: their first bytes, up to a budget in all, named in its
``PREFETCH_AHEAD_KEY`` attribute ({parameter: bytes}). :mod:`tvm_dsm.transform.prefetch_ahead`
has that function's last kernel issue the L2 prefetches as its CTAs finish. A prefetch changes
no result, and no kernel writes a weight (:mod:`tvm_dsm.relax_weights`).

A weight is fetched by a call only where it is bound before that call, and only where its
elements are whole bytes. One PrimFunc called before several attention calls (every layer's
QKV projection) takes the weights of the same shapes at each; where calls would give it
different ones, or the module names it otherwise too (a call that fetches nothing, an argument
of a packed call), the other kinds of call get copies of the function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from .annotations import PREFETCH_AHEAD_KEPT_KEY, PREFETCH_AHEAD_KEY
from .ir import find_all
from .relax_integration import FAMILY_ATTR
from .relax_weights import is_weight, module_weights
from .transform.prefetch_ahead import BULK_BYTES

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: The KV cache's attention calls (``nn.llm.kv_cache``): RoPE, the append and attention, in the
#: runtime, between the kernels of a Relax function.
ATTENTION_CALLS = ("vm.builtin.attention_kv_cache_attention_with_fused_qkv",
                   "vm.builtin.attention_kv_cache_self_attention",
                   "vm.builtin.attention_kv_cache_cross_attention",
                   "vm.builtin.attention_kv_cache_attention_with_shared_kv")
#: The families whose kernels attend: a ``call_tir`` of one (attention as a torch model or a user's
#: Relax function holds it) is an attention call too.
ATTENTION_FAMILIES = ("attention", "decode_attention")
#: The share of L2 :func:`default_budget` fills: the prefetched weights must stay there through
#: the kernels before their readers and the readers' own streaming.
L2_SHARE = 0.5


def default_budget(l2_bytes: int) -> int:
    """The bytes prefetched ahead of each attention call by default: :data:`L2_SHARE` of L2."""
    return int(l2_bytes * L2_SHARE) // BULK_BYTES * BULK_BYTES


def _attention_kernels(mod: tvm.IRModule) -> set[str]:
    """The PrimFuncs of ``mod`` an attention family scheduled (:data:`ATTENTION_FAMILIES`)."""
    return {gv.name_hint for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and str((f.attrs or {}).get(FAMILY_ATTR, "")) in ATTENTION_FAMILIES}


def _is_attention_call(value, kernels: set[str]) -> bool:
    """Whether ``value`` calls the KV cache's attention, or a kernel of ``kernels`` (``call_tir``)."""
    if not (isinstance(value, relax.Call) and len(value.args) > 0):
        return False
    callee = value.args[0]
    if isinstance(callee, relax.ExternFunc):
        return str(callee.global_symbol) in ATTENTION_CALLS
    return value.op.same_as(_CALL_TIR) and callee.name_hint in kernels


def _nbytes(ty) -> int | None:
    """Bytes of a tensor of static type ``ty``; None where its shape is not static or its
    elements are not whole bytes (a prefetch's share is counted in elements)."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    bits = tvm.runtime.DataType(ty.dtype).bits
    try:
        dims = [int(d) for d in ty.shape.values]
    except (TypeError, AttributeError):
        return None
    return math.prod(dims) * bits // 8 if bits % 8 == 0 else None


@dataclass(frozen=True)
class _Fetch:
    """A weight an earlier kernel prefetches: its argument, and the bytes from its start."""

    weight: relax.Expr
    nbytes: int

    def kind(self) -> tuple:
        ty = self.weight.ty
        return tuple(int(d) for d in ty.shape.values), ty.dtype, self.nbytes


def _weights_read(value, weights: list) -> list:
    """The weights (``weights``' variables, or constants) a ``call_tir`` passes, in order."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR) and isinstance(value.args[1], relax.Tuple)):
        return []
    return [a for a in value.args[1].fields if is_weight(a, weights)]


def _visible(func: relax.Function, blocks: list[int], bindings: list, at: int) -> list:
    """The variables the binding at position ``at`` of ``bindings`` (in block ``blocks[at]``) may
    read: ``func``'s parameters, and those bound before it (a dataflow variable in its block only)."""
    return [*func.params, *(b.var for n, b in enumerate(bindings[:at])
                            if blocks[n] == blocks[at] or not isinstance(b.var, relax.DataflowVar))]


def _planned(func: relax.Function, weights: list, budget: int,
             kernels: set[str]) -> list[tuple[relax.VarBinding, list[_Fetch]]]:
    """(the binding of the last weight-reading kernel before an attention call, what it fetches)
    for each attention call of ``func`` (``kernels``: the attention kernels, :func:`_attention_kernels`)."""
    blocks, bindings = [], []
    for n, block in enumerate(func.body.blocks):
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                blocks.append(n)
                bindings.append(b)
    items = {b.var: (b.value.tuple_value, b.value.index) for b in bindings if isinstance(b.value, relax.TupleGetItem)}

    def same(a, b) -> bool:  # the same weight: one variable, or two bound to one item of the weights
        return a.same_as(b) or (a in items and b in items and items[a][0].same_as(items[b][0])
                                and items[a][1] == items[b][1])

    plans = []
    last = None
    for i, binding in enumerate(bindings):
        if _weights_read(binding.value, weights):
            last = i
        if not (_is_attention_call(binding.value, kernels) and last is not None):
            continue
        bound = _visible(func, blocks, bindings, last)
        taken = list(_weights_read(bindings[last].value, weights))
        fetches, left = [], budget
        for later in bindings[i + 1:]:
            if _is_attention_call(later.value, kernels) or left < BULK_BYTES:
                break
            for weight in _weights_read(later.value, weights):
                size = _nbytes(weight.ty)
                if (size is None or any(same(weight, t) for t in taken)
                        or not (isinstance(weight, tvm.ir.Constant) or any(weight.same_as(v) for v in bound))):
                    continue
                nbytes = min(size, left) // BULK_BYTES * BULK_BYTES
                if nbytes:
                    fetches.append(_Fetch(weight, nbytes))
                    taken.append(weight)
                    left -= nbytes
        if fetches:
            plans.append((bindings[last], fetches))
        last = None
    return plans


def _with_params(func: tirx.PrimFunc, inputs: int, fetches: list[_Fetch], kept: bool) -> tirx.PrimFunc:
    """``func`` taking a buffer for each of ``fetches`` after its ``inputs`` inputs (before its
    outputs), named in its ``PREFETCH_AHEAD_KEY`` attribute (``kept``: ``PREFETCH_AHEAD_KEPT_KEY``)."""
    shapes = [f.kind() for f in fetches]
    added = [tirx.decl_buffer(shape, dtype, f"prefetch_ahead_{n}") for n, (shape, dtype, _) in enumerate(shapes)]
    params = list(func.params)
    new = tirx.PrimFunc([*params[:inputs], *added, *params[inputs:]], func.body, attrs=func.attrs)
    new = new.with_attr(PREFETCH_AHEAD_KEY, {b.name: nbytes for b, (_, _, nbytes) in zip(added, shapes)})
    return new.with_attr(PREFETCH_AHEAD_KEPT_KEY, True) if kept else new


def _references(mod: tvm.IRModule) -> tuple[dict[str, int], dict[str, int]]:
    """How often the functions of ``mod`` name each GlobalVar (a PrimFunc calling another
    included), and how often as the callee of a Relax ``call_tir``."""
    named: dict[str, int] = {}
    called: dict[str, int] = {}
    for func in mod.functions.values():
        for gv in find_all(func.body, tvm.ir.GlobalVar):
            named[gv.name_hint] = named.get(gv.name_hint, 0) + 1
        if isinstance(func, relax.Function):
            for call in find_all(func.body, relax.Call):
                if call.op.same_as(_CALL_TIR):
                    called[call.args[0].name_hint] = called.get(call.args[0].name_hint, 0) + 1
    return named, called


def prefetch_ahead(mod: tvm.IRModule, budget: int, kept: bool = False) -> tvm.IRModule:
    """``mod`` (scheduled, its Relax functions still calling PrimFuncs by ``call_tir``) with
    weights prefetched ahead of each attention call, up to ``budget`` bytes a call (module
    docstring; ``kept``: the prefetched lines marked evict-last, kept in L2 before others). A
    PrimFunc the module names only as the callee of calls that all fetch takes the first kind of
    weights itself, under its name; each other kind gets a copy (``<name>_prefetch<n>``)."""
    if budget < BULK_BYTES:
        return mod
    plans = []  # (Relax function, binding, fetches)
    kernels = _attention_kernels(mod)
    for name, weights in module_weights(mod).items():
        if weights:
            plans += [(name, binding, fetches) for binding, fetches in _planned(mod[name], weights, budget, kernels)]
    if not plans:
        return mod
    kinds: dict[str, list[tuple]] = {}
    for _, binding, fetches in plans:
        kind = tuple(f.kind() for f in fetches)
        callee = binding.value.args[0].name_hint
        if kind not in kinds.setdefault(callee, []):
            kinds[callee].append(kind)
    named, called = _references(mod)
    fetching = [b.value.args[0].name_hint for _, b, _ in plans]
    in_place = {callee for callee in kinds if named[callee] == called[callee] == fetching.count(callee)}
    # the PrimFuncs taking new parameters under new GlobalVars (a GlobalVar's type holds its parameters)
    kept_functions = {gv: f for gv, f in mod.functions.items() if gv.name_hint not in in_place}
    builder = relax.BlockBuilder(tvm.IRModule(kept_functions, attrs=mod.attrs, global_infos=mod.global_infos))
    callees: dict[tuple, tvm.ir.GlobalVar] = {}  # (callee, kind) -> the function fetching that kind
    rewritten: dict[str, list] = {}  # Relax function -> [(binding, its replacement)]
    for name, binding, fetches in plans:
        call = binding.value
        callee, inputs = call.args[0], list(call.args[1].fields)
        kind = tuple(f.kind() for f in fetches)
        if (callee.name_hint, kind) not in callees:
            index = kinds[callee.name_hint].index(kind)
            own_name = callee.name_hint in in_place and not index
            symbol = callee.name_hint if own_name else f"{callee.name_hint}_prefetch{index}"
            gv = builder.add_func(_with_params(mod[callee], len(inputs), fetches, kept), symbol)
            builder.update_func(gv, builder.get()[gv].with_attr("global_symbol", gv.name_hint))
            callees[(callee.name_hint, kind)] = gv
        args = relax.Tuple([*inputs, *(f.weight for f in fetches)])
        new_call = builder.normalize(relax.Call(call.op, [callees[(callee.name_hint, kind)], args, *call.args[2:]],
                                                call.attrs, call.ty_args))
        rewritten.setdefault(name, []).append((binding, relax.VarBinding(binding.var, new_call)))
    for name, swaps in rewritten.items():
        gv = mod.get_global_var(name)
        builder.update_func(gv, builder.normalize(_rebound(mod[gv], swaps)))
    return builder.get()


def _rebound(func: relax.Function, swaps: list) -> relax.Function:
    """``func`` with each binding of ``swaps`` ((binding, replacement)) replaced."""
    blocks = []
    for block in func.body.blocks:
        bindings = [next((new for old, new in swaps if old.same_as(b)), b) for b in block.bindings]
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def PrefetchAhead(budget: int, kept: bool = False) -> tvm.transform.Pass:  # noqa: N802 - TVM pass style
    """:func:`prefetch_ahead` with ``budget`` bytes a call (``kept``: evict-last), as a module pass."""
    return tvm.transform.module_pass(lambda mod, _ctx: prefetch_ahead(mod, budget, kept), opt_level=0,
                                     name="tvm_dsm.PrefetchAhead")
