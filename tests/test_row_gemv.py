"""One row of a matmul as a row GEMV (tvm_dsm.rules.row_gemv, tvm_dsm.families.row_gemv): what
it takes (gated layers too), what it refuses, its kernels' structure, and (GPU) every
configuration against float64."""

import re

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from tvm_dsm.driver import H100, plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.relax_integration import scheduling_form
from tvm_dsm.rules.row_gemv import (RowGemvConfig, candidate_configs, check_config, default_config,
                                    find_row_gemv, schedule_row_gemv)
from tvm_dsm.workloads import gemv
from tvm_dsm.workloads.dense import dense, gated_dense


def _residual_dense(n: int, k: int, rows: int = 1):
    """``(x @ W^T).astype(fp16) + r``: a Relax linear with its residual add, written in TE."""
    x = te.placeholder((1, rows, k), "float16", name="x")
    w = te.placeholder((n, k), "float16", name="w")
    r = te.placeholder((1, rows, n), "float16", name="r")
    red = te.reduce_axis((0, k), "k")
    mm = te.compute((1, rows, n), lambda b, i, j: te.sum(x[b, i, red].astype("float32") * w[j, red].astype("float32"),
                                                         axis=red), name="mm")
    out = te.compute((1, rows, n), lambda b, i, j: mm[b, i, j].astype("float16") + r[b, i, j], name="out")
    return te.create_prim_func([x, w, r, out])


def _dot_product(k: int):
    """``sum_k x[k] w[k]`` into a scalar: a reduction with no output axis."""
    x = te.placeholder((k,), "float16", name="x")
    w = te.placeholder((k,), "float16", name="w")
    red = te.reduce_axis((0, k), "k")
    y = te.compute((), lambda: te.sum(x[red].astype("float32") * w[red].astype("float32"), axis=red), name="y")
    return te.create_prim_func([x, w, y])


def _gated_halves(n: int, k: int):
    """One product over a fused [2N, K] gate/up weight, then ``silu(g) * u`` of its halves: the
    epilogue reads the product N columns off the element it writes."""
    x = te.placeholder((1, k), "float16", name="x")
    w = te.placeholder((2 * n, k), "float16", name="w")
    red = te.reduce_axis((0, k), "k")
    mm = te.compute((1, 2 * n), lambda i, j: te.sum(x[i, red].astype("float32") * w[j, red].astype("float32"),
                                                    axis=red), name="mm")
    out = te.compute((1, n), lambda i, j: (mm[i, j] * te.sigmoid(mm[i, j]) * mm[i, j + n]).astype("float16"),
                     name="out")
    return te.create_prim_func([x, w, out])


def test_one_row_of_a_matmul_is_a_row_gemv_with_its_epilogue():
    found = find_row_gemv(scheduling_form(_residual_dense(2048, 8192)))
    assert (found.n, found.k, found.elem_bytes, found.epilogue is not None) == (2048, 8192, 2, True)
    assert plan(_residual_dense(2048, 8192)).family.name == "row_gemv"
    assert plan(dense(1, 3072, 2048, "bfloat16")).family.name == "row_gemv"


@pytest.mark.parametrize("func", [lambda: _residual_dense(2048, 8192, rows=2), lambda: dense(2, 2048, 2048),
                                  lambda: gated_dense(2, 8192, 2048, fused_weight=True)])
def test_two_rows_load_each_vector_of_w_once_for_both(func):
    """Two rows of x (a decode batch of two): a lane loads each vector of W once and multiplies it
    into both rows' sums, so W streams once as at one row; each row's lanes meet in their own sum."""
    found = find_row_gemv(scheduling_form(func()))
    config = default_config(found)
    assert found.rows == 2 and plan(func()).family.name == "row_gemv"
    source = tvm.compile(schedule_row_gemv(found, config).mod, target=H100).mod.imports[0].inspect_source()
    # per step: each product's unrolled vectors of W, each loaded once (a fused gate/up weight
    # is read by both products)
    assert len(re.findall(r"= \*\(uint4\*\)\(W[a-z]*_ptr", source, re.IGNORECASE)) == config.unroll * len(found.reductions)
    # x: each product's, in a loop over the rows
    assert len(re.findall(r"= \*\(uint4\*\)\(X_ptr", source, re.IGNORECASE)) == config.unroll * len(found.reductions)
    assert re.search(r"_rf_local_ptr\[1\]", source)  # the second row's partial sum


