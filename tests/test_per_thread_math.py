"""Transcendental math computed once per thread (tvm_dsm.rules.per_thread_math): nn.llm's rotary
embedding."""

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.nn.llm import position_embedding
from tvm import te, tirx

import tvm_dsm
from conftest import LLVM, kernels
from tvm_dsm.driver import plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.row_ranges import ROW_RANGES, ROWS_BEYOND
from tvm_dsm.ir import row_variable, specialized
from tvm_dsm.rules import per_thread_math as rule
from tvm_dsm.rules.per_thread_math import find_per_thread_math, per_thread_math
from tvm_dsm.workloads.elementwise import split_silu_mul


def _rope(theta: float = 10000.0, heads: int = 32, kv_heads: int = 8, dim: int = 64):
    return position_embedding.llama_rope_with_position_map(theta, 1.0, dim, heads, kv_heads, "float16", {}, None) \
        .with_attr("global_symbol", "main")


def test_rotary_embedding_computes_its_angle_once_per_position_and_head_dim():
    """The angle's cosine and sine depend on the position and the head dim, not the head: two
    calls computed once per thread, the 48 heads (32 query, 8 key, 8 value) looped inside."""
    found = find_per_thread_math(_rope())
    assert (found.axis, found.extent, found.calls) == (1, 48, 2)


def test_the_rewrite_computes_what_the_function_does_on_llvm():
    """Rewritten and not, built for the CPU: the same q, k and v for random positions."""
    rng = np.random.default_rng(0)
    rows = 5
    args = [rng.standard_normal((rows, 48, 64)).astype("float16"), rng.integers(0, 4096, rows).astype("int32")]
    outputs = []
    for func in (_rope(), per_thread_math(_rope())):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=LLVM, tir_pipeline="s_tir_stock")
        out = [tvm.runtime.tensor(np.full(s, np.nan, "float16")) for s in ((rows, 32, 64), (rows, 8, 64), (rows, 8, 64))]
        lib(*(tvm.runtime.tensor(a) for a in args), *out, 1)
        outputs.append([o.numpy() for o in out])
    for before, after in zip(*outputs):
        assert not np.isnan(after).any()
        np.testing.assert_allclose(after.astype("float32"), before.astype("float32"), rtol=2e-3, atol=2e-3)


def test_the_kernels_evaluate_each_transcendental_call_once_and_assemble(assemble):
    """``tvm_dsm.build`` of the symbolic-length function: a thread takes 8 head-dim elements
    (rotate-half's ``d < 32`` holds alike for each vector of them) and two of the 48 heads at
    every token count, so every range shares one kernel; one ``cosf`` and one ``sinf`` a thread
    (dlight's schedule evaluates them per element and head), q, k and v moved in 16-byte vectors."""
    rope = _rope()
    assert find_per_thread_math(rope).lanes == 8
    splits = [plan(specialized(rope, row_variable(rope), rows)) for rows in (*ROW_RANGES, ROWS_BEYOND)]
    assert all(r.family.name == "per_thread_math" and r.best.config.parts == 24 for r in splits)
    source = tvm_dsm.build(rope).mod.imports[0].inspect_source()
    bodies = list(kernels(source).values())
    assert len(bodies) == 1 and bodies[0].count("cosf(") == 1 and bodies[0].count("sinf(") == 1
    assert "*(uint4*)(qkv_ptr" in bodies[0]
    assemble(source, "per_thread_math_rope")


def test_a_thread_moving_elements_fills_the_gpu_with_parts():
    """Without vectors (the head dim's conditions vary within a vector), the heads split into
    the fewest parts whose threads fill the GPU: a decode step's token, a head a thread; 4096
    tokens, two parts."""
    rope = _rope()
    lanes = rule.branch_lanes
    try:
        rule.branch_lanes = rule.vector_lanes  # without uniform conditions
        parts = {rows: plan(specialized(rope, row_variable(rope), rows)).best.config.parts
                 for rows in (16, 256, 1024, 4096)}
    finally:
        rule.branch_lanes = lanes
    assert parts == {16: 48, 256: 24, 1024: 6, 4096: 2}


def test_math_on_every_axis_or_a_vector_stream_is_refused():
    with pytest.raises(ClusterError, match="16-byte vectors"):
        find_per_thread_math(split_silu_mul(8, 1024))


