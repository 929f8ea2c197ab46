"""Any tvm-dsm schedule family inside MetaSchedule: its pruned configuration space as a decision
MetaSchedule samples, mutates and records; its analytical model as the cost model.

The analytical model prunes first: the planner's ``top`` valid configurations of the family that
takes the task's function (:mod:`tvm_dsm.families`). The design space is then the function with
one ``sample_categorical`` over those configurations (weighted by predicted time);
:class:`ApplyPlannedConfig`, its postprocessor, schedules the function in the sampled
configuration, and
:class:`MutatePlannedConfig` moves a measured candidate to a configuration one knob away. Every
value of the decision is a configuration the planner validated, so the search cannot build an
invalid combination of coupled knobs (tiles, stages and cluster size share the shared memory);
one configuration the lowering still refuses is a failed postprocessor, reported as such.

One categorical decision rather than one per knob: the knobs are coupled (a tile size decides
which stage counts and cluster sizes fit), so most of a free product of per-knob decisions is
invalid, and rejecting it after sampling starves the search. The mutator gives the per-knob
moves: neighbours differ in one knob, nested ones (a chain's two GEMMs) included, for
MetaSchedule's evolutionary search; :class:`PlannedSearch`, the search tvm-dsm runs over the
space, scores every configuration each round instead (the space is small and enumerable).

A family that writes a new kernel function (attention, decode attention, row norms, fused
cascades: templates and rewrites) has no schedule trace of the task's function; its candidates
are the function marked with the sampled configuration, MetaSchedule's CUDA postprocessors pass
them untouched, and tvm-dsm's pipeline writes the kernel when the candidate is built
(:mod:`tvm_dsm.transform.generate_kernels`).

A GEMM chain's unfused plans (two split-K GEMM kernels, :mod:`tvm_dsm.rules.unfused_chain`) are
in the space where s_tir's checks let their schedule be made, since MetaSchedule creates every
candidate's schedule with them on: every unfused plan whose first GEMM runs on one CTA per
output tile, the usual pick. The others (a first GEMM split over a cluster) are left out;
:func:`tvm_dsm.tune` measures them with MetaSchedule's builder and runner and records them in
its database, and :func:`tvm_dsm.build` replays them.

Each candidate carries its configuration (:mod:`~tvm_dsm.meta_schedule.candidate_config`) and
its predicted time as root-block annotations: :class:`PlanCostModel` scores by the prediction,
:class:`~tvm_dsm.meta_schedule.PlanFeatureExtractor` reads the configuration.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tvm
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule.schedule import ScheduleError

from ..annotations import GENERATED_BY_KEY, PLAN_INDEX_KEY, PREDICTED_US_KEY
from ..driver import Ranking, plan
from ..errors import ClusterError
from ..hardware import Hardware, load_hardware
from ..intrin import import_tvm_intrinsics
from ..rules.unfused_chain import UnfusedChainConfig
from ..transform.generate_kernels import mark_generated
from .candidate_config import annotate_config
from .cost_model import AnalyticalScores
from .verify_kernels import VerifyLoweredKernels

logger = logging.getLogger(__name__)

#: How sharply the design space's decision favours the best predicted configurations: a
#: configuration predicted ``r`` times slower than the best is sampled ``r**-SHARPNESS`` as often.
SHARPNESS = 4.0


#: MetaSchedule's CUDA postprocessors, applied after the configuration is scheduled (on tvm-dsm's
#: schedules the rewrites find nothing to do: the kernels' CUDA is unchanged); then
#: :class:`~tvm_dsm.meta_schedule.verify_kernels.VerifyLoweredKernels`, VerifyGPUCode's check on
#: the kernels tvm-dsm's lowering makes.
CUDA_POSTPROCS = (ms.postproc.DisallowDynamicLoop, ms.postproc.RewriteCooperativeFetch,
                  ms.postproc.RewriteUnboundBlock, ms.postproc.RewriteParallelVectorizeUnroll,
                  ms.postproc.RewriteReductionBlock)


class _Plans:
    """The pruned ranking of the task a :class:`PlannedSpace` generated its design space for,
    shared with its postprocessor and mutator: each configuration's schedule trace (made on first
    use, then replayed onto every candidate that samples it) and its one-knob neighbours."""

    def __init__(self, top: int, hw: Hardware):
        self.top, self.hw = top, hw
        self.ranking: Ranking | None = None
        self.neighbours: list[list[int]] = []
        self._traces: dict[int, s_tir.Trace] = {}

    def plan(self, mod: tvm.IRModule) -> Ranking:
        # A copy: s_tir may edit in place a function a schedule under MetaSchedule also holds.
        ranking = plan(tvm.ir.load_json(tvm.ir.save_json(mod["main"])), self.hw)
        kept, self._traces = [], {}
        for rank, p in enumerate(ranking.plans):
            if len(kept) == self.top:
                break
            if isinstance(p.config, UnfusedChainConfig):  # scheduled now: kept if s_tir's checks held
                try:
                    sch = ranking.schedule(rank)
                except (ClusterError, ScheduleError):
                    continue
                if not sch.state.enable_check:
                    continue
                self._traces[len(kept)] = sch.trace
            kept.append(p)
        self.ranking = dataclasses.replace(ranking, plans=kept)
        self.neighbours = neighbours([p.config for p in kept])
        return self.ranking

    def trace(self, index: int) -> s_tir.Trace:
        """The schedule trace of configuration ``index`` (ClusterError or ScheduleError where
        the family refuses it)."""
        if index not in self._traces:
            self._traces[index] = self.ranking.schedule(index).trace
        return self._traces[index]


def _root(sch: s_tir.Schedule):
    return sch.get(sch.get_sblock("root"))


@derived_object
class PlannedSpace(ms.space_generator.PySpaceGenerator):
    """The design space of a task: its function with the sampled plan index (ClusterError if no
    family applies, or one that writes a new kernel function). Its postprocessors are
    :class:`ApplyPlannedConfig`, MetaSchedule's CUDA ones (:data:`CUDA_POSTPROCS`), then
    :class:`~tvm_dsm.meta_schedule.verify_kernels.VerifyLoweredKernels`; its mutator
    :class:`MutatePlannedConfig`."""

    def __init__(self, top: int = 64, hw: Hardware | None = None):
        super().__init__()
        import_tvm_intrinsics()  # before the TuneContext this space is made for imports them slowly
        self.top, self.hw = top, hw or load_hardware()
        self.plans = _Plans(top, self.hw)
        self.sch_rules = []
        self.postprocs = [ApplyPlannedConfig(self.plans), *(OnScheduledKernels(make()) for make in CUDA_POSTPROCS),
                          VerifyLoweredKernels(self.hw)]
        self.mutator_probs = {MutatePlannedConfig(self.plans): 1.0}

    def _initialize_with_tune_context(self, context) -> None:  # noqa: D401 - MetaSchedule hook
        # MetaSchedule leaves a Python space generator's postprocessors and mutators to it. They
        # see the target with the GPU's opt-in shared memory per CTA: a target tag states the
        # default 48 KB, which would refuse every deeper pipeline.
        target = tvm.target.Target({**context.target.export(), "max_shared_memory_per_block": self.hw.smem_per_cta})
        limits = ms.TuneContext(mod=context.mod, target=target, task_name=context.task_name)
        for part in (*self.postprocs, *self.mutator_probs):
            part._initialize_with_tune_context(limits)

    def generate_design_space(self, mod: tvm.IRModule) -> list[s_tir.Schedule]:
        predicted = [p.predicted_us for p in self.plans.plan(mod).plans]
        weights = [(min(predicted) / t) ** SHARPNESS for t in predicted]
        probs = [w / sum(weights) for w in weights]
        sch = s_tir.Schedule(mod)
        index = sch.sample_categorical(list(range(len(probs))), probs)
        # On a leaf block: the decision needs a use to stay in the trace, and a root annotation
        # before the schedule's splits makes s_tir edit the task's own function in place.
        sch.annotate(sch.get_child_blocks(sch.get_sblock("root"))[-1], PLAN_INDEX_KEY, index)
        return [sch]

    def clone(self) -> "PlannedSpace":
        return PlannedSpace(self.top, self.hw)


@derived_object
class OnScheduledKernels(ms.postproc.PyPostproc):
    """``postproc`` (one of MetaSchedule's) on candidates scheduled as traces; a candidate whose
    kernel a family writes when it is lowered passes untouched (its function is replaced whole,
    and the family recognizes it only as written)."""

    def __init__(self, postproc: ms.postproc.Postproc):
        super().__init__()
        self.postproc = postproc

    def _initialize_with_tune_context(self, context) -> None:
        self.postproc._initialize_with_tune_context(context)

    def apply(self, sch: s_tir.Schedule) -> bool:
        return GENERATED_BY_KEY in _root(sch).annotations or self.postproc.apply(sch)

    def clone(self) -> "OnScheduledKernels":
        return OnScheduledKernels(self.postproc.clone())


def _plan_sample(trace: s_tir.Trace):
    """The design space's ``sample_categorical`` instruction in ``trace``, or None."""
    annotated = next((inst for inst in trace.insts if inst.kind.name == "Annotate"
                      and str(inst.attrs[0]) == PLAN_INDEX_KEY), None)
    if annotated is None:
        return None
    return next(inst for inst in trace.insts if inst.kind.name == "SampleCategorical"
                and inst.outputs[0].same_as(annotated.inputs[1]))


@derived_object
class PlannedSearch(ms.search_strategy.PySearchStrategy):
    """The search of a :class:`PlannedSpace`: every configuration of the pruned space made into
    a candidate once (its trace with that decision, then the space's postprocessors; those they
    refuse dropped), and each round the ``num_trials_per_iter`` unmeasured ones the cost model
    scores best. The space is small and enumerable (the planner's ``top``), so scoring all of
    it each round finds what an evolutionary search over it would, without replaying thousands
    of traces; a round with nothing left to measure ends the task (MetaSchedule's task scheduler
    would otherwise repeat empty rounds until the trial budget is spent). Configurations the
    database already measured for the task (a resumed run) are not measured again.

    This is the search :mod:`tvm_dsm.bench.search_quality` simulates over measured pools: the
    first round in the analytical model's order, each later one the best by the model refitted
    on what was measured."""

    def __init__(self):
        super().__init__()
        self.context = None
        self._reset()

    def _reset(self) -> None:
        self.candidates: list[ms.MeasureCandidate] = []
        self.measured: set[int] = set()  # positions in self.candidates
        self.trials_left = 0
        self.per_round = 0
        self.cost_model = None

    def _initialize_with_tune_context(self, context) -> None:
        self.context = context

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self._reset()
        self.trials_left, self.per_round, self.cost_model = max_trials, num_trials_per_iter, cost_model
        (design,) = design_spaces
        sample = _plan_sample(design.trace)
        postprocs = self.context.space_generator.postprocs
        args_info = ms.arg_info.ArgInfo.from_entry_func(self.context.mod, remove_preproc=True)
        done = _measured_indices(database, self.context.mod)
        points = len(sample.attrs[0]) if sample is not None else 0
        for index in range(points):
            if index in done:
                continue
            sch = s_tir.Schedule(self.context.mod)
            design.trace.with_decision(sample, index, True).apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            if all(postproc.apply(sch) for postproc in postprocs):
                self.candidates.append(ms.MeasureCandidate(sch, args_info))
        logger.info("task %s: %d of the planned space's %d configurations to measure (%d measured before, "
                    "%d refused by a postprocessor)", self.context.task_name, len(self.candidates), points,
                    len(done), points - len(done) - len(self.candidates))

    def post_tuning(self) -> None:
        self._reset()

    def generate_measure_candidates(self):
        left = [i for i in range(len(self.candidates)) if i not in self.measured]
        count = min(self.per_round, self.trials_left, len(left))
        if count <= 0:
            return None
        if self.cost_model is not None:
            scores = np.asarray(self.cost_model.predict(self.context, [self.candidates[i] for i in left]))
            left = [left[i] for i in np.argsort(-scores, kind="stable")]
        chosen = left[:count]
        self.measured.update(chosen)
        self.trials_left -= count
        return [self.candidates[i] for i in chosen]

    def notify_runner_results(self, measure_candidates, results) -> None:
        pass  # the task scheduler's measure callbacks update the cost model and the database

    def clone(self) -> "PlannedSearch":
        return PlannedSearch()


def _measured_indices(database: ms.Database | None, mod: tvm.IRModule) -> set[int]:
    """The plan indices ``database`` holds measurements of for ``mod``."""
    if database is None or not database.has_workload(mod):
        return set()
    workload = database.commit_workload(mod)
    records = database.get_top_k(workload, 1 << 30)
    return {i for r in records if (i := plan_index(ms.database.TuningRecord.as_measure_candidate(r).sch)) is not None}


def plan_index(sch: s_tir.Schedule) -> int | None:
    """The plan index the design space sampled for ``sch``, or None outside a PlannedSpace."""
    sample = _plan_sample(sch.trace)
    return None if sample is None else int(sch.trace.decisions[sample])


@derived_object
class ApplyPlannedConfig(ms.postproc.PyPostproc):
    """Schedules a candidate in the configuration its plan index names (the family's own
    schedule's trace replayed onto it) and annotates the index, the configuration and its
    prediction on the root block. False (an invalid candidate) where s_tir or the family
    refuses it. A family that writes a new kernel function instead is named on the root block
    (``GENERATED_BY_KEY``): tvm-dsm's pipeline writes that kernel in the recorded configuration
    when the candidate is built (:mod:`tvm_dsm.transform.generate_kernels`)."""

    def __init__(self, plans: _Plans):
        super().__init__()
        self.plans = plans

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: s_tir.Schedule) -> bool:
        sample = _plan_sample(sch.trace)
        if sample is None or PREDICTED_US_KEY in _root(sch).annotations:
            return sample is not None  # already applied (a replayed record)
        index = int(sch.trace.decisions[sample])
        chosen = self.plans.ranking.plans[index]
        family = self.plans.ranking.family
        if family.traced:
            try:
                self.plans.trace(index).apply_to_schedule(sch, remove_postproc=False)
            except (ClusterError, ScheduleError, tvm.error.InternalError):
                return False
            annotate_config(sch, chosen.config)
        else:  # tvm-dsm's pipeline writes the family's kernel when it lowers the function
            mark_generated(sch, family.name, chosen.config)
        root = sch.get_sblock("root")
        sch.annotate(root, PLAN_INDEX_KEY, sample.outputs[0])
        sch.annotate(root, PREDICTED_US_KEY, float(chosen.predicted_us))
        return True

    def clone(self) -> "ApplyPlannedConfig":
        return ApplyPlannedConfig(self.plans)


