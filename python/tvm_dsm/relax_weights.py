"""Which PrimFunc parameters only ever receive a model's weights.

A Relax function's parameters past its ``num_input`` attribute are its weights (``nn.Module``
exports pass them as one tuple, ``packed_params``), and a bound model holds them as constants.
The contract, as in TVM's own weight handling: no kernel of the program writes a weight (a
device-side weight transform runs as a program of its own, before). So a kernel launched
programmatically may load a weight's first tiles before it waits for the previous grid
(:mod:`tvm_dsm.transform.programmatic_launch`): a decode step's GEMV then fetches its weight
while the kernel before it runs.

:func:`MarkReadOnlyParams` names, on each PrimFunc, the parameters that every call of it passes
a weight (``READ_ONLY_PARAMS_KEY``), conservatively:

* ``num_input`` is trusted only on a Relax function no other function of the module calls;
* a weight is an item of such a weight tuple taken with ``TupleGetItem``, or a constant; a weight
  (or weight tuple) that appears anywhere but as a direct argument of ``call_tir`` (an alias, a
  tuple built of it, a ``match_cast``, a packed or in-place call, a returned value) is not one;
* a PrimFunc called any other way than ``call_tir`` with a tuple of arguments (in place, from a
  packed call, directly) gets no mark, nor a parameter whose name another parameter shares.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from .annotations import READ_ONLY_PARAMS_KEY
from .ir import find_all

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _called_functions(mod: tvm.IRModule) -> set[str]:
    """The Relax functions of ``mod`` some function of it calls."""
    relax_functions = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
    return {v.name_hint for f in mod.functions.values() if isinstance(f, relax.Function)
            for v in find_all(f.body, tvm.ir.GlobalVar) if v.name_hint in relax_functions}


def _weights(func: relax.Function, bindings: list) -> list[relax.Var]:
    """``func``'s weights: items of its parameters past ``num_input`` bound by ``TupleGetItem``
    (or those parameters themselves, where not tuples), that nothing but ``call_tir`` reads."""
    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    if num_input is None:
        return []
    params = list(func.params[int(num_input):])
    items = [b.var for b in bindings if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.TupleGetItem)
             and any(b.value.tuple_value.same_as(p) for p in params)]
    escaped = []
    for binding in bindings:
        if any(binding.var.same_as(v) for v in items):
            continue
        value = binding.value
        if isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
            direct = list(value.args[1].fields) if isinstance(value.args[1], relax.Tuple) else []
            rest = [a for a in value.args[1].fields if not isinstance(a, relax.Var)] if direct else [value.args[1]]
            escaped += [v for part in [*rest, *value.args[2:]] for v in find_all(part, relax.Var)]
        else:
            escaped += find_all(value, relax.Var)
    escaped += find_all(func.body.body, relax.Var)  # returned values
    if any(p.same_as(e) for p in params for e in escaped):
        return []  # a weight tuple read whole: any of its items might be written through it
    return [v for v in [*items, *(p for p in params if not isinstance(p.ty, relax.TupleType))]
            if not any(v.same_as(e) for e in escaped)]


def read_only_params(mod: tvm.IRModule) -> dict[str, list[str]]:
    """For each PrimFunc of ``mod``, the names of its parameters that every call passes a weight
    or a constant (see the module docstring)."""
    called = _called_functions(mod)
    flags: dict[str, list[bool]] = {}
    unsafe: set[str] = set()
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        bindings = find_all(func.body, relax.VarBinding) + find_all(func.body, relax.MatchCast)
        weights = [] if gv.name_hint in called else _weights(func, bindings)
        for call in find_all(func.body, relax.Call):
            if not (call.op.same_as(_CALL_TIR) and isinstance(call.args[1], relax.Tuple)):
                unsafe.update(v.name_hint for v in find_all(call, tvm.ir.GlobalVar))
                continue
            callee = call.args[0].name_hint
            passed = [isinstance(a, tvm.ir.Constant) or any(a.same_as(w) for w in weights) for a in call.args[1].fields]
            flags[callee] = [x and y for x, y in zip(flags[callee], passed)] if callee in flags else passed
    names = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint in unsafe:
            continue
        params = [p.name for p in func.params]
        marked = [name for name, weight in zip(params, flags.get(gv.name_hint, [])) if weight and params.count(name) == 1]
        if marked:
            names[gv.name_hint] = marked
    return names


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.MarkReadOnlyParams")
def MarkReadOnlyParams(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Each PrimFunc of ``mod`` with :func:`read_only_params` naming them in its
    ``READ_ONLY_PARAMS_KEY`` attribute."""
    marked = read_only_params(mod)
    if not marked:
        return mod
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for name, params in marked.items():
        gv = mod.get_global_var(name)
        mod[gv] = mod[gv].with_attr(READ_ONLY_PARAMS_KEY, params)
    return mod