@pytest.mark.parametrize("fused_weight", [True, False])
def test_a_gated_layer_is_two_row_gemvs_meeting_in_its_epilogue(fused_weight):
    """``silu(x Wg^T) * (x Wu^T)``: both products of a CTA's rows in one kernel, the epilogue on
    their lane sums (one launch where the split-K GEMM's 16-row tile took the gated layer)."""
    func = gated_dense(1, 8192, 2048, fused_weight=fused_weight)
    found = find_row_gemv(scheduling_form(func))
    assert (found.n, found.k, len(found.reductions), found.epilogue) == (8192, 2048, 2, "H")
    assert plan(func).family.name == "row_gemv"
    source = tvm_dsm.build(func, H100).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # one kernel, declared and defined


def _product(n: int = 1024, k: int = 2048, weight_dtype: str = "float16", scale=None):
    """fp16 ``x[1, k]``, ``W[n, k]`` and their fp32 product ``mm[1, n]`` (times ``scale[j]``
    inside the sum, if given)."""
    x = te.placeholder((1, k), "float16", name="x")
    w = te.placeholder((n, k), weight_dtype, name="w")
    red = te.reduce_axis((0, k), "k")

    def term(i, j):
        product = x[i, red].astype("float32") * w[j, red].astype("float32")
        return product if scale is None else product * scale[j].astype("float32")

    return x, w, te.compute((1, n), lambda i, j: te.sum(term(i, j), axis=red), name="mm")


def _weight_only_int8():
    """fp16 x, an int8 W and its per-column scale in the epilogue: loads of two element sizes."""
    s = te.placeholder((1024,), "float16", name="s")
    x, w, mm = _product(weight_dtype="int8")
    out = te.compute((1, 1024), lambda i, j: (mm[i, j] * s[j].astype("float32")).astype("float16"), name="out")
    return te.create_prim_func([x, w, s, out])


def _scaled_inside_the_sum():
    s = te.placeholder((1024,), "float16", name="s")
    x, w, mm = _product(scale=s)
    return te.create_prim_func([x, w, s, mm])


def _product_also_returned():
    x, w, mm = _product()
    return te.create_prim_func([x, w, mm, te.compute((1, 1024), lambda i, j: mm[i, j].astype("float16"), name="out")])


def _broadcast_epilogue():
    x, w, mm = _product()
    return te.create_prim_func([x, w, te.compute((1, 1024, 4), lambda i, j, c: mm[i, j].astype("float16"), name="out")])


def _reversed_epilogue():
    """``out[j] = y[n - 1 - j]``: the epilogue reads another CTA's column."""
    x, w, mm = _product()
    return te.create_prim_func([x, w, te.compute((1, 1024), lambda i, j: mm[i, 1023 - j].astype("float16"), name="out")])


