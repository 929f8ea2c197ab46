"""User entry points: ``plan`` (rank without measuring), ``tune`` (measure the top plans into a
MetaSchedule database) and ``build`` (a runnable module from the best known schedule).

Each takes an ordinary PrimFunc. The schedule family is found by pattern
(:mod:`tvm_dsm.families`); a function no family fits is built with TVM's stock GPU schedules
(dlight) and a logged reason, and one dlight cannot schedule either (a chain of convolutions in
one function) raises ClusterError with both reasons: ``build`` returns a correct module or
says why not.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir import SBlockRealize
from tvm.s_tir.schedule.schedule import ScheduleError
from tvm.tirx.buffer import BufferType

from .device import gpu_or_reason
from .errors import ClusterError, last_line
from .families import INT32_ELEMENTS, ScheduleFamily, fastest_family, match_family, matching_families
from .families.row_ranges import RangeKernel, dispatch, range_kernels, range_specializations
from .hardware import H100, Hardware, load_hardware
from .intrin import register_all
from .ir import (block_allocations, declares, extent_variables, find_all, fresh_definitions, items, narrow_indices,
                 on_host, seq, specialized, substitute, with_block_body)
from .learned_ranking import rerank
from .local_measure import local_builder, local_runner
from .planners.report import Plan
from .stock import stock_rules, stock_target
from .families.packed_gemv import PackedGemvFamily
from .families.simt_gemm import SimtGemm, pads_faster
from .rules.aligned_rows import misaligned_products, pad_rows_to_vectors
from .rules.packed_gemv import MAX_ROWS as MAX_PACKED_ROWS
from .transform.generate_kernels import mark_generated, recorded_config
from .transform.host_sorts import refuse_host_loops, refuse_host_sorts, router_top_k
from .transform.columns_as_one import columns_as_one
from .transform.merged_heads import heads_apart
from .transform.operand_copies import copies_inlined
from .transform.rows_as_matrix import has_row_axes, over_original_tensors, rows_as_matrix
from .transform.unit_axes import unit_axes_dropped
from .transform.split_operators import merge_operators, split_operators
from .transform.product_halves import products_of_halves
from .transform.product_order import products_in_gemm_order
from .transform.reductions_first import reductions_first
from .transform.computed_operands import operands_apart
from .transform.reduction_inits import inits_apart
from .transform.separate_reductions import reductions_apart
from .transform.widen_accumulation import widen_accumulation
from .tuning_database import open_database

LOG = logging.getLogger("tvm_dsm.driver")

#: Seconds a MetaSchedule builder worker may take for one candidate (it imports tvm-dsm first).
BUILD_TIMEOUT_S = 300


@dataclass
class Ranking:
    """The pruned design space of one function, best predicted first."""

    family: ScheduleFamily
    shape: Any
    plans: list[Plan]
    func: tirx.PrimFunc = field(repr=False)
    hw: Hardware = field(repr=False)

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def explain(self, alternatives: int = 3) -> str:
        """The winner's tiles, cluster, bytes and time per level, then the runners-up."""
        lines = [f"{self.family.name}: {len(self.plans)} valid configurations, best predicted:",
                 self.best.explain()]
        for rank, plan in enumerate(self.plans[1:1 + alternatives], start=2):
            lines.append(f"  #{rank}: {plan.predicted_us:.1f} us  {plan.config}")
        return "\n".join(lines)

    def schedule(self, rank: int = 0) -> s_tir.Schedule:
        """The schedule of the ``rank``-th best configuration."""
        return self.family.apply(self.func, self.plans[rank].config, self.hw)

    def recordable(self, rank: int = 0) -> s_tir.Schedule:
        """The ``rank``-th best configuration as a schedule of the function that a tuning
        record can hold: the family's own, or for a family that writes a new kernel function,
        the function marked for tvm-dsm's pipeline to write that kernel when it is built
        (:mod:`tvm_dsm.transform.generate_kernels`)."""
        if self.family.traced:
            return self.schedule(rank)
        sch = s_tir.Schedule(tvm.ir.load_json(tvm.ir.save_json(self.func)))  # a root annotation edits in place
        mark_generated(sch, self.family.name, self.plans[rank].config)
        return sch


def _forms(func: tirx.PrimFunc) -> Iterator[tuple[tirx.PrimFunc, str | None]]:
    """``func``'s forms that compute the same values, in the order they are tried, each with
    what is logged where one is taken: as written; its matmuls accumulating in fp32 where they
    accumulate in 16 bits (:mod:`tvm_dsm.transform.widen_accumulation`); its blocks with
    reductions first where they are written in another order
    (:mod:`tvm_dsm.transform.reductions_first`); both; then the same of its products in the
    GEMM families' order (:mod:`tvm_dsm.transform.product_order`), and of a product over a fused
    gate/up weight as the gated layer's two products (:mod:`tvm_dsm.transform.product_halves`);
    last, those of its products reading in place the parameters it copies for them
    (:mod:`tvm_dsm.transform.operand_copies`). Each is made when it is asked for."""
    yield from _rewritten_forms(func, None)
    ordered = products_in_gemm_order(func)
    if ordered is not None:
        yield from _rewritten_forms(ordered, "its products' iterators and operands in the GEMM order")
    halves = products_of_halves(ordered or func)
    if halves is not None:
        yield from _rewritten_forms(halves, "its product over a fused gate/up weight as the gated layer's two products")
    inlined = copies_inlined(func)
    if inlined is not None:
        how = "its products reading in place the parameters it copies for them (split, slice, transpose)"
        yield from _rewritten_forms(products_in_gemm_order(inlined) or inlined, how)


