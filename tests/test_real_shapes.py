"""The real-model table (tvm_dsm.workloads.real_models) agrees with itself, the real_shapes suite
covers the sizes issue 50 names, and one variant of each class builds for sm_90a."""

from __future__ import annotations

import pytest
import tvm
from conftest import TARGET

from tvm_dsm.gpu.suites.real_shapes import (
    ATTENTION_DIMS, CLASSES, ROWS, SEQ_LENS, cases, real_shapes, sample_cases)
from tvm_dsm.workloads.real_models import MODELS


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_model_sizes_agree(model):
    if not model.head_dim_set:
        assert model.heads * model.head_dim == model.hidden
    assert model.heads % model.kv_heads == 0
    if model.moe:
        assert model.expert_intermediate and 0 < model.experts_per_token < model.experts
    else:
        assert model.expert_intermediate is None and model.experts_per_token == 0


def test_the_table_spans_sizes_and_kinds():
    assert len({m.name for m in MODELS}) == len(MODELS) >= 8
    assert {m.hidden for m in MODELS} >= {896, 8192}  # 0.5B to 70B-class
    assert any(m.moe for m in MODELS) and any(not m.moe for m in MODELS)


def test_the_suite_covers_the_issues_rows_lengths_and_heads():
    by_class = {cls: [c for c in cases() if c.cls == cls] for cls in CLASSES}
    for cls in ("swiglu", "dense", "norm"):
        assert {c.shape[0] for c in by_class[cls]} == set(ROWS)
    attention = [c.shape for c in by_class["attention"]]
    assert {s for _, _, _, s, _, _ in attention} == set(SEQ_LENS)
    assert {d for *_, d, _ in attention} == set(ATTENTION_DIMS)
    assert {causal for *_, causal in attention} == {False, True}
    assert {h == kv for _, h, kv, *_ in attention} == {False, True}  # grouped-query and not
    shapes = [(c.cls, c.shape) for c in cases()]
    assert len(shapes) == len(set(shapes)) <= 260


def test_one_variant_per_class_builds_for_sm90a():
    variants = real_shapes(sample=True)
    assert [v.extra["class"] for v in variants] == list(CLASSES) == [c.cls for c in sample_cases()]
    for v in variants:
        assert "torch_eager" in v.peers and ("torch_sdpa" in v.peers) == (v.extra["class"] == "attention")
        assert ("torch_compile" in v.peers) == (v.extra["class"] in ("swiglu", "norm"))
        source = tvm.compile(v.mod, target=TARGET).mod.imports[0].inspect_source()
        assert "__global__" in source, v.name
