"""The split-K family inside MetaSchedule: a traced decision per configuration, replayable, and
scored by the analytical cost model."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_dsm
from conftest import cuda_source, named_alike
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.hardware import load_hardware
from tvm_dsm.meta_schedule import AnalyticalCostModel, SplitKReductionRule, candidate_configs
from tvm_dsm.meta_schedule.split_k_reduction import config_of
from tvm_dsm.planners.split_k import predict
from tvm_dsm.workloads import gemv
from tvm_dsm.workloads.dense import dense

M, K = 256, 16384


def _design_space():
    mod = tvm.IRModule({"main": gemv(M, K)})
    context = ms.TuneContext(
        mod=mod,
        target=tvm.target.Target("nvidia/nvidia-h100"),
        space_generator=ms.space_generator.PostOrderApply(
            sch_rules=[SplitKReductionRule()], postprocs=[], mutator_probs={}
        ),
        search_strategy=ms.search_strategy.ReplayTrace(),
        task_name="gemv",
    )
    (space,) = context.generate_design_space()
    return mod, context, space


def _replay(mod, trace, config_index: int) -> s_tir.Schedule:
    """Replay ``trace`` with the decisions that select candidate_configs(M, K)[config_index]."""
    size_inst, rows_inst = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
    n_rows = len(rows_inst.attrs[0])
    for inst, decision in ((size_inst, config_index // n_rows), (rows_inst, config_index % n_rows)):
        trace = trace.with_decision(inst, decision, True)
    sch = s_tir.Schedule(mod)
    trace.apply_to_schedule(sch, True)
    return sch


def test_every_decision_replays_to_its_configuration():
    mod, context, space = _design_space()
    configs = candidate_configs(M, K)
    assert len(configs) == 25  # clusters 1-16 x 1-16 rows per CTA, all valid for 256 x 16384
    for index in (0, 7, 13, len(configs) - 1):
        sch = _replay(mod, space.trace, index)
        assert config_of(sch.mod)[0] == configs[index]
        source = cuda_source(sch.mod)  # builds: the replayed decisions give a valid kernel
        assert "ld_shared__cluster" in source or configs[index].cluster_size == 1


def test_cost_model_ranks_candidates_by_the_analytical_model():
    mod, context, space = _design_space()
    configs = candidate_configs(M, K)
    candidates = [
        ms.MeasureCandidate(_replay(mod, space.trace, d), ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
        for d in range(len(configs))
    ]
    scores = AnalyticalCostModel().predict(context, candidates)
    hw = load_hardware()
    predicted = [predict(M, K, 4, 4 * K, c, hw).predicted_us for c in configs]
    assert int(scores.argmax()) == min(range(len(configs)), key=predicted.__getitem__)
    assert sorted(range(len(configs)), key=lambda i: -scores[i])[:5] == sorted(
        range(len(configs)), key=predicted.__getitem__
    )[:5]


def _planned_tuning(mod, work_dir: str, trials: int, top: int, builder=None, measure_callbacks="default"):
    """tune_tir over ``PlannedSpace(top)`` with the learned cost model, a scripted runner and
    the search tune_relax uses for such a space, in rounds of half the trials (building in this
    process unless another ``builder`` is given)."""
    from conftest import without_unnamed_meta_schedule_handlers
    from test_driver import InProcessBuilder, _ScriptedRunner

    from tvm_dsm.meta_schedule import LearnedPlanModel, PlannedSearch, PlannedSpace

    without_unnamed_meta_schedule_handlers()
    return ms.tir_integration.tune_tir(
        mod, target="nvidia/nvidia-h100", work_dir=work_dir, max_trials_global=trials,
        num_trials_per_iter=trials // 2, space=PlannedSpace(top=top), strategy=PlannedSearch(),
        cost_model=LearnedPlanModel(), builder=builder or InProcessBuilder(), runner=_ScriptedRunner(),
        measure_callbacks=measure_callbacks)


def test_the_search_measures_distinct_configurations_and_replays_every_one(tmp_path, caplog):
    """A dense layer's pruned space searched through MetaSchedule: every configuration a
    candidate (none refused by a postprocessor), every measured candidate a different one,
    each record building its configuration's kernels."""
    from tvm_dsm.meta_schedule.planned_space import plan_index, predicted_us
    func = dense(64, 512, 512)
    mod = tvm.IRModule({"main": func})
    with caplog.at_level("INFO", logger="tvm_dsm.meta_schedule.planned_space"):
        database = _planned_tuning(mod, str(tmp_path), trials=6, top=8)
    assert "8 of the planned space's 8 configurations to measure (0 measured before, 0 refused" in caplog.text
    records = database.get_all_tuning_records()
    candidates = [ms.database.TuningRecord.as_measure_candidate(r).sch for r in records]
    indices = [plan_index(sch) for sch in candidates]
    assert len(records) == 6 and len(set(indices)) == 6 and all(0 <= i < 8 for i in indices)
    plans = tvm_dsm.plan(func).plans
    fused = [p for p in plans if type(p.config).__name__ != "UnfusedChainConfig"]
    for sch, index in zip(candidates[:3], indices):
        expected = tvm_dsm.plan(func).schedule(plans.index(fused[index])).mod
        assert predicted_us(sch.mod) == fused[index].predicted_us
        assert cuda_source(sch.mod) == cuda_source(expected)


