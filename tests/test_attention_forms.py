"""Attention as users write it (tvm_dsm.workloads.attention_forms: TE in several layouts and
styles, TOPI; with score terms: a bias, ALiBi, a soft cap, other masks, a log-sum-exp output;
decode with terms) reaches the tensor-core attention kernel or the decode kernel: what is read
from each form, the CUDA it builds, refusals that name the limit, the references against TVM's
llvm build, and (GPU) every form through ``tvm_dsm.build`` against float64."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.script import tirx as T

from conftest import LLVM, TARGET, cuda_source, host_launch
from conftest import kernels as cuda_kernels
from tvm_dsm.errors import ClusterError
from tvm_dsm.ir import extent_variables, specialized
from tvm_dsm.kernels.attention import TEMPLATE, AttentionConfig, fuse_attention, prefetches_terms
from tvm_dsm.kernels.attention_pattern import HeadAxis, find_attention, find_decode_attention
from tvm_dsm.workloads.attention_forms import (attention_with_terms, decode_attention_with_terms, relax_attention,
                                              te_attention, topi_attention)
from tvm_dsm.workloads.generated import REFERENCES

#: (name, arguments of te_attention after batch, heads, q_len, kv_len, dim)
FORMS = {
    "bhsd": {},
    "bshd": {"layout": "bshd"},
    "hsd": {"layout": "hsd"},
    "gqa": {"kv_heads": 2},
    "mqa": {"kv_heads": 1},
    "scale_on_q": {"scale_on": "q"},
    "scale_in_softmax": {"scale_on": "softmax"},
    "causal_select": {"causal": True},
    "causal_if_then_else": {"causal": True, "mask": "if_then_else"},
    "causal_added": {"causal": True, "mask": "add"},
    "probabilities": {"normalize": "probabilities"},
    "gqa_bshd_causal_probabilities": {"kv_heads": 2, "layout": "bshd", "causal": True, "normalize": "probabilities"},
    "bf16": {"dtype": "bfloat16"},
}


def _form(name: str, batch=2, heads=4, q_len=128, kv_len=128, dim=64, **extra):
    kwargs = {**FORMS[name], **extra}
    if kwargs.get("layout") == "hsd":
        batch = 1
    return te_attention(batch, heads, q_len, kv_len, dim, **kwargs)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_every_form_is_read_as_attention(name):
    shape = find_attention(_form(name))
    assert (shape.q_len, shape.kv_len, shape.dim) == (128, 128, 64)
    assert shape.heads == (4 if name == "hsd" else 8)
    assert shape.scale == pytest.approx(0.125)
    assert shape.causal == FORMS[name].get("causal", False)
    assert shape.dtype == FORMS[name].get("dtype", "float16")
    q, k, v, out = shape.layouts
    assert q == out and k == v
    assert q.dim == k.dim == len(q.heads) + 1
    assert q.seq == (1 if FORMS[name].get("layout") in ("bshd", "hsd") else 2)


def test_grouped_and_multi_query_keys_are_read_per_group():
    assert find_attention(_form("gqa")).layouts[1].heads[-1] == HeadAxis(1, 1, divisor=2)
    assert find_attention(_form("mqa")).layouts[1].heads[-1] == HeadAxis(1, None)


def test_topi_flattened_heads_are_two_axes_of_one_variable():
    shape = find_attention(topi_attention(2, 4, 128, 128, 64))
    assert shape.head_extents == (8,)
    assert shape.layouts[0].heads == (HeadAxis(0, 0, divisor=4), HeadAxis(2, 0, modulus=4))


@pytest.mark.parametrize("causal", [False, True])
def test_relax_legalized_attention_is_read_through_its_reshapes(causal):
    """R.nn.attention legalized: [B, S, H, D] transposed and reshaped to [B * H, S, D], fp16
    scores, the causal mask zeroing masked scores and then their exponentials."""
    shape = find_attention(relax_attention(2, 4, 128, 256, 64, causal))
    assert (shape.heads, shape.q_len, shape.kv_len, shape.causal) == (8, 128, 256, causal)
    assert shape.layouts[0].heads == (HeadAxis(0, 0, divisor=4), HeadAxis(2, 0, modulus=4))


@pytest.mark.parametrize(("name", "extra"), [
    ("bshd", {}), ("gqa_bshd_causal_probabilities", {}), ("bf16", {}), ("causal_select", {"dim": 96}),
    ("bhsd", {"q_len": 200, "kv_len": 300}), ("causal_added", {"q_len": 130, "kv_len": 130, "dim": 80}),
])
def test_forms_build_one_kernel_that_assembles(assemble, name, extra):
    source = cuda_source(fuse_attention(_form(name, **extra)))
    assert source.count("__global__") == 2
    rank = 3 if FORMS[name].get("layout") == "hsd" else 4
    assert f"cp.async.bulk.tensor.{rank}d" in source
    ptx = "bf16" if name == "bf16" else "f16"
    assert f".f32.{ptx}.{ptx}" in source
    assert assemble(source, f"attention_form_{name}_{extra.get('dim', 64)}")


def _variant(condition=None, head_dim_outer=False, v_dim=64):
    """[2, 4, 128, 64] attention written by hand with the causal mask's ``condition(i, t)``
    replaced, q and k stored [B, H, D, S] (the head dim not innermost), or v and the output of
    ``v_dim`` columns (multi-head latent attention's values)."""
    qk_shape = (2, 4, 64, 128) if head_dim_outer else (2, 4, 128, 64)
    q = te.placeholder(qk_shape, "float16", name="q")
    k = te.placeholder(qk_shape, "float16", name="k")
    v = te.placeholder((2, 4, 128, v_dim), "float16", name="v")
    d = te.reduce_axis((0, 64), "d")

    def at(x, b, h, s):
        return x[b, h, d, s] if head_dim_outer else x[b, h, s, d]

    s = te.compute((2, 4, 128, 128), lambda b, h, i, t: te.sum(
        at(q, b, h, i).astype("float32") * at(k, b, h, t).astype("float32") * 0.125, axis=d), name="s")
    if condition is not None:
        scores = s
        s = te.compute(s.shape, lambda b, h, i, t: tirx.Select(
            condition(i, t), scores[b, h, i, t], tirx.const(float("-inf"), "float32")), name="masked")
    t1, t2, t3 = (te.reduce_axis((0, 128), n) for n in ("t1", "t2", "t3"))
    m = te.compute((2, 4, 128), lambda b, h, i: te.max(s[b, h, i, t1], axis=t1), name="m")
    l = te.compute((2, 4, 128), lambda b, h, i: te.sum(te.exp(s[b, h, i, t2] - m[b, h, i]), axis=t2), name="l")
    o = te.compute((2, 4, 128, v_dim), lambda b, h, i, e: te.sum(
        te.exp(s[b, h, i, t3] - m[b, h, i]) * v[b, h, t3, e].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, h, i, e: (o[b, h, i, e] / l[b, h, i]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])


@pytest.mark.parametrize(("func", "message"), [
    (_variant(head_dim_outer=True), "head dim must be the innermost axis"),
    (_variant(v_dim=36), "head dim 36"),
    (te_attention(1, 2, 128, 128, 264), "head dim 264"),
    (te_attention(1, 2, 128, 128, 60), "head dim 60"),
    (te_attention(1, 2, 128, 128, 64, dtype="float32"), "float16 or bfloat16"),
])
def test_what_the_kernel_cannot_take_is_refused_by_name(func, message):
    with pytest.raises(ClusterError, match=message):
        fuse_attention(func)


@pytest.mark.parametrize(("dim", "value_dim", "causal"), [(192, 128, True), (192, 128, False), (64, 32, False),
                                                         (128, 192, True)])
def test_a_value_head_dim_other_than_qs_is_computed_at_its_own_width(ptxas_report, dim, value_dim, causal):
    """DeepSeek's latent attention scores 192 columns and weighs 128: S = Q K^T steps over q's
    head dim, O += P V is one wgmma of v's width (no zero columns computed), its K/V slots and
    output panels v's, registers without spills."""
    func = te_attention(1, 4, 256, 256, dim, value_dim=value_dim, causal=causal)
    shape = find_attention(func)
    assert (shape.dim, shape.v_dim) == (dim, value_dim)
    config = TEMPLATE.default_config(shape)
    assert (config == AttentionConfig(128, warpgroups=2)) == (value_dim < dim)  # measured fastest there
    source = cuda_source(fuse_attention(func))
    width = -(-value_dim // 64) * 64
    assert f"tvm_dsm_attention_values_n{config.block_n}d{width}(" in source
    assert f"tvm_dsm_attention_scores_m{config.block_m}n{config.block_n}d{-(-dim // 64) * 64}(" in source
    assert f"wgmma.mma_async.sync.aligned.m64n{width}k16" in source
    report = ptxas_report(source, f"attention_value_dim_{dim}_{value_dim}_{causal}")
    assert "0 bytes spill stores" in report and "0 bytes stack frame" in report


def _reference(layout: str, q, k, v, heads, kv_heads, causal):
    """float64 softmax(Q K^T / sqrt(D)) V over inputs in ``layout``."""

    def bhsd(x):
        x = x.astype(np.float64)
        return x[None] if layout == "hsd" else x.transpose(0, 2, 1, 3) if layout == "bshd" else x

    q4, k4, v4 = bhsd(q), bhsd(k), bhsd(v)
    k4, v4 = (np.repeat(x, heads // kv_heads, axis=1) for x in (k4, v4))
    s = np.einsum("bhid,bhtd->bhit", q4, k4) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p @ v4) / p.sum(-1, keepdims=True)
    return o[0] if layout == "hsd" else o.transpose(0, 2, 1, 3) if layout == "bshd" else o


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "sizes"), [
    *((name, (2, 4, 256, 256, 64)) for name in sorted(FORMS)),
    ("gqa_bshd_causal_probabilities", (2, 8, 200, 200, 96)),
    ("bhsd", (1, 2, 130, 333, 128)),
    ("causal_added", (3, 2, 257, 257, 80)),
    ("bf16", (2, 2, 192, 320, 128)),
    ("causal_select", (1, 4, 300, 300, 192, 128)),
    ("gqa_bshd_causal_probabilities", (2, 8, 200, 200, 192, 128)),
    ("bshd", (2, 4, 256, 333, 64, 32)),
    ("bf16", (1, 4, 256, 256, 128, 192)),
])
def test_gpu_every_te_form_matches_float64(name, sizes):
    """Through ``tvm_dsm.build`` (the planner's pick), NaN-poisoned output, fresh inputs; a
    sixth size is v's head dim, where it is not q's."""
    batch, heads, q_len, kv_len, dim, *value_dim = sizes
    extra = {"value_dim": value_dim[0]} if value_dim else {}
    dtype = ml_dtypes.bfloat16 if FORMS[name].get("dtype") == "bfloat16" else np.float16
    func = _form(name, batch, heads, q_len, kv_len, dim, **extra)
    error = _built_error(func, FORMS[name].get("layout", "bhsd"), heads, FORMS[name].get("kv_heads", heads),
                         FORMS[name].get("causal", False), dtype)
    assert error < (1e-2 if dtype is not np.float16 else 2e-3)


def _built_error(func, layout: str, heads: int, kv_heads: int, causal: bool, dtype) -> float:
    """``func`` through ``tvm_dsm.build`` (the planner's pick) on fresh inputs with a
    NaN-poisoned output: its relative error against :func:`_reference`."""
    import tvm_dsm

    module = tvm_dsm.build(func, TARGET)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng = np.random.default_rng()
    inputs = [(rng.standard_normal(s) * 2).astype(dtype) for s in shapes[:3]]
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(shapes[3], np.nan, dtype), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
    ref = _reference(layout, *inputs, heads, kv_heads, causal)
    got = out.numpy().astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize(("build", "causal"), [(topi_attention, False), (relax_attention, False),
                                               (relax_attention, True)])
def test_gpu_topi_and_relax_forms_match_float64(build, causal):
    import tvm_dsm

    args = (2, 4, 200, 200, 64) + ((causal,) if build is relax_attention else ())
    func = build(*args)
    module = tvm_dsm.build(func, TARGET)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng = np.random.default_rng()
    inputs = [(rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3]]
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(shapes[3], np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
    ref = _reference("bshd", *inputs, 4, 4, causal)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3



def _symbolic(layout: str, causal: bool, dim: int = 64):
    """A grouped attention (batch 2, 8 query heads, 2 KV heads) over any sequence length ``S``."""
    length = te.var("S")
    return te_attention(2, 8, length, length, dim, kv_heads=2, layout=layout, causal=causal)


@pytest.mark.parametrize(("layout", "causal", "dim"), [("bhsd", True, 64), ("bshd", False, 128)])
def test_a_symbolic_sequence_length_builds_one_kernel_for_every_length(layout, causal, dim, assemble):
    """Matched at one length, the kernel keeps the variable: its grid and the key mask of the
    last tile follow it, and an empty sequence launches nothing."""
    func = _symbolic(layout, causal, dim)
    shape = TEMPLATE.find(func)
    length = func.params[0].ty.shape[shape.layouts[0].seq]
    assert shape.q_len.same_as(length) and shape.kv_len.same_as(length) and shape.causal == causal
    assert TEMPLATE.default_config(shape).block_n == 64  # 128-key tiles only where a length says so
    mod = fuse_attention(func)
    (launch,) = host_launch(mod, "tvm_dsm")
    assert ", S, " in launch  # the kernel takes the length: its grid (heads x query tiles) and key mask
    last = mod["main"].body.seq[-1]
    assert isinstance(last, tirx.IfThenElse) and str(last.condition).endswith("S) > 0")  # empty: no launch
    source = cuda_source(mod, "tvm_dsm")
    assemble(source, f"attention_symbolic_{layout}")


@pytest.mark.parametrize("length", [128, "S"])
def test_a_symbolic_batch_is_a_head_extent_of_the_kernel(length):
    """A batch of any size (and a sequence of any length): the kernel's grid runs over batch x
    heads query heads, the batch read when it is called."""
    batch = te.var("B")
    seq = te.var(length) if isinstance(length, str) else length
    shape = TEMPLATE.find(te_attention(batch, 4, seq, seq, 64))
    assert shape.head_extents[0].same_as(batch) and tvm_ffi.structural_equal(shape.heads, batch * 4)
    assert (shape.q_len, shape.kv_len) == ((seq, seq) if isinstance(length, str) else (128, 128))


def test_a_symbolic_batch_the_rows_do_not_run_over_is_refused():
    """k holds a batch of any size, of which the attention reads the first 2 (its rows' extent):
    not a batch of the kernel's grid."""
    q = te.placeholder((2, 4, 128, 64), "float16", "q")
    batch = te.var("B")
    k, v = (te.placeholder((batch, 4, 128, 64), "float16", n) for n in "kv")
    d, t, u = te.reduce_axis((0, 64), "d"), te.reduce_axis((0, 128), "t"), te.reduce_axis((0, 128), "u")
    s = te.compute((2, 4, 128, 128), lambda b, h, i, j: te.sum(
        q[b, h, i, d].astype("float32") * 0.125 * k[b, h, j, d].astype("float32"), axis=d), name="s")
    m = te.compute((2, 4, 128), lambda b, h, i: te.max(s[b, h, i, t], axis=t), name="m")
    e = te.compute(s.shape, lambda b, h, i, j: te.exp(s[b, h, i, j] - m[b, h, i]), name="e")
    total = te.compute((2, 4, 128), lambda b, h, i: te.sum(e[b, h, i, u], axis=u), name="total")
    w = te.reduce_axis((0, 128), "w")
    o = te.compute((2, 4, 128, 64), lambda b, h, i, c: te.sum(e[b, h, i, w] * v[b, h, w, c].astype("float32"), axis=w),
                   name="o")
    out = te.compute(o.shape, lambda b, h, i, c: (o[b, h, i, c] / total[b, h, i]).astype("float16"), name="out")
    func = te.create_prim_func([q, k, v, out])
    assert find_attention(specialized(func, extent_variables(func)[0], 2)).heads == 8  # attention at 2
    with pytest.raises(ClusterError, match="outer head axis"):
        TEMPLATE.find(func)


def test_keys_as_many_as_the_head_dim_still_match():
    """Relax's causal attention at 64 keys of head dim 64: the max over keys of the scores (a sum
    over the head dim, of the same extent) reduces the scores' own axis, so it starts the cascade
    rather than joining the scores' group."""
    shape = find_attention(relax_attention(2, 16, 64, 64, 64, causal=True))
    assert (shape.q_len, shape.kv_len, shape.dim, shape.causal) == (64, 64, 64, True)


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "causal", "dim"), [("bhsd", True, 64), ("bshd", False, 128), ("bshd", True, 128)])
def test_gpu_one_kernel_of_a_symbolic_length_matches_float64_at_every_length(layout, causal, dim):
    """One module for lengths of one key, a tile less one, off the tiles and long; fresh inputs,
    NaN-poisoned outputs."""
    func = _symbolic(layout, causal, dim)
    module = tvm.compile(fuse_attention(func), target=TARGET, tir_pipeline="tvm_dsm")
    dev, rng = tvm.cuda(0), np.random.default_rng()
    for length in (1, 63, 100, 257, 1024):
        shapes = [[int(x) if isinstance(x, tirx.IntImm) else length for x in p.ty.shape] for p in func.params]
        inputs = [(rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3]]
        out = tvm.runtime.tensor(np.full(shapes[3], np.nan, np.float16), dev)
        module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
        ref = _reference(layout, *inputs, 8, 2, causal)
        error = np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref)
        assert error < 2e-3, (length, error)


