"""tvm_dsm.learned_ranking: the planner's first candidates re-ordered by what the committed
measurements (data/measured_plans.json) say of similar shapes, and only there; the committed
features are those this code computes."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

from tvm_dsm.families import match_family
from tvm_dsm.hardware import load_hardware
from tvm_dsm.learned_ranking import (CALIBRATED_FAMILIES, FEATURE_NAMES, MEASURED_PLANS, MIN_WORKLOADS, RERANKED,
                                     PlanResidual, config_key, measured_plans_files, plan_features, rerank)
from tvm_dsm.families.configs import config_from, examples
from tvm_dsm.workloads.chains import swiglu_ffn
from tvm_dsm.workloads.dense import dense

#: The GPU the committed measurements were taken on.
HW = load_hardware("h200_sxm")


def _ranked(func, hw=HW):
    family, shape = match_family(func)
    return family, shape, family.rank(shape, hw)


def test_only_the_first_plans_of_a_covered_shape_are_reordered():
    family, shape, plans = _ranked(swiglu_ffn(128, 8192, 2048, 2048))
    reranked = rerank(family.name, shape, plans, HW)
    assert family.name == "gemm_chain" and reranked != plans
    assert reranked[RERANKED:] == plans[RERANKED:]
    assert sorted(map(id, reranked[:RERANKED])) == sorted(map(id, plans[:RERANKED]))


def test_plans_for_another_gpu_keep_the_analytical_order():
    """The chains' measurements were taken on the H200: an H100's plans have other features."""
    family, shape, plans = _ranked(swiglu_ffn(128, 8192, 2048, 2048), load_hardware("h100_sxm"))
    assert rerank(family.name, shape, plans, load_hardware("h100_sxm")) == plans


def test_families_fitted_into_the_constants_keep_the_analytical_order():
    data = json.loads(MEASURED_PLANS.read_text())
    assert len({r["workload"] for r in data["rows"] if r["family"] == "split_k_gemm"}) >= MIN_WORKLOADS
    family, shape, plans = _ranked(dense(8, 6144, 4096))
    assert family.name in CALIBRATED_FAMILIES[HW.device] and rerank(family.name, shape, plans, HW) == plans


def test_each_gpu_reranks_by_its_own_measurements():
    """The H100's split-K GEMM plans are re-ranked by the H100's pools (where it measured a
    4-row layer fastest on 16 x 64 tiles, 128 CTAs, the analytical model ranks 16 x 256 first,
    64 CTAs); the committed files name one GPU each."""
    h100 = load_hardware("h100_sxm")
    devices = [json.loads(path.read_text())["device"] for path in measured_plans_files()]
    assert len(devices) == len(set(devices)) and {HW.device, h100.device} <= set(devices)
    family, shape, plans = _ranked(dense(4, 2048, 2048), h100)
    reranked = rerank(family.name, shape, plans, h100)
    assert family.name not in CALIBRATED_FAMILIES.get(h100.device, ())
    assert plans[0].config.block_n == 256 and reranked[0].config.block_n < 256  # more CTAs


@pytest.mark.parametrize("m", [4096, 8192])
def test_shapes_past_the_measured_rows_keep_the_analytical_order(m):
    family, shape, plans = _ranked(swiglu_ffn(m, 8192, 2048, 2048))
    assert rerank(family.name, shape, plans, HW) == plans


def test_families_without_measurements_keep_the_analytical_order():
    family, shape, plans = _ranked(dense(8, 6144, 4096))
    assert rerank("split_k_reduction", shape, plans, HW) == plans


def test_families_measured_on_too_few_workloads_keep_the_analytical_order():
    from tvm_dsm.workloads.cascades import attention

    data = json.loads(MEASURED_PLANS.read_text())
    measured = {r["workload"] for r in data["rows"] if r["family"] == "attention"}
    assert 0 < len(measured) < MIN_WORKLOADS
    family, shape = match_family(attention(16, 1024, 1024, 64, True))
    plans = family.rank(shape, HW)
    assert family.name == "attention" and len(plans) > 1
    assert rerank(family.name, shape, plans, HW) == plans


def test_the_correction_follows_consistent_measurements():
    """Measurements twice as slow as predicted wherever the cluster has 4 CTAs: the corrected
    times keep the others' predictions and double those."""
    _, _, plans = _ranked(dense(16, 8192, 8192))
    features = np.stack([plan_features("split_k_gemm", p.config, p, HW) for p in plans[:64]])
    slow = np.array([p.config.cluster_size == 4 for p in plans[:64]])
    predicted = np.array([p.predicted_us for p in plans[:64]])
    model = PlanResidual()
    model.add(features, predicted * np.where(slow, 2.0, 1.0))
    ratio = model.predict_us(features) / predicted
    assert slow.any() and (~slow).any()
    assert np.all(ratio[slow] > 1.6) and np.all(np.abs(ratio[~slow] - 1) < 0.2)


