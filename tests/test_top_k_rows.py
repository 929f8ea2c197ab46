"""The top-k rows kernel (tvm_dsm.kernels.top_k_rows): MoE routing read once into shared memory,
softmax statistics by shuffles, only elements at or above the k-th largest lane maximum inserted.
Recognition and refusals with reasons, the planner's choice, the generated CUDA (cp.async, no
barrier, no spills), and on the GPU the planned kernels against a stable sort (ties included)
with poisoned outputs."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from tvm_dsm.driver import schedule_row_ranges
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.top_k_rows import TopKRows
from tvm_dsm.fusion.top_k import top_k
from tvm_dsm.planners.cascade_split import CascadeSplit
from tvm_dsm.kernels.top_k_rows import (TopKRowsConfig, check_config, default_config, find_top_k_rows,
                                      fuse_top_k_rows)
from tvm_dsm.workloads.cascades import moe_routing

from conftest import cuda_source


def _router_with_statistics(rows: int, experts: int, k: int, dtype: str = "float16"):
    """Top-k values and indices (written directly, indices first) with the row max and exp-sum:
    every level result is a parameter, in an order of the user's choosing."""
    x = te.placeholder((rows, experts), dtype, name="x")
    r = te.reduce_axis((0, experts), "r")
    mx = te.compute((rows,), lambda i: te.max(x[i, r].astype("float32"), axis=r), name="m")
    r2 = te.reduce_axis((0, experts), "r2")
    l = te.compute((rows,), lambda i: te.sum(te.exp(x[i, r2].astype("float32") - mx[i]), axis=r2), name="l")
    best = top_k(lambda i, j: x[i, j].astype("float32"), (rows,), experts, k)
    return te.create_prim_func([x, *best[k:], mx, *best[:k], l])


def test_moe_routing_is_recognized_with_its_epilogue():
    found = find_top_k_rows(moe_routing(4096, 4096, 8))
    assert (found.rows, found.width, found.top_k.top_k.k) == (4096, 4096, 8)
    assert found.max_level is not None and found.sum_level is not None
    assert sorted(b.name_hint for b in found.epilogue) == ["indices", "weights"]


@pytest.mark.parametrize("shape, config", [((4096, 4096, 8), (32, 4)), ((16384, 256, 8), (8, 16)),
                                           ((16384, 64, 6), (2, 64)), ((16384, 8, 2), (1, 128)),
                                           ((98, 2048, 8), (32, 2))])
def test_default_config_gives_a_lane_per_32_elements(shape, config):
    c = default_config(find_top_k_rows(moe_routing(*shape)))
    assert (c.lanes, c.rows_per_cta) == config


@pytest.mark.parametrize("config, reason", [(TopKRowsConfig(64, 1), "a power of two <= 32"),
                                            (TopKRowsConfig(32, 8), "bytes of shared memory"),
                                            (TopKRowsConfig(4, 2), "whole warps")])
def test_check_config_names_the_broken_constraint(config, reason):
    with pytest.raises(ClusterError, match=reason):
        check_config(find_top_k_rows(moe_routing(96, 4096, 8)), config)


def test_rows_that_do_not_fill_a_warp_share_one_and_only_they_are_written():
    """16 tokens of 8 experts, a lane a row: the CTA keeps a warp of row slots; the 16 past the
    count read the last row and write nothing."""
    found = find_top_k_rows(moe_routing(16, 8, 2))
    config = default_config(found)
    assert (config.lanes, config.rows_per_cta) == (1, 32)
    source = cuda_source(fuse_top_k_rows(moe_routing(16, 8, 2)))
    assert "min(((int)threadIdx.x), 15)" in source and "if (((int)threadIdx.x) < 16)" in source


def test_rows_off_16_bytes_are_copied_in_the_widest_pieces_that_divide_them():
    """60 fp16 experts (Qwen1.5-MoE's router: 120-byte rows) are 15 pieces of 8 bytes."""
    func = moe_routing(16, 60, 2, "float16")
    found = find_top_k_rows(func)
    assert found.vector == 4 and default_config(found).lanes == 1
    assert "cp.async.ca.shared.global [%0], [%1], 8" in cuda_source(fuse_top_k_rows(func))


def test_a_row_of_no_whole_4_byte_pieces_is_refused_naming_the_limit():
    """61 fp16 experts: no piece cp.async copies divides the row; the family refuses it by name
    and the driver goes on to the fused rows."""
    func = moe_routing(16, 61, 2, "float16")
    with pytest.raises(ClusterError, match="not whole pieces of 4 bytes or more"):
        default_config(find_top_k_rows(func))
    assert TopKRows().match(func) is None


def _top_k_and_max(dtype: str, extra=None):
    """A top-2 with the row max of the same values (a two-level cascade); ``extra(x, best)`` adds
    a stage after it."""
    x = te.placeholder((64, 256), dtype, name="x")
    r = te.reduce_axis((0, 256), "r")
    mx = te.compute((64,), lambda i: te.max(x[i, r].astype("float32"), axis=r), name="m")
    best = top_k(lambda i, j: x[i, j].astype("float32"), (64,), 256, 2)
    outs = [mx, *best] if extra is None else [mx, extra(x, best)]
    return te.create_prim_func([x, *outs])