def _error_on_gpu(module, func, layout: str, causal: bool, extent) -> float:
    """``module`` (``func`` built) run on fresh inputs of the shapes ``extent(param, dim)`` gives
    (a dimension's extent), its output NaN-poisoned, against float64 (8 query heads, 2 KV)."""
    rng = np.random.default_rng()
    dev = tvm.cuda(0)
    shapes = [[int(x) if isinstance(x, tirx.IntImm) else extent(p, x) for x in p.ty.shape] for p in func.params]
    inputs = [(rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3]]
    out = tvm.runtime.tensor(np.full(shapes[3], np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
    ref = _reference(layout, *inputs, 8, 2, causal)
    return float(np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "causal"), [("bshd", True), ("bhsd", False)])
def test_gpu_a_symbolic_batch_and_length_match_float64(layout, causal):
    """One build of grouped attention over any batch and sequence length (``tvm_dsm.build``: the
    batch's ranges share the kernel), at batches of 1, 3 and 8; fresh inputs, NaN-poisoned
    outputs."""
    import tvm_dsm

    length = te.var("S")
    func = te_attention(te.var("B"), 8, length, length, 64, kv_heads=2, layout=layout, causal=causal)
    module = tvm_dsm.build(func, TARGET)
    for batch, seq in ((1, 1), (3, 100), (8, 257)):
        error = _error_on_gpu(module, func, layout, causal, lambda _, x: batch if x.name == "B" else seq)
        assert error < 2e-3, (batch, seq, error)


def test_a_relax_model_of_any_batch_and_prompt_length_takes_the_attention_kernel():
    """Relax's attention over an int64 batch and sequence length, as a model served at any batch
    has it: the attention family's kernel, one for every batch (was dlight's, per operator)."""
    import tvm_dsm
    from tvm_dsm.families.row_ranges import range_kernels
    from tvm_dsm.hardware import load_hardware

    batch, length = tirx.Var("B", "int64"), tirx.Var("S", "int64")
    func = relax_attention(batch, 16, length, length, 64, causal=True)
    kernels = range_kernels(func, TARGET, load_hardware())
    assert {k.family.name for k in kernels} == {"attention"} and kernels[-1].bound is None
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(cuda_kernels(source)) == len(kernels)


def test_a_relax_model_of_any_prompt_length_builds_a_kernel_per_range_of_lengths():
    """Relax's attention over an int64 sequence length: the ranges of lengths each take a
    configuration (128-key tiles from 1024 keys), one dispatch."""
    import tvm_dsm
    from tvm_dsm.families.row_ranges import range_kernels
    from tvm_dsm.hardware import load_hardware

    length = tirx.Var("S", "int64")
    func = relax_attention(2, 16, length, length, 64, causal=True)
    kernels = range_kernels(func, TARGET, load_hardware())
    assert {k.family.name for k in kernels} == {"attention"}
    assert [k.config.block_n for k in kernels] == [64, 128]
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(cuda_kernels(source)) == len(kernels)


def test_parameters_in_another_order_are_refused_by_name():
    """The kernel's signature is (q, k, v, out): a function taking k first would get q and k
    swapped, so it is refused (and falls back)."""
    func = te_attention(2, 4, 128, 128, 64)
    q, k, v, out = func.params
    swapped = tvm.tirx.PrimFunc([k, q, v, out], func.body, attrs=func.attrs)
    with pytest.raises(ClusterError, match=r"\(q, k, v, out\) in that order \(other inputs may sit between them\); the function has \['k', 'q'"):
        find_attention(swapped)


def _two_lengths(layout: str, causal: bool, dim: int):
    """A grouped attention (batch 2, 8 query heads, 2 KV heads) of ``Q`` queries over ``K`` keys,
    two variables (a prompt over a cached past, as a Relax model with a KV cache writes it)."""
    return te_attention(2, 8, te.var("Q"), te.var("K"), dim, kv_heads=2, layout=layout, causal=causal)


@pytest.mark.slow
def test_a_query_length_and_a_key_length_build_the_attention_kernel(assemble):
    """Two length variables: matched at two lengths, the kernel takes both (its grid follows the
    queries, its last key tile's mask the keys), one dispatch over ranges of query lengths, one
    query the decode kernel."""
    import tvm_dsm
    from tvm_dsm.families.row_ranges import range_kernels
    from tvm_dsm.hardware import load_hardware

    func = _two_lengths("bshd", False, 128)
    shape = TEMPLATE.find(func)
    q_len, kv_len = (func.params[n].ty.shape[shape.layouts[n].seq] for n in (0, 1))
    assert shape.q_len.same_as(q_len) and shape.kv_len.same_as(kv_len) and not q_len.same_as(kv_len)
    kernels = range_kernels(func, TARGET, load_hardware())
    # one query a head (no mask) is decode attention over the past: a kernel of its own; more
    # queries the attention kernel, in the configuration of their range (up to 1024 queries the
    # 128-row CTAs of 16 heads are one wave: default_config)
    names = [k.family.name for k in kernels]
    assert names[0] == "decode_attention" and kernels[0].bound == 1 and set(names[1:]) == {"attention"}
    assert [k.config for k in kernels[1:]] == [AttentionConfig(128, 1, 2), AttentionConfig(64, 2)]
    one_query = range_kernels(specialized(func, q_len, 1), TARGET, load_hardware())  # ranges of keys in their turn
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(cuda_kernels(source)) == len(one_query) + len(kernels) - 1
    assert all(", int K" in line for line in source.splitlines() if "__global__" in line)  # the key tail's mask
    assemble(source, "attention_two_lengths")


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "causal", "dim"), [("bshd", False, 128), ("bhsd", True, 64)])
def test_gpu_two_length_variables_match_float64_at_every_pair(layout, causal, dim):
    """One module for queries fewer, as many as and more than the keys, on and off the tiles;
    fresh inputs, NaN-poisoned outputs."""
    import tvm_dsm

    func = _two_lengths(layout, causal, dim)
    module = tvm_dsm.build(func, TARGET)
    for q_len, kv_len in ((1, 1), (1, 300), (63, 1024), (257, 100), (1024, 1024)):
        error = _error_on_gpu(module, func, layout, causal, lambda p, _: kv_len if p.name in ("k", "v") else q_len)
        assert error < 2e-3, (q_len, kv_len, error)


