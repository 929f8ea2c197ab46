"""Functions whose row count is a variable (a model's batch or sequence length): one kernel per
range of rows, the range chosen on the host each call.

A family plans for a known shape. A function of ``m`` rows, ``m`` an extent of its parameters
known only when it is called, is planned once per range of :data:`ROW_RANGES` at the range's
largest row count (the range past the last bound at :data:`ROWS_BEYOND`), and the family
schedules the function itself, ``m`` still a variable, in that range's best configuration: the
kernels of a family with ``symbolic_rows`` compute whole tiles over any ``m``, as they do over a
row count off the tiles. The function then branches on ``m`` to its range's kernel; TVM lowers
each branch to a kernel of its own and keeps the test on the host, so a call is one launch.
Neighbouring ranges whose best configuration is the same share one kernel. Tuning measures the
function at each range's row count (:func:`range_specializations`); a range whose specialization
has a tuning record takes the record's configuration.

A function of several extent variables (attention over a query length and a key length) is
dispatched on the first (its first parameter's) and planned with the first at the range's row
count and the others at ROWS_BEYOND (a key length is as long as the queries or longer: the past
of a KV cache), by a family whose kernels take them all symbolic (``symbolic_extents``).

Where another family takes a function at exactly one row (a matmul's row GEMV, a decode batch of
one, where the first range takes the split-K GEMM; decode attention, one query a head, where the
queries' range takes attention), that row count gets a kernel of its own: the function at one
row, other variables dispatched in their turn, the branch's parameters the function's own (in
the branch they hold one row); so do 2, 3, ... rows while that family takes them (the row
GEMV's 2 rows, 8 in fp32), as a constant row count gets them; and a symbolic batch's first few
product counts, where the first range's split-K tiles would leave most SMs idle
(:data:`IDLE_SM_SHARE`).
"""

from __future__ import annotations

import dataclasses

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import branch_on, extent_variables, fresh_definitions, specialized, substitute
from ..planners.report import Plan
from . import FAMILIES, INT32_ELEMENTS, fastest_family, int32_overflows, match_family, matching_families
from .base import ScheduleFamily
from .configs import config_from, examples
from .split_k_gemm import SplitKGemm

#: The largest row count of each range but the last: decode batches, small and large prefill
#: chunks. A range's kernel is planned at its largest row count, so a range's bottom may leave
#: SMs idle: a 512-token prefill on a range ending at 1024 ran the 1B Llama's down projection on
#: 128 x 256 tiles, half the SMs idle (prefill 3.18 against 2.72 ms with a range ending at 512,
#: H200, ``bench/results/archive/llama_1b_row_ranges_s52.json``); a decode batch of 17 on a
#: range ending at 64 ran the gate/up GEMM on 64-row tiles at 34.9 us, where 32-row tiles take
#: 19.2 (``bench/results/archive/tile_heights_s59.json``).
ROW_RANGES = (16, 32, 64, 128, 256, 512, 1024, 2048)
#: The row count the range past the last bound is planned for.
ROWS_BEYOND = 4096
#: Configurations of a range tried, best predicted first, before the range is refused.
ATTEMPTS = 4


@dataclass(frozen=True)
class RangeKernel:
    """The kernel of the rows up to ``bound`` (None: every row count past the ranges before),
    with its configuration's predicted time at the range's largest row count (``bound``, or
    ROWS_BEYOND for the last range)."""

    bound: int | None
    family: ScheduleFamily
    config: Any
    func: tirx.PrimFunc
    predicted_us: float
    tuned: bool = False  # the configuration is a tuning record's (:func:`range_kernels`)


#: The configuration fields a tuning record holds for a function of constant extents, or None:
#: what :func:`range_kernels` asks of each range's specialization.
RecordedConfig = Callable[[tirx.PrimFunc], "dict | None"]


def range_variable(func: tirx.PrimFunc) -> tirx.Var | None:
    """The variable ``func``'s ranges of rows are of: its first extent variable (see the module
    docstring); None where its extents are constants."""
    variables = extent_variables(func)
    return variables[0] if variables else None


def range_specializations(func: tirx.PrimFunc) -> list[tuple[int, tirx.PrimFunc]]:
    """``func`` at the row count each range is planned for (see the module docstring): the
    functions a tuning of ``func``'s ranges measures, and whose records :func:`range_kernels`
    takes."""
    return [(rows, _with_rows(func, rows)) for rows in (*ROW_RANGES, ROWS_BEYOND)]


def _with_rows(func: tirx.PrimFunc, rows: int) -> tirx.PrimFunc:
    """``func`` with its first extent variable bound to ``rows``, the others to ROWS_BEYOND."""
    first, *others = extent_variables(func)
    for var in others:
        func = specialized(func, var, ROWS_BEYOND)
    return specialized(func, first, rows)


