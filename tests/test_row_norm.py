"""The row-norm kernel (tvm_dsm.kernels.row_norm, family row_norm): softmax, log-softmax, RMSNorm
and LayerNorm as TOPI, Relax legalization and hand-written TE produce them, each row read from
HBM once into registers (a cluster's for long rows). Recognition and refusals with reasons, the
configurations and their limits, the generated CUDA (one 16-byte load of each held piece, sm_90a
assembly), and on the GPU every form against float64 with poisoned outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi
from tvm.script import tirx as T

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.families import match_family
from tvm_dsm.kernels.row_norm import (RowNormConfig, candidate_configs, check_config, default_config, find_row_norm,
                                    fuse_row_norm, pieces_per_thread)
from tvm_dsm.workloads.norms import EPS, composed_norm, residual_rms_norm_returned, topi_norm

from conftest import cuda_source, kernels



def relax_form(form: str, rows: int, width: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """The PrimFunc Relax's LegalizeOps makes of one operator (int64 indices)."""
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((rows, width), dtype))
    w = relax.Var("w", R.Tensor((width,), dtype))
    b = relax.Var("b", R.Tensor((width,), dtype))
    args, make = {
        "softmax": ([x], lambda: relax.op.nn.softmax(x, axis=-1)),
        "rms_norm": ([x, w], lambda: relax.op.nn.rms_norm(x, w, axes=[-1], epsilon=EPS)),
        "layer_norm": ([x, w, b], lambda: relax.op.nn.layer_norm(x, w, b, axes=[-1], epsilon=EPS)),
    }[form]
    with bb.function("main", args):
        bb.emit_func_output(bb.emit(make()))
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def residual_rms_norm(rows: int, width: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """RMSNorm of x + r written by hand: the statistics read both rows, so both are held."""
    x = te.placeholder((rows, width), dtype, name="x")
    r = te.placeholder((rows, width), dtype, name="r")
    w = te.placeholder((width,), dtype, name="w")
    h = te.compute((rows, width), lambda i, j: (x[i, j] + r[i, j]).astype("float32"), name="h")
    k = te.reduce_axis((0, width), "k")
    ss = te.compute((rows,), lambda i: te.sum(h[i, k] * h[i, k], axis=k), name="ss")
    out = te.compute((rows, width), lambda i, j: (h[i, j] * te.rsqrt(ss[i] / width + EPS)
                                                  * w[j].astype("float32")).astype(dtype), name="out")
    return te.create_prim_func([x, r, w, out])


def rms_norm_then_residual(rows: int, width: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """A post-norm (Gemma's ``h = r + norm(x)``): RMSNorm of x rounded to ``dtype``, then the
    residual r added, a row the statistics do not read."""
    x = te.placeholder((rows, width), dtype, name="x")
    w = te.placeholder((width,), dtype, name="w")
    r = te.placeholder((rows, width), dtype, name="r")
    k = te.reduce_axis((0, width), "k")
    ss = te.compute((rows,), lambda i: te.sum(x[i, k].astype("float32") * x[i, k].astype("float32"), axis=k),
                    name="ss")
    normed = te.compute((rows, width), lambda i, j: (x[i, j].astype("float32") * te.rsqrt(ss[i] / width + EPS)
                                                     * w[j].astype("float32")).astype(dtype), name="normed")
    out = te.compute((rows, width), lambda i, j: r[i, j] + normed[i, j], name="out")
    return te.create_prim_func([x, w, r, out])


def hand_layer_norm(rows: int, width: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """LayerNorm written by hand over a 3-D input: mean, then the mean square deviation."""
    x = te.placeholder((2, rows // 2, width), dtype, name="x")
    k = te.reduce_axis((0, width), "k")
    total = te.compute((2, rows // 2), lambda a, i: te.sum(x[a, i, k].astype("float32"), axis=k), name="total")
    mean = te.compute((2, rows // 2), lambda a, i: total[a, i] / width, name="mean")
    k2 = te.reduce_axis((0, width), "k2")
    deviation = te.compute((2, rows // 2), lambda a, i: te.sum(
        (x[a, i, k2].astype("float32") - mean[a, i]) * (x[a, i, k2].astype("float32") - mean[a, i]), axis=k2),
        name="deviation")
    var = te.compute((2, rows // 2), lambda a, i: deviation[a, i] / width, name="var")
    out = te.compute((2, rows // 2, width), lambda a, i, j: ((x[a, i, j].astype("float32") - mean[a, i])
                                                             * te.rsqrt(var[a, i] + EPS)).astype(dtype), name="out")
    return te.create_prim_func([x, out])


def one_pass_layer_norm(rows: int, width: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """LayerNorm from one pass over the row: the sum and the sum of squares in one block (a TE
    tuple reducer), the variance their difference."""
    x, w, b = (te.placeholder(shape, dtype, name=n) for shape, n in (((rows, width), "x"), ((width,), "w"),
                                                                     ((width,), "b")))
    moments = te.comm_reducer(lambda p, q: (p[0] + q[0], p[1] + q[1]),
                              lambda t0, t1: (tvm.tirx.const(0, t0), tvm.tirx.const(0, t1)), name="moments")
    k = te.reduce_axis((0, width), "k")
    xf = lambda i, j: x[i, j].astype("float32")  # noqa: E731
    total, squares = te.compute((rows,), lambda i: moments((xf(i, k), xf(i, k) * xf(i, k)), axis=k), name="stats")
    out = te.compute((rows, width), lambda i, j: (
        (xf(i, j) - total[i] / width) * te.rsqrt(squares[i] / width - (total[i] / width) * (total[i] / width) + EPS)
        * w[j].astype("float32") + b[j].astype("float32")).astype(dtype), name="out")
    return te.create_prim_func([x, w, b, out])


FORMS = {
    **{f"topi_{f}": (lambda f: lambda *a: topi_norm(f, *a))(f)
       for f in ("softmax", "log_softmax", "rms_norm", "layer_norm")},
    **{f"relax_{f}": (lambda f: lambda *a: relax_form(f, *a))(f) for f in ("softmax", "rms_norm", "layer_norm")},
    **{f"composed_{f}": (lambda f: lambda *a: composed_norm(f, *a))(f) for f in ("softmax", "rms_norm")},
    "te_residual_rms_norm": residual_rms_norm,
    "te_rms_norm_then_residual": rms_norm_then_residual,
    "te_layer_norm": hand_layer_norm,
    "te_one_pass_layer_norm": one_pass_layer_norm,
}


@pytest.mark.parametrize("width", [1, 4096])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_is_planned_by_the_row_norm_family(form, width):
    ranking = tvm_dsm.plan(FORMS[form](64, width))
    assert ranking.family.name == "row_norm" and not ranking.family.traced
    assert "read from HBM once" in ranking.explain() and ranking.best.seconds["hbm"] > 0


@pytest.mark.parametrize("rows", [1, 8, 32, 64, 128, 1024])
def test_rows_spread_over_clusters_keep_the_grid_within_the_sms(rows):
    hw = load_hardware()
    config = default_config(find_row_norm(topi_norm("rms_norm", rows, 8192, "float16")), hw)
    assert config.ranks == 1 or rows * config.ranks <= hw.sm_count


@pytest.mark.parametrize("rows, width", [(2, 7), (6, 1), (2, 3)])
def test_a_few_short_rows_take_a_cta_each_rather_than_share_a_part_warp(rows, width):
    found = find_row_norm(hand_layer_norm(rows, width))
    config = default_config(found, load_hardware())
    assert config.rows_per_cta == 1 or config.rows_per_cta * config.threads_per_row % 32 == 0
    assert candidate_configs(found)  # the search space is not empty either
    assert tvm_dsm.plan(hand_layer_norm(rows, width)).family.name == "row_norm"


def test_layer_norm_levels_run_in_two_waves_and_the_residual_holds_both_rows():
    ln = find_row_norm(topi_norm("layer_norm", 64, 4096))
    assert [lvl.op for lvl in ln.levels] == ["sum", "sum"] and ln.waves() == [[0], [1]]
    residual = find_row_norm(residual_rms_norm(64, 4096, "float16"))
    assert [h.name for h in residual.held] == ["x", "r"] and residual.vector == 8


def test_a_returned_residual_sum_is_computed_from_the_held_rows(assemble):
    """The statistics of fused add-RMSNorm read its output ``h``: the kernel holds x and r and
    computes h from them, writing it as one more stage."""
    func = residual_rms_norm_returned(64, 4096)
    found = find_row_norm(func)
    assert [h.name for h in found.held] == ["x", "residual"]
    assert sorted(stage.body.buffer.name for stage in found.stages) == ["h", "y"]
    assert tvm_dsm.plan(func).family.name == "row_norm"
    source = cuda_source(fuse_row_norm(func, hw=load_hardware()))
    assert len(kernels(source)) == 1 and assemble(source, "returned_residual_rms_norm")


def test_a_softmax_over_a_symbolic_width_is_refused_naming_it_and_built_by_dlight():
    """Attention scores of a symbolic number of keys (Relax's int64 form): the row norm takes a
    constant width; the function still builds (TVM's schedule)."""
    from tvm import tirx
    from tvm_dsm.workloads.generated import relax_prim_func

    keys = tirx.Var("keys", "int64")
    func = relax_prim_func([("s", (2, 8, keys, keys), "float16")],
                           lambda bb, s: relax.op.nn.softmax(s, axis=-1)).with_attr("global_symbol", "main")
    with pytest.raises(ClusterError, match="reduces over keys elements: a row norm's rows have a constant width"):
        tvm_dsm.driver.schedule(func, stock_fallback=False)
    assert "__global__" in tvm_dsm.build(func).mod.imports[0].inspect_source()


def test_a_reduction_over_another_axis_is_refused():
    x = te.placeholder((64, 4096), "float32", name="x")
    with pytest.raises(ClusterError, match="reduces over the last axis"):
        find_row_norm(te.create_prim_func([x, topi.nn.softmax(x, axis=0)]))


def test_a_residual_added_after_the_norm_is_read_a_piece_at_a_time(assemble):
    """The residual is no held row (the statistics do not read it): the stage loads its piece in
    16 bytes beside the held row's, one kernel."""
    func = rms_norm_then_residual(64, 4096, "float16")
    found = find_row_norm(func)
    assert [h.name for h in found.held] == ["x"] and [r.name for r in found.stage_rows] == ["r"]
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert len(kernels(source)) == 1 and assemble(source, "rms_norm_then_residual")
    assert "*(uint4*)(r_ptr + " in source  # the residual's piece in one vector load


def _temperature_softmax(rows: int, width: int):
    """A sampler's softmax of fp16 logits over a temperature per row, as TE and TOPI write it."""
    logits = te.placeholder((rows, width), "float16", name="logits")
    temperature = te.placeholder((rows,), "float32", name="temperature")
    scaled = te.compute((rows, width), lambda i, j: logits[i, j].astype("float32") / temperature[i], name="scaled")
    return te.create_prim_func([logits, temperature, topi.nn.softmax(scaled, axis=-1)])


def _scaled_rms_norm(rows: int, width: int):
    """An RMSNorm whose output is scaled per row (a token's quantization scale) after the weight."""
    x = te.placeholder((rows, width), "float16", name="x")
    w = te.placeholder((width,), "float16", name="w")
    scale = te.placeholder((rows, 1), "float32", name="scale")
    y = topi.nn.rms_norm(x, w, axis=[1], epsilon=EPS)
    out = te.compute((rows, width), lambda i, j: (y[i, j].astype("float32") * scale[i, 0]).astype("float16"),
                     name="scaled")
    return te.create_prim_func([x, w, scale, out])


@pytest.mark.parametrize("make", [_temperature_softmax, _scaled_rms_norm], ids=["temperature", "row_scale"])
def test_a_parameter_of_one_element_a_row_is_read_at_the_row(make, assemble):
    """A temperature inside the statistics and the normalization, a scale in the stage: one
    kernel, the parameter read at the row's index (a row's element of it, once a row in L1)."""
    func = make(8, 4096)
    found = find_row_norm(func)
    assert [h.name for h in found.held] == [func.params[0].name]
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert len(kernels(source)) == 1 and assemble(source, make.__name__.strip("_"))
    assert f"{func.params[-2].name}_ptr[" in source


def test_a_parameter_read_at_another_rows_element_is_refused():
    x = te.placeholder((8, 4096), "float16", name="x")
    t = te.placeholder((8,), "float32", name="t")
    scaled = te.compute((8, 4096), lambda i, j: x[i, j].astype("float32") / t[7 - i], name="scaled")
    with pytest.raises(ClusterError, match="reduces over the last axis"):
        find_row_norm(te.create_prim_func([x, t, topi.nn.softmax(scaled, axis=-1)]))


@T.prim_func(s_tir=True)
def _softmax_times_a_row_value_then_updated(x: T.Buffer((8, 256), "float32"), m: T.Buffer((8,), "float32"),
                                            o: T.Buffer((8, 256), "float32")):
    """A softmax scaled by ``m[i]``, then ``m[i]`` replaced by the row's max (an online update):
    the stage reads the value ``m`` had, not the max the kernel computes."""
    T.func_attr({"tirx.noalias": True})
    mx = T.sblock_alloc_buffer((8,))
    s = T.sblock_alloc_buffer((8,))
    for i, k in T.grid(8, 256):
        with T.sblock("mx"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mx[vi] = T.float32(-3.0e38)
            mx[vi] = T.max(mx[vi], x[vi, vk])
    for i, k in T.grid(8, 256):
        with T.sblock("s"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                s[vi] = T.float32(0)
            s[vi] = s[vi] + T.exp(x[vi, vk] - mx[vi])
    for i, k in T.grid(8, 256):
        with T.sblock("o"):
            vi, vk = T.axis.remap("SS", [i, k])
            o[vi, vk] = T.exp(x[vi, vk] - mx[vi]) / s[vi] * m[vi]
    for i in range(8):
        with T.sblock("update"):
            vi = T.axis.remap("S", [i])
            m[vi] = mx[vi]


def test_a_parameter_read_before_a_stage_writes_it_is_refused():
    """Neither recomputed from the row stage that writes it later (the kernel would multiply by
    the new max) nor read at the row (the kernel writes it while other threads read it)."""
    with pytest.raises(ClusterError, match="m\\[vi\\]"):
        find_row_norm(_softmax_times_a_row_value_then_updated)


def test_a_stage_reading_only_another_tensors_row_is_refused():
    x = te.placeholder((64, 4096), "float32", name="x")
    y = te.placeholder((64, 4096), "float32", name="y")
    k = te.reduce_axis((0, 4096), "k")
    s = te.compute((64,), lambda i: te.sum(x[i, k], axis=k), name="s")
    out = te.compute((64, 4096), lambda i, j: y[i, j] / s[i], name="out")
    with pytest.raises(ClusterError, match="no element-wise stage reads the row again"):
        find_row_norm(te.create_prim_func([x, y, out]))


def test_statistics_without_an_element_stage_stay_with_the_fused_rows():
    x = te.placeholder((64, 4096), "float32", name="x")
    k = te.reduce_axis((0, 4096), "k")
    m = te.compute((64,), lambda i: te.max(x[i, k], axis=k), name="m")
    k2 = te.reduce_axis((0, 4096), "k2")
    l = te.compute((64,), lambda i: te.sum(te.exp(x[i, k2] - m[i]), axis=k2), name="l")
    func = te.create_prim_func([x, m, l])
    with pytest.raises(ClusterError, match="no element-wise stage reads the row again"):
        find_row_norm(func)
    assert tvm_dsm.plan(func).family.name == "fused_cascade"


def test_a_row_beyond_a_cluster_of_16_ctas_registers_is_refused_naming_the_limit():
    func = topi_norm("softmax", 1, 1 << 19)
    with pytest.raises(ClusterError, match="row_norm: a row of 524288 elements .* exceeds the registers of a "
                                           "cluster of 16 CTAs"):
        match_family(func)


@pytest.mark.parametrize("rows, width, dtype, config", [
    (4096, 4096, "float16", (256, 1, 1)), (4096, 32000, "float16", (1024, 1, 1)),
    (4096, 32000, "float32", (1024, 1, 2)), (8, 128256, "float16", (256, 1, 16)),
    (4096, 7, "float32", (8, 16, 1)), (4096, 1, "float32", (1, 128, 1)),
    (1, 2048, "float16", (256, 1, 1)), (128, 4096, "float16", (256, 1, 1)),
    (1, 896, "float16", (128, 1, 1)), (32, 8192, "float16", (256, 1, 1))])
def test_default_config(rows, width, dtype, config):
    """At least 256 threads a row where it has 256 pieces (a piece each below: 112 pieces of 896
    on 128 threads); a cluster only for rows of 32 KB or more (16 KB rows measured faster in one
    CTA at 1-64 rows), or where registers require it (32000 fp32)."""
    c = default_config(find_row_norm(topi_norm("softmax", rows, width, dtype)), load_hardware())
    assert (c.threads_per_row, c.rows_per_cta, c.ranks) == config


@pytest.mark.parametrize("config, reason", [(RowNormConfig(128, 1, 32), "1 to 16 CTAs"),
                                            (RowNormConfig(32, 2, 2), "one row a CTA"),
                                            (RowNormConfig(32, 3, 1), "not a multiple of rows_per_cta"),
                                            (RowNormConfig(32, 1, 1), "holds at most 128 B")])
def test_check_config_names_the_broken_constraint(config, reason):
    with pytest.raises(ClusterError, match=reason):
        check_config(find_row_norm(topi_norm("softmax", 64, 32000)), config)


def _x_loads(source: str) -> tuple[list[str], list[str]]:
    """The kernel's 16-byte loads of x, and every mention of x in its body."""
    (body,) = kernels(source).values()
    return re.findall(r"\*\((?:uint4|float4)\*\)\(x_ptr[^;]*", body), re.findall(r"x_ptr", body.split("{", 1)[1])


@pytest.mark.parametrize("form", ["topi_softmax", "topi_log_softmax", "topi_rms_norm", "topi_layer_norm",
                                  "relax_layer_norm", "te_residual_rms_norm"])
def test_the_kernel_reads_each_piece_of_the_row_once_in_16_bytes(form, assemble):
    func = FORMS[form](4096, 4096, "float16") if not form.startswith("relax") else FORMS[form](4096, 4096)
    found = find_row_norm(func)
    config = default_config(found, load_hardware())
    source = cuda_source(fuse_row_norm(func, config))
    vector_loads, every_read = _x_loads(source)
    pieces = pieces_per_thread(found, config)
    assert len(vector_loads) == len(every_read) == pieces  # no second read of x
    assemble(source, f"row_norm_{form}")


@pytest.mark.parametrize("rows, width, dtype", [(8, 128256, "float16"), (1, 32000, "float32"),
                                                (4096, 7, "float16"), (1, 1, "float32")])
def test_cluster_and_ragged_kernels_assemble(rows, width, dtype, assemble):
    func = topi_norm("layer_norm", rows, width, dtype)
    found = find_row_norm(func)
    config = default_config(found, load_hardware())
    source = cuda_source(fuse_row_norm(func, config))
    if config.ranks > 1:  # the partial statistics cross the cluster through DSM
        assert "mapa" in source and "barrier.cluster" in source
    assemble(source, f"row_norm_{rows}x{width}_{dtype}")


# GPU: every form through tvm_dsm.build against float64 with NaN-poisoned outputs.


def _reference(form: str, args: list[np.ndarray]) -> np.ndarray:
    x = args[0].astype(np.float64)
    if form.endswith("then_residual"):
        x, w, r = args
        normed = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS) * w
        return normed.astype(x.dtype).astype(np.float64) + r
    if "residual" in form:
        x = (args[0] + args[1]).astype(np.float32).astype(np.float64)
        ms = (x * x).mean(-1, keepdims=True)
        return x / np.sqrt(ms + EPS) * args[2].astype(np.float64)
    if form.endswith("log_softmax"):
        z = x - x.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))
    if form.endswith("softmax"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if form.endswith("rms_norm"):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * args[1].astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS)
    if form == "te_layer_norm":
        return normed
    return normed * args[1].astype(np.float64) + args[2].astype(np.float64)


def _error_on_gpu(form: str, rows: int, width: int, dtype: str) -> float:
    func = FORMS[form](rows, width, dtype)
    assert tvm_dsm.plan(func).family.name == "row_norm"
    lib = tvm_dsm.build(func)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    *inputs, out = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    args = [(rng.standard_normal(s) * 2).astype(dtype) for s in inputs]
    result = tvm.runtime.tensor(np.full(out, np.nan, dtype), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in args), result)
    ref = _reference(form, args).reshape(out)
    scale = np.max(np.abs(ref)) or 1.0  # a row of one element normalizes to exactly 0
    return float(np.max(np.abs(result.numpy().astype(np.float64) - ref)) / scale)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4096])
@pytest.mark.parametrize("width", [1, 7, 4096, 32000])
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("float16", 2e-3)])
def test_forms_match_float64_on_the_gpu(form, rows, width, dtype, tolerance):
    if form == "te_layer_norm" and rows == 1:
        rows = 2  # its rows are two halves of a 3-D input
    assert _error_on_gpu(form, rows, width, dtype) < tolerance


def test_relax_bf16_softmax_is_evaluated_in_fp32_and_rounded_once():
    """Relax legalizes a bf16 softmax with its exponentials and their sum in bf16 (8 bits each:
    4.4e-3 from float64 as written); the kernel computes them in fp32 and rounds the output
    only."""
    source = cuda_source(fuse_row_norm(relax_form("softmax", 7, 4096, "bfloat16"), hw=load_hardware()))
    assert "__expf((((float)" in source and "hexp" not in source


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["relax_softmax", "relax_rms_norm", "topi_log_softmax"])  # (TOPI has no bf16 LayerNorm)
@pytest.mark.parametrize(("rows", "width"), [(7, 4096), (1028, 5120)])
def test_bf16_forms_match_float64_within_the_bf16_bound_on_the_gpu(form, rows, width):
    import ml_dtypes

    func = FORMS[form](rows, width, "bfloat16")
    lib, dev = tvm_dsm.build(func), tvm.cuda(0)
    rng = np.random.default_rng()
    *inputs, out = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    args = [(rng.standard_normal(s) * 2).astype(ml_dtypes.bfloat16) for s in inputs]
    result = tvm.runtime.tensor(np.full(out, np.nan, ml_dtypes.bfloat16), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in args), result)
    ref = _reference(form, args).reshape(out)
    got = result.numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("float16", 2e-3)])
def test_a_128k_vocabulary_softmax_of_8_rows_runs_on_a_cluster_of_16(dtype, tolerance):
    assert default_config(find_row_norm(topi_norm("softmax", 8, 128256, dtype)), load_hardware()).ranks == 16
    assert _error_on_gpu("topi_softmax", 8, 128256, dtype) < tolerance


def test_rmsnorm_with_fp8_absmax_quantization_is_one_row_norm_kernel(assemble):
    """RMSNorm, then per-token fp8 quantization: the absmax reads the weight inside its term
    (|x * w| / sqrt(ms + eps), proven positive through the mean square's sign), and the scale
    is written once a row from the statistics."""
    from tvm_dsm.workloads.generated import _rms_norm_fp8

    func = _rms_norm_fp8(128, 4096, "float16")
    found = find_row_norm(func)
    assert [lvl.op for lvl in found.levels] == ["sum", "max"] and len(found.row_stages) == 1
    assert tvm_dsm.plan(func).family.name == "row_norm"
    source = cuda_source(fuse_row_norm(func, hw=load_hardware()))
    assemble(source, "rms_norm_fp8")


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width", [(13, 4096), (128, 1021)])
def test_rmsnorm_with_fp8_quantization_matches_on_the_gpu(rows, width):
    from tvm_dsm.workloads.generated import _rms_norm_fp8

    import ml_dtypes

    func = _rms_norm_fp8(rows, width, "float16")
    lib, dev = tvm_dsm.build(func), tvm.cuda(0)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, width)).astype("float16")
    w = rng.standard_normal(width).astype("float16")
    q = tvm.runtime.tensor(np.zeros((rows, width), ml_dtypes.float8_e4m3fn), dev)
    scale = tvm.runtime.tensor(np.full(rows, np.nan, "float32"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), q, scale)
    y = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + EPS) * w
    amax = np.abs(y).max(-1)
    assert np.abs(scale.numpy() - amax / 448) .max() / (amax / 448).max() < 2e-3
    got = q.numpy().astype(np.float64) * scale.numpy()[:, None]
    assert np.linalg.norm(got - y) / np.linalg.norm(y) < 0.05  # e4m3 keeps 3 mantissa bits


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "width"), [(1, 2048), (100, 4096), (4096, 8192)])
def test_a_returned_residual_sum_and_its_norm_match_float64_on_the_gpu(rows, width):
    func = residual_rms_norm_returned(rows, width)
    lib = tvm_dsm.build(func)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    x, r = (rng.standard_normal((rows, width)).astype(np.float16) for _ in range(2))
    w = rng.standard_normal(width).astype(np.float16)
    h, out = (tvm.runtime.tensor(np.full((rows, width), np.nan, np.float16), dev) for _ in range(2))
    lib(*(tvm.runtime.tensor(a, dev) for a in (x, r, w)), h, out)
    # the sum rounded to fp16, as the function stores and reads it
    want_h = (x.astype(np.float64) + r).astype(np.float16).astype(np.float64)
    want = want_h / np.sqrt((want_h ** 2).mean(-1, keepdims=True) + EPS) * w
    assert np.array_equal(h.numpy().astype(np.float64), want_h)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_the_softmax_suite_times_what_build_picks_beside_the_other_schedules():
    """The softmax suite's pick (its ``planner`` row, what its summary reports) is the schedule
    ``tvm_dsm.build`` gives TOPI's softmax, the row norm family's; the generic fused rows and
    dlight's are timed beside it."""
    from tvm_dsm.gpu.suites.cascades import softmax

    variants = softmax()
    picks = [v.name for v in variants if v.plan["planner"]]
    assert picks == ["softmax_4096x4096_row_norm", "softmax_16384x1024_row_norm", "softmax_1024x32000_row_norm"]
    assert {v.extra["schedule"] for v in variants} == {"row_norm", "fused_rows", "dlight"}