def _bshd_causal_by_where(batch=2, heads=4, length=257, dim=128, dtype="bfloat16"):
    """Causal attention over ``[B, S, H, D]``: the mask a bool tensor selected by ``topi.where``,
    TOPI's softmax, the weighted sum written in the output's ``[B, S, H, D]`` order."""
    from tvm import topi

    q, k, v = (te.placeholder((batch, length, heads, dim), dtype, name=n) for n in "qkv")
    d, t = te.reduce_axis((0, dim), "d"), te.reduce_axis((0, length), "t")
    qk = te.compute((batch, heads, length, length), lambda b, h, i, j: te.sum(
        q[b, i, h, d].astype("float32") * k[b, j, h, d].astype("float32"), axis=d), name="qk")
    scaled = te.compute(qk.shape, lambda b, h, i, j: qk[b, h, i, j] * (1.0 / np.sqrt(dim)), name="scaled")
    keep = te.compute((length, length), lambda i, j: j <= i, name="keep")
    lowest = te.compute((1,), lambda _: tirx.const(-1e30, "float32"), name="lowest")
    masked = topi.where(topi.broadcast_to(keep, qk.shape), scaled, topi.broadcast_to(lowest, qk.shape))
    p = topi.cast(topi.nn.softmax(masked, axis=-1), dtype)
    pv = te.compute((batch, length, heads, dim), lambda b, i, h, e: te.sum(
        p[b, h, i, t].astype("float32") * v[b, t, h, e].astype("float32"), axis=t), name="pv")
    out = te.compute(pv.shape, lambda *i: pv(*i).astype(dtype), name="out")
    return te.create_prim_func([q, k, v, out])


