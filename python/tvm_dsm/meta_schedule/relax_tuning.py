"""Tuning a Relax model's tasks with MetaSchedule, every task in a design space that has one:
a task a tvm-dsm family takes in :class:`~tvm_dsm.meta_schedule.PlannedSpace`, any other
(softmax, a transpose, ...) in TVM's default CUDA design space, with one log line saying why.
MetaSchedule's own ``tune_relax`` takes one space for every task, so ``PlannedSpace`` alone would
abort on the first task no family covers. The tasks are the functions the "tvm_dsm" pipeline
compiles, in the form it looks their records up by, so a model compiled with
``relax.get_pipeline("tvm_dsm", database=...)`` uses what tuning found."""

from __future__ import annotations

import logging

import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from ..device import gpu_or_reason
from ..driver import BUILD_TIMEOUT_S, family_form, load_tvm_dsm, plan, row_range_tasks
from ..errors import ClusterError
from ..families import match_family
from ..ir import row_variable
from ..hardware import Hardware, load_hardware
from ..intrin import import_tvm_intrinsics
from ..local_measure import local_builder, local_runner
from ..relax_integration import scheduling_form
from ..relax_pipeline import DEFAULT_KV_CACHE_KERNELS, lower_for_scheduling
from ..tuning_database import open_database
from .learned_cost_model import LearnedPlanModel
from .planned_space import PlannedSearch, PlannedSpace
from .progress import TuningProgress

logger = logging.getLogger(__name__)

#: The GPU target tuning defaults to: MetaSchedule's CUDA rules read its shared-memory and
#: thread limits.
H100_TAG = "nvidia/nvidia-h100"
#: TVM's default design space for the target's kind (its CUDA schedule rules, postprocessors
#: and mutators).
DEFAULT_SPACE = "post-order-apply"


def task_space(name: str, func: tvm.tirx.PrimFunc, target: tvm.target.Target, top: int,
               hw: Hardware) -> ms.SpaceGenerator | str:
    """``PlannedSpace`` where a tvm-dsm family takes ``func``, else TVM's
    default space (logged)."""
    try:
        match_family(func, target)
    except ClusterError as err:
        logger.info("task %s: no tvm-dsm space (%s); TVM's default CUDA design space",
                    name, " ".join(str(err).split()))
        return DEFAULT_SPACE
    return PlannedSpace(top, hw)


def tuning_tasks(mod: tvm.IRModule, target: tvm.target.Target, hw: Hardware, params=None,
                 kv_cache_kernels: tuple[str, ...] = DEFAULT_KV_CACHE_KERNELS,
                 rows: tuple[int, ...] | None = None) -> list[ms.ExtractedTask]:
    """The tasks of ``mod`` as the "tvm_dsm" pipeline compiles it (:func:`lower_for_scheduling`),
    each function in the form :class:`~tvm_dsm.relax_integration.ScheduleTIR` looks its record
    up by (where a family takes it, the form of :func:`scheduling_form` it takes:
    :func:`~tvm_dsm.driver.family_form`, matmuls accumulating in fp32 where written in 16 bits); a
    function of a symbolic row count
    as one task per range of rows, at the range's row count (:func:`row_range_tasks`, named
    ``NAME_rowsR``; ``rows``: only the ranges planned for those row counts, e.g. ``(16,)`` for
    decode batches); not the functions that arrive scheduled, reshapes (Relax makes them views:
    no kernel runs), functions of other symbolic extents, nor those a family takes and then
    declines (a chain whose GEMMs run faster apart, which build schedules a kernel per operator:
    a record of the chain would bring it back), each left out with a log line."""
    if params:
        mod = relax.transform.BindParams("main", params)(mod)
    mod = lower_for_scheduling(mod, target, hw, kv_cache_kernels)
    ranges, untuned = [], set()  # the functions MetaSchedule does not measure as they are
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
            continue
        form = scheduling_form(func)
        try:
            var = row_variable(func)
        except ClusterError as err:
            logger.info("task %s: not tuned (%s)", gv.name_hint, err)
            untuned.add(gv.name_hint)
            continue
        if var is not None:  # a task needs constant extents: the ranges of rows are the tasks
            ranges += _range_tasks(gv.name_hint, form, target, rows)
            untuned.add(gv.name_hint)
            continue
        try:
            form, _ = family_form(form, target)
        except ClusterError:
            continue
        mod[gv] = form
        try:
            plan(form, hw, target)
        except ClusterError as err:  # taken, then declined (a chain built as its GEMMs apart)
            logger.info("task %s: not tuned; build schedules it without its family (%s)",
                        gv.name_hint, str(err).strip().splitlines()[0])
            untuned.add(gv.name_hint)
    tasks = []
    for task in ms.relax_integration.extract_tasks(mod, target):
        func = task.dispatched[0]["main"]
        if func.attrs.get("tirx.is_scheduled", False):
            logger.info("task %s: arrives scheduled; not tuned", task.task_name)
        elif relax.analysis.has_reshape_pattern(func):
            logger.info("task %s: a reshape, which Relax makes a view (no kernel); not tuned", task.task_name)
        elif task.task_name not in untuned:
            tasks.append(task)
    return tasks + ranges


