"""Group Relax calls into one TIR function by dataflow pattern, checked on what the TIR functions
they call are: how :mod:`tvm_dsm.relax_chains` and :mod:`tvm_dsm.relax_attention` hand a family
the whole computation it fuses, which ``FuseOps`` would cut at each reduction."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import tvm
from tvm import relax, tirx
from tvm.relax.dpl import DFPattern, TuplePattern, is_gv, is_op, wildcard


def call_tir(*args, func: DFPattern | None = None):
    """The pattern of a ``call_tir`` on ``args`` of any function, or of one ``func`` matches."""
    return is_op("relax.call_tir")(func or wildcard(), TuplePattern(list(args)))


def group_calls(mod: tvm.IRModule, composite: str, patterns: Callable[[DFPattern], list],
                classify: Callable[[tirx.PrimFunc], str | None],
                accept: Callable[[list[str | None], list[str | None]], bool], sources: tuple[str, ...]) -> tvm.IRModule:
    """``mod`` with each match of ``patterns(first)`` (first first) grouped into one function
    named ``composite`` (``FuseTIR`` later makes one PrimFunc of it) where ``accept`` takes the
    kinds of its calls (``classify`` of each called PrimFunc), then those of the calls that
    read nothing the group computes (a caller takes calls of ``sources``' kinds there, or the
    ones its patterns place before them, such as the copies repeating an attention's KV heads).
    ``first`` matches the functions of ``sources``' kinds, for the patterns' first calls:
    matched structurally, a call of another kind in that place (an operator of an attention
    mask's computation, which a ``where`` also reads) would be taken first and the group
    refused, where the right operand leads to a match. ``mod`` itself where no function is of
    those kinds."""
    kinds = {gv.name_hint: classify(f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    names = [name for name, kind in kinds.items() if kind in sources]
    if not names:
        return mod

    def check(context) -> bool:
        calls = []  # the root call is also among the bindings
        for e in [*context.matched_bindings.values(), context.matched_expr]:
            is_call = isinstance(e, relax.Call) and e.op.name == "relax.call_tir"
            if is_call and not any(e.same_as(c) for c in calls):
                calls.append(e)
        computed = [var for var, e in context.matched_bindings.items() if any(e.same_as(c) for c in calls)]
        origins = [c for c in calls if not any(arg.same_as(var) for arg in c.args[1].fields for var in computed)]
        return accept([kinds[c.args[0].name_hint] for c in calls], [kinds[c.args[0].name_hint] for c in origins])

    first = functools.reduce(operator.or_, (is_gv(name) for name in names))
    checked = [(composite, pattern, {}, check) for pattern in patterns(first)]
    return relax.transform.FuseOpsByPattern(checked, bind_constants=False, annotate_codegen=False)(mod)