def _scale_in_the_exponent(heads=12, length=100, dim=80, causal=False):
    """``[H, S, D]`` attention whose row max is over the raw scores and whose exponent scales
    the difference: ``exp((S - max S) / sqrt(D))``; ``causal``: the scores past the diagonal
    filled with fp32's lowest value before the max."""
    q, k, v = (te.placeholder((heads, length, dim), "float16", name=n) for n in "qkv")
    d, t, t1, t2 = (te.reduce_axis((0, e), n) for e, n in ((dim, "d"), (length, "t"), (length, "t1"), (length, "t2")))
    scale = 1.0 / np.sqrt(dim)
    raw = te.compute((heads, length, length), lambda h, i, j: te.sum(
        q[h, i, d].astype("float32") * k[h, j, d].astype("float32"), axis=d), name="raw")
    lowest = tirx.const(-3.4e38, "float32")
    s = te.compute(raw.shape, lambda h, i, j: te.if_then_else(j <= i, raw[h, i, j], lowest) if causal else raw[h, i, j],
                   name="s")
    m = te.compute((heads, length), lambda h, i: te.max(s[h, i, t1], axis=t1), name="m")
    e = te.compute(s.shape, lambda h, i, j: te.exp((s[h, i, j] - m[h, i]) * scale), name="e")
    l = te.compute((heads, length), lambda h, i: te.sum(e[h, i, t2], axis=t2), name="l")
    o = te.compute((heads, length, dim), lambda h, i, c: te.sum(
        (e[h, i, t] / l[h, i]).astype("float16").astype("float32") * v[h, t, c].astype("float32"), axis=t), name="o")
    out = te.compute(o.shape, lambda *i: o(*i).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])