def test_the_search_ends_when_the_space_runs_out(tmp_path):
    """A space of 4 configurations under a budget of 16 trials: all 4 measured, then the task
    ends (MetaSchedule's evolutionary search alone repeats empty rounds until the budget is
    spent)."""
    database = _planned_tuning(tvm.IRModule({"main": dense(64, 512, 512)}), str(tmp_path), trials=16, top=4)
    assert len(database.get_all_tuning_records()) == 4
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert logs.count("sample(s) to builder") <= 2


def test_a_resumed_search_measures_only_what_the_database_lacks(tmp_path, caplog):
    """A second search into the same work directory (a run cut short, resumed) measures the
    configurations the first did not, none twice."""
    from tvm_dsm.meta_schedule.planned_space import plan_index

    mod = tvm.IRModule({"main": dense(64, 512, 512)})
    _planned_tuning(mod, str(tmp_path), trials=2, top=4)
    with caplog.at_level("INFO", logger="tvm_dsm.meta_schedule.planned_space"):
        database = _planned_tuning(mod, str(tmp_path), trials=4, top=4)
    assert "2 of the planned space's 4 configurations to measure (2 measured before" in caplog.text
    indices = [plan_index(ms.database.TuningRecord.as_measure_candidate(r).sch)
               for r in database.get_all_tuning_records()]
    assert sorted(indices) == list(range(4))


def test_the_mutator_moves_one_knob():
    from conftest import planned_candidate
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm_dsm.meta_schedule.planned_space import PlannedSpace, _knobs, plan_index

    mod = tvm.IRModule({"main": dense(128, 1024, 1024)})
    space = PlannedSpace(top=32)
    sch = planned_candidate(space, mod, 5)
    (mutator,) = space.mutator_probs
    configs = [p.config for p in space.plans.ranking.plans]
    moved = set()
    for seed in range(12):
        trace = _ffi_api.MutatorApply(mutator, sch.trace, seed)  # as the search calls it
        index = int(next(d for i, d in trace.decisions.items() if i.kind.name == "SampleCategorical"))
        before, after = _knobs(configs[5]), _knobs(configs[index])
        assert sum(before[k] != after[k] for k in before) == 1
        moved.add(index)
    assert len(moved) > 1 and plan_index(sch) == 5


@pytest.mark.parametrize("workload", ["attention", "rms_norm"])
def test_families_that_write_their_kernel_are_searched_and_their_records_build_it(tmp_path, workload):
    """A template family writes a new kernel function: MetaSchedule searches its planned space
    all the same (a candidate is the task's function with its configuration recorded, and
    tvm-dsm's pipeline writes the kernel when it is built), each record builds the kernel the
    family writes in that configuration, and tune_relax gives such a task the planned space."""
    from tvm_dsm.meta_schedule import PlannedSpace
    from tvm_dsm.meta_schedule.planned_space import plan_index
    from tvm_dsm.meta_schedule.relax_tuning import task_space
    from tvm_dsm.workloads.cascades import attention
    from tvm_dsm.workloads.norms import topi_norm

    func = attention(16, 1024, 1024, 64, True) if workload == "attention" else topi_norm("rms_norm", 32, 8192, "float16")
    ranking = tvm_dsm.plan(func)
    assert not ranking.family.traced
    top = min(3, len(ranking.plans))
    database = _planned_tuning(tvm.IRModule({"main": func}), str(tmp_path), trials=2 * top, top=top)
    records = database.get_all_tuning_records()
    candidates = [ms.database.TuningRecord.as_measure_candidate(r).sch for r in records]
    indices = sorted(plan_index(sch) for sch in candidates)
    assert indices == list(range(top))
    for sch in candidates[:2]:
        assert named_alike(cuda_source(sch.mod)) == named_alike(cuda_source(ranking.schedule(plan_index(sch)).mod))
    target = tvm.target.Target("nvidia/nvidia-h100")
    assert isinstance(task_space(workload, func, target, 4, load_hardware()), PlannedSpace)


