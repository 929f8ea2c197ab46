"""The learned cost model's features and XGBoost ranking (CPU only)."""

from __future__ import annotations

import numpy as np
import tvm
from scipy.stats import spearmanr
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.hardware import load_hardware
from tvm_dsm.families import match_family
from tvm_dsm.meta_schedule import FEATURE_NAMES, PlanFeatureExtractor, PlannedSpace, plan_xgb_model
from tvm_dsm.meta_schedule.candidate_config import annotate_config
from tvm_dsm.workloads.cascades import attention
from tvm_dsm.workloads.dense import dense
from tvm_dsm.workloads.reductions import row_sum


def Task(func) -> ms.TuneContext:
    return ms.TuneContext(tvm.IRModule({"main": func}), target=tvm.target.Target("nvidia/nvidia-h100"))


def _candidates(func, configs):
    out = []
    for config in configs:
        sch = s_tir.Schedule(func)
        annotate_config(sch, config)
        out.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(func)))
    return out


def test_features_are_finite_and_of_one_length_for_three_families():
    hw, extractor = load_hardware(), PlanFeatureExtractor()
    seen = set()
    for func in (dense(128, 4096, 4096), row_sum(1024, 4096), attention(16, 512, 512, 64)):
        family, shape = match_family(func)
        seen.add(family.name)
        configs = family.space(shape, hw)[:4]
        features = [f.numpy() for f in extractor.extract_from(Task(func), _candidates(func, configs))]
        assert all(f.shape == (1, len(FEATURE_NAMES)) and np.isfinite(f).all() for f in features)
        assert len({f.tobytes() for f in features}) == len(configs)  # configurations told apart
    assert seen == {"split_k_gemm", "split_k_reduction", "attention"}


def test_planned_space_schedules_carry_their_configuration():
    func = dense(128, 1024, 1024)
    spaces = PlannedSpace(top=2).generate_design_space(tvm.IRModule({"main": func}))
    features = PlanFeatureExtractor().features(tvm.IRModule({"main": func}), spaces[0].mod)
    assert features.shape == (len(FEATURE_NAMES),)


def test_xgb_on_plan_features_ranks_held_out_candidates_of_a_monotone_cost():
    """Trained on a synthetic time (a monotone function of features that the analytical total
    does not order alone), XGBModel ranks unseen shapes' candidates far better than chance."""
    hw = load_hardware()
    model = plan_xgb_model(hw)
    names = list(FEATURE_NAMES)
    stages, cluster = names.index("knob.stages"), names.index("knob.cluster_size")

    def synthetic_us(features):
        return 2.0 ** (features[:, stages] - 0.5 * features[:, cluster])

    def task(m):
        func = dense(m, 2048, 2048)
        family, shape = match_family(func)
        configs = family.space(shape, hw)[:40]
        candidates = _candidates(func, configs)
        context = Task(func)
        features = np.concatenate([f.numpy() for f in model.extractor.extract_from(context, candidates)])
        return context, candidates, synthetic_us(features)

    for m in (64, 128, 512):
        context, candidates, us = task(m)
        model.update(context, candidates, [ms.runner.RunnerResult([t * 1e-6], None) for t in us])
    context, candidates, us = task(256)
    rho = spearmanr(model.predict(context, candidates), -us).statistic
    assert rho > 0.7