def _decode_bshd(batch=4, keys=1000, heads=16, dim=80):
    """Decode attention over ``[B, S, H, D]`` tensors (one query), TOPI's softmax, the weighted
    sum written ``[B, 1, H, D]``."""
    from tvm import topi

    q = te.placeholder((batch, 1, heads, dim), "float16", name="q")
    k, v = (te.placeholder((batch, keys, heads, dim), "float16", name=n) for n in "kv")
    d, t = te.reduce_axis((0, dim), "d"), te.reduce_axis((0, keys), "t")
    qk = te.compute((batch, heads, 1, keys), lambda b, h, i, j: te.sum(
        q[b, i, h, d].astype("float32") * k[b, j, h, d].astype("float32"), axis=d), name="qk")
    p = topi.nn.softmax(te.compute(qk.shape, lambda *i: qk(*i) * (dim ** -0.5), name="s"), axis=-1)
    pv = te.compute((batch, 1, heads, dim), lambda b, i, h, e: te.sum(
        p[b, h, i, t] * v[b, t, h, e].astype("float32"), axis=t), name="pv")
    out = te.compute(pv.shape, lambda *i: pv(*i).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])


def _decode_bshd_grouped(batch=2, keys=1000, heads=28, kv_heads=4, dim=128, max_row=None, sum_row=None):
    """Grouped decode attention over a ``[B, S, Hkv, D]`` cache (Qwen2-7B's 7 query heads a KV
    head), bf16, its statistics ``[B, H]`` without the query axis, which only the weighted sum
    and the output ``[B, 1, H, D]`` keep (an axis of extent 1 the sum does not read).
    ``max_row``, ``sum_row``: the row ``(b, h)`` of the max the row sum shifts by, and of the sum
    the output divides by (each the row's own by default)."""
    max_row, sum_row = (rows or (lambda b, h: (b, h)) for rows in (max_row, sum_row))
    group = heads // kv_heads
    q = te.placeholder((batch, 1, heads, dim), "bfloat16", name="q")
    k, v = (te.placeholder((batch, keys, kv_heads, dim), "bfloat16", name=n) for n in "kv")
    d, t1, t2, t3 = te.reduce_axis((0, dim), "d"), *(te.reduce_axis((0, keys), f"t{n}") for n in range(3))
    s = te.compute((batch, heads, keys), lambda b, h, j: te.sum(
        q[b, 0, h, d].astype("float32") * k[b, j, h // group, d].astype("float32"), axis=d), name="s")
    m = te.compute((batch, heads), lambda b, h: te.max(s[b, h, t1], axis=t1), name="m")
    e = te.compute(s.shape, lambda b, h, j: te.exp((s[b, h, j] - m[b, h]) * dim ** -0.5), name="e")
    l = te.compute((batch, heads), lambda b, h: te.sum(
        te.exp((s[b, h, t2] - m[max_row(b, h)]) * dim ** -0.5), axis=t2), name="l")
    o = te.compute((batch, 1, heads, dim), lambda b, i, h, c: te.sum(
        e[b, h, t3] * v[b, t3, h // group, c].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, i, h, c: (o[b, i, h, c] / l[sum_row(b, h)]).astype("bfloat16"), name="out")
    return te.create_prim_func([q, k, v, out])


@pytest.mark.parametrize("rows", [dict(max_row=lambda b, h: (b, (h + 1) % 28)),
                                  dict(sum_row=lambda b, h: (b, (h + 1) % 28))], ids=["max", "sum"])
def test_statistics_read_at_another_row_are_not_attention(rows):
    """The row sum shifted by another head's max, or the output divided by another head's sum:
    read as symbols of the row, they would have passed as attention (and computed each head's
    own statistics)."""
    with pytest.raises(ClusterError, match="not at its own row"):
        find_decode_attention(_decode_bshd_grouped(**rows))


@T.prim_func(s_tir=True)
def _weighted_sum_over_a_unit_axis_from_one(q: T.Buffer((2, 1, 4, 8), "float16"), k: T.Buffer((2, 8, 2, 8), "float16"),
                                            v: T.Buffer((2, 8, 2, 8), "float16"),
                                            out: T.Buffer((2, 1, 4, 8), "float16")):
    """Its weighted sum's unit axis ranges over [1, 2): v is read at head ``(h // 2 + 1) % 2``."""
    s = T.sblock_alloc_buffer((2, 4, 8))
    m = T.sblock_alloc_buffer((2, 4))
    o = T.sblock_alloc_buffer((2, 2, 4, 8))
    l = T.sblock_alloc_buffer((2, 4))
    for b, h, j, d in T.grid(2, 4, 8, 8):
        with T.sblock("s"):
            v_b, v_h, v_j, v_d = T.axis.remap("SSSR", [b, h, j, d])
            with T.init():
                s[v_b, v_h, v_j] = T.float32(0.0)
            s[v_b, v_h, v_j] = s[v_b, v_h, v_j] + T.Cast("float32", q[v_b, 0, v_h, v_d]) * T.Cast(
                "float32", k[v_b, v_j, v_h // 2, v_d])
    for b, h, t in T.grid(2, 4, 8):
        with T.sblock("m"):
            v_b, v_h, v_t = T.axis.remap("SSR", [b, h, t])
            with T.init():
                m[v_b, v_h] = T.float32(-3.4028234663852886e38)
            m[v_b, v_h] = T.max(m[v_b, v_h], s[v_b, v_h, v_t])
    for b, i, h, c, t in T.grid(2, 1, 4, 8, 8):
        with T.sblock("o"):
            v_b, v_i, v_h, v_c = T.axis.spatial(2, b), T.axis.spatial((1, 2), i + 1), T.axis.spatial(4, h), \
                T.axis.spatial(8, c)
            v_t = T.axis.reduce(8, t)
            with T.init():
                o[v_b, v_i, v_h, v_c] = T.float32(0.0)
            o[v_b, v_i, v_h, v_c] = o[v_b, v_i, v_h, v_c] + T.exp((s[v_b, v_h, v_t] - m[v_b, v_h]) * T.float32(0.35)) \
                * T.Cast("float32", v[v_b, v_t, (v_h // 2 + v_i) % 2, v_c])
    for b, h, t in T.grid(2, 4, 8):
        with T.sblock("l"):
            v_b, v_h, v_t = T.axis.remap("SSR", [b, h, t])
            with T.init():
                l[v_b, v_h] = T.float32(0.0)
            l[v_b, v_h] = l[v_b, v_h] + T.exp((s[v_b, v_h, v_t] - m[v_b, v_h]) * T.float32(0.35))
    for b, i, h, c in T.grid(2, 1, 4, 8):
        with T.sblock("out"):
            v_b, v_i, v_h, v_c = T.axis.remap("SSSS", [b, i, h, c])
            out[v_b, v_i, v_h, v_c] = T.Cast("float16", o[v_b, v_i + 1, v_h, v_c] / l[v_b, v_h])


def test_a_reduction_over_an_axis_not_from_zero_is_not_a_level():
    """The kernels index every level from 0: an axis of extent 1 ranging over [1, 2) read as 0
    would read the other KV head."""
    with pytest.raises(ClusterError):
        find_decode_attention(_weighted_sum_over_a_unit_axis_from_one)


def test_a_grouped_decode_whose_query_axis_only_the_output_keeps_reads_each_kv_head_once():
    """The weighted sum's axis of extent 1 is not a second head dim: the decode kernel takes
    the function, each KV head read once for its group of 7 query heads."""
    import tvm_dsm

    shape = find_decode_attention(_decode_bshd_grouped())
    assert (shape.head_extents, shape.group, shape.dim) == ((2, 28), 7, 128)
    assert [str(i) for i in shape.indices[3]][1] == "0"
    assert tvm_dsm.plan(_decode_bshd_grouped()).family.name == "decode_attention"


def test_a_weighted_sum_written_in_another_order_than_the_statistics_is_attention(assemble):
    """The weighted sum iterates ``[B, S, H, D]`` while the statistics' rows are ``[B, H, S]``
    (its variables are put in the statistics' order), the mask a bool tensor compared with 0."""
    shape = find_attention(_bshd_causal_by_where())
    assert shape.causal and shape.dtype == "bfloat16" and (shape.q_len, shape.dim) == (257, 128)
    q, _, _, out = shape.layouts
    assert q.seq == out.seq == 1
    assemble(cuda_source(fuse_attention(_bshd_causal_by_where())), "attention_bshd_where")


@pytest.mark.parametrize("causal", [False, True])
def test_a_scale_inside_the_exponent_is_the_attentions_scale(causal, assemble):
    shape = find_attention(_scale_in_the_exponent(causal=causal))
    assert shape.scale == pytest.approx(1 / np.sqrt(80)) and shape.causal == causal
    assemble(cuda_source(fuse_attention(_scale_in_the_exponent(causal=causal))), f"attention_scale_in_exp_{causal}")


def test_decode_attention_over_bshd_tensors_takes_the_decode_kernel():
    import tvm_dsm

    assert tvm_dsm.plan(_decode_bshd()).family.name == "decode_attention"


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["bshd_where", "scale_in_exp", "scale_in_exp_causal", "decode_bshd",
                                  "decode_bshd_grouped"])
def test_gpu_attention_forms_read_by_their_variables_match_float64(form):
    func, layout, causal, dtype = {
        "bshd_where": (_bshd_causal_by_where(), "bshd", True, ml_dtypes.bfloat16),
        "scale_in_exp": (_scale_in_the_exponent(), "hsd", False, np.float16),
        "scale_in_exp_causal": (_scale_in_the_exponent(causal=True), "hsd", True, np.float16),
        "decode_bshd": (_decode_bshd(), "bshd", False, np.float16),
        "decode_bshd_grouped": (_decode_bshd_grouped(), "bshd", False, ml_dtypes.bfloat16),
    }[form]
    shape, kv_shape = ([int(x) for x in p.ty.shape] for p in func.params[:2])
    heads, kv_heads = (shape[0], kv_shape[0]) if layout == "hsd" else (shape[2], kv_shape[2])
    assert _built_error(func, layout, heads, kv_heads, causal, dtype) < (1e-2 if dtype is not np.float16 else 2e-3)


#: What each form of :func:`attention_with_terms` reads: (masked, causal tiles skipped, inputs besides q, k, v).
TERMS = {"bias": (False, False, 1), "alibi": (True, True, 1), "softcap": (False, False, 0),
         "window": (True, True, 0), "fp16_fill": (True, False, 0), "strict": (True, False, 0),
         "after": (True, False, 0), "padding": (True, False, 1)}


@pytest.mark.parametrize("terms", sorted(TERMS))
def test_an_exponent_of_more_than_the_scaled_score_is_computed_by_the_kernel(terms, assemble):
    """A bias, ALiBi, a soft cap or a mask other than the causal one: the kernel computes each
    key's exponent as the function writes it (a masked key gets the function's fill exactly,
    so rows it empties come out as the function computes them); tiles past the diagonal are
    skipped only where the mask provably rejects them, keeps the diagonal and the fill
    underflows (-65504 need not)."""
    masked, skipped, inputs = TERMS[terms]
    func = attention_with_terms(terms)
    shape = find_attention(func)
    assert shape.terms is not None and shape.scale == 1.0
    assert (shape.terms.mask is not None, shape.causal, len(shape.params) - 4) == (masked, skipped, inputs)
    assert shape.positions == (0, 1, 2, 3 + inputs)
    source = cuda_source(fuse_attention(func))
    assert len(cuda_kernels(source)) == 1
    assert assemble(source, f"attention_terms_{terms}")


def test_a_bias_is_loaded_while_the_scores_mma_runs_where_its_registers_fit():
    """The bias elements a thread adds to its scores are loaded between the scores' MMA and its
    wait (the MMA hides their latency), where a register each fits beside the accumulators: not
    at head dim 128 in two row blocks, nor without a tensor to load (a soft cap)."""
    func = attention_with_terms("bias", 32, 1024, 64)
    assert TEMPLATE.default_config(find_attention(func)) == AttentionConfig(64)  # 128-key tiles without it
    assert prefetches_terms(find_attention(func), AttentionConfig(128, 1))
    assert not prefetches_terms(find_attention(func), AttentionConfig(128, 1, prefetch_terms=False))
    assert not prefetches_terms(find_attention(attention_with_terms("bias", 16, 2048, 128)), AttentionConfig(64, 2))
    assert not prefetches_terms(find_attention(attention_with_terms("softcap", 32, 1024, 64)), AttentionConfig(128, 1))
    source = cuda_source(fuse_attention(func, AttentionConfig(128, 1)))
    kernel = source[source.index('extern "C" __global__'):]
    loads = [m.start() for m in re.finditer(r"mask_ptr\[", kernel)]
    issues = [m.start() for m in re.finditer(r"tvm_dsm_attention_scores_\w+\(", kernel)]
    waits = [m.start() for m in re.finditer(r"tvm_dsm_attention_wait64_\d\(", kernel)]
    assert len(loads) == 64 * len(issues)  # each step's elements, after its MMA is issued, before its wait
    assert all(max(i for i in issues if i < at) > max((w for w in waits if w < at), default=-1) for at in loads)


@pytest.mark.parametrize("config", [AttentionConfig(128, 1), AttentionConfig(128, 1, 2)])
def test_a_prefetched_bias_fits_in_registers_at_the_most_accumulators(ptxas_report, config):
    func = attention_with_terms("bias", 16, 512, 128)
    assert prefetches_terms(find_attention(func), config)
    report = ptxas_report(cuda_source(fuse_attention(func, config)), f"attention_bias_w{config.warpgroups}")
    assert "0 bytes spill stores" in report and "0 bytes stack frame" in report


def test_the_scaled_score_alone_keeps_the_plain_kernel():
    shape = find_attention(_form("causal_select"))
    assert shape.terms is None and shape.causal and shape.params == ()


def test_score_terms_over_a_symbolic_length_build_one_kernel(assemble):
    """A soft cap over any sequence length: one kernel, its terms over the function's own
    parameters."""
    func = _symbolic_with_soft_cap(tirx.Var("S", "int32"))
    shape = TEMPLATE.find(func)
    assert shape.terms is not None and isinstance(shape.q_len, tirx.Var)
    source = cuda_source(fuse_attention(func))
    assert len(cuda_kernels(source)) == 1 and "tanhf" in source
    assert assemble(source, "attention_terms_symbolic")


def test_a_mask_written_with_a_symbolic_length_is_refused():
    """``t >= S - 100`` read at one length would keep that length's keys at every other."""
    length = tirx.Var("S", "int32")
    q, k, v = (te.placeholder((4, length, 64), "float16", name=n) for n in "qkv")
    d, t1, t2, t3 = (te.reduce_axis((0, e), n) for e, n in ((64, "d"), (length, "t1"), (length, "t2"), (length, "t3")))
    raw = te.compute((4, length, length), lambda h, i, t: te.sum(
        q[h, i, d].astype("float32") * k[h, t, d].astype("float32"), axis=d), name="raw")
    s = te.compute(raw.shape, lambda h, i, t: te.if_then_else(
        t >= length - 100, raw[h, i, t] * 0.125, tirx.const(float("-inf"), "float32")), name="s")
    m = te.compute((4, length), lambda h, i: te.max(s[h, i, t1], axis=t1), name="m")
    l = te.compute((4, length), lambda h, i: te.sum(te.exp(s[h, i, t2] - m[h, i]), axis=t2), name="l")
    o = te.compute((4, length, 64), lambda h, i, c: te.sum(
        te.exp(s[h, i, t3] - m[h, i]) * v[h, t3, c].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda h, i, c: (o[h, i, c] / l[h, i]).astype("float16"), name="out")
    with pytest.raises(ClusterError, match="depend on the lengths"):
        TEMPLATE.find(te.create_prim_func([q, k, v, out]))


@pytest.mark.parametrize(("terms", "tensor_cores"), [("softcap", False), ("window", True), ("alibi", True)])
def test_decode_attention_computes_its_score_terms(terms, tensor_cores, assemble):
    from tvm_dsm.kernels.decode_attention import DecodeConfig
    from tvm_dsm.kernels.dense_decode import TEMPLATE as DECODE, find_dense_decode

    func = decode_attention_with_terms(terms)
    found = find_dense_decode(func)
    assert found.has_terms and found.shape.scale == 1.0 and found.shape.group == 4
    source = cuda_source(DECODE.fuse(func, DecodeConfig(2, tensor_cores)))
    assert assemble(source, f"decode_terms_{terms}_{tensor_cores}")


def test_a_decode_mask_that_may_drop_the_last_key_is_refused():
    from tvm_dsm.kernels.attention_pattern import find_decode_attention

    with pytest.raises(ClusterError, match="must provably keep the last key"):
        find_decode_attention(decode_attention_with_terms("first"))


@pytest.mark.gpu
@pytest.mark.parametrize("terms", ["softcap", "window", "alibi"])
def test_gpu_decode_attention_with_score_terms_matches_float64(terms):
    import tvm_dsm

    func = decode_attention_with_terms(terms, batch=4, heads=32, kv_heads=8, keys=1000, dim=128)
    module = tvm_dsm.build(func, TARGET)
    rng = np.random.default_rng()
    q = (rng.standard_normal((4, 32, 128)) * 2).astype(np.float16)
    k, v = ((rng.standard_normal((4, 8, 1000, 128)) * 2).astype(np.float16) for _ in range(2))
    slopes = (2.0 ** -np.arange(1, 33)).astype(np.float32)
    inputs = [q, k, v] + ([slopes] if terms == "alibi" else [])
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((4, 32, 128), np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
    want = REFERENCES["decode_attention_terms"](*(x.astype(np.float64) for x in inputs), terms=terms)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def _symbolic_with_soft_cap(length):
    q, k, v = (te.placeholder((4, length, 64), "float16", name=n) for n in "qkv")
    d, t1, t2, t3 = (te.reduce_axis((0, e), n) for e, n in ((64, "d"), (length, "t1"), (length, "t2"), (length, "t3")))
    raw = te.compute((4, length, length), lambda h, i, t: te.sum(
        q[h, i, d].astype("float32") * k[h, t, d].astype("float32"), axis=d), name="raw")
    s = te.compute(raw.shape, lambda h, i, t: te.tanh(raw[h, i, t] * 0.125 / 30.0) * 30.0, name="s")
    m = te.compute((4, length), lambda h, i: te.max(s[h, i, t1], axis=t1), name="m")
    l = te.compute((4, length), lambda h, i: te.sum(te.exp(s[h, i, t2] - m[h, i]), axis=t2), name="l")
    o = te.compute((4, length, 64), lambda h, i, c: te.sum(te.exp(s[h, i, t3] - m[h, i]) * v[h, t3, c].astype("float32"),
                                                           axis=t3), name="o")
    out = te.compute(o.shape, lambda h, i, c: (o[h, i, c] / l[h, i]).astype("float16"), name="out")
    return te.create_prim_func([q, k, v, out])


@pytest.mark.parametrize("terms", sorted(TERMS))
def test_the_float64_reference_of_each_form_is_what_llvm_computes(terms):
    """The reference the GPU checks the kernel against is the function's own meaning: TVM's
    llvm build of the unscheduled function (fp32 inputs) agrees with it, masked rows included."""
    func = attention_with_terms(terms, heads=2, length=70, dim=16, dtype="float32")
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    dtypes = [str(p.ty.dtype) for p in func.params]
    rng = np.random.default_rng()
    inputs = [rng.random(shape) < 0.7 if dtype == "bool" else rng.standard_normal(shape).astype(dtype)
              for shape, dtype in zip(shapes[:-1], dtypes)]
    out = tvm.runtime.tensor(np.zeros(shapes[-1], "float32"))
    tvm.compile(func, target=LLVM)(*(tvm.runtime.tensor(x) for x in inputs), out)
    ref = REFERENCES["attention_terms"](*(x.astype(np.float64) for x in inputs), terms=terms)
    got = out.numpy().astype(np.float64)
    empty = np.isnan(ref)
    assert np.array_equal(np.isnan(got), empty) and empty.any() == (terms == "strict")
    assert np.linalg.norm(got[~empty] - ref[~empty]) / np.linalg.norm(ref[~empty]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("terms", sorted(TERMS))
def test_gpu_an_exponent_of_more_than_the_scaled_score_matches_float64(terms):
    """Through ``tvm_dsm.build``; a row the mask empties (``strict``'s first) is NaN in both."""
    import tvm_dsm

    func = attention_with_terms(terms, heads=4, length=333, dim=128)
    module = tvm_dsm.build(func, TARGET)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng = np.random.default_rng()
    q, k, v = ((rng.standard_normal(s) * 2).astype(np.float16) for s in shapes[:3])
    extra = {"bias": lambda s: (rng.standard_normal(s) * 3).astype(np.float16),
             "alibi": lambda s: (2.0 ** -np.arange(1, s[0] + 1)).astype(np.float32),
             "padding": lambda s: rng.random(s) < 0.7}.get(terms)
    inputs = [q, k, v] + ([extra(shapes[3])] if extra else [])
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in inputs), out)
    ref = REFERENCES["attention_terms"](*(x.astype(np.float64) for x in inputs), terms=terms)
    got = out.numpy().astype(np.float64)
    empty = np.isnan(ref)
    assert np.array_equal(np.isnan(got), empty)
    error = np.linalg.norm(got[~empty] - ref[~empty]) / np.linalg.norm(ref[~empty])
    assert error < 2e-3, error


def _with_log_sum_exp(heads=4, length=200, dim=64, causal=False, extra_max=False):
    """Attention that also writes each row's log-sum-exp ``log(l) + max`` (what a backward pass
    reads), as hand-written TE; ``extra_max``: the row max written too (a third output)."""
    q, k, v = (te.placeholder((1, heads, length, dim), "float16", name=n) for n in "qkv")
    d = te.reduce_axis((0, dim), "d")
    raw = te.compute((1, heads, length, length), lambda b, h, i, t: te.sum(
        q[b, h, i, d].astype("float32") * k[b, h, t, d].astype("float32"), axis=d), name="raw")
    s = te.compute(raw.shape, lambda b, h, i, t: te.if_then_else(t <= i, raw[b, h, i, t] * (dim ** -0.5),
                                                                  tirx.const(float("-inf"), "float32"))
                   if causal else raw[b, h, i, t] * (dim ** -0.5), name="s")
    t1, t2, t3 = (te.reduce_axis((0, length), n) for n in ("t1", "t2", "t3"))
    m = te.compute(s.shape[:3], lambda b, h, i: te.max(s[b, h, i, t1], axis=t1), name="m")
    l = te.compute(s.shape[:3], lambda b, h, i: te.sum(te.exp(s[b, h, i, t2] - m[b, h, i]), axis=t2), name="l")
    lse = te.compute(s.shape[:3], lambda b, h, i: te.log(l[b, h, i]) + m[b, h, i], name="lse")
    o = te.compute((1, heads, length, dim), lambda b, h, i, c: te.sum(
        te.exp(s[b, h, i, t3] - m[b, h, i]) * v[b, h, t3, c].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, h, i, c: (o[b, h, i, c] / l[b, h, i]).astype("float16"), name="out")
    row_max = te.compute(s.shape[:3], lambda b, h, i: m[b, h, i] * 1.0, name="row_max")
    return te.create_prim_func([q, k, v, out, lse, *([row_max] if extra_max else [])])


@pytest.mark.parametrize("causal", [False, True])
def test_a_log_sum_exp_output_is_written_by_the_kernel(causal, assemble):
    shape = find_attention(_with_log_sum_exp(causal=causal))
    assert len(shape.row_outputs) == 1 and shape.causal == causal and shape.positions == (0, 1, 2, 3)
    source = cuda_source(fuse_attention(_with_log_sum_exp(causal=causal)))
    assert len(cuda_kernels(source)) == 1 and "lse_ptr[" in source
    assert assemble(source, f"attention_log_sum_exp_{causal}")


def test_two_outputs_of_the_row_statistics_are_refused_by_name():
    with pytest.raises(ClusterError, match="at most one output of the row statistics"):
        find_attention(_with_log_sum_exp(extra_max=True))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_the_output_and_its_log_sum_exp_match_float64(causal):
    import tvm_dsm

    func = _with_log_sum_exp(heads=4, length=333, dim=128, causal=causal)
    module = tvm_dsm.build(func, TARGET)
    rng = np.random.default_rng()
    q, k, v = ((rng.standard_normal((1, 4, 333, 128)) * 2).astype(np.float16) for _ in range(3))
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((1, 4, 333, 128), np.nan, np.float16), dev)
    lse = tvm.runtime.tensor(np.full((1, 4, 333), np.nan, np.float32), dev)
    module(*(tvm.runtime.tensor(x, dev) for x in (q, k, v)), out, lse)
    x = np.einsum("bhid,bhtd->bhit", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(128)
    if causal:
        x = np.where(np.tril(np.ones((333, 333), bool)), x, -np.inf)
    top = x.max(-1, keepdims=True)
    want_lse = np.log(np.exp(x - top).sum(-1)) + top[..., 0]
    want = (np.exp(x - top) @ v.astype(np.float64)) / np.exp(x - top).sum(-1, keepdims=True)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
    assert np.abs(lse.numpy() - want_lse).max() < 1e-3 * np.abs(want_lse).max()


def test_inputs_of_one_name_are_told_apart():
    """Relax names two variables alike (both "x"): the legalized attention's v and bias buffers
    share a name; v is still the one the weighted sum reads (told apart by identity, not name)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    q, k = (relax.Var(n, relax.TensorType((2, 16, 4, 64), "float16")) for n in "qk")
    v = relax.Var("x", relax.TensorType((2, 16, 4, 64), "float16"))
    bias = relax.Var("x", relax.TensorType((2, 4, 16, 16), "float16"))
    with bb.function("main", [q, k, v, bias]):
        bb.emit_func_output(bb.emit(relax.op.nn.attention(q, k, v, bias)))
    func = next(f for f in relax.transform.LegalizeOps()(bb.get()).functions.values() if isinstance(f, tirx.PrimFunc))
    shape = find_attention(func)
    assert (shape.heads, shape.q_len, shape.kv_len) == (8, 16, 16)


def test_two_masks_of_one_name_are_both_read():
    """Two bias inputs that share a name are two inputs of the scores' terms (keyed by name,
    they were one, read twice: ``2 * a`` where the function adds ``a + b``), and the kernel
    reads both."""
    import re

    import tvm_dsm

    func = attention_with_terms("two_masks", heads=2, length=128)
    loads = find_attention(func).terms.tensor_loads()
    assert len(loads) == 2 and not loads[0].source.same_as(loads[1].source)
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"(mask\w*)\[", source))) == 2


@pytest.mark.gpu
def test_gpu_two_masks_of_one_name_match_float64():
    import tvm_dsm

    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype("float16") for _ in range(3))
    a, b = (rng.standard_normal((128, 128)).astype("float16") for _ in range(2))
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((1, 2, 128, 64), np.nan, "float16"), dev)
    tvm_dsm.build(attention_with_terms("two_masks", heads=2, length=128))(
        *(tvm.runtime.tensor(x, dev) for x in (q, k, v, a, b)), out)
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) * 0.125 + a + b.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