def test_the_lowered_kernels_are_checked_against_the_targets_limits():
    """Every candidate's kernels, as tvm-dsm lowers them, go through TVM's GPU-code check: a
    target allowing 32 threads a block refuses the dense layer's kernels (at least a warp group
    each), the H100's takes them."""
    mod = tvm.IRModule({"main": dense(64, 512, 512)})
    narrow = {"kind": "cuda", "arch": "sm_90a", "max_threads_per_block": 32, "max_num_threads": 32,
              "thread_warp_size": 32, "max_shared_memory_per_block": 49152}
    for target, accepted in ((narrow, False), ("nvidia/nvidia-h100", True)):
        verdicts = _postproc_verdicts(mod, target, top=4)
        assert all(v[0] and all(v[:-1]) and v[-1] == accepted for v in verdicts)


def _postproc_verdicts(mod, target, top: int) -> list[list[bool]]:
    """For each configuration of ``mod``'s planned space, what each postprocessor said."""
    from conftest import planned_candidates
    from tvm_dsm.meta_schedule import PlannedSpace

    return [verdicts for _, verdicts in planned_candidates(PlannedSpace(top=top), mod, target=target)]


def test_no_planned_configuration_is_refused_by_the_checks():
    """The planner's first 64 configurations of a dense layer whose first pick overlays its
    fp32 partials on the operand pipeline's shared memory: all pass every postprocessor
    (MetaSchedule's VerifyGPUCode, lowering without tvm-dsm's passes, refused 8 of them)."""
    mod = tvm.IRModule({"main": dense(1024, 1152, 896)})
    verdicts = _postproc_verdicts(mod, "nvidia/nvidia-h100", top=64)
    assert len(verdicts) == 64 and all(all(v) for v in verdicts)


def test_a_chain_space_holds_its_unfused_plans_that_s_tir_checks():
    """A SwiGLU chain's planned space: its unfused plans (two GEMM kernels, the usual pick at
    M = 128) are in it where s_tir's checks let them be scheduled, and a candidate sampling one
    builds the kernels of that plan; those the checks refuse are left out, none dropped later."""
    from conftest import planned_candidate
    from tvm_dsm.meta_schedule.planned_space import PlannedSpace
    from tvm_dsm.rules.unfused_chain import UnfusedChainConfig
    from tvm_dsm.workloads.chains import swiglu_ffn

    func = swiglu_ffn(128, 1024, 512, 512)
    ranking = tvm_dsm.plan(func)
    mod = tvm.IRModule({"main": func})
    space = PlannedSpace(top=40)
    sch = planned_candidate(space, mod, 0)
    kept = space.plans.ranking.plans
    unfused = [i for i, p in enumerate(kept) if isinstance(p.config, UnfusedChainConfig)]
    assert unfused and len(unfused) < len(kept)
    first = kept[unfused[0]]
    if unfused[0] != 0:
        sch = planned_candidate(space, mod, unfused[0])
    assert cuda_source(sch.mod) == cuda_source(ranking.schedule(ranking.plans.index(first)).mod)
    # every unfused plan ranked above the space's last one is in it, or refused by s_tir's checks
    left_out = [p for p in ranking.plans[:ranking.plans.index(kept[-1])] if p not in kept]
    assert all(isinstance(p.config, UnfusedChainConfig) and p.config.gemm0.cluster_size > 1 for p in left_out)


def test_progress_counts_every_trial_and_reports_a_tasks_first_failure_once(tmp_path, caplog):
    """A tuning run whose builds all fail: the progress bar reaches the trial count and the log
    has one line naming the task, the stage and the error's last line."""
    from tvm.ir.utils import derived_object

    from tvm_dsm.meta_schedule.progress import TuningProgress

    @derived_object
    class NoCompiler(ms.builder.PyBuilder):
        def build(self, build_inputs):
            return [ms.builder.BuilderResult(None, "Traceback ...\nRuntimeError: nvcc not found") for _ in build_inputs]

    progress = TuningProgress(total=6, disable=True)
    caplog.set_level("WARNING", logger="tvm_dsm.meta_schedule.progress")
    _planned_tuning(tvm.IRModule({"main": dense(64, 512, 512)}), str(tmp_path), trials=6, top=8, builder=NoCompiler(),
                    measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), progress])
    assert progress.trials == 6 and progress.failed == 6
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "task 0: a candidate failed to build: RuntimeError: nvcc not found"