def _rope_float64(qkv: np.ndarray, positions: np.ndarray, heads: int = 32, theta: float = 10000.0):
    """q, k and v of nn.llm's rotary embedding (rotate-half, head dim 64) in float64."""
    x = qkv.astype(np.float64)
    dim = x.shape[-1]
    freq = positions[:, None].astype(np.float64) / theta ** ((np.arange(dim) * 2 % dim) / dim)
    rotated = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], -1)
    roped = np.cos(freq)[:, None] * x + np.sin(freq)[:, None] * rotated
    kv = (x.shape[1] - heads) // 2
    return roped[:, :heads], roped[:, heads:heads + kv], x[:, heads + kv:]


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 300, 5000])
def test_gpu_rotary_embedding_matches_float64(rows):
    lib, dev, rng = tvm_dsm.build(_rope()), tvm.cuda(), np.random.default_rng(rows)
    qkv = rng.standard_normal((rows, 48, 64)).astype("float16")
    positions = rng.integers(0, 2048, rows).astype("int32")  # a 2048-token context
    out = [tvm.runtime.tensor(np.full(s, np.nan, "float16"), dev) for s in ((rows, 32, 64), (rows, 8, 64), (rows, 8, 64))]
    lib(tvm.runtime.tensor(qkv, dev), tvm.runtime.tensor(positions, dev), *out, 1)
    for got, ref in zip(out, _rope_float64(qkv, positions)):
        assert np.linalg.norm(got.numpy().astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def test_rotate_half_written_as_a_select_moves_vectors(assemble):
    """Rotary embedding over ``[B, S, H, D]`` with rotate-half as a Select on ``d < D / 2`` of
    fp32 values: scheduled as a branch, one condition a vector (vectorized as a Select, its
    condition is a bool vector TVM's CUDA code cannot declare: every plan failed to lower); its
    ``-1.0`` in fp32, alike for every lane, bounds the vector at 4 lanes (a broadcast of 8 fp32
    values is an invalid ``make_ulonglong4`` in TVM's CUDA), so 8-byte accesses; valid CUDA."""
    import math

    f32 = "float32"
    x = te.placeholder((1, 77, 8, 128), "float16", name="x")
    angle = lambda s, d: tirx.Cast(f32, s) * te.exp(tirx.Cast(f32, d % 64 * 2) * tirx.const(-math.log(1e4) / 128, f32))  # noqa: E731
    y = te.compute(x.shape, lambda b, s, h, d: (
        x[b, s, h, d].astype(f32) * te.cos(angle(s, d)) + tirx.Select(
            d < 64, -x[b, s, h, d + 64].astype(f32), x[b, s, h, d - 64].astype(f32)) * te.sin(angle(s, d))
    ).astype("float16"), name="rope")
    func = te.create_prim_func([x, y])
    assert find_per_thread_math(func).lanes == 4 and plan(func).family.name == "per_thread_math"
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert "*(half4*)(x_ptr" in source and source.count("sinf(") == 1
    assemble(source, "per_thread_math_select")


def _scaled(factor, width: int):
    """``y[s, h, j] = x[s, h, j] * factor(p, s, j)`` over 16 x 8 x 63 (63 columns: no 16-byte
    vectors), ``p`` of 16 rows of ``width``."""
    x = te.placeholder((16, 8, 63), "float32", name="x")
    p = te.placeholder((16, width), "float32", name="p")
    y = te.compute((16, 8, 63), lambda s, h, j: x[s, h, j] * factor(p, s, j), name="y")
    return te.create_prim_func([x, p, y]).with_attr("global_symbol", "main")


def test_one_call_is_computed_once_per_thread_and_builds(assemble):
    func = _scaled(lambda p, s, j: te.exp(p[s, j]), 63)
    assert find_per_thread_math(func).calls == 1
    assemble(tvm_dsm.build(func).mod.imports[0].inspect_source(), "per_thread_math_one_call")


def test_a_call_that_reads_in_bounds_only_under_its_condition_is_refused():
    """Computed first, the call would run for j >= 32 too, past the end of p's rows."""
    with pytest.raises(ClusterError, match="may read outside p"):
        find_per_thread_math(_scaled(lambda p, s, j: tirx.if_then_else(j < 32, te.cos(p[s, j]), 1.0), 32))