def _rewritten_forms(base: tirx.PrimFunc, how: str | None) -> Iterator[tuple[tirx.PrimFunc, str | None]]:
    """``base`` (reached as ``how`` says), then its accumulation-widened and reductions-first
    forms (:func:`_forms`), each made when it is asked for."""
    def joined(then: str) -> str:
        return then if how is None else f"{how}; {then}"

    yield base, how
    widened = widen_accumulation(base)
    if widened is not None:
        yield widened, joined("its matmuls accumulate in 16 bits; scheduled accumulating in fp32, rounded once")
    reordered = reductions_first(base)
    if reordered is not None:
        yield reordered, joined("its blocks are scheduled with its reductions first")
        both = widen_accumulation(reordered)
        if both is not None:
            yield both, joined("its blocks are scheduled with its reductions first, its matmuls accumulating in fp32")


def _first_form_taken(func: tirx.PrimFunc, attempt: Callable[[tirx.PrimFunc], Any]) -> tuple[tirx.PrimFunc, Any]:
    """``(form, attempt(form))`` for the first of ``func``'s forms (:func:`_forms`) that
    ``attempt`` takes without a ClusterError; else the error of ``func`` as written, followed by
    the reasons each other form was refused for where they differ (a 16-bit sum widened, a
    family then names the limit it meets next)."""
    first, others = None, []
    for form, how in _forms(func):
        try:
            result = attempt(form)
        except ClusterError as err:
            if first is None:
                first, seen = err, set(str(err).splitlines())
            else:
                changed = [line for line in str(err).splitlines() if line.startswith("  ") and line not in seen]
                if changed:
                    others.append(f"{how}:\n" + "\n".join(changed))
            continue
        if how is not None:
            LOG.info(how)
        return form, result
    if others:
        raise ClusterError("\n".join([str(first), *others])) from None
    raise first


