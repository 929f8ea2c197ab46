"""Group Relax calls into one TIR function by dataflow pattern, checked on what the TIR functions
they call are: how :mod:`tvm_dsm.relax_chains` and :mod:`tvm_dsm.relax_attention` hand a family
the whole computation it fuses, which ``FuseOps`` would cut at each reduction."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax, tirx
from tvm.relax.dpl import TuplePattern, is_op, wildcard


def call_tir(*args):
    """The pattern of a ``call_tir`` of any function on ``args``."""
    return is_op("relax.call_tir")(wildcard(), TuplePattern(list(args)))


def group_calls(mod: tvm.IRModule, composite: str, patterns: list,
                classify: Callable[[tirx.PrimFunc], str | None],
                accept: Callable[[list[str | None]], bool], source: str) -> tvm.IRModule:
    """``mod`` with each match of ``patterns`` (first first) grouped into one function named
    ``composite`` (``FuseTIR`` later makes one PrimFunc of it) where ``accept`` takes the kinds
    of its calls (``classify`` of each called PrimFunc, worked out once a PrimFunc: the
    patterns try the same calls many times over) and each call that reads nothing the group
    computes is of kind ``source`` (the patterns' first operators: an operator of another kind
    before one is not taken in its place)."""
    known: dict[str, str | None] = {}

    def kind(gv) -> str | None:
        if gv.name_hint not in known:
            known[gv.name_hint] = classify(mod[gv])
        return known[gv.name_hint]

    def check(context) -> bool:
        calls = []  # the root call is also among the bindings
        for e in [*context.matched_bindings.values(), context.matched_expr]:
            is_call = isinstance(e, relax.Call) and e.op.name == "relax.call_tir"
            if is_call and not any(e.same_as(c) for c in calls):
                calls.append(e)
        computed = [var for var, e in context.matched_bindings.items() if any(e.same_as(c) for c in calls)]
        sources = [c for c in calls if not any(arg.same_as(var) for arg in c.args[1].fields for var in computed)]
        return (all(kind(c.args[0]) == source for c in sources)
                and accept([kind(c.args[0]) for c in calls]))

    checked = [(composite, pattern, {}, check) for pattern in patterns]
    return relax.transform.FuseOpsByPattern(checked, bind_constants=False, annotate_codegen=False)(mod)