def range_kernels(func: tirx.PrimFunc, target: Any, hw: Hardware,
                  recorded: RecordedConfig | None = None) -> list[RangeKernel]:
    """The kernel of each range of rows (see the module docstring), the last one taking every
    row count past the others; ClusterError where a range has no family that schedules a
    symbolic row count, naming it. ``recorded``: where it knows a tuned configuration of a
    range's specialization (:func:`range_specializations`), that configuration is tried first."""
    variables = extent_variables(func)
    if not variables:
        raise ClusterError("the function's extents are constants: plan it as it is")
    var = range_variable(func)
    # several variables: only the families that take them are tried
    families = None if len(variables) == 1 else [f for f in FAMILIES if f.symbolic_extents]
    kernels: list[RangeKernel] = []
    for (rows, fixed), bound in zip(range_specializations(func), (*ROW_RANGES, None)):
        if kernels and int32_overflows(fixed):
            # planned at these rows (the other variables at ROWS_BEYOND: a batch of long
            # attention) the tensors outgrow int32 indices: the last range's kernel takes the
            # rest (a call that large is refused when it runs, naming the limit)
            last = kernels[-1]
            kernels[-1] = RangeKernel(None, last.family, last.config, last.func, last.predicted_us, last.tuned)
            break
        try:
            family, shape = match_family(fixed, target, families)
        except ClusterError as err:
            if families is None:
                raise
            raise ClusterError(f"{len(variables)} extents are symbolic ({sorted(v.name for v in variables)}): "
                               f"of the families that take one symbolic row count, only "
                               f"{[f.name for f in families]} take several: {err}") from None
        if not family.symbolic_rows:
            raise ClusterError(f"{family.name} (the family of {var.name} = {rows}) schedules constant "
                               f"extents only; {var.name} is symbolic")
        left = family.leaves_symbolic_rows(func)
        if left:
            raise ClusterError(f"{family.name} (the family of {var.name} = {rows}) leaves a symbolic {var.name} "
                               f"to TVM's stock schedules: {left}")
        plans = family.rank(shape, hw)
        fields = recorded(fixed) if recorded is not None else None
        if fields is not None:
            plans = [family.predict(shape, config_from(fields, examples(family.space(shape, hw))), hw), *plans]
        previous = kernels[-1] if kernels and kernels[-1].family is family else None
        plan, scheduled = _first_that_applies(family, func, plans, var, rows, hw, previous)
        tuned = fields is not None and plan.config == family.for_symbolic_rows(plans[0].config)
        if previous is not None and previous.config == plan.config:
            kernels[-1] = RangeKernel(bound, family, plan.config, previous.func, plan.predicted_us,
                                      tuned or previous.tuned)
        else:
            kernels.append(RangeKernel(bound, family, plan.config, scheduled, plan.predicted_us, tuned))
    return _few_row_kernels(func, target, hw, kernels[0]) + kernels


#: A split-K GEMM over a symbolic batch gets a kernel of its own for each of its first few
#: product counts where the first range's tiles, sized for up to 16 products, leave at least this
#: share of the SMs idle and its own plan has more CTAs. b x 512 x 512 x 256 on 16 CTAs of the
#: range's 128x128 tiles a product: 4.31 us at one product against 2.60 static (64 CTAs of
#: 64x64), 4.59 against 2.97 at two (H200, bench/results/archive/symbolic_batch_s88.json,
#: symbolic_batch_one_product_s89.json). The model predicted 5.2 and 4.7 us at one product, so
#: the grid decides, not the predicted gain. With those kernels, 2.59 / 2.89 / 3.43 / 4.26 us at
#: 1-4 products against 2.55 / 2.86 / 3.33 / 4.20 static (symbolic_batch_two_to_five_s90.json).
IDLE_SM_SHARE = 0.5


def _few_row_kernels(func: tirx.PrimFunc, target: Any, hw: Hardware, first: RangeKernel) -> list[RangeKernel]:
    """The kernels of ``func`` at exactly 1, 2, ... rows, in order, as long as a family other than
    the first range's takes that row count (a row GEMV's up to 2 rows of 16-bit elements, 8 of
    fp32, as a constant row count gets them; see the module docstring), or, over a symbolic batch
    of products, the first range's split-K GEMM tiles leave the SMs idle there
    (:func:`_own_plan_pays`)."""
    kernels = []
    for rows in range(1, ROW_RANGES[0]):
        kernel = _exact_rows_kernel(func, target, hw, first, rows)
        if kernel is None:
            break
        kernels.append(kernel)
    return kernels


def _is_product_batch(func: tirx.PrimFunc) -> bool:
    """Whether ``func``'s range variable is the batch of a batched split-K GEMM (the products'
    count, not their rows)."""
    shape = SplitKGemm().match(func)
    return shape is not None and isinstance(shape.batch, tirx.Var) and shape.batch.same_as(range_variable(func))