def test_the_committed_features_are_what_this_code_computes():
    """A stale file (the model or the feature list changed since it was written) would re-rank
    by features no plan has: regenerate it with ``python -m tvm_dsm.bench.search_quality prior``."""
    from tvm_dsm.bench.search_quality import WORKLOADS

    data = json.loads(MEASURED_PLANS.read_text())
    assert tuple(data["feature_names"]) == FEATURE_NAMES
    rows = data["rows"]
    for row in random.Random(0).sample(rows, 8):
        family, shape = match_family(WORKLOADS[row["workload"]]())
        config = config_from(row["config"], examples(family.space(shape, HW)))
        features = plan_features(family.name, config, family.predict(shape, config, HW), HW)
        np.testing.assert_allclose(features, row["features"], atol=1e-4)


def test_row_wise_operators_are_reranked_within_the_measured_row_counts():
    """A row-wise operator's row count is its rows' product: RMSNorm over 32 rows (measured up
    to 4096) has its first plans re-ordered by the norm measurements, over 8192 rows it keeps
    the analytical order."""
    from tvm_dsm.learned_ranking import row_count
    from tvm_dsm.workloads.norms import topi_norm

    for rows, covered in ((32, True), (8192, False)):
        family, shape = match_family(topi_norm("rms_norm", rows, 4096, "float16"))
        assert family.name == "row_norm" and row_count(shape) == rows
        plans = family.rank(shape, HW)
        reranked = rerank(family.name, shape, plans, HW)
        assert reranked[RERANKED:] == plans[RERANKED:] and sorted(map(id, reranked)) == sorted(map(id, plans))
        assert (reranked != plans) == covered


def test_the_h100_measurements_are_what_this_code_computes():
    """Its rows (dense layers measured on the H100, ``python -m tvm_dsm.bench.calibrate
    --measured-plans``) hold the features this code gives their configurations."""
    h100 = load_hardware("h100_sxm")
    data = next(d for path in measured_plans_files() if (d := json.loads(path.read_text()))["device"] == h100.device)
    assert tuple(data["feature_names"]) == FEATURE_NAMES
    for row in random.Random(0).sample(data["rows"], 8):
        n, k = (int(x) for x in row["workload"].split("_")[1].split("x"))
        family, shape = match_family(dense(row["m"], n, k))
        config = config_from(row["config"], examples(family.space(shape, h100)))
        features = plan_features(family.name, config, family.predict(shape, config, h100), h100)
        np.testing.assert_allclose(features, row["features"], atol=1e-4)


def test_a_measured_plan_ranks_by_its_own_measured_time():
    """Each H100 row is found again by its shape and configuration (not by its rounded features,
    which leave knobs out): the re-ranked first plan of a measured layer is its fastest measured
    plan among the head, and the H200's rows (written without their shape) substitute nothing."""
    h100 = load_hardware("h100_sxm")
    data = next(d for path in measured_plans_files() if (d := json.loads(path.read_text()))["device"] == h100.device)
    rows = [r for r in data["rows"] if r["workload"] == "dense_896x896_m1024"]
    family, shape, plans = _ranked(dense(1024, 896, 896), h100)
    measured = {config_key(r["config"]): r["measured_us"] for r in rows if r["shape"] == repr(shape)}
    head = {config_key(dataclasses.asdict(p.config)): p for p in plans[:RERANKED]}
    in_head = {k: t for k, t in measured.items() if k in head}
    assert len(in_head) >= 2
    first = rerank(family.name, shape, plans, h100)[0]
    assert config_key(dataclasses.asdict(first.config)) == min(in_head, key=in_head.get)
    h200 = json.loads(MEASURED_PLANS.read_text())
    assert not any("shape" in r for r in h200["rows"])