@pytest.mark.parametrize("func, reason", [
    (lambda: dense(3, 2048, 2048), "1 to 2 rows of 2-byte elements"),
    (lambda: dense(9, 2048, 2048, "float32"), "1 to 8 rows of 4-byte elements"),
    (lambda: dense(8, 2048, 64, "float32"), "8 rows take at least 16 lanes a row"),  # K = 64: 2 lanes
    (lambda: dense(2, 64, 64), "2 rows take at least 4 lanes a row"),  # K = 64: 2 lanes
    (lambda: gemv(2048, 2048), "rows of a matmul"),  # the split-K reduction's
    (lambda: _dot_product(1024), "rows of a matmul"),  # no spatial axis at all
    (lambda: _gated_halves(1024, 512), "covers its 2048 columns"),  # halves of one product
    (lambda: dense(1, 2048, 2048, weight_layout="kn"), r"as W\[j, k\], K innermost"),
    (_weight_only_int8, "one element size"),
    (_scaled_inside_the_sum, "reads s along K"),
    (_product_also_returned, "buffers of its own"),
    (_broadcast_epilogue, "covers its 1024 columns"),
    (_reversed_epilogue, "at the element it writes"),
    (lambda: dense(1, 3000, 1000), "more than 16 a lane"),  # 125 vectors: 1 lane (25 lanes: under a warp)
    (lambda: dense(1, 8192, 28672), "more than 16 a lane"),  # 28 a lane, dlight's grid 512 CTAs
    (lambda: dense(1, 2048, 65536), "more than 16 a lane"),  # 64 a lane: past 48
])
def test_what_is_not_one_row_of_a_matmul_is_refused_by_name(func, reason):
    with pytest.raises(ClusterError, match=reason):
        find_row_gemv(scheduling_form(func()))


def test_a_long_k_is_taken_where_dlights_grid_leaves_sms_short():
    """Past 16 vectors a lane the rule keeps a row where as many lanes split it as dlight's GEMV
    gives it and dlight's grid of 16 rows a CTA leaves SMs fewer than two CTAs: a SwiGLU's down
    projection at one row, K = 4864 (19 vectors over 32 lanes) and 18944 (37 over 64)."""
    for n, k, lanes in ((896, 4864, 32), (3584, 18944, 64)):
        found = find_row_gemv(scheduling_form(dense(1, n, k)))
        assert default_config(found).threads_per_row == lanes


def test_what_it_refuses_still_builds_on_dlights_schedule():
    """A refusal leaves the function to the fallback: a module, not an error."""
    for func in (_weight_only_int8(), dense(1, 2048, 2048, weight_layout="kn"), dense(1, 3000, 1000)):
        assert tvm_dsm.build(func, H100) is not None


def test_the_default_is_the_sweeps_fastest_form_and_every_candidate_is_valid():
    short, long = (find_row_gemv(scheduling_form(dense(1, 2048, k))) for k in (2048, 8192))
    assert default_config(short) == RowGemvConfig(8, 64, 2)
    assert default_config(long) == RowGemvConfig(4, 128, 4)
    small = find_row_gemv(scheduling_form(dense(1, 1000, 576)))  # SmolLM's hidden size: 8 lanes of 9 vectors
    assert default_config(small) == RowGemvConfig(8, 8, 1)
    for found in (short, long, small):
        configs = candidate_configs(found)
        assert default_config(found) in configs
        for config in configs:
            check_config(found, config)
    with pytest.raises(ClusterError, match="multiple of a step"):
        check_config(short, RowGemvConfig(1, 256, 2))  # 256 lanes x 8 x 2 = 4096 > K