def _exact_rows_kernel(func: tirx.PrimFunc, target: Any, hw: Hardware,
                       first: RangeKernel, rows: int) -> RangeKernel | None:
    """The kernel of ``func`` at exactly ``rows`` rows where the family a constant row count
    gets (:func:`~tvm_dsm.families.fastest_family`) is not ``first``'s, or, ``rows`` counting a
    batch of products, is the split-K GEMM whose own plan pays there (:func:`_own_plan_pays`);
    else None."""
    fixed = specialized(func, range_variable(func), rows)
    try:
        if extent_variables(fixed):
            kernels = range_kernels(fixed, target, hw)
            family, config, predicted = kernels[-1].family, kernels[-1].config, kernels[-1].predicted_us
            if family is first.family:
                return None
            scheduled = dispatch(fixed, [(k.bound, k.func) for k in kernels])
        else:
            family, shape, plans = fastest_family(matching_families(fixed, target), hw)
            config, predicted = plans[0].config, plans[0].predicted_us
            if family is first.family and not _own_plan_pays(func, family, shape, first.config, plans[0], hw):
                return None
            scheduled = family.apply(fixed, config, hw).mod["main"]
    except (ClusterError, ScheduleError, tvm.error.InternalError):  # the ranges' kernel takes these rows too
        return None
    params = list(zip(scheduled.params, func.params))
    return RangeKernel(rows, family, config, func.with_body(substitute(scheduled.body, params)), predicted)


def _own_plan_pays(func: tirx.PrimFunc, family: ScheduleFamily, shape: Any, range_config: Any, own: Plan,
                   hw: Hardware) -> bool:
    """Whether ``func`` is a split-K GEMM over a symbolic batch of products whose ``own`` plan
    at ``shape`` has more CTAs than the first range's ``range_config`` there, where that leaves
    :data:`IDLE_SM_SHARE` of the SMs idle or more. (Whether the batch is the range variable is
    asked last: only functions that reach here pay for recognizing it.)"""
    if family.name != SplitKGemm.name or own.config == range_config:
        return False
    try:
        ranged = family.predict(shape, range_config, hw)
    except ClusterError:
        return False
    return ranged.ctas <= (1 - IDLE_SM_SHARE) * hw.sm_count and own.ctas > ranged.ctas and _is_product_batch(func)


def _first_that_applies(family: ScheduleFamily, func: tirx.PrimFunc, plans: list[Plan],
                        var: tirx.Var, rows: int, hw: Hardware,
                        previous: RangeKernel | None) -> tuple[Plan, tirx.PrimFunc]:
    """The best of the first ATTEMPTS ``plans`` whose configuration schedules ``func`` over a
    symbolic row count, with that schedule's function: the ``previous`` range's, not scheduled
    again, where its configuration comes first."""
    refusals = []
    for plan in plans[:ATTEMPTS]:
        plan = dataclasses.replace(plan, config=family.for_symbolic_rows(plan.config))
        if previous is not None and previous.config == plan.config:
            return plan, previous.func
        try:
            return plan, family.apply(func, plan.config, hw).mod["main"]
        except ClusterError as err:
            refusals.append(str(err))
    raise ClusterError(f"{family.name}: none of the {len(refusals)} best configurations for "
                       f"{var.name} = {rows} takes a symbolic {var.name}: {refusals[-1] if refusals else 'no plan'}")


def dispatch(func: tirx.PrimFunc, kernels: list[tuple[int | None, tirx.PrimFunc]]) -> tirx.PrimFunc:
    """``func`` branching on its first extent variable to the scheduled functions ``kernels`` (each with
    the largest row count it takes, in increasing order; the last, None, takes the rest):
    ``if m <= bound`` in that order, nothing for ``m = 0`` (:func:`tvm_dsm.ir.branch_on`), after
    the :func:`int32_extent_check` of an int32 variable."""
    branches = [(bound, kernel.with_body(fresh_definitions(kernel.body)) if i else kernel)
                for i, (bound, kernel) in enumerate(kernels)]
    var = range_variable(func)
    body = branch_on(var, branches)
    if str(var.ty) == "int32":
        body = tirx.SeqStmt([int32_extent_check(func), body])
    return func.with_body(SBlockRealize([], True, SBlock([], [], [], "root", body)))


def int32_extent_check(func: tirx.PrimFunc) -> tirx.AssertStmt:
    """``assert`` (ValueError, on the host, before any launch) that every tensor argument of
    ``func`` whose shape has a variable holds fewer than :data:`INT32_ELEMENTS` elements. The
    families' kernels index in int32 (:func:`tvm_dsm.ir.narrow_indices`); a call past that
    would address past the 2^31st element, a fault or a wrong answer, so it is refused naming
    the limit."""
    shapes = [(param.name, list(param.ty.shape)) for param in func.params
              if any(not isinstance(e, tirx.IntImm) for e in getattr(param.ty, "shape", None) or ())]
    condition, names = tirx.const(True, "bool"), []
    for name, shape in shapes:
        elements = tirx.const(1, "int64")
        for extent in shape:
            elements = elements * tirx.Cast("int64", extent)
        condition = tirx.And(condition, elements < tirx.const(INT32_ELEMENTS, "int64"))
        names.append(f"{name} {[str(e) for e in shape]}")
    symbol = func.attrs.get("global_symbol", "the function") if func.attrs is not None else "the function"
    message = (f"`{symbol}`: tvm-dsm's kernels of a symbolic shape index in int32, so each tensor "
               f"argument holds fewer than 2^31 elements ({', '.join(names)}); split the call "
               "(a smaller batch or prefill chunk)")
    return tirx.AssertStmt(condition, tvm.ir.StringImm("ValueError"), [message])