def test_fp64_logits_are_refused_and_the_planner_falls_back_to_fused_rows():
    func = _top_k_and_max("float64")
    with pytest.raises(ClusterError, match="16-bit or fp32 floats"):
        find_top_k_rows(func)
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == "fused_cascade" and isinstance(ranking.best.config, CascadeSplit)


def test_a_top_k_of_an_expression_of_x_is_refused():
    x = te.placeholder((64, 256), "float16", name="x")
    r = te.reduce_axis((0, 256), "r")
    mx = te.compute((64,), lambda i: te.max(x[i, r] * tvm.tirx.const(2, "float16"), axis=r), name="m")
    best = top_k(lambda i, j: x[i, j] * tvm.tirx.const(2, "float16"), (64,), 256, 2)
    with pytest.raises(ClusterError, match="as loaded"):
        find_top_k_rows(te.create_prim_func([x, mx, *best]))


def test_fp32_logits_take_64_bit_keys(ptxas_report):
    mod = fuse_top_k_rows(moe_routing(4096, 4096, 8, "float32"))
    source = cuda_source(mod)
    assert "uint64_t keys_ptr[8]" in source and "<< (uint64_t)32ULL" in source
    report = ptxas_report(source, "top_k_rows_fp32")
    assert "0 bytes spill stores" in report


def test_a_stage_reading_the_logits_again_is_refused():
    func = _top_k_and_max("float16", lambda x, best: te.compute(
        (64, 2), lambda i, c: te.if_then_else(c == 0, best[0][i], best[1][i]) - x[i, 0].astype("float32"),
        name="shifted"))
    with pytest.raises(ClusterError, match="only the cascade's results of its row"):
        find_top_k_rows(func)


def test_a_sum_reading_another_operand_is_refused():
    x = te.placeholder((64, 256), "float16", name="x")
    w = te.placeholder((256,), "float32", name="w")
    r = te.reduce_axis((0, 256), "r")
    mx = te.compute((64,), lambda i: te.max(x[i, r].astype("float32"), axis=r), name="m")
    r2 = te.reduce_axis((0, 256), "r2")
    l = te.compute((64,), lambda i: te.sum(te.exp(x[i, r2].astype("float32") - mx[i]) * w[r2], axis=r2), name="l")
    best = top_k(lambda i, j: x[i, j].astype("float32"), (64,), 256, 2)
    with pytest.raises(ClusterError, match="the sum may read only"):
        find_top_k_rows(te.create_prim_func([x, w, mx, l, *best]))


def test_the_planner_takes_it_and_keeps_the_parameter_order():
    func = _router_with_statistics(512, 1024, 4)
    ranking = tvm_dsm.plan(func)
    sch, config = ranking.schedule(), ranking.best.config
    assert isinstance(config, TopKRowsConfig) and "k-th largest lane maximum" in config.explain()
    assert [p.name for p in sch.mod["main"].params] == [p.name for p in func.params]


def test_cuda_copies_by_cp_async_without_a_barrier_and_assembles_without_spills(ptxas_report):
    source = cuda_source(fuse_top_k_rows(moe_routing(4096, 4096, 8)))
    assert "cp_async" in source and "__syncthreads" not in source and "__expf" in source
    report = ptxas_report(source, "top_k_rows")
    assert "0 bytes spill stores" in report and "0 bytes stack frame" in report


def test_a_symbolic_token_count_gets_a_kernel_per_range_that_writes_only_its_rows(assemble):
    """A router over a token count known when called (int64, as Relax legalizes it): each range's
    kernel runs whole CTAs of rows, so the last CTA's row slots past the count read the last row
    (their lanes stay in the warp's shuffles) and write nothing."""
    tokens = tvm.tirx.Var("tokens", "int64")
    kernels, sch = schedule_row_ranges(moe_routing(tokens, 64, 6))
    assert {k.family.name for k in kernels} == {"top_k_rows"} and len(kernels) >= 2
    source = cuda_source(sch.mod)
    kernel = source[source.index("__global__ void __launch_bounds__(32) main_kernel(int*"):]
    assert "min(((((int)blockIdx.x) * 16) + (((int)threadIdx.x) >> 1))" in kernel  # the row read, clamped
    assert re.search(r"if \(\(\(\(\(int\)blockIdx\.x\) \* 16\) \+ \(\(\(int\)threadIdx\.x\) >> 1\)\) < tokens\)",
                     kernel) or "< tokens" in kernel  # the stores, guarded
    assemble(source, "top_k_rows_symbolic")