@T.prim_func(s_tir=True)
def _norm_then_residual_in_place(x: T.Buffer((64, 4096), "float32"), w: T.Buffer((4096,), "float32"),
                                 r: T.Buffer((64, 4096), "float32"), o: T.Buffer((64, 4096), "float32")):
    ss = T.sblock_alloc_buffer((64,))
    for i, k in T.grid(64, 4096):
        with T.sblock("ss"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                ss[vi] = T.float32(0)
            ss[vi] = ss[vi] + x[vi, vk] * x[vi, vk]
    for i, k in T.grid(64, 4096):
        with T.sblock("norm"):
            vi, vk = T.axis.remap("SS", [i, k])
            o[vi, vk] = x[vi, vk] * T.rsqrt(ss[vi] / T.float32(4096) + T.float32(1e-5)) * w[vk]
    for i, k in T.grid(64, 4096):
        with T.sblock("add_residual"):
            vi, vk = T.axis.remap("SS", [i, k])
            o[vi, vk] = o[vi, vk] + r[vi, vk]


def test_a_row_a_stage_writes_is_not_read_at_the_element():
    """``o = norm(x); o += r`` as two blocks: the second stage's ``o`` is the first stage's
    result, but a row read at the element is loaded before the stages run (it would add r to
    o's prior contents): refused by name."""
    with pytest.raises(ClusterError, match="reads o's row, which a stage writes"):
        find_row_norm(_norm_then_residual_in_place)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, width", [(8, 151936), (33, 4096)])
def test_gpu_a_softmax_over_a_temperature_per_row_matches_float64(rows, width):
    rng = np.random.default_rng(17)
    logits = (rng.standard_normal((rows, width)) * 4).astype(np.float16)
    temperature = rng.uniform(0.3, 1.5, rows).astype(np.float32)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((rows, width), np.nan, np.float32), dev)
    tvm_dsm.build(_temperature_softmax(rows, width))(tvm.runtime.tensor(logits, dev),
                                                      tvm.runtime.tensor(temperature, dev), out)
    s = logits.astype(np.float64) / temperature.astype(np.float64)[:, None]
    ref = np.exp(s - s.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5
