"""Which PrimFunc parameters only ever receive a model's weights.

A Relax function's parameters past its ``num_input`` attribute are its weights (``nn.Module``
exports pass them as one tuple, ``packed_params``), and a bound model holds them as constants.
No kernel writes them, so a kernel launched programmatically may load a weight's first tiles
before it waits for the previous grid (:mod:`tvm_dsm.transform.programmatic_launch`): a decode
step's GEMV then fetches its weight while the kernel before it (a norm, the attention) runs.
:func:`MarkReadOnlyParams` names, on each PrimFunc, the parameters that every ``call_tir`` of
it passes a weight (``READ_ONLY_PARAMS_KEY``). A weight any other call receives (an in-place
call, a packed function) marks nothing: that call might write it.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from .annotations import READ_ONLY_PARAMS_KEY

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _weights(func: relax.Function) -> list[relax.Var]:
    """``func``'s weight parameters and the variables bound to their tuple items."""
    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    if num_input is None:
        return []
    weights = list(func.params[int(num_input):])
    for binding in (b for block in func.body.blocks for b in block.bindings):
        value = binding.value
        if isinstance(value, relax.TupleGetItem) and any(value.tuple_value.same_as(w) for w in weights):
            weights.append(binding.var)
    return weights


def _flattened(args) -> list:
    """``args`` with the fields of each tuple among them in its place (recursively)."""
    return [x for a in args for x in (_flattened(a.fields) if isinstance(a, relax.Tuple) else [a])]


def _calls(func: relax.Function) -> list[relax.Call]:
    return [b.value for block in func.body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]


def read_only_params(mod: tvm.IRModule) -> dict[str, list[str]]:
    """For each PrimFunc ``mod``'s Relax functions call, the names of its parameters that every
    call passes a weight or a constant (see the module docstring)."""
    seen: dict[str, list[bool]] = {}
    for func in (f for f in mod.functions.values() if isinstance(f, relax.Function)):
        weights = _weights(func)
        for call in _calls(func):
            if not call.op.same_as(_CALL_TIR):
                passed = _flattened(call.args)
                weights = [w for w in weights if not any(w.same_as(a) for a in passed)]
        for call in _calls(func):
            if not call.op.same_as(_CALL_TIR):
                continue
            if not isinstance(call.args[1], relax.Tuple):
                continue
            callee, args = call.args[0].name_hint, list(call.args[1].fields)
            flags = [isinstance(a, tvm.ir.Constant) or any(a.same_as(w) for w in weights) for a in args]
            seen[callee] = [x and y for x, y in zip(seen[callee], flags)] if callee in seen else flags
    names = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and any(seen.get(gv.name_hint, [])):
            names[gv.name_hint] = [p.name for p, weight in zip(func.params, seen[gv.name_hint]) if weight]
    return names


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.MarkReadOnlyParams")
def MarkReadOnlyParams(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Each PrimFunc of ``mod`` with :func:`read_only_params` naming them in its
    ``READ_ONLY_PARAMS_KEY`` attribute."""
    marked = read_only_params(mod)
    for name, params in marked.items():
        gv = mod.get_global_var(name)
        mod[gv] = mod[gv].with_attr(READ_ONLY_PARAMS_KEY, params)
    return mod