@pytest.mark.parametrize("config", [RowGemvConfig(8, 64, 2), RowGemvConfig(1, 64, 4), RowGemvConfig(2, 256, 1)])
def test_lanes_split_k_and_rows_split_the_ctas(config):
    """The lanes are threadIdx.x of both the partial sums and their reduction, the rows of a CTA
    threadIdx.y, whatever unit loops a configuration leaves (one step a lane included)."""
    found = find_row_gemv(scheduling_form(_residual_dense(2048, 2048)))
    script = schedule_row_gemv(found, config).mod["main"].script()
    bindings = re.findall(r'T.thread_binding\((\d+), thread="(\w+\.\w)"\)', script)
    assert bindings == [(str(2048 // config.rows_per_cta), "blockIdx.x"), (str(config.rows_per_cta), "threadIdx.y"),
                        (str(config.threads_per_row), "threadIdx.x"), (str(config.threads_per_row), "threadIdx.x")]


def test_a_short_k_takes_two_lanes_a_row_and_one_lane_is_refused():
    """K = 32 (a small MoE expert's down projection): one lane a row bound the rows to threadIdx.x
    beside it, and each CTA computed its first row alone; its default takes two lanes, the rows
    threadIdx.y, and a one-lane configuration is refused by name."""
    found = find_row_gemv(scheduling_form(_residual_dense(64, 32)))
    config = default_config(found)
    assert config.threads_per_row == 2
    script = schedule_row_gemv(found, config).mod["main"].script()
    bindings = re.findall(r'T.thread_binding\((\d+), thread="(\w+\.\w)"\)', script)
    assert (str(config.rows_per_cta), "threadIdx.y") in bindings, bindings
    with pytest.raises(ClusterError, match="1 lane a row"):
        check_config(found, RowGemvConfig(8, 1, 2))


def test_a_row_gemv_compiles_for_hopper(assemble):
    lib = tvm_dsm.build(_residual_dense(2048, 8192), H100)
    assemble(lib.mod.imports[0].inspect_source(), "row_gemv")


def _batched(batch: tuple, rows: int, n: int, k: int, shared_x: bool = False):
    """``torch.bmm``-style products over ``batch`` axes, each its own W; ``shared_x``: one x."""
    from tvm_dsm.workloads.dense import batched_matmul

    return batched_matmul(batch, rows, n, k, shared_x=shared_x)


def test_a_batch_of_one_row_products_leads_the_grid_with_its_axes(assemble):
    """Two batch axes (batch, heads) of one-row products: each CTA's rows within one product, the
    grid over every product's rows; the kernel assembles for Hopper."""
    found = find_row_gemv(scheduling_form(_batched((2, 16), 1, 1024, 128)))
    assert (found.batch, found.rows, found.n, found.k) == (32, 1, 1024, 128)
    config = default_config(found)
    assert config == RowGemvConfig(32, 8, 1)
    source = tvm.compile(schedule_row_gemv(found, config).mod, target=tvm.target.Target(H100)).mod.imports[0].inspect_source()
    assert f"__launch_bounds__({config.threads})" in source
    assert "blockIdx.x" in source
    assemble(source, "batched_row_gemv")


@pytest.mark.parametrize("func, reason", [
    (lambda: _batched((8,), 2, 1024, 128), "one row of each"),
    (lambda: _batched((8,), 1, 1024, 128, shared_x=True), "reads the row x of each product"),
])
def test_a_batch_is_refused_where_its_products_are_not_one_row_each_over_its_own_x(func, reason):
    with pytest.raises(ClusterError, match=reason):
        find_row_gemv(scheduling_form(func()))


def test_the_column_gemv_refuses_a_batch():
    from tvm_dsm.rules.column_gemv import find_column_gemv
    from tvm_dsm.workloads.dense import batched_matmul

    with pytest.raises(ClusterError, match="not a batch"):
        find_column_gemv(scheduling_form(batched_matmul((8,), 1, 1024, 256, weight_layout="kn")))


WAIT = "tvm_builtin_ptx_griddepcontrol_wait();"
PREFETCH = re.compile(r"prefetch_L2_global\(\(&\((\w+)_ptr\[(.*?)\]\)\), \(uint\)(\d+)\)")


def _prefetched_before_the_wait(func, read_only: list[str]) -> list[tuple[str, str, int]]:
    """(weight, first element, bytes) of each L2 prefetch the kernel of ``func`` issues before it
    waits for the previous grid, its weights named read-only as a model's are."""
    from tvm_dsm.annotations import READ_ONLY_PARAMS_KEY

    func = func.with_attr(READ_ONLY_PARAMS_KEY, read_only) if read_only else func
    source = tvm_dsm.build(func, H100).mod.imports[0].inspect_source()
    body = source[source.index("__global__"):]
    assert WAIT in body
    before, after = body.split(WAIT, 1)
    assert "prefetch_L2" not in after
    return [(name, re.sub(r"\(int\)|[() ]", "", first), int(size)) for name, first, size in PREFETCH.findall(before)]


@pytest.mark.parametrize("fused_weight", [True, False])
def test_each_cta_prefetches_its_rows_of_a_read_only_weight_before_it_waits(fused_weight):
    """Launched programmatically, each CTA of a gated layer's row GEMV (8 rows of 2048, fp16)
    prefetches its rows of each product's weight into L2 before waiting for the previous kernel:
    32 KB from row 8 b (and, of a fused [2N, K] weight, from row N + 8 b); nothing where the
    weight may be written by an earlier kernel (not named read-only)."""
    func = gated_dense(1, 8192, 2048, fused_weight=fused_weight)
    names = [p.name for p in func.params if len(p.ty.shape) == 2 and int(p.ty.shape[0]) > 1]
    found = _prefetched_before_the_wait(func, names)
    if fused_weight:
        assert found == [(names[0], "blockIdx.x*16384", 32768), (names[0], "blockIdx.x*16384+16777216", 32768)]
    else:
        assert sorted(found) == sorted((name, "blockIdx.x*16384", 32768) for name in names)
    assert _prefetched_before_the_wait(func, []) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_relax_legalized_row_prefetches_with_its_int64_indices(dtype):
    """One row of a Relax-legalized matmul (int64 indices and thread variables), launched
    programmatically with its weight read-only, builds and prefetches its CTA's rows."""
    from tvm import relax

    from tvm_dsm.annotations import READ_ONLY_PARAMS_KEY
    from tvm_dsm.workloads.generated import relax_prim_func

    def body(bb, x, w):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w)), out_dtype="float32"))
        return relax.op.astype(product, dtype)

    func = relax_prim_func([("x", (1, 4096), dtype), ("w", (4096, 4096), dtype)], body)
    assert "T.int64(4096)" in func.script()
    source = tvm_dsm.build(func.with_attr(READ_ONLY_PARAMS_KEY, ["w"]), H100).mod.imports[0].inspect_source()
    assert WAIT in source and "prefetch_L2" in source.split(WAIT, 1)[0]