def _range_tasks(name: str, func: tvm.tirx.PrimFunc, target: tvm.target.Target,
                 only: tuple[int, ...] | None) -> list[ms.ExtractedTask]:
    """A task per range of rows of ``func`` (of those planned for ``only``'s row counts, if
    given) that a family schedules over a symbolic row count."""
    tasks = []
    for rows, fixed in row_range_tasks(func):
        if only is not None and rows not in only:
            continue
        try:
            fixed, family = family_form(fixed, target)
        except ClusterError as err:
            logger.info("task %s at %d rows: no tvm-dsm family (%s); not tuned", name, rows, err)
            continue
        if family.symbolic_rows:
            fixed_mod = tvm.IRModule({"main": fixed.with_attr("global_symbol", "main")})
            tasks.append(ms.ExtractedTask(f"{name}_rows{rows}", fixed_mod, target, [fixed_mod], 1))
    return tasks


def tuning_contexts(mod: tvm.IRModule, work_dir: str, target=H100_TAG, params=None, top: int = 64,
                    hw: Hardware | None = None, seed: int | None = None, rows: tuple[int, ...] | None = None,
                    tasks: list[ms.ExtractedTask] | None = None) -> tuple[list[ms.TuneContext], list[float]]:
    """The tuning contexts of ``mod``'s tasks (:func:`tuning_tasks`, unless the caller has them
    as ``tasks``) and their weights, each with its space and search
    (:class:`~tvm_dsm.meta_schedule.PlannedSearch` for a planned space, MetaSchedule's
    evolutionary search otherwise)."""
    target, hw = tvm.target.Target(target), hw or load_hardware()
    import_tvm_intrinsics()  # before the first TuneContext imports them, slowly from a deep stack
    contexts, weights = [], []
    for task in tasks if tasks is not None else tuning_tasks(mod, target, hw, params, rows=rows):
        space = task_space(task.task_name, task.dispatched[0]["main"], target, top, hw)
        strategy = "evolutionary" if space == DEFAULT_SPACE else PlannedSearch()
        made, weight = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [task], work_dir, space=space, strategy=strategy, seed=seed)
        contexts += made
        weights += weight
    return contexts, weights


def tune_relax(mod: tvm.IRModule, work_dir: str, max_trials_global: int, *, target=H100_TAG,
               params=None, top: int = 64, hw: Hardware | None = None, builder: ms.Builder | None = None,
               runner: ms.Runner | None = None,
               cost_model: ms.CostModel | None = None, num_trials_per_iter: int = 64,
               seed: int | None = None, rows: tuple[int, ...] | None = None,
               tasks: list[ms.ExtractedTask] | None = None) -> ms.Database:
    """Tune every task of ``mod`` (see :func:`tuning_contexts`; ``rows``: of a function over a
    symbolic row count, only the ranges planned for those counts; ``tasks``: the
    :func:`tuning_tasks` of ``mod`` where the caller has them already) with the learned cost model
    (:class:`~tvm_dsm.meta_schedule.LearnedPlanModel`) unless another is given, into the JSON
    database in ``work_dir`` (:func:`~tvm_dsm.tuning_database.open_database`: a run killed
    mid-write resumes from it), showing a progress bar and each task's first failure
    (:class:`~tvm_dsm.meta_schedule.progress.TuningProgress`); returns the database.
    ``builder`` and ``runner`` default to MetaSchedule's local ones as
    :mod:`tvm_dsm.local_measure` sets them up."""
    if runner is None and (reason := gpu_or_reason()):
        raise RuntimeError(f"tune_relax measures on this machine's GPU: {reason} (pass runner=, e.g. "
                           "MetaSchedule's RPCRunner, to measure elsewhere)")
    hw = hw or load_hardware()
    contexts, weights = tuning_contexts(mod, work_dir, target, params, top, hw, seed=seed, rows=rows, tasks=tasks)
    database = ms.tune.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                              max_trials_global=max_trials_global, num_trials_per_iter=num_trials_per_iter,
                              builder=builder or local_builder(BUILD_TIMEOUT_S, load_tvm_dsm),
                              runner=runner or local_runner(load_tvm_dsm), database=open_database(work_dir),
                              cost_model=cost_model or LearnedPlanModel(hw),
                              measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"),
                                                 TuningProgress(max_trials_global)])
    logger.info("tuned %d tasks into %s:\n%s", len(contexts), work_dir, task_table(contexts, database))
    return database


#: MetaSchedule records a failed measurement with this many seconds (or more).
_FAILED_SECONDS = 1e9


def task_table(contexts: list[ms.TuneContext], database: ms.Database) -> str:
    """One line per task: its design space (tvm-dsm's or TVM's default), the valid measurements
    the database holds for it and the best time (``-``: none)."""
    lines = [f"{'task':40s} {'space':8s} {'valid':>8s} {'best us':>9s}"]
    for context in contexts:
        space = "default" if isinstance(context.space_generator, ms.space_generator.PostOrderApply) else "tvm-dsm"
        workload = database.commit_workload(context.mod) if database.has_workload(context.mod) else None
        times = [sum(secs) / len(secs) for r in database.get_all_tuning_records()
                 if workload is not None and r.workload.same_as(workload) and r.run_secs
                 and max(secs := [float(t) for t in r.run_secs]) < _FAILED_SECONDS]
        best = f"{min(times) * 1e6:9.1f}" if times else f"{'-':>9s}"
        lines.append(f"{context.task_name[:40]:40s} {space:8s} {len(times):8d} {best}")
    return "\n".join(lines)
