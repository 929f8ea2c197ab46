"""The split-K family inside MetaSchedule: a traced decision per configuration, replayable, and
scored by the analytical cost model."""

from __future__ import annotations

import numpy as np
import tvm
from conftest import cuda_source
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.hardware import load_hardware
from tvm_dsm.meta_schedule import AnalyticalCostModel, SplitKReductionRule, candidate_configs
from tvm_dsm.meta_schedule.split_k_reduction import config_of
from tvm_dsm.planners.split_k import predict
from tvm_dsm.workloads import gemv

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


def test_planned_space_tunes_a_fused_chain_through_tune_tir(tmp_path):
    """Any family's pruned space inside MetaSchedule's own tuning loop: distinct top-predicted
    schedules measured (a scripted runner here) and recorded; the cost model follows the plan."""
    from test_driver import CHAIN, InProcessBuilder, _ScriptedRunner

    from tvm_dsm.meta_schedule import PlanCostModel, PlannedSpace
    from tvm_dsm.meta_schedule.planned_space import predicted_us
    from tvm_dsm.workloads.chains import gemm_chain

    mod = tvm.IRModule({"main": gemm_chain(*CHAIN, "relu")})
    spaces = PlannedSpace(top=4).generate_design_space(mod)
    predictions = [predicted_us(s.mod) for s in spaces]
    assert predictions == sorted(predictions) and len(spaces) == 4
    context = ms.TuneContext(mod=mod, target=tvm.target.Target("nvidia/nvidia-h100"), task_name="chain")
    scores = PlanCostModel().predict(context, [ms.MeasureCandidate(s, []) for s in spaces])
    assert list(np.argsort(-scores)) == [0, 1, 2, 3]
    database = ms.tir_integration.tune_tir(
        mod, target={"kind": "cuda", "arch": "sm_90a"}, work_dir=str(tmp_path),
        max_trials_global=4, num_trials_per_iter=4, space=PlannedSpace(top=4),
        strategy="evolutionary", cost_model=PlanCostModel(), builder=InProcessBuilder(),
        runner=_ScriptedRunner())
    records = database.get_all_tuning_records()
    measured = {predicted_us(ms.database.TuningRecord.as_measure_candidate(r).sch.mod) for r in records}
    assert measured == set(predictions)