def _check(lib, n: int, k: int, rows: int = 1) -> float:
    dev, rng = tvm.cuda(), np.random.default_rng()
    x = rng.standard_normal((1, rows, k)).astype("float16")
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype("float16")
    r = rng.standard_normal((1, rows, n)).astype("float16")
    out = tvm.runtime.tensor(np.full((1, rows, n), np.nan, "float16"), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in (x, w, r)), out)
    ref = x.astype("float64") @ w.astype("float64").T + r
    return float(np.linalg.norm(out.numpy().astype("float64") - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("k", [512, 2048, 8192])
def test_gpu_configurations_of_one_and_two_steps_match_float64(k, rows):
    """The default, and every configuration whose lanes take K in one or two steps (one step
    leaves unit loops among those the rule binds by position), at one and two rows."""
    n = 1024
    func = _residual_dense(n, k, rows=rows)
    found = find_row_gemv(scheduling_form(func))
    steps = {c: k // (c.threads_per_row * found.vector * c.unroll) for c in candidate_configs(found)}
    for config in [default_config(found), *(c for c, s in steps.items() if s <= 2 and c.rows_per_cta in (1, 8))]:
        lib = tvm.compile(schedule_row_gemv(found, config).mod, target=tvm.target.Target(H100))
        assert _check(lib, n, k, rows) < 2e-3, config


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2])
def test_gpu_a_gated_layer_matches_float64(rows):
    n, k = 1024, 2048
    lib = tvm_dsm.build(gated_dense(rows, n, k, fused_weight=True))
    dev, rng = tvm.cuda(), np.random.default_rng()
    x = rng.standard_normal((rows, k)).astype("float16")
    w = (rng.standard_normal((2 * n, k)) / np.sqrt(k)).astype("float16")
    out = tvm.runtime.tensor(np.full((rows, n), np.nan, "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    gate, up = (x.astype("float64") @ half.astype("float64").T for half in (w[:n], w[n:]))
    ref = gate / (1 + np.exp(-gate)) * up
    assert np.linalg.norm(out.numpy().astype("float64") - ref) / np.linalg.norm(ref) < 2e-3


def test_fp32_takes_up_to_8_rows_and_topi_silu_is_one_epilogue():
    """fp32 has no tensor-core GEMM: up to 8 rows stream W once (the CUDA-core GEMM's 32-row tile
    took 2 x 14336 x 3000 in 130.6 us, torch 69.7). TOPI's SiLU (a sigmoid block, then the
    product) is inlined into one epilogue: a gated layer written so is one kernel."""
    for rows in (3, 8):
        assert find_row_gemv(dense(rows, 2048, 2048, "float32")).rows == rows
        assert plan(dense(rows, 2048, 2048, "float32")).family.name == "row_gemv"
    x = te.placeholder((2, 2048), "float32", name="x")
    wg, wu = (te.placeholder((1024, 2048), "float32", name=n) for n in ("wg", "wu"))
    gate, up = (topi.nn.dense(x, w) for w in (wg, wu))
    func = te.create_prim_func([x, wg, wu, topi.multiply(topi.multiply(gate, topi.sigmoid(gate)), up)])
    found = find_row_gemv(func)
    assert found.rows == 2 and len(found.reductions) == 2 and found.epilogue is not None


@pytest.mark.parametrize(("rows", "k", "dtype", "lanes"), [(1, 3000, "bfloat16", 75), (2, 3000, "float32", 75),
                                                         (8, 1000, "float32", 25)])
def test_a_k_whose_vectors_no_power_of_two_divides_splits_over_a_divisor(rows, k, dtype, lanes):
    """K = 3000 in bf16 is 375 vectors: a power of two of lanes would be one lane reading all of
    them (dlight's GEMV took 1 x 127 x 3000 in 20.9 us, torch 6.0); 75 lanes read 5 each."""
    found = find_row_gemv(dense(rows, 1024, k, dtype))
    assert default_config(found).threads_per_row == lanes


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "n", "k", "dtype"), [
    (2, 1024, 2048, "bfloat16"), (2, 1024, 2048, "float32"), (5, 1024, 2048, "float32"), (8, 1024, 2048, "float32"),
    (1, 127, 3000, "bfloat16"), (2, 1024, 3000, "float32"), (8, 1000, 1000, "float32")])
def test_gpu_rows_in_other_types_and_lanes_of_no_power_of_two_match_float64(rows, n, k, dtype):
    """Two rows in bf16 (16-byte vectors of 8), 2-8 in fp32 (of 4), no epilogue past the cast;
    and K's vectors over 75 and 25 lanes."""
    import ml_dtypes

    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    lib = tvm_dsm.build(dense(rows, n, k, dtype))
    dev, rng = tvm.cuda(), np.random.default_rng()
    x = rng.standard_normal((rows, k)).astype(host)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(host)
    out = tvm.runtime.tensor(np.full((rows, n), np.nan, host), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    ref = x.astype("float64") @ w.astype("float64").T
    error = np.linalg.norm(out.numpy().astype("float64") - ref) / np.linalg.norm(ref)
    assert error < (2e-3 if dtype == "bfloat16" else 1e-5)


@pytest.mark.gpu
def test_gpu_a_symbolic_row_count_takes_the_row_gemv_at_one_row():
    func = _residual_dense(1024, 2048, rows=te.var("m"))
    lib = tvm_dsm.build(func)
    for rows in (1, 2, 17):
        assert _check(lib, 1024, 2048, rows) < 2e-3, rows