def _as_planned(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` as :func:`plan` takes its forms from: a softmax's top-k as the fused router
    (:func:`~tvm_dsm.transform.host_sorts.router_top_k`), allocations in the root block,
    intermediate tensors without their unit axes (a keepdims reduction's ``[rows, 1]`` results:
    :func:`~tvm_dsm.transform.unit_axes.unit_axes_dropped`),
    independent reductions accumulated in one block apart
    (:func:`~tvm_dsm.transform.separate_reductions.reductions_apart`), reductions started from
    another value than their identity started from it and combined with that value after
    (:func:`~tvm_dsm.transform.reduction_inits.inits_apart`)."""
    func = block_allocations(router_top_k(func) or func)
    func = unit_axes_dropped(func) or func
    func = reductions_apart(func) or func
    return inits_apart(func) or func


def _taken(func: tirx.PrimFunc, target) -> bool:
    """Whether a family takes one of ``func``'s forms."""
    try:
        family_form(func, target)
    except ClusterError:
        return False
    return True


def family_form(func: tirx.PrimFunc, target=None) -> tuple[tirx.PrimFunc, ScheduleFamily]:
    """The first of ``func``'s forms (:func:`_forms`) a family takes, with that family: the
    function :func:`plan` ranks and a tuning record of ``func`` is kept for; ClusterError where
    no family takes any."""
    form, (family, _) = _first_form_taken(_as_planned(func), lambda f: match_family(f, target))
    return form, family


def plan(func: tirx.PrimFunc, hw: Hardware | None = None, target=None) -> Ranking:
    """Rank every valid configuration of the family ``func`` belongs to (ClusterError if none
    applies, naming why each family does not, or if ``target`` is not a Hopper GPU). Where no
    family takes the function as written, its other forms are tried (:func:`_forms`: matmuls
    accumulating in fp32, reductions first); the ranking holds the form taken. The
    analytical ranking's first plans are re-ordered by what was measured on similar shapes
    (:func:`tvm_dsm.learned_ranking.rerank`). Where no family takes a function whose tensors'
    leading axes are rows, the error says so: ``build`` takes it as matrices, which
    ``plan(rows_as_matrix(func).func)`` ranks."""
    refuse_empty_tensors(func)
    refuse_host_loops(func)
    written, func = func, _as_planned(func)
    refused: list[str] = []  # why the other families do not take the form taken

    def matches_of(form: tirx.PrimFunc) -> list:
        refused.clear()
        return matching_families(form, target, refused=refused)

    try:
        func, matches = _first_form_taken(func, matches_of)
    except ClusterError as err:
        if has_row_axes(func) and rows_as_matrix(written) is not None:  # the advice holds for the function given
            raise ClusterError(f"{err}\nIts tensors' leading axes are rows: build and schedule take it as matrices "
                               "(tvm_dsm.transform.rows_as_matrix), which plan(rows_as_matrix(func).func) "
                               "ranks") from None
        split = heads_apart(func)
        if split is not None and _taken(split.func, target):
            raise ClusterError(f"{err}\nIt holds heads and the head dim on one axis: build and schedule split "
                               "them (tvm_dsm.transform.merged_heads), which plan(heads_apart(func).func) "
                               "ranks") from None
        raise
    hw = hw or load_hardware()
    try:
        family, shape, plans = fastest_family(
            matches, hw, lambda family, shape: rerank(family.name, shape, family.rank(shape, hw), hw))
    except ClusterError as err:
        if not refused:
            raise
        taking = ", ".join(family.name for family, _ in matches)
        raise ClusterError(f"{taking} cannot plan it: {err}\nthe other families do not take it:\n  "
                           + "\n  ".join(refused)) from None
    if family.name == SimtGemm.name and pads_faster(shape, hw):
        # (a function of a symbolic row count keeps the CUDA cores: its ranges are planned
        # without this check, and the padded copies are built for constant row counts only)
        raise ClusterError(f"{shape.m}x{shape.n}x{shape.k} {shape.dtype}: copies padded to whole 16-byte rows, then "
                           "the tensor cores, are predicted faster than the CUDA cores: build pads them "
                           "(tvm_dsm.rules.aligned_rows)")
    return Ranking(family, shape, plans, func, hw)


@dataclass(frozen=True)
class Measured:
    """One tuned candidate: its planner rank, prediction and measured median."""

    rank: int
    plan: Plan
    measured_us: float | None  # None: failed to build or run (``error`` says why)
    error: str = ""


def tune(func: tirx.PrimFunc, work_dir: str, *, target=H100, top_k: int = 8,
         ranks: Sequence[int] | None = None, hw: Hardware | None = None,
         builder: ms.Builder | None = None, runner: ms.Runner | None = None) -> list[Measured]:
    """Build and time the planner's ``top_k`` configurations (or those of the given ``ranks``
    in its order) with MetaSchedule's builder and
    runner (on this machine's GPU unless a runner is given) and commit every measured one to the
    JSON database in ``work_dir`` (:meth:`Ranking.recordable`); returns them fastest first
    (failures last)."""
    if runner is None:
        reason = gpu_or_reason()
        if reason:
            raise RuntimeError(f"tvm_dsm.tune measures on this machine's GPU: {reason} "
                               "(pass runner=, e.g. MetaSchedule's RPCRunner, to measure elsewhere)")
    ranking = plan(func, hw, target)
    target = tvm.target.Target(target)
    ranks = range(min(top_k, len(ranking.plans))) if ranks is None else ranks
    candidates = [(rank, ranking.plans[rank]) for rank in ranks]
    schedules = [ranking.recordable(rank) for rank, _ in candidates]
    # A fresh worker imports TVM and its tensor intrinsics before building (MetaSchedule's 30 s
    # default is too short for that on a cold machine).
    builder = builder or local_builder(BUILD_TIMEOUT_S, load_tvm_dsm)
    runner = runner or local_runner(load_tvm_dsm)
    built = builder.build([ms.builder.BuilderInput(s.mod, target) for s in schedules])
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    database = open_database(work_dir)
    workload = database.commit_workload(_module(ranking.func))  # the form planned (what build looks up)
    results = []
    to_run = [(i, b) for i, b in enumerate(built) if b.error_msg is None]
    futures = runner.run([ms.runner.RunnerInput(b.artifact_path, target.kind.name, args_info)
                          for _, b in to_run])
    errors = {i: b.error_msg for i, b in enumerate(built) if b.error_msg is not None}
    seconds = {}
    for (i, _), future in zip(to_run, futures):
        result = future.result()
        if result.error_msg is not None:
            errors[i] = result.error_msg
            continue
        seconds[i] = [float(s) for s in result.run_secs]
        database.commit_tuning_record(ms.database.TuningRecord(
            schedules[i].trace, workload, seconds[i], target, args_info))
    for i, (rank, p) in enumerate(candidates):
        if i in seconds:
            times = sorted(seconds[i])
            results.append(Measured(rank, p, times[len(times) // 2] * 1e6))
        else:
            results.append(Measured(rank, p, None, errors.get(i, "not run")))
    return sorted(results, key=lambda m: (m.measured_us is None, m.measured_us or 0.0))


#: Plans ``build`` tries, best predicted first: a plan whose kernels need more shared memory
#: than the planner counts is refused when it lowers (ClusterError), and the next one is built.
BUILD_ATTEMPTS = 4


def build(func: tirx.PrimFunc, target=H100, *, database: ms.Database | None = None,
          hw: Hardware | None = None) -> tvm.runtime.Module:
    """A runnable module for ``func``: the fastest schedule ``database`` recorded for it, else
    the planner's best that lowers (of its BUILD_ATTEMPTS best, each refusal logged), else (no
    family applies, or none of those plans lowers) TVM's stock GPU schedule; ClusterError for a function that sorts on the host
    or loops on the host (:mod:`tvm_dsm.transform.host_sorts`)."""
    target = tvm.target.Target(target)
    func = router_top_k(func) or func
    refuse_host_sorts(func)
    refuse_host_loops(func)
    refuse_empty_tensors(func, outputs_only=True)
    func = _public(func)
    recorded = _recorded(database, func, target)
    if recorded is not None:
        return tvm.compile(replay(recorded[1].trace, recorded[0]).mod, target=target)
    try:
        refuse_empty_tensors(func)
        if extent_variables(func):
            return tvm.compile(schedule_row_ranges(func, target, hw, database)[1].mod, target=target)
        ranking = plan(func, hw, target)
    except ClusterError as err:
        return _compiled_fallback(func, target, err, hw)
    except FAMILY_FAILURES as err:
        LOG.warning("a tvm-dsm family failed on the function (a tvm-dsm bug); TVM's stock schedule instead",
                    exc_info=True)
        return _compiled_fallback(func, target, ClusterError(f"{type(err).__name__}: {err}"), hw)
    refusals = []
    for rank in range(min(BUILD_ATTEMPTS, len(ranking.plans))):
        try:
            return tvm.compile(ranking.schedule(rank).mod, target=target)
        except ClusterError as err:
            LOG.warning("tvm-dsm's plan #%d does not lower: %s", rank + 1, err)
            refusals.append(err)
        except FAMILY_FAILURES as err:
            LOG.warning("tvm-dsm's plan #%d failed (a tvm-dsm bug)", rank + 1, exc_info=True)
            refusals.append(err)
    reason = ClusterError(f"none of tvm-dsm's {len(refusals)} best plans lowers; the last: "
                          f"{refusals[-1] if refusals else 'no plan'}")
    LOG.warning("%s; TVM's stock schedule instead", reason)
    return _compiled_fallback(func, target, reason, hw)


#: What a family's schedule or its lowering raises besides a refusal where the family took a
#: function it should have refused (a tvm-dsm bug: s_tir refusing a primitive, a TVM check in
#: lowering, an assertion): ``build`` warns and builds as for a refusal.
FAMILY_FAILURES = (ScheduleError, RuntimeError, ValueError, AssertionError)


#: What dlight's rules raise on forms they misjudge: a refused primitive, an assertion, or an
#: error of their own analysis (its GEMV rule reads a batch of one-row products' index ``b + 0``
#: as a constant: AttributeError). Its fallback rule alone is tried next.
DLIGHT_RULE_FAILURES = (ScheduleError, AssertionError, AttributeError, TypeError, IndexError, KeyError)


def _compiled_fallback(func: tirx.PrimFunc, target, reason: ClusterError, hw: Hardware | None):
    """:func:`_compiled_stock`, refused where a function storing tensor elements holds no GPU kernel: TVM
    compiles a function its schedules leave unscheduled (dlight's, of a reduction over an axis not
    starting at 0) into host code, which would read the device's tensors from the CPU."""
    lib = _compiled_stock(func, target, reason, hw)
    computes = bool(find_all(func.body, tirx.BufferStore))  # not an extern call (it stores through its callee)
    if target.kind.name == "cuda" and computes and not list(lib.mod.imports):
        raise ClusterError(f"neither tvm-dsm nor TVM's stock schedules (dlight) put this function on the GPU "
                           f"(TVM would run it on the host); tvm-dsm's families: {reason}")
    return lib


def _compiled_stock(func: tirx.PrimFunc, target, reason: ClusterError, hw: Hardware | None):
    """``func`` compiled from :func:`_fallback_schedule`; where that does not lower, from its
    schedule without tvm-dsm's families; where dlight's tensor-core schedule for "sm_90" does not
    lower either (its int8 WMMA products), from dlight's schedule for ``target`` itself, which
    keeps to the CUDA cores. Where a schedule of the function whole does not lower (dlight's of a
    product written to two outputs is ill-formed), one schedule per operator first.
    ClusterError where nothing schedules the function."""
    try:
        return tvm.compile(_fallback_schedule(func, target, reason, hw).mod, target=target)
    except (ClusterError, *FAMILY_FAILURES) as lowering:  # a tvm-dsm kernel of an operator does not lower
        LOG.warning("the fallback with tvm-dsm's families does not lower (%s)", last_line(lowering))
    try:
        narrowed = narrow_indices(func) if extent_variables(func) else func
    except ClusterError:  # an extent that is an expression of variables: dlight's whole
        narrowed = None
    operators = _operators(narrowed) if narrowed is not None else []
    if len(operators) >= 2:
        try:
            scheduled = _per_operator(narrowed, operators, target, hw, True)
            LOG.warning("scheduled one operator at a time instead")
            return tvm.compile(scheduled.mod, target=target)
        except (ClusterError, ScheduleError, *FAMILY_FAILURES) as lowering:
            LOG.warning("one operator at a time does not lower either (%s); dlight's alone", last_line(lowering))
    try:
        return tvm.compile(_fallback_schedule(func, target, reason, hw, families=False).mod, target=target)
    except FAMILY_FAILURES as lowering:
        LOG.warning("dlight's tensor-core schedule does not lower (%s); its CUDA-core one", last_line(lowering))
    try:
        return tvm.compile(stock_schedule(func, target, tensor_cores=False).mod, target=target)
    except FAMILY_FAILURES as err:
        raise _unschedulable(reason, last_line(err)) from None


def _unschedulable(reason: ClusterError, dlight: str) -> ClusterError:
    """The refusal of a function neither tvm-dsm nor dlight schedules, with both reasons."""
    return ClusterError(f"neither tvm-dsm nor TVM's stock schedules (dlight) can schedule this function. "
                        f"tvm-dsm: {reason}\ndlight: {dlight}")


def refuse_empty_tensors(func: tirx.PrimFunc, outputs_only: bool = False) -> None:
    """ClusterError naming the parameters of ``func`` (``outputs_only``: those it writes) with a
    constant extent of 0: no elements, nothing for a family's kernel to compute. :func:`build`
    refuses an empty output (its kernel would launch no CTA, which CUDA refuses when it runs)
    and leaves an empty input to TVM's stock schedule (a sum over an empty axis is zeros)."""
    written = [s.buffer for s in find_all(func.body, tirx.BufferStore)]
    empty = [f"{p.name}{[int(d) if isinstance(d, tirx.IntImm) else str(d) for d in p.ty.shape]}"
             for p in func.params if any(isinstance(d, tirx.IntImm) and int(d) == 0 for d in getattr(p.ty, "shape", ()))
             and (not outputs_only or any(p.same_as(w) for w in written))]
    if empty:
        raise ClusterError(f"{', '.join(empty)}: an extent of 0 (no elements); a kernel needs at least one")


def schedule(func: tirx.PrimFunc, target=H100, *, database: ms.Database | None = None,
             hw: Hardware | None = None, stock_fallback: bool = True) -> s_tir.Schedule:
    """The schedule :func:`build` compiles first (see there); ``stock_fallback=False``:
    ClusterError where no family applies, for callers that leave such functions to dlight
    themselves."""
    target = tvm.target.Target(target)
    func = _public(router_top_k(func) or func)
    recorded = _recorded(database, func, target)
    if recorded is not None:
        return replay(recorded[1].trace, recorded[0])
    try:
        if extent_variables(func):
            return schedule_row_ranges(func, target, hw, database)[1]
        return plan(func, hw, target).schedule()
    except ClusterError as err:
        if not stock_fallback:
            raise
        return _fallback_schedule(func, target, err, hw)
    except FAMILY_FAILURES as err:  # a family's schedule failed on it (a tvm-dsm bug), as in build
        if not stock_fallback:
            raise
        LOG.warning("a tvm-dsm family failed to schedule the function (%s); the fallback instead", last_line(err))
        return _fallback_schedule(func, target, ClusterError(f"{type(err).__name__}: {err}"), hw)


def schedule_row_ranges(func: tirx.PrimFunc, target=H100, hw: Hardware | None = None,
                        database: ms.Database | None = None) -> tuple[list[RangeKernel], s_tir.Schedule]:
    """A function whose row count is a variable, scheduled as one kernel per range of rows
    (:mod:`tvm_dsm.families.row_ranges`), with those ranges' kernels; ClusterError where a
    range has no family that takes a symbolic row count. A range whose specialization
    (:func:`row_range_tasks`) has a record in ``database`` takes the record's configuration."""
    func = _as_planned(narrow_indices(func))

    def recorded(fixed: tirx.PrimFunc) -> dict | None:
        record = tuning_record(database, fixed, target)
        return None if record is None else recorded_config(replay(record.trace, fixed).mod["main"])

    func, kernels = _first_form_taken(func, lambda f: range_kernels(f, target, hw or load_hardware(), recorded))
    for kernel in kernels:
        LOG.info("rows up to %s: %s %s", kernel.bound or "any", kernel.family.name, kernel.config)
    # s_tir's checks expect one root block; each range's kernel holds its own
    branches = [(kernel.bound, kernel.func) for kernel in kernels]
    return kernels, s_tir.Schedule(dispatch(func, branches), enable_check=False)


def row_range_tasks(func: tirx.PrimFunc) -> list[tuple[int, tirx.PrimFunc]]:
    """A function of a symbolic row count at the row count of each of its ranges, as
    :func:`schedule_row_ranges` looks their tuning records up: what tuning measures of it."""
    # the families' kernels index in int32 (a template's kernel is built on the narrowed
    # function, whose variables the branches must share)
    return range_specializations(_as_planned(narrow_indices(func)))


def _recorded(database: ms.Database | None, func: tirx.PrimFunc,
              target) -> tuple[tirx.PrimFunc, ms.database.TuningRecord] | None:
    """The tuning record ``database`` holds for ``func`` or one of its forms (:func:`_forms`:
    ``tune`` records the form the planner took), with that form; None where it holds none."""
    if database is None:
        return None
    for form, _ in _forms(func):
        record = tuning_record(database, form, target)
        if record is not None:
            return form, record
    return None


def tuning_record(database: ms.Database | None, func: tirx.PrimFunc,
                  target) -> ms.database.TuningRecord | None:
    """The tuning record ``database`` holds for ``func``, if any."""
    if database is None:
        return None
    register_all()  # the record's trace names tvm-dsm's tensor intrinsics
    return database.query_tuning_record(_module(func), target, workload_name="main")


def _fallback_schedule(func: tirx.PrimFunc, target, reason: ClusterError,
                       hw: Hardware | None, families: bool = True) -> s_tir.Schedule:
    """:func:`_fallback_apart`; with ``families``, preceded at a few rows by a family's kernel of
    the whole function where one takes it there (:func:`_few_rows_first`)."""
    scheduled = _fallback_apart(func, target, reason, hw, families)
    return _few_rows_first(func, scheduled, target, hw) if families else scheduled


def _few_rows_first(func: tirx.PrimFunc, scheduled: s_tir.Schedule, target, hw: Hardware | None) -> s_tir.Schedule:
    """``scheduled`` (``func`` of a variable row count, scheduled apart), branching at one row to
    the kernel a family makes of ``func`` whole at one row, where there a stage unpacking a
    product's operand joins the product (:func:`~tvm_dsm.transform.split_operators.split_operators`),
    and, where that family is the packed GEMV, at each row count up to its
    :data:`~tvm_dsm.rules.packed_gemv.MAX_ROWS` it takes: MLC's batched decode GEMV over 4-bit
    codes, whose operators apart unpack the weight into a tensor and read it back (4 times the
    codes' bytes, twice), is at a few rows the packed GEMV reading the codes once. ``scheduled``
    itself otherwise."""
    try:
        variables = extent_variables(func)
    except ClusterError:  # an extent that is an expression of a variable: no row count to branch on
        return scheduled
    if len(variables) != 1:
        return scheduled
    one_row = specialized(func, variables[0], 1)
    if not 0 < len(_operators(one_row)) < len(_operators(func)):
        return scheduled
    rest = scheduled.mod["main"]
    kernels = []  # the whole function's kernel at 1, 2, ... rows
    for rows in range(1, MAX_PACKED_ROWS + 1):
        try:
            ranking = plan(one_row if rows == 1 else specialized(func, variables[0], rows), hw, target)
            if rows > 1 and ranking.family.name != PackedGemvFamily.name:
                break
            kernel = ranking.schedule().mod["main"]
        except (ClusterError, *FAMILY_FAILURES):
            break
        if [str(p.ty.dtype) for p in kernel.params] != [str(p.ty.dtype) for p in rest.params]:
            break
        kernels.append(kernel)
        LOG.info("at %d row(s), %s takes it whole", rows, ranking.family.name)
        if ranking.family.name != PackedGemvFamily.name:
            break
    if not kernels:
        return scheduled
    # the kernels apart behind "more rows", the root block's declarations (the views of
    # parameters their tensor maps are encoded from) kept where they are; the whole kernels last
    row_count = extent_variables(rest)[0]
    root = rest.body.block
    apart = [stmt if declares(stmt) else tirx.IfThenElse(on_host(row_count > len(kernels)), stmt, None)
             for stmt in items(root.body)]
    # each kernel's blocks and loops defined afresh: a traced family's keep the function's own
    # variables, which a kernel apart defines too
    whole = [tirx.IfThenElse(on_host(row_count == rows), fresh_definitions(
        substitute(kernel.body, list(zip(kernel.params, rest.params)))), None)
        for rows, kernel in enumerate(kernels, start=1)]
    body = SBlockRealize(rest.body.iter_values, rest.body.predicate, with_block_body(root, seq([*apart, *whole])))
    return s_tir.Schedule(rest.with_body(body), enable_check=False)


def _fallback_apart(func: tirx.PrimFunc, target, reason: ClusterError,
                    hw: Hardware | None, families: bool = True) -> s_tir.Schedule:
    """The schedule of a function no tvm-dsm family takes whole: a family's over matrices
    where its tensors' leading axes are rows (:func:`_as_matrices`); else (``reason`` logged
    at INFO) TVM's stock schedule (dlight), of the matrices where dlight fails on the tensors;
    16-bit products over ``[N, K]`` weights whose rows are off 16 bytes, where predicted faster,
    over copies padded to whole rows (:mod:`tvm_dsm.rules.aligned_rows`), a schedule per operator;
    where it holds a matmul and other operators (two GEMMs, a GEMM and a reduction of its rows),
    or dlight cannot schedule it whole, one schedule per operator
    (:mod:`tvm_dsm.transform.split_operators`: a family's, such as the split-K GEMM's at any M,
    N and K, else dlight's; dlight's only without
    ``families``); else ClusterError with the reasons. A product operand computed inside the
    product (a weight dequantized in it) is computed into a tensor first, an operator of its own
    (:mod:`tvm_dsm.transform.computed_operands`). Matmuls written to accumulate in 16 bits
    accumulate in fp32 here too (:mod:`tvm_dsm.transform.widen_accumulation`): never less
    accurate than asked, and the same numbers whichever path schedules the function."""
    func = inits_apart(func) or func  # as the families see it: a widened sum keeps its start
    matrices = _as_matrices(func, target, hw) if families else None
    if matrices is not None:
        return matrices
    LOG.info("tvm-dsm falls back from its families: %s", reason)
    func = widen_accumulation(func) or func
    if families:
        func = operands_apart(func) or func
    misaligned = misaligned_products(func) if families else None
    if misaligned is not None and pads_faster(misaligned, hw or load_hardware()):
        try:
            aligned = pad_rows_to_vectors(func)
            if aligned is not None:
                scheduled = _per_operator(aligned, _operators(aligned), target, hw, families)
                LOG.info("its 16-bit rows are off 16 bytes: copied to whole rows, a kernel per operator")
                return scheduled
        except Exception as err:  # noqa: BLE001  (the unpadded paths below still apply)
            LOG.info("its 16-bit rows padded to whole rows do not schedule (%s)", str(err).strip().splitlines()[-1])
    # indexed in int32 as every range's kernel is (tvm_dsm.ir.narrow_indices): the operators'
    # schedules then share the merged function's row-count variable
    func = narrow_indices(func) if extent_variables(func) else func
    operators = _operators(func)
    per_operator_error = None
    if families and len(operators) >= 2 and any(op.matmul for op in operators) \
            and not _stock_whole_first(operators, target, hw):
        # dlight has no rule for a matmul followed by more than element-wise work: what it makes
        # of two matmuls, or of a matmul and a reduction of its rows, is a few CTAs (an M = 1
        # SwiGLU chain: 26 ms where its operators take 40 us; at N = 28672 more shared memory
        # than a CTA has; an LM head's row max: 10.4 ms where torch takes 71 us). Operator by
        # operator first.
        try:
            scheduled = _per_operator(func, operators, target, hw, families)
            LOG.info("scheduled one operator at a time")
            return scheduled
        except Exception as err:  # noqa: BLE001  (dlight's rules assert on forms they misjudge)
            per_operator_error = err
            LOG.info("its operators one by one do not schedule (%s); dlight's schedule whole", last_line(err))
    try:
        return stock_schedule(func, target)
    except DLIGHT_RULE_FAILURES as err:
        whole = last_line(err)
    matrices = _as_matrices(func, target, hw, families=False)  # dlight may take the matrices
    if matrices is not None:
        return matrices
    if len(operators) < 2:
        return _stock_fallback_rule(func, target, reason, whole)
    if per_operator_error is not None:  # tried above: its error, not the same work again
        raise per_operator_error
    LOG.info("scheduling its %d operators one by one (dlight: %s)", len(operators), whole)
    return _per_operator(func, operators, target, hw, families)


def _stock_whole_first(operators: list, target, hw: Hardware | None) -> bool:
    """Whether dlight's schedule of the whole function comes before one schedule per operator:
    where its one reduction is a product no family takes alone, scheduling it apart only adds
    the kernels dlight would have fused into the product's (ViT's patch embedding, a strided
    convolution with its bias, cast and transpose: 155 us operator by operator, 48 whole; H100,
    ``bench/user_functions`` 203)."""
    reducing = [op for op in operators if op.reduces]
    if len(reducing) != 1 or not reducing[0].matmul or extent_variables(reducing[0].func):
        return False
    product = reducing[0].func
    for form in [product, *(m.func for t in _MATRIX_FORMS if (m := t(product)) is not None)]:
        try:
            plan(form, hw, target)
            return False
        except ClusterError:
            continue
    return True


def _narrowed_from_int64(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` indexed in int32 where it indexes in int64 over static extents (Relax's
    legalization) and every tensor it holds, parameter or not, fits int32 indices; else as it
    is (also where TVM's narrowing refuses it: an int64 value past 2^31 in its arithmetic)."""
    held = [*func.params, *find_all(func.body, tirx.Var, lambda v: isinstance(v.ty, BufferType))]
    shapes = [list(b.ty.shape) for b in held if isinstance(b.ty, BufferType)]
    if not (any(str(d.ty) == "int64" for shape in shapes for d in shape)
            and all(isinstance(d, tirx.IntImm) for shape in shapes for d in shape)
            and all(math.prod(int(d) for d in shape) < INT32_ELEMENTS for shape in shapes)):
        return func
    try:
        return narrow_indices(func)
    except tvm.error.InternalError:
        return func


#: The forms :func:`_as_matrices` tries a function in, and what each does to it.
_MATRIX_FORMS = {rows_as_matrix: "its tensors' leading axes merged into rows",
                 columns_as_one: "its reductions' trailing axes merged into one",
                 heads_apart: "its merged head axes split into heads and the head dim"}


def _as_matrices(func: tirx.PrimFunc, target, hw: Hardware | None, families: bool = True) -> s_tir.Schedule | None:
    """``func`` scheduled by a family (without ``families``: by dlight, which may take the
    matrices where it fails on the tensors) over matrices, its tensors' leading row axes merged
    (:mod:`tvm_dsm.transform.rows_as_matrix`) or, for a family, its reductions' trailing axes
    (:mod:`tvm_dsm.transform.columns_as_one`) or its merged head axes split
    (:mod:`tvm_dsm.transform.merged_heads`), called with its own tensors: the first of these
    forms that is taken; None where it has none or nothing takes them."""
    forms = list(_MATRIX_FORMS.items()) if families else [(rows_as_matrix, _MATRIX_FORMS[rows_as_matrix])]
    for transform, how in forms:
        matrices = transform(func)
        if matrices is None:
            continue
        try:
            scheduled = (schedule(matrices.func, target, hw=hw, stock_fallback=False) if families
                         else stock_schedule(matrices.func, target))
            wrapped = over_original_tensors(func, matrices, scheduled.mod["main"])
        except (ClusterError, ScheduleError) as err:
            LOG.info("as matrices (%s) %s takes it either: %s", how, "no family" if families else "dlight",
                     str(err).strip().splitlines()[-1])
            continue
        LOG.info("scheduled as matrices (%s) by %s", how, "a family" if families else "dlight")
        return s_tir.Schedule(wrapped, enable_check=False)
    return None


def schedule_operators(func: tirx.PrimFunc, target=H100, hw: Hardware | None = None) -> s_tir.Schedule:
    """``func``, holding two or more matmuls, scheduled one operator at a time (a family's
    schedule where one takes the operator, dlight's otherwise): what a function no family takes
    whole gets where dlight cannot schedule it either; ClusterError for any other function."""
    operators = _operators(func)
    if sum(op.matmul for op in operators) < 2:
        raise ClusterError("scheduling operator by operator is for functions of two or more matmuls")
    return _per_operator(func, operators, target, hw, True)


def operator_families(func: tirx.PrimFunc, target=H100, hw: Hardware | None = None) -> list[str]:
    """What :func:`schedule_operators` schedules each operator of ``func`` with, in order: a
    family's name (those of its ranges of rows, joined by "/"), or "dlight"."""
    def family(op) -> str | None:
        try:
            if extent_variables(op.func):
                kernels = range_kernels(narrow_indices(op.func), target, hw or load_hardware())
                return "/".join(dict.fromkeys(k.family.name for k in kernels))
            return plan(op.func, hw, target).family.name
        except ClusterError:
            return None

    for norms in (True, False):
        together = _operators(func, products_together=True, norms_together=norms)
        names = [family(op) for op in together]
        if not any(n is None for n, op in zip(names, together) if op.norm):
            break
    operators = _operators(func)
    if len(together) < len(operators) and any(n is None for n, op in zip(names, together) if op.products > 1):
        names = [family(op) for op in operators]
    return [n or "dlight" for n in names]


def _per_operator(func: tirx.PrimFunc, operators: list, target, hw: Hardware | None,
                  families: bool) -> s_tir.Schedule:
    """``func`` with each of its ``operators`` scheduled on its own: by :func:`schedule` (a
    family's, else the fallback), or by dlight alone without ``families``. With ``families``, a
    gated layer's two products are first one operator where a family takes them together (the
    gated split-K GEMM or row GEMV: one kernel, X read once, no product through global memory;
    a SwiGLU chain of 4 rows over 28672 x 8192 ran 479 us a product at a time against torch's
    338, bench/results/real_shapes), and a norm's statistics and normalization one operator
    where a family takes them together (the row norm's one kernel, where apart each statistic
    and the normalization is a kernel reading the rows again)."""
    if not families:
        return _merged(func, [stock_schedule(op.func, target) for op in operators])
    # the row norm's kernel is written over its operator narrowed to int32: narrowed first, an
    # int64-indexed function's operators share its tensors
    narrowed = _narrowed_from_int64(func)
    if narrowed is not func:
        func, operators = narrowed, _operators(narrowed)
    for norms in (True, False):
        together = _operators(func, products_together=True, norms_together=norms)
        if norms and not any(op.norm for op in together):
            continue
        scheduled, refused = {}, None
        for op in together:
            if op.products > 1 or op.norm:
                try:
                    scheduled[id(op)] = schedule(op.func, target, hw=hw, stock_fallback=False)
                except (ClusterError, ScheduleError, tvm.error.InternalError) as err:
                    refused = op, str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    break
        if refused is None:
            try:
                return _merged(func, [scheduled.get(id(op)) or schedule(op.func, target, hw=hw) for op in together])
            except tvm.error.InternalError as err:
                if not norms:
                    raise
                # the row norm's kernel is written over the operator narrowed to int32 indices:
                # its tensors are not the int64-indexed function's
                LOG.info("its norm's kernel does not merge into the function (%s): its statistics apart",
                         last_line(err))
                continue
        if refused[0].norm:
            LOG.info("no family takes its norm whole (%s): its statistics apart", refused[1])
            continue
        LOG.info("no family takes its gated products together (%s): each product alone", refused[1])
        break
    return _merged(func, [schedule(o.func, target, hw=hw) for o in operators])


def _operators(func: tirx.PrimFunc, products_together: bool = False, norms_together: bool = False) -> list:
    """``func``'s operators (:func:`split_operators`), none where it is not in that form."""
    try:
        return split_operators(func, products_together, norms_together)
    except ClusterError:
        return []


def _merged(func: tirx.PrimFunc, scheduled: list[s_tir.Schedule]) -> s_tir.Schedule:
    """``func`` with its operators replaced by their schedules (one per operator, in order)."""
    return s_tir.Schedule(merge_operators(func, [sch.mod["main"] for sch in scheduled]), enable_check=False)


def replay(trace: s_tir.Trace, func: tirx.PrimFunc) -> s_tir.Schedule:
    """``trace`` (a tuning record's) applied to ``func``. Replayed with s_tir's checks off, where
    MetaSchedule's ``query_schedule`` keeps them on: some unfused chains' traces schedule
    their second kernel where s_tir's region analysis cannot follow
    (:mod:`tvm_dsm.rules.unfused_chain`); every recorded trace passed those checks, or was
    built as that module explains, when ``tune`` scheduled it. (The schedule takes ``func``
    itself: one of ``func.with_attr(...)`` was measured to mutate ``func``'s body in place.)"""
    sch = s_tir.Schedule(func, enable_check=False)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def load_tvm_dsm() -> None:
    """Builder worker start: register tvm-dsm's pipeline and tensor intrinsics there too. A worker imports only TVM,
    which registers it through the installed entry point; from a source tree on PYTHONPATH (the
    GPU machine) nothing would, and cluster kernels would build with the stock pipeline."""
    import tvm_dsm  # noqa: F401

    register_all()


def _public(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` compiled alone as the module's packed function ``main``: a private one (Relax's
    legalized functions) given that symbol, as TVM's packed API needs one to take its buffers;
    its statement allocations the root block's (:func:`~tvm_dsm.ir.block_allocations`)."""
    func = block_allocations(func)
    return func if "global_symbol" in (func.attrs or {}) else func.with_attr("global_symbol", "main")


def _module(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def stock_schedule(func: tirx.PrimFunc, target=H100, tensor_cores: bool = True) -> s_tir.Schedule:
    """dlight's GPU rules (the schedules ``tvm.compile`` users get without tvm-dsm), for
    :func:`stock_target` (without ``tensor_cores``: for ``target`` itself, where dlight's rules
    keep to the CUDA cores); the module still compiles for ``target``."""
    with stock_target(target) if tensor_cores else tvm.target.Target(target):
        mod = stock_rules()(_module(func))
    return s_tir.Schedule(mod)


def _stock_fallback_rule(func: tirx.PrimFunc, target, reason: ClusterError, whole: str) -> s_tir.Schedule:
    """dlight's fallback rule alone (its other rules failed on the function with ``whole``: its
    matmul rule asserts on an epilogue over two columns of one product), else ClusterError with
    both reasons."""
    from tvm.s_tir import dlight as dl

    try:
        with stock_target(target):
            scheduled = s_tir.Schedule(dl.ApplyDefaultSchedule(dl.gpu.Fallback())(_module(func)))
    except (*DLIGHT_RULE_FAILURES, RuntimeError) as err:
        raise _unschedulable(reason, f"{whole}; its fallback rule alone: {last_line(err)}") from None
    LOG.info("dlight's rules fail on it (%s): its fallback rule alone", whole)
    return scheduled