def _knobs(config, prefix: str = "") -> dict[str, object]:
    """A configuration's knobs by name, nested configurations' under ``outer.inner``."""
    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            out.update(_knobs(value, f"{prefix}{field.name}."))
        else:
            out[prefix + field.name] = value
    return out


def neighbours(configs: list) -> list[list[int]]:
    """For each configuration, the others of its type that differ from it in one knob."""
    knobs = [(type(c), _knobs(c)) for c in configs]
    out = []
    for kind, mine in knobs:
        out.append([j for j, (other_kind, theirs) in enumerate(knobs) if other_kind is kind
                    and sum(mine[name] != theirs[name] for name in mine) == 1])
    return out


@derived_object
class MutatePlannedConfig(ms.mutator.PyMutator):
    """Moves a candidate's plan index to a configuration one knob away (any other where it has
    none)."""

    def __init__(self, plans: _Plans):
        super().__init__()
        self.plans = plans

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace: s_tir.Trace, rand_state: int) -> s_tir.Trace | None:
        sample = _plan_sample(trace)
        if sample is None:
            return None
        near = self.plans.neighbours
        current = int(trace.decisions[sample])
        choices = near[current] or [i for i in range(len(near)) if i != current]
        if not choices:
            return None
        rng = np.random.default_rng(rand_state & 0xFFFFFFFF)
        return trace.with_decision(sample, int(rng.choice(choices)), remove_postproc=True)

    def clone(self) -> "MutatePlannedConfig":
        return MutatePlannedConfig(self.plans)


def predicted_us(mod: tvm.IRModule) -> float:
    """The prediction a :class:`PlannedSpace` candidate carries."""
    root = mod["main"].body.block
    return float(root.annotations[PREDICTED_US_KEY])


@derived_object
class PlanCostModel(AnalyticalScores):
    """Scores a :class:`PlannedSpace` candidate by the prediction it carries."""

    def predicted_us(self, mod: tvm.IRModule) -> float:
        return predicted_us(mod)