def _logits(rows: int, experts: int, dtype: str) -> np.ndarray:
    x = np.random.default_rng().standard_normal((rows, experts)).astype(dtype)
    x[1, [0, experts // 2, experts - 1]] = 4.0  # ties inside the top k: the lower index first
    x[2, :] = 0.5  # a row that is all ties
    return x


def _reference(x: np.ndarray, k: int):
    x64 = x.astype("float64")
    p = np.exp(x64 - x64.max(1, keepdims=True))
    order = np.argsort(-x64, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(p / p.sum(1, keepdims=True), order, 1), order, x64.max(1), p.sum(1)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, experts, k, dtype", [(4096, 4096, 8, "float16"), (1024, 2048, 8, "float16"),
                                                     (16384, 8, 2, "float16"), (4096, 64, 6, "float16"),
                                                     (2048, 256, 8, "float16"), (4096, 4096, 8, "float32"),
                                                     (8192, 64, 6, "float32"), (2048, 60, 4, "float16"),
                                                     (257, 60, 2, "float16")])
def test_gpu_planned_routing_matches_a_stable_sort(rows, experts, k, dtype):
    from conftest import TARGET

    ranking = tvm_dsm.plan(moe_routing(rows, experts, k, dtype))
    sch, config = ranking.schedule(), ranking.best.config
    assert isinstance(config, TopKRowsConfig)
    ex = tvm.compile(sch.mod, target=TARGET)
    x = _logits(rows, experts, dtype)
    dev = tvm.cuda(0)
    weights = tvm.runtime.tensor(np.full((rows, k), np.nan, "float32"), dev)
    indices = tvm.runtime.tensor(np.full((rows, k), np.iinfo("int32").min, "int32"), dev)
    ex["main"](tvm.runtime.tensor(x, dev), weights, indices)
    want_w, want_i, _, _ = _reference(x, k)
    np.testing.assert_array_equal(indices.numpy(), want_i)
    assert np.linalg.norm(weights.numpy() - want_w) / np.linalg.norm(want_w) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("experts, k", [(64, 6), (256, 8), (8, 2), (60, 4)])
def test_gpu_one_module_routes_any_token_count(experts, k):
    """One module built for a symbolic token count, called at counts inside each range and off
    the CTAs' rows (1, 17, 100, 4099): every token's experts and weights, nothing written past
    the last token (the outputs are one row longer and poisoned)."""
    from conftest import TARGET

    ex = tvm_dsm.build(moe_routing(tvm.tirx.Var("tokens", "int64"), experts, k), TARGET)
    dev = tvm.cuda(0)
    for tokens in (1, 17, 100, 4099):
        x = _logits(max(tokens, 3), experts, "float16")[:tokens]
        weights = tvm.runtime.tensor(np.full((tokens + 1, k), np.nan, "float32"), dev)
        indices = tvm.runtime.tensor(np.full((tokens + 1, k), np.iinfo("int32").min, "int32"), dev)
        views = [t._create_view((tokens, k)) for t in (weights, indices)]
        ex["main"](tvm.runtime.tensor(x, dev), *views)
        want_w, want_i, _, _ = _reference(x, k)
        got_w, got_i = weights.numpy(), indices.numpy()
        np.testing.assert_array_equal(got_i[:tokens], want_i)
        assert np.linalg.norm(got_w[:tokens] - want_w) / np.linalg.norm(want_w) < 1e-5, tokens
        assert np.isnan(got_w[tokens]).all() and (got_i[tokens] == np.iinfo("int32").min).all(), tokens


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, config", [("float16", None), ("bfloat16", None), ("float16", TopKRowsConfig(16, 4))])
def test_gpu_statistics_and_top_k_written_directly(dtype, config):
    """Every level result is a parameter (max, exp-sum, values, indices), bf16 too, and a
    configuration with fewer lanes than the planner's."""
    from conftest import TARGET

    rows, experts, k = 256, 1024, 4
    func = _router_with_statistics(rows, experts, k, dtype)
    ex = tvm.compile(fuse_top_k_rows(func, config), target=TARGET)
    rounded = _logits(rows, experts, "float32").astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    dev = tvm.cuda(0)
    x_dev = tvm.runtime.tensor(rounded, dev)
    outs = ([tvm.runtime.tensor(np.full((rows,), np.iinfo("int32").min, "int32"), dev) for _ in range(k)]
            + [tvm.runtime.tensor(np.full((rows,), np.nan, "float32"), dev)]
            + [tvm.runtime.tensor(np.full((rows,), np.nan, "float32"), dev) for _ in range(k)]
            + [tvm.runtime.tensor(np.full((rows,), np.nan, "float32"), dev)])
    ex["main"](x_dev, *outs)
    _, order, m, l = _reference(rounded, k)
    got_i = np.stack([o.numpy() for o in outs[:k]], 1)
    got_v = np.stack([o.numpy() for o in outs[k + 1:2 * k + 1]], 1)
    np.testing.assert_array_equal(got_i, order)
    np.testing.assert_array_equal(got_v, np.take_along_axis(rounded.astype("float64"), order, 1))
    np.testing.assert_array_equal(outs[k].numpy(), m)
    assert np.linalg.norm(outs[-1].numpy() - l) / np.linalg.norm(l) < 1e-5

