"""Decode attention as users write it (one query a head; TE in several layouts, TOPI, Relax
legalized) reaches tvm-dsm's cluster decode kernel (tvm_dsm.kernels.dense_decode), each K/V row
read once for its group of query heads: what is read from each form, the groups it proves, the
kernel it writes, refusals naming the limit, and (GPU) every form against float64."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te

from conftest import TARGET, cuda_source, host_launch, registers
from conftest import kernels as cuda_kernels
from tvm_dsm.driver import plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.kernels.decode_attention import TWICE_RESIDENT_HEAD_DIMS, DecodeConfig
from tvm_dsm.kernels.dense_decode import TEMPLATE, find_dense_decode
from tvm_dsm.workloads.attention_forms import relax_attention, te_attention, topi_attention

#: name: (function, query heads, query heads reading one K/V row set in a CTA, pairs)
FORMS = {
    "gqa_bhsd": (lambda: te_attention(8, 32, 1, 4096, 128, kv_heads=8), 4, 64),
    "gqa_bshd_scale_on_q": (lambda: te_attention(2, 32, 1, 1000, 64, kv_heads=4, layout="bshd", scale_on="q"), 8, 8),
    "mha_hsd": (lambda: te_attention(1, 16, 1, 512, 128, layout="hsd"), 1, 16),
    "gqa_bf16_probabilities": (lambda: te_attention(3, 28, 1, 333, 128, kv_heads=4, dtype="bfloat16",
                                                    normalize="probabilities"), 7, 12),
    "mqa_16_heads": (lambda: te_attention(2, 16, 1, 256, 64, kv_heads=1, scale_on="softmax"), 8, 4),
    "topi": (lambda: topi_attention(4, 8, 1, 512, 64), 1, 32),
    "relax": (lambda: relax_attention(2, 4, 1, 256, 64), 1, 8),
    "gqa_dim_96": (lambda: te_attention(2, 32, 1, 777, 96, kv_heads=8), 4, 16),
    "mha_dim_80_bshd": (lambda: te_attention(3, 8, 1, 300, 80, layout="bshd"), 1, 24),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_every_form_is_read_with_its_groups(name):
    make, group, pairs = FORMS[name]
    found = find_dense_decode(make())
    assert (found.group, found.pairs()) == (group, pairs)


def test_a_group_larger_than_the_registers_is_taken_in_parts():
    """16 query heads on one K/V head: two CTAs of 8 heads, each reading the rows."""
    found = find_dense_decode(FORMS["mqa_16_heads"][0]())
    assert (found.shape.group, found.group) == (16, 8)


def _uneven_groups():
    """k shared by 4 query heads, v by 2: only pairs of heads read the same rows of both."""
    q = te.placeholder((1, 8, 1, 64), "float16", name="q")
    k = te.placeholder((1, 2, 128, 64), "float16", name="k")
    v = te.placeholder((1, 4, 128, 64), "float16", name="v")
    d, t1, t2, t3 = (te.reduce_axis((0, n), name) for n, name in ((64, "d"), (128, "t1"), (128, "t2"), (128, "t3")))
    s = te.compute((1, 8, 1, 128), lambda b, h, i, t: te.sum(
        q[b, h, i, d].astype("float32") * k[b, h // 4, t, d].astype("float32") * 0.125, axis=d), name="s")
    m = te.compute((1, 8, 1), lambda b, h, i: te.max(s[b, h, i, t1], axis=t1), name="m")
    l = te.compute((1, 8, 1), lambda b, h, i: te.sum(te.exp(s[b, h, i, t2] - m[b, h, i]), axis=t2), name="l")
    o = te.compute((1, 8, 1, 64), lambda b, h, i, e: te.sum(
        te.exp(s[b, h, i, t3] - m[b, h, i]) * v[b, h // 2, t3, e].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, h, i, e: (o[b, h, i, e] / l[b, h, i]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])


def test_groups_are_what_both_k_and_v_share():
    assert find_dense_decode(_uneven_groups()).group == 2


@pytest.mark.parametrize(("make", "message"), [
    (lambda: te_attention(2, 8, 1, 256, 512, kv_heads=2), "a head dim that is a multiple of 8 up to 256"),
    (lambda: te_attention(2, 8, 1, 256, 64, causal=True), "must provably keep the last key"),
    (lambda: te_attention(2, 8, 1, 256, 64, dtype="float32"), "float16 or bfloat16"),
])
def test_what_the_kernel_cannot_take_is_refused_by_name(make, message):
    with pytest.raises(ClusterError, match=message):
        find_dense_decode(make())


def test_short_sequences_keep_clusters_whose_ctas_each_have_a_step():
    step = 4 * 2 * 2  # 4 warps of 2 token slots (16 lanes of 128 columns), 2 tokens each (4 heads a group)
    found = find_dense_decode(te_attention(1, 8, 1, 2 * step, 128, kv_heads=2))
    assert found.unroll == 2
    assert TEMPLATE.configs(found) == [DecodeConfig(1), DecodeConfig(2), DecodeConfig(1, warps=8), DecodeConfig(1, True),
                                       DecodeConfig(1, True, warps=8)]
    with pytest.raises(ClusterError, match="less than one step"):
        TEMPLATE.check(found, DecodeConfig(4))
    with pytest.raises(ClusterError, match="less than one step of 64 keys"):  # 4 warps of 16 tokens
        TEMPLATE.check(found, DecodeConfig(2, True))


def test_a_head_dim_off_a_power_of_two_pieces_idles_the_lanes_past_the_row(assemble):
    """96 columns are 12 pieces on 16 lanes: the last 4 hold a zero query, load the row's last
    piece again and store nothing."""
    found = find_dense_decode(FORMS["gqa_dim_96"][0]())
    assert (found.pieces, found.lanes) == (12, 16)
    source = cuda_source(TEMPLATE.fuse(FORMS["gqa_dim_96"][0](), DecodeConfig(2)), "tvm_dsm")
    assert "min((((int)threadIdx.x) & 15), 11)" in source
    assemble(source, "dense_decode_dim_96")


@pytest.mark.parametrize("name", ["relax", "topi"])
def test_legalized_and_topi_forms_build_for_cuda(name, assemble):
    """Relax legalization gives a private function of int64 indices: the kernel is its own
    function, named and indexed for the host launch."""
    source = cuda_source(TEMPLATE.fuse(FORMS[name][0](), DecodeConfig(2)), "tvm_dsm")
    assemble(source, f"dense_decode_{name}")


def test_the_planner_takes_grouped_decode_and_reads_each_row_once(assemble):
    func = FORMS["gqa_bhsd"][0]()
    ranking = plan(func, load_hardware())
    assert ranking.family.name == "decode_attention"
    # 4 query heads a row: tensor cores, a CTA an SM: 64 pairs x 2, of 8 warps each
    assert ranking.plans[0].config == DecodeConfig(2, tensor_cores=True, warps=8)
    kv_bytes = 2 * 8 * 8 * 4096 * 128 * 2
    assert kv_bytes < ranking.plans[0].bytes["hbm"] < 1.05 * kv_bytes
    mod = TEMPLATE.fuse(func, DecodeConfig(8))
    (launch,) = host_launch(mod, "tvm_dsm")
    assert "512, 128, 8" in launch and '"clusterCtaIdx.x"' in launch
    source = cuda_source(mod, "tvm_dsm")
    # K and V of 2 tokens a step (4 heads a group), loaded evict-first: the first step's, then two steps' a loop
    # pass; + the definition
    assert source.count("ld_vec_global_cs_nc_v4_b32(") == 3 * 2 * 2 + 1
    assemble(source, "dense_decode")


@pytest.mark.parametrize(("name", "loads"), [
    # K: 2 rows of 64 columns (4 loads), V: 4 rows of 16 (2 loads): per step, a first step + two a loop pass
    ("gqa_bhsd", 3 * (2 * 4 + 4 * 2) + 1),
    # 8 heads a group, head dim 64: K 2 rows x 2 loads, V 4 rows x 1
    ("gqa_bshd_scale_on_q", 3 * (2 * 2 + 4 * 1) + 1),
])
def test_grouped_heads_take_tensor_cores_reading_each_byte_once_without_spills(name, loads, ptxas_report):
    """The tensor-core body: mma.sync for the scores and the output (two score tiles and the
    head dim's k-steps, then an n8 tile per 8 columns of the output), every load 16 bytes
    straight into registers, and no register spilled at 128 columns (two steps' rows held)."""
    func = FORMS[name][0]()
    found = find_dense_decode(func)
    config = TEMPLATE.default_config(found, load_hardware())
    assert config.tensor_cores
    source = cuda_source(TEMPLATE.fuse(func, config), "tvm_dsm")
    kernel = source[source.index("__global__ void"):]
    steps = found.head_dim // 16
    assert kernel.count("mma_sync_aligned_m16n8k16_row_col_f32") == 2 * (2 * steps + found.head_dim // 8)
    assert source.count("ld_vec_global_cs_nc_v4_b32(") == loads
    report = ptxas_report(source, f"dense_decode_mma_{name}")
    assert "0 bytes spill stores" in report, report


@pytest.mark.parametrize(("batch", "expected"), [
    (1, DecodeConfig(8, True, warps=8, files=3)),  # 64 CTAs in clusters of 8: one an SM
    (4, DecodeConfig(4, True, warps=8)),  # 128 in clusters of 4: 120 run at once at one an SM
    (8, DecodeConfig(2, True, warps=8, files=3)),  # 128 in clusters of 2: one an SM
    (32, DecodeConfig(1, True, warps=8)),  # 256: two an SM
    (64, DecodeConfig(1, True)),  # 512: four an SM
])
def test_the_grid_sets_the_warps_and_register_files(batch, expected):
    """The 1B Llama's decode attention (32 query / 8 KV heads of 64, 8192 keys): the most loads
    in flight an SM that keep the grid one wave."""
    found = find_dense_decode(te_attention(batch, 32, 1, 8192, 64, kv_heads=8))
    assert TEMPLATE.default_config(found, load_hardware()) == expected


@pytest.mark.parametrize(("dim", "kv_heads", "dtype"), [
    (64, 8, "float16"), (64, 4, "bfloat16"), (128, 8, "float16"), (128, 4, "bfloat16")])
def test_two_ctas_of_eight_warps_fit_an_sm_at_the_head_dims_said(dim, kv_heads, dtype, ptxas_report):
    """Two register files, 8 warps, 4 or 8 query heads a group: at most 128 registers a thread
    lets two CTAs share an SM's 64K registers, as decode_attention.TWICE_RESIDENT_HEAD_DIMS
    counts on."""
    func = te_attention(32, 32, 1, 2048, dim, kv_heads=kv_heads, dtype=dtype)
    source = cuda_source(TEMPLATE.fuse(func, DecodeConfig(1, True, warps=8)), "tvm_dsm")
    report = ptxas_report(source, f"dense_decode_wide_{dim}_{kv_heads}_{dtype}")
    used = registers(report)
    assert (used <= 128) == (dim in TWICE_RESIDENT_HEAD_DIMS), used


def test_the_tensor_core_body_names_what_it_cannot_take():
    wide = find_dense_decode(FORMS["gqa_dim_96"][0]())
    assert not TEMPLATE.default_config(wide, load_hardware()).tensor_cores
    with pytest.raises(ClusterError, match=r"tensor cores: needs a head dim in \(64, 128\) \(not 96\)"):
        TEMPLATE.check(wide, DecodeConfig(1, True))
    single = find_dense_decode(FORMS["mha_hsd"][0]())  # one query head a row: CUDA cores by default
    assert not TEMPLATE.default_config(single, load_hardware()).tensor_cores
    TEMPLATE.check(single, DecodeConfig(1, True))


def test_eight_warps_a_cta_keep_their_states_within_static_shared_memory(assemble):
    """8 heads of 128 columns a group: a warp's states take 4,160 B; 8 warps and 4 ranks' would
    take 49,920 B, past CUDA's 48 KB of static shared memory."""
    func = te_attention(2, 32, 1, 4096, 128, kv_heads=4)
    found = find_dense_decode(func)
    TEMPLATE.check(found, DecodeConfig(4, True, warps=4))
    with pytest.raises(ClusterError, match="4 CTAs of 8 warps needs 49920 B of static shared memory"):
        TEMPLATE.check(found, DecodeConfig(4, True, warps=8))
    with pytest.raises(ClusterError, match="4 or 8 warps a CTA"):
        TEMPLATE.check(found, DecodeConfig(1, True, warps=2))
    source = cuda_source(TEMPLATE.fuse(func, DecodeConfig(2, True, warps=8)), "tvm_dsm")
    assert "__launch_bounds__(256)" in source
    assemble(source, "dense_decode_mma_eight_warps")


def _reference(layout: str, q, k, v):
    """float64 softmax(q K^T / sqrt(D)) V of one query a head, inputs in ``layout``."""
    def bhsd(x):
        x = x.astype(np.float64)
        return x[None] if layout == "hsd" else x.transpose(0, 2, 1, 3) if layout == "bshd" else x

    q4, k4, v4 = bhsd(q), bhsd(k), bhsd(v)
    k4, v4 = (np.repeat(x, q4.shape[1] // x.shape[1], axis=1) for x in (k4, v4))
    s = np.einsum("bhid,bhtd->bhit", q4, k4) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p @ v4) / p.sum(-1, keepdims=True)
    return o[0] if layout == "hsd" else o.transpose(0, 2, 1, 3) if layout == "bshd" else o


C, TC = DecodeConfig, functools.partial(DecodeConfig, tensor_cores=True)
#: name: (layout of q, k, v and out for the reference, configurations to run; None: the planner's)
GPU_FORMS = {
    "gqa_bhsd": ("bhsd", (None, C(1), C(2), TC(1), TC(2, warps=8))),
    "gqa_bshd_scale_on_q": ("bshd", (None, C(4), TC(2), TC(2, warps=8, files=3))),
    "mha_hsd": ("hsd", (None, TC(2))),
    "gqa_bf16_probabilities": ("bhsd", (None, C(8), TC(4))),
    # the planner gives multi-query heads to the tensor-core attention kernel
    "mqa_16_heads": ("bhsd", (C(2), C(4), TC(2))),
    "topi": ("bshd", (None,)),
    "relax": ("bshd", (None,)),
    "gqa_dim_96": ("bhsd", (None, C(1))),
    "mha_dim_80_bshd": ("bshd", (None,)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_FORMS))
def test_gpu_every_form_matches_float64(name):
    """Through ``tvm_dsm.build`` (the planner's pick) and in other cluster sizes: NaN-poisoned
    output, fresh inputs, twice (the second run catches state left by the first)."""
    import tvm_dsm

    func = FORMS[name][0]()
    layout, configs = GPU_FORMS[name]
    dtype = np.dtype(ml_dtypes.bfloat16) if "bf16" in name else np.dtype(np.float16)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    dev = tvm.cuda(0)
    for config in configs:
        if config is None:
            assert tvm_dsm.plan(func).family.name == "decode_attention"
            module = tvm_dsm.build(func, TARGET)
        else:
            module = tvm.compile(TEMPLATE.fuse(func, config), target=TARGET, tir_pipeline="tvm_dsm")
        for _ in range(2):
            rng = np.random.default_rng()
            inputs = [(rng.standard_normal(s) * 2).astype(dtype) for s in shapes[:3]]
            out = tvm.runtime.tensor(np.full(shapes[3], np.nan, dtype), dev)
            module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
            ref = _reference(layout, *inputs).reshape(shapes[3])
            got = out.numpy().astype(np.float64)
            tolerance = 1e-2 if dtype != np.float16 else 2e-3
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < tolerance, (name, config)


def _variant(v_cols=64, k_cols=64, start=0, sum_init=0.0, out=None):
    """[1, 8, 1, 64] decode attention over 128 keys, written by hand with one thing changed: v's
    columns, k's row pitch, the keys' range starting at ``start``, the row sum's init, or the
    output's (shape, index) ``out``."""
    q = te.placeholder((1, 8, 1, 64), "float16", name="q")
    k = te.placeholder((1, 8, 128 + start, k_cols), "float16", name="k")
    v = te.placeholder((1, 8, 128 + start, v_cols), "float16", name="v")
    d = te.reduce_axis((0, 64), "d")
    t1, t2, t3 = (te.reduce_axis((start, start + 128), n) for n in ("t1", "t2", "t3"))
    s = te.compute((1, 8, 1, 128 + start), lambda b, h, i, t: te.sum(
        q[b, h, i, d].astype("float32") * k[b, h, t, d].astype("float32") * 0.125, axis=d), name="s")
    m = te.compute((1, 8, 1), lambda b, h, i: te.max(s[b, h, i, t1], axis=t1), name="m")
    adder = te.comm_reducer(lambda a, b: a + b, lambda dtype: tvm.tirx.const(sum_init, dtype), name="add")
    l = te.compute((1, 8, 1), lambda b, h, i: adder(te.exp(s[b, h, i, t2] - m[b, h, i]), axis=t2), name="l")
    o = te.compute((1, 8, 1, v_cols), lambda b, h, i, e: te.sum(
        te.exp(s[b, h, i, t3] - m[b, h, i]) * v[b, h, t3, e].astype("float32"), axis=t3), name="o")
    shape, index = out or ((1, 8, 1, v_cols), lambda b, h, i, e: (b, h, i, e))
    result = te.compute(shape, lambda *a: (o[index(*a)] / l[index(*a)[:3]]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, result])


@pytest.mark.parametrize(("make", "message"), [
    (lambda: _variant(v_cols=128), "decode attention takes one head dim; v has 128 columns"),
    (lambda: _variant(k_cols=100), "rows must be the 64 columns"),
    (lambda: _variant(start=16), "not decode attention|cascade"),
    (lambda: _variant(sum_init=1.0), "must start at 0"),
    (lambda: _variant(out=((1, 1, 64), lambda b, x, e: (b, 0, 0, e))), "each head's row once|cannot be inverted|not at its own row"),
])
def test_functions_computing_something_else_are_refused(make, message):
    """Read-through cases a matcher that only checked the softmax's form let through: each
    would have computed another function (or written past a buffer)."""
    with pytest.raises(ClusterError, match=message):
        find_dense_decode(make())
    assert find_dense_decode(_variant()).group == 1  # the function they vary is taken


def _any_past(layout: str = "bhsd", length=None):
    """Grouped decode attention (batch 2, 32 query heads, 8 KV heads, head dim 128) over a past of
    any length ``K``, as a model with a KV cache holds it."""
    return te_attention(2, 32, 1, te.var("K") if length is None else length, 128, kv_heads=8, layout=layout)


def test_a_symbolic_past_is_read_to_its_length_at_run_time(assemble):
    """The key length a variable: the kernel takes the function's own K and V and reads their
    length when called, one kernel per range of lengths (larger clusters for longer pasts)."""
    import tvm_dsm
    from tvm_dsm.families.row_ranges import range_kernels

    func = _any_past("bshd")
    found = find_dense_decode(func)
    length = func.params[1].ty.shape[1]
    assert found.shape.kv_len.same_as(length) and found.group == 4
    assert [p.same_as(op) for p, op in zip(func.params, found.shape.operands)] == [True] * 4
    kernels = range_kernels(func, TARGET, load_hardware())
    assert {k.family.name for k in kernels} == {"decode_attention"}
    assert len({k.config.ranks for k in kernels}) > 1
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(cuda_kernels(source)) == len(kernels)
    assert all(", int K" in line for line in source.splitlines() if "__global__" in line)
    assemble(source, "decode_any_past")


def test_relax_legalized_attention_over_an_int64_past_is_read_at_run_time():
    """Relax's ``R.nn.attention`` of one query over an int64 key length: the kernel reads the
    length cast to int32, and each range of lengths is the decode kernel."""
    from tvm_dsm.families.row_ranges import range_kernels

    func = relax_attention(2, 4, 1, tvm.tirx.Var("K", "int64"), 64)
    found = find_dense_decode(func)
    assert str(found.shape.kv_len.ty) == "int64" and str(found.length().ty) == "int32"
    assert {k.family.name for k in range_kernels(func, TARGET, load_hardware())} == {"decode_attention"}


def test_a_relax_decode_with_a_static_caches_mask_is_the_decode_kernel():
    """What a torch model's decode over a static KV cache imports as: ``R.nn.attention`` of one
    query over the whole cache with an additive bf16 mask ``[1, 1, 1, S]`` (the positions past
    the step's masked). Legalized with int64 indices, its softmax's unit query axis reads the
    scores at 0 (a reshape's index simplified): still the statistics' own row."""
    import tvm_dsm

    func = relax_attention(1, 32, 1, 1024, 64, dtype="bfloat16", bias_shape=(1, 1, 1, 1024))
    found = find_dense_decode(func)
    assert found.shape.terms is not None and len(found.shape.terms.tensor_loads()) == 1
    assert tvm_dsm.plan(func).family.name == "decode_attention"


def _any_batch(layout: str = "bhsd", batch=None):
    """Grouped decode attention (32 query heads, 8 KV heads, 1000 keys, head dim 128) over a
    batch of any size ``B``, as continuous batching calls it."""
    return te_attention(te.var("B") if batch is None else batch, 32, 1, 1000, 128, kv_heads=8, layout=layout)


def test_a_symbolic_batch_is_a_symbolic_grid_of_the_decode_kernel(assemble):
    """The batch a variable: the kernel's pairs of sequence and KV head group are counted when
    called, one kernel per range of batch sizes, each group's K/V rows read once."""
    import tvm_dsm
    from tvm_dsm.families.row_ranges import range_kernels

    func = _any_batch("bshd")
    found = find_dense_decode(func)
    batch = func.params[0].ty.shape[0]
    assert found.shape.head_extents[0].same_as(batch) and found.shape.kv_len == 1000 and found.group == 4
    kernels = range_kernels(func, TARGET, load_hardware())
    assert {k.family.name for k in kernels} == {"decode_attention"}
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(cuda_kernels(source)) == len(kernels)
    assert "% B)" not in source  # a CTA's sequence is its pair over the KV head groups, no runtime modulo
    assemble(source, "decode_any_batch")
    # a symbolic count of ungrouped heads too: the last head variable, which the pattern names the
    # group's (of one)
    heads = te.var("H")
    found = find_dense_decode(te_attention(2, heads, 1, 256, 64, layout="bshd"))
    assert found.shape.group == 1 and found.shape.head_extents[1].same_as(heads)


def test_a_symbolic_extent_of_two_roles_is_refused_by_name():
    """One variable as both the batch and the key length."""
    length = te.var("B")
    with pytest.raises(ClusterError, match="must be the key length of k and v alone"):
        find_dense_decode(te_attention(length, 8, 1, length, 64))


def _errors_at_each_extent(make, layout: str, extents: tuple) -> dict:
    """The relative error from float64 of one module built from ``make(layout)`` (a symbolic
    extent) at each of ``extents`` (``make(layout, extent)``'s shapes); fresh inputs,
    NaN-poisoned outputs."""
    import tvm_dsm

    module = tvm_dsm.build(make(layout), TARGET)
    dev, rng = tvm.cuda(0), np.random.default_rng()
    errors = {}
    for extent in extents:
        shapes = [[int(x) for x in p.ty.shape] for p in make(layout, extent).params]
        inputs = [(rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3]]
        out = tvm.runtime.tensor(np.full(shapes[3], np.nan, np.float16), dev)
        module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
        ref = _reference(layout, *inputs)
        errors[extent] = np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref)
    return errors


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_a_symbolic_past_matches_float64_at_every_length(layout):
    """A past of one key, fewer keys than a cluster's CTAs take a step, off the steps and long."""
    errors = _errors_at_each_extent(_any_past, layout, (1, 5, 300, 1000, 4097))
    assert max(errors.values()) < 2e-3, errors


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_a_symbolic_batch_matches_float64_at_every_size(layout):
    """A batch of one, a few, the first range's last and next, and many."""
    errors = _errors_at_each_extent(_any_batch, layout, (1, 3, 16, 17, 40))
    assert max(errors.values()) < 2e-3, errors


def test_the_decode_forms_suite_times_each_pick_beside_the_other_body():
    """The GPU suite ``decode_forms``: per form the planner's pick (tensor cores where a group
    shares each row) and the same cluster on the other cores; its kernels lower for CUDA."""
    from tvm_dsm.gpu.suites import SUITES
    from tvm_dsm.gpu.suites.attention import DECODE_FORMS

    variants = SUITES["decode_forms"]()
    picks = [v for v in variants if v.plan["planner"]]
    assert len(picks) == len(DECODE_FORMS) < len(variants)
    for pick in picks:
        form = pick.name.removesuffix("_tvm_dsm")
        others = [v for v in variants if not v.plan["planner"] and v.name.rsplit("_", 2)[0] == form]
        for other in others:
            assert other.plan["tensor_cores"] != pick.plan["tensor_cores"]
            assert other.plan["ranks"] == pick.plan["ranks"]
    grouped = picks[0]  # b8 h32/8: four query heads a row
    assert grouped.plan["tensor_cores"] and grouped.name.endswith("_tvm_dsm")
    tvm.compile(grouped.mod, target=TARGET)


def test_the_small_batch_suite_sets_three_files_beside_two_at_each_cluster():
    """The GPU suite ``llama_decode_small_batches``: per form the pick and clusters of 1-8 CTAs of
    8 warps with two and three register files (a cluster whose CTAs would get less than a step of
    keys is refused with both)."""
    from tvm_dsm.gpu.suites import SUITES
    from tvm_dsm.gpu.suites.experiments import LLAMA_SMALL_BATCH_FORMS

    variants = SUITES["llama_decode_small_batches"]()
    assert len({v.name for v in variants}) == len(variants)
    assert sum(v.plan["planner"] for v in variants) == len(LLAMA_SMALL_BATCH_FORMS)
    configs = [(v.name.split("_float16")[0], v.plan["ranks"], v.plan["files"])
               for v in variants if not v.plan["planner"]]
    assert sorted(c[:2] for c in configs if c[2] == 2) == sorted(c[:2] for c in configs if c[2] == 3)
    short = sum(form[3] == 512 for form in LLAMA_SMALL_BATCH_FORMS)
    assert len(configs) == len(LLAMA_SMALL_BATCH_FORMS) * 4 * 2 - short * 2  # 512 keys: no cluster of 8


def test_a_grid_that_runs_at_once_two_ctas_an_sm_takes_the_larger_cluster():
    """Head dim 64 (two CTAs of 8 warps fit an SM): a batch of 3 of the 1B Llama's 32/8 heads
    takes clusters of 8 (192 CTAs, at once two an SM) with two register files; head dim 128
    (one CTA an SM) keeps the grid within the SMs."""
    from tvm_dsm.gpu.suites.attention import decode_pick

    pick = decode_pick((3, 32, 8, 8192, 64, "bhsd", "float16"))
    assert (pick.ranks, pick.warps, pick.files, pick.tensor_cores) == (8, 8, 2, True)
    wide = decode_pick((3, 32, 8, 8192, 128, "bhsd", "float16"))
    assert 3 * 8 * wide.ranks <= load_hardware().sm_count


def _masked_decode(mask: str, batch: int = 1, heads: int = 16, keys: int = 1000, dim: int = 80):
    """One query a head at the end of ``keys`` keys, masked as users write it: ``causal``
    (``t <= i + keys - 1``, the query last) or an additive ``[1, keys]`` tensor; a batch of one
    leaves two unit axes, the batch's and the query's."""
    import math

    from tvm import tirx

    f32 = "float32"
    q = te.placeholder((batch, heads, 1, dim), "float16", name="q")
    k = te.placeholder((batch, heads, keys, dim), "float16", name="k")
    v = te.placeholder((batch, heads, keys, dim), "float16", name="v")
    d = te.reduce_axis((0, dim), name="d")
    s = te.compute((batch, heads, 1, keys), lambda b, h, i, j: te.sum(
        q[b, h, i, d].astype(f32) * k[b, h, j, d].astype(f32) * tirx.const(1 / math.sqrt(dim), f32), axis=d), name="s")
    extra = []
    if mask == "causal":
        m = te.compute(s.shape, lambda b, h, i, j: te.if_then_else(j <= i + keys - 1, s[b, h, i, j],
                                                                   tirx.const(-1e30, f32)), name="masked")
    else:
        bias = te.placeholder((1, keys), "float16", name="mask")
        extra = [bias]
        m = te.compute(s.shape, lambda b, h, i, j: s[b, h, i, j] + bias[i, j].astype(f32), name="masked")
    r, r2, t = (te.reduce_axis((0, keys), name=n) for n in ("r", "r2", "t"))
    mx = te.compute((batch, heads, 1), lambda b, h, i: te.max(m[b, h, i, r], axis=r), name="mx")
    e = te.compute(s.shape, lambda b, h, i, j: te.exp(m[b, h, i, j] - mx[b, h, i]), name="e")
    sm = te.compute((batch, heads, 1), lambda b, h, i: te.sum(e[b, h, i, r2], axis=r2), name="sm")
    o = te.compute((batch, heads, 1, dim), lambda b, h, i, c: te.sum(
        e[b, h, i, t] * v[b, h, t, c].astype(f32), axis=t), name="o")
    out = te.compute(o.shape, lambda b, h, i, c: (o[b, h, i, c] / sm[b, h, i]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, *extra, out])


@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_a_mask_over_the_query_position_is_read_at_the_one_query(mask):
    """The mask's query position (and a batch of one's axis) is 0 in the kernel: its plans lower
    (the unit axes had been left unbound in the kernel, so every plan failed and dlight ran it)."""
    ranking = plan(_masked_decode(mask))
    assert ranking.family.name == "decode_attention"
    tvm.compile(ranking.schedule(0).mod, target=TARGET)


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_gpu_a_masked_decode_matches_float64(mask):
    import tvm_dsm

    func = _masked_decode(mask)
    assert tvm_dsm.plan(func).family.name == "decode_attention"
    module = tvm_dsm.build(func, TARGET)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng, dev = np.random.default_rng(), tvm.cuda(0)
    inputs = [(rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3]]
    bias = [] if mask == "causal" else [np.where(rng.random(shapes[3]) < 0.3, -1e4, 0).astype(np.float16)]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs + bias), out)
    q, k, v = (x.astype(np.float64) for x in inputs)
    s = np.einsum("bhid,bhtd->bhit", q, k) / np.sqrt(q.shape[-1]) + (bias[0].astype(np.float64) if bias else 0)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p @ v) / p.sum(-1, keepdims=True)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3
