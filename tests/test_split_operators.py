"""Functions no family takes and dlight cannot schedule whole build one schedule per operator."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import LLVM, TARGET, relative_error_on_gpu
from tvm import te, topi

import tvm_dsm
from tvm_dsm.gpu.suites.generality import FFNS, dense, ffn
from tvm_dsm.transform.split_operators import merge_operators, split_operators
from tvm_dsm.workloads.chains import swiglu_ffn
from tvm_dsm.workloads.norms import topi_norm


@pytest.mark.parametrize("rows", [24, te.var("m")], ids=["constant_rows", "symbolic_rows"])
def test_split_then_merge_computes_the_same_on_llvm(rows):
    func = ffn(rows, 40, 16, 8, "float32", nk=False)
    operators = split_operators(func)
    assert [len(op.outputs) for op in operators] == [1, 1]
    assert operators[0].outputs[0].same_as(operators[1].inputs[0])  # H passes between them
    merged = merge_operators(func, [op.func for op in operators])
    rng = np.random.default_rng()
    shapes = [[24 if isinstance(d, tvm.tirx.Var) else int(d) for d in p.ty.shape] for p in func.params]
    args = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    outs = []
    for f in (func, merged):
        tensors = [tvm.runtime.tensor(a) for a in args[:-1]] + [tvm.runtime.tensor(np.full_like(args[-1], np.nan))]
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*tensors)
        outs.append(tensors[-1].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6)
    a, w1, w2 = (x.astype(np.float64) for x in args[:3])
    ref = np.maximum(a @ w1, 0) @ w2
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("shape", FFNS, ids=lambda s: "x".join(map(str, s[:4])) + f"_{s[4]}_{'nk' if s[5] else 'kn'}")
def test_ffns_no_family_fuses_build_per_operator(shape):
    source = tvm_dsm.build(ffn(*shape), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 4  # at least one kernel per GEMM, declared and defined


def test_a_function_without_a_root_block_is_left_to_tvm():
    """An extern call has no s_tir root block: every family says no (none raises), and the
    function builds the way stock TVM builds it."""
    x = te.placeholder((64, 64), "float32", name="x")
    y = te.extern((64, 64), [x], lambda ins, outs: tvm.tirx.call_packed("my.op", ins[0], outs[0]), name="y")
    func = te.create_prim_func([x, y])
    with pytest.raises(tvm_dsm.ClusterError, match="no tvm-dsm schedule family applies"):
        tvm_dsm.plan(func)
    tvm_dsm.build(func, TARGET)


def test_prime_batch_dense_builds():
    assert "__global__" in tvm_dsm.build(dense(37, 1024, 512, "bfloat16"), TARGET).mod.imports[0].inspect_source()


@pytest.mark.parametrize("m", [3, 7, 13])  # (two rows: the row GEMV's, tests/test_row_gemv.py)
def test_decode_batch_dense_takes_the_gemm_family_with_rows_padded_inside(m):
    assert tvm_dsm.plan(dense(m, 2048, 2048, "float16")).family.name == "split_k_gemm"
    source = tvm_dsm.build(dense(m, 2048, 2048, "float16"), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # the GEMM alone: no kernel copies rows (declared and defined)
    assert "mma" in source  # tensor cores


def test_an_ffn_of_symbolic_rows_builds_per_operator():
    source = tvm_dsm.build(ffn(te.var("m"), 1024, 512, 256, "float16", False), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 4  # at least one kernel per GEMM, declared and defined


def test_matmuls_are_told_from_reductions_of_one_tensor():
    assert [op.matmul for op in split_operators(swiglu_ffn(1, 256, 128, 128))] == [True, True, True]
    assert not any(op.matmul for op in split_operators(topi_norm("layer_norm", 4, 64, "float16")))


def test_a_single_row_swiglu_chain_takes_a_gemv_per_operator_not_a_thread_per_output():
    """No chain plan takes M = 1, and dlight's only schedule for the whole function is its
    Fallback rule (every output element a thread, its K loop serial: 13 ms on the GPU where the
    operators take 40 us): the gated products are one operator (the row GEMV's gated form), the
    down projection another."""
    assert tvm_dsm.driver.operator_families(swiglu_ffn(1, 8192, 2048, 2048)) == ["row_gemv", "row_gemv"]
    source = tvm_dsm.build(swiglu_ffn(1, 8192, 2048, 2048), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 4  # a kernel per operator, declared and defined
    assert "__shfl" in source  # the GEMV's warp reductions


def _lm_head_row_max(m: int, k: int, vocab: int):
    """Logits and their row max (greedy decoding's max logit) in one function, as a user writes it."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((vocab, k), "float16", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((m, vocab), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
                   name="logits")
    v = te.reduce_axis((0, vocab), name="v")
    return te.create_prim_func([x, w, te.compute((m,), lambda i: te.max(y[i, v], axis=v), name="max_logit")])


def test_a_gemm_and_a_reduction_of_its_rows_take_a_family_per_operator_not_dlight_whole():
    """dlight's one schedule of a GEMM and its rows' max is its Fallback rule (10.4 ms on the H200
    for 16 x 4096 x 32000, torch 71 us): the GEMM and the max are scheduled apart by the families."""
    func = _lm_head_row_max(16, 4096, 32000)
    assert tvm_dsm.driver.operator_families(func) == ["split_k_gemm", "split_k_reduction"]
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "wgmma" in source or "mma.sync" in source  # the GEMM on tensor cores


@pytest.mark.gpu
def test_gpu_a_gemm_and_its_rows_max_match_float64():
    rng = np.random.default_rng(3)
    x, w = rng.uniform(-1, 1, (16, 512)).astype("float16"), (rng.uniform(-1, 1, (3000, 512)) / 16).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(16, np.nan, "float32"), dev)
    tvm_dsm.build(_lm_head_row_max(16, 512, 3000), TARGET)(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    ref = (x.astype(np.float64) @ w.astype(np.float64).T).max(-1)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("rows", [4, te.var("m")], ids=["constant_rows", "symbolic_rows"])
def test_a_gated_layers_products_are_one_operator_and_compute_the_same_on_llvm(rows):
    func = swiglu_ffn(rows, 48, 32, 16, "float32")
    apart, together = split_operators(func), split_operators(func, products_together=True)
    assert [op.products for op in apart] == [1, 1, 1]
    assert [op.products for op in together] == [2, 1]
    assert [p.name for p in together[0].func.params] == ["A", "Wg", "Wu", "H"]
    merged = merge_operators(func, [op.func for op in together])
    rng = np.random.default_rng()
    shapes = [[4 if isinstance(d, tvm.tirx.Var) else int(d) for d in p.ty.shape] for p in func.params]
    args = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    tensors = [tvm.runtime.tensor(a) for a in args[:-1]] + [tvm.runtime.tensor(np.full_like(args[-1], np.nan))]
    tvm.compile(tvm.IRModule({"main": merged}), target=LLVM)(*tensors)
    ref = _swiglu_reference(*(x.astype(np.float64) for x in args[:4]))
    out = tensors[-1].numpy()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def _two_products(shared_x: bool, combined: bool):
    x = te.placeholder((16, 64), "float16", name="x")
    y = x if shared_x else te.placeholder((16, 64), "float16", name="y")
    w = te.placeholder((64, 64), "float16", name="w")
    v = te.placeholder((64, 64), "float16", name="v")
    r, q = te.reduce_axis((0, 64), "r"), te.reduce_axis((0, 64), "q")
    a = te.compute((16, 64), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r), name="a")
    b = te.compute((16, 64), lambda i, j: te.sum(y[i, q].astype("float32") * v[j, q].astype("float32"), axis=q), name="b")
    if combined:
        out = te.compute((16, 64), lambda i, j: (a[i, j] * b[i, j]).astype("float16"), name="out")
        return te.create_prim_func([x, *([] if shared_x else [y]), w, v, out])
    a16 = te.compute((16, 64), lambda i, j: a[i, j].astype("float16"), name="a16")
    b16 = te.compute((16, 64), lambda i, j: b[i, j].astype("float16"), name="b16")
    return te.create_prim_func([x, w, v, a16, b16])


def test_products_that_are_no_gated_layer_stay_apart():
    """Two matmuls of different inputs (or of one weight), or two projections of one X each
    written out, are not a gated layer: split apart. The split-K GEMM takes the projections of
    one X whole, as sibling products with an output each."""
    x, y = (te.placeholder((16, 64), "float16", name=n) for n in ("x", "y"))
    w = te.placeholder((64, 64), "float16", name="w")
    r, q = te.reduce_axis((0, 64), "r"), te.reduce_axis((0, 64), "q")
    a = te.compute((16, 64), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r), name="a")
    b = te.compute((16, 64), lambda i, j: te.sum(y[i, q].astype("float32") * w[j, q].astype("float32"), axis=q), name="b")
    shared_weight = te.create_prim_func([x, y, w, te.compute((16, 64), lambda i, j: (a[i, j] * b[i, j]).astype("float16"))])
    for func in (_two_products(shared_x=False, combined=True), _two_products(shared_x=True, combined=False),
                 shared_weight):
        assert [op.products for op in split_operators(func, products_together=True)] == [1, 1]
    siblings = tvm_dsm.plan(_two_products(shared_x=True, combined=False)).shape
    assert (siblings.products, siblings.outputs) == (2, 2)
    assert tvm_dsm.plan(_two_products(shared_x=True, combined=True)).shape.products == 2


def test_gated_products_together_where_a_family_takes_them():
    """At 4 rows the gated split-K GEMM computes both products (2 kernels in all, not 3)."""
    func = swiglu_ffn(4, 8192, 2048, 2048)
    assert tvm_dsm.driver.operator_families(func) == ["split_k_gemm", "split_k_gemm"]
    assert tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source().count("__global__") == 4


def _swiglu_reference(a, wg, wu, w2):
    gate = a @ wg.T
    return (gate / (1 + np.exp(-gate)) * (a @ wu.T)) @ w2.T


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "m"), [(1, 1), (2, 2), (4, 4), (13, 13), ("m", 1), ("m", 4), ("m", 37)])
def test_gpu_gated_products_together_match_float64(rows, m):
    """The gated products as one operator (row GEMV at 1-2 rows, the gated split-K GEMM past
    that, by ranges of rows where the count is symbolic), then the down projection."""
    func = swiglu_ffn(te.var("m") if rows == "m" else rows, 2048, 1024, 1024)
    rng = np.random.default_rng()
    weights = [rng.standard_normal(s) / np.sqrt(s[1]) for s in ((2048, 1024), (2048, 1024), (1024, 2048))]
    inputs = [rng.standard_normal((m, 1024)), *weights]
    assert relative_error_on_gpu(func, inputs, _swiglu_reference, (m, 1024), "float16") < 2e-3


def _random_products(rng):
    """Two or three matmuls over small random extents, each reading X or another input, some
    sharing a weight, combined, cast or written out at random: the forms split_operators groups
    or keeps apart (gated layers, projections of one X, unrelated products)."""
    m, k, n = (int(rng.integers(2, 9)) for _ in range(3))
    xs = [te.placeholder((m, k), "float32", name=f"x{i}") for i in range(2)]
    ws = [te.placeholder((n, k), "float32", name=f"w{i}") for i in range(3)]
    def product(i, x, w):
        r = te.reduce_axis((0, k), f"r{i}")
        return te.compute((m, n), lambda a, b: te.sum(x[a, r] * w[b, r], axis=r), name=f"p{i}")

    def scaled(i, p):
        return te.compute((m, n), lambda a, b: p[a, b] * 2.0, name=f"c{i}")

    products = [product(i, xs[int(rng.integers(0, 2))], ws[int(rng.integers(0, 3))])
                for i in range(int(rng.integers(2, 4)))]
    outputs, kind = [], rng.integers(0, 3)
    if kind == 0:  # a gated layer's combine (of the first two: SiLU as TOPI writes it), the rest written out
        gate = topi.multiply(products[0], topi.sigmoid(products[0]))
        outputs.append(topi.multiply(gate, products[1]))
        outputs += products[2:]
    elif kind == 1:  # each product scaled on its own
        outputs += [scaled(i, p) for i, p in enumerate(products)]
    else:  # all summed
        outputs.append(te.compute((m, n), lambda a, b: sum(p[a, b] for p in products), name="total"))
    inputs = sorted({t for p in products for t in p.op.input_tensors}, key=lambda t: t.op.name)
    return te.create_prim_func([*inputs, *outputs])


@pytest.mark.parametrize("seed", range(12))
def test_random_products_split_together_and_merged_compute_the_same_on_llvm(seed):
    """Whatever split_operators groups (products together or apart), merging the operators back
    computes what the function does."""
    rng = np.random.default_rng(seed)
    func = _random_products(rng)
    operators = split_operators(func, products_together=True)
    merged = merge_operators(func, [op.func for op in operators])
    params = list(func.params)
    outputs = len(params) - sum(1 for p in params if p.name.startswith(("x", "w")))
    args = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in params]
    results = []
    for f in (func, merged):
        tensors = [tvm.runtime.tensor(a) for a in args[:-outputs]] + [
            tvm.runtime.tensor(np.full_like(a, np.nan)) for a in args[-outputs:]]
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*tensors)
        results.append([t.numpy() for t in tensors[-outputs:]])
    for got, want in zip(*results[::-1]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _group_norm(n: int, c: int, h: int, w: int, groups: int, dtype: str):
    x = te.placeholder((n, c, h, w), dtype, name="x")
    g, b = (te.placeholder((c,), dtype, name=name) for name in ("gamma", "beta"))
    y = topi.nn.group_norm(x, g, b, num_groups=groups, channel_axis=1, axes=[2, 3], epsilon=1e-5)
    return te.create_prim_func([x, g, b, y])


def test_operators_whose_schedules_declare_views_merge_and_compute_the_same_on_llvm():
    """A norm over several axes is scheduled over a view of its input as rows, declared ahead of
    its root block (:mod:`tvm_dsm.transform.columns_as_one`): the merged function keeps the view
    with its operator and computes as the function."""
    func = _group_norm(2, 8, 4, 5, 2, "float32")
    operators = split_operators(func)

    def declaring_a_view(sub):
        first = sub.params[0]
        view = tvm.tirx.decl_buffer([int(np.prod([int(d) for d in first.ty.shape]))], first.ty.dtype,
                                    f"{first.name}_rows")
        return sub.with_body(tvm.tirx.SeqStmt([tvm.tirx.DeclBuffer(view, data=first.data), sub.body]))

    merged = merge_operators(func, [declaring_a_view(op.func) for op in operators])
    rng = np.random.default_rng()
    x, g, b = rng.standard_normal((2, 8, 4, 5)), rng.uniform(0.5, 1.5, 8), rng.uniform(-0.5, 0.5, 8)
    out = tvm.runtime.tensor(np.full((2, 8, 4, 5), np.nan, "float32"))
    tvm.compile(tvm.IRModule({"main": merged}), target=LLVM)(
        *(tvm.runtime.tensor(a.astype("float32")) for a in (x, g, b)), out)
    xr = x.reshape(2, 2, -1)
    ref = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    ref = ref * g[None, :, None, None] + b[None, :, None, None]
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5


def test_topi_group_norm_builds_operator_by_operator():
    """dlight cannot schedule TOPI's group norm whole (its bind fails): each operator alone, the
    statistics on the row norm's view of their rows."""
    source = tvm_dsm.build(_group_norm(2, 64, 16, 16, 32, "float16"), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 2


@pytest.mark.gpu
def test_gpu_topi_group_norm_matches_float64():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 64, 16, 16)).astype("float16")
    g, b = rng.uniform(0.5, 1.5, 64).astype("float16"), rng.uniform(-0.5, 0.5, 64).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(x.shape, np.nan, "float16"), dev)
    tvm_dsm.build(_group_norm(2, 64, 16, 16, 32, "float16"), TARGET)(
        *(tvm.runtime.tensor(a, dev) for a in (x, g, b)), out)
    xr = x.astype(np.float64).reshape(2, 32, -1)
    ref = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    ref = ref * g.astype(np.float64)[None, :, None, None] + b.astype(np.float64)[None, :, None, None]
    assert np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def test_a_function_declaring_buffers_outside_its_nests_is_not_split():
    """TOPI's GPU scan declares its buffers around its kernels: an operator cut from it would read
    a buffer it does not declare (TVM refuses such a function as ill-formed)."""
    p = te.placeholder((8, 1000), "float32", name="probs")
    with tvm.target.Target("cuda"):
        c = topi.gpu.cumsum(p, axis=1)
    keep = te.compute((8, 1000), lambda b, v: te.if_then_else(c[b, v] - p[b, v] < 0.9, p[b, v], 0.0), name="keep")
    func = te.create_prim_func([p, keep])
    with pytest.raises(tvm_dsm.ClusterError, match="declares outside its loop nests"):
        split_operators(func)
    assert tvm_dsm.driver.operator_families(func) == []
    assert "__global__" in tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()


def _layer_norm_then_dense(m: int, k: int, n: int, dtype: str = "float16"):
    """A pre-LN projection: TOPI's layer norm (two row statistics, then the normalization) and
    a dense layer reading it."""
    x = te.placeholder((m, k), dtype, name="x")
    g, b = (te.placeholder((k,), dtype, name=name) for name in ("gamma", "beta"))
    w = te.placeholder((n, k), dtype, name="w")
    y = topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5)
    return te.create_prim_func([x, g, b, w, topi.cast(topi.nn.dense(y, w, out_dtype="float32"), dtype)])


def _merged_computes_the_same_on_llvm(func, operators, shapes: list[tuple], out_shape: tuple) -> None:
    """``func`` and its ``operators`` merged back give bit-identical fp32 outputs on llvm."""
    merged = merge_operators(func, [op.func for op in operators])
    rng = np.random.default_rng()
    args = [rng.standard_normal(s).astype("float32") for s in shapes]
    outs = []
    for f in (func, merged):
        out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*(tvm.runtime.tensor(a) for a in args), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])


def test_a_norms_statistics_and_normalization_are_one_operator_and_compute_the_same_on_llvm():
    func = _layer_norm_then_dense(6, 32, 8, "float32")
    operators = split_operators(func, norms_together=True)
    assert [op.norm for op in operators] == [True, False]
    assert len(split_operators(func)) == 4  # apart: each statistic, the normalization, the product
    _merged_computes_the_same_on_llvm(func, operators, [(6, 32), (32,), (32,), (8, 32)], (6, 8))


def test_a_layer_norm_then_a_dense_layer_is_the_row_norm_and_the_gemm():
    func = _layer_norm_then_dense(512, 768, 2304)
    assert tvm_dsm.driver.operator_families(func) == ["row_norm", "split_k_gemm"]
    assert tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source().count("__global__") == 4  # 2 kernels


def _rms_norm_then_dense(m: int, k: int, n: int, dtype: str = "float16"):
    """A pre-norm projection as TOPI writes it: ``rms_norm`` casts its input and weight to fp32
    and squares the input in blocks of their own, the weight's cast between the statistic and
    the normalization."""
    x = te.placeholder((m, k), dtype, name="x")
    g = te.placeholder((k,), dtype, name="gamma")
    w = te.placeholder((n, k), dtype, name="w")
    y = topi.cast(topi.nn.rms_norm(x, g, axis=[1], epsilon=1e-5), dtype)
    return te.create_prim_func([x, g, w, topi.cast(topi.nn.dense(y, w, out_dtype="float32"), dtype)])


def test_topis_rms_norm_maps_of_its_inputs_join_the_norm_and_compute_the_same_on_llvm():
    func = _rms_norm_then_dense(6, 32, 8, "float32")
    operators = split_operators(func, norms_together=True)
    assert [(op.norm, op.matmul) for op in operators] == [(True, False), (False, True)]
    assert len(split_operators(func)) > 2  # apart: the casts, the statistic, the normalization, the product
    _merged_computes_the_same_on_llvm(func, operators, [(6, 32), (32,), (8, 32)], (6, 8))


def test_a_residual_sum_before_a_norm_stays_an_operator_of_its_own():
    """Inlined, ``x + r`` would make the norm's statistic read two tensors along its axis, as a
    matmul does: the sum, the norm and the product stay three operators."""
    x, r = (te.placeholder((256, 2048), "float16", name=name) for name in ("x", "r"))
    g, b = (te.placeholder((2048,), "float16", name=name) for name in ("gamma", "beta"))
    w = te.placeholder((1024, 2048), "float16", name="w")
    h = te.compute(x.shape, lambda i, j: x[i, j] + r[i, j], name="h")
    func = te.create_prim_func([x, r, g, b, w, topi.nn.dense(topi.nn.layer_norm(h, g, b, axis=[1]), w,
                                                                      out_dtype="float32")])
    assert [(op.norm, op.matmul) for op in split_operators(func, norms_together=True)] == [
        (False, False), (True, False), (False, True)]


def test_topis_rms_norm_then_a_dense_layer_is_the_row_norm_and_the_gemm():
    func = _rms_norm_then_dense(128, 4096, 4096)
    assert tvm_dsm.driver.operator_families(func) == ["row_norm", "split_k_gemm"]
    assert tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source().count("__global__") == 4  # 2 kernels


def _rms_norm_dense(x, g, w):
    """float64 RMSNorm (eps 1e-5) rounded to fp16, then ``@ w.T``."""
    y = (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g).astype(np.float16).astype(np.float64)
    return y @ w.T


@pytest.mark.gpu
def test_gpu_topis_rms_norm_then_a_dense_layer_matches_float64():
    rng = np.random.default_rng()
    x, g = rng.standard_normal((300, 2048)), rng.uniform(0.5, 1.5, 2048)
    w = rng.uniform(-1, 1, (1024, 2048)) / np.sqrt(2048)

    err = relative_error_on_gpu(_rms_norm_then_dense(300, 2048, 1024), [x, g, w], _rms_norm_dense, (300, 1024),
                                "float16")
    assert err < 2e-3


def test_a_norm_no_family_takes_whole_is_scheduled_statistic_by_statistic(monkeypatch, caplog):
    schedule = tvm_dsm.driver.schedule

    def no_norms(func, *args, **kwargs):
        if len([b for b in tvm_dsm.ir.root_blocks(func) if b.init is not None]) > 1:
            raise tvm_dsm.ClusterError("no norms here")
        return schedule(func, *args, **kwargs)

    monkeypatch.setattr(tvm_dsm.driver, "schedule", no_norms)
    with caplog.at_level("INFO", logger="tvm_dsm.driver"):
        source = tvm_dsm.build(_layer_norm_then_dense(512, 768, 2304), TARGET).mod.imports[0].inspect_source()
    assert "its statistics apart" in caplog.text
    assert source.count("__global__") > 4


@pytest.mark.gpu
def test_gpu_a_layer_norm_then_a_dense_layer_matches_float64():
    rng = np.random.default_rng(13)
    x, g, b = rng.standard_normal((300, 768)), rng.uniform(0.5, 1.5, 768), rng.uniform(-0.5, 0.5, 768)
    w = rng.uniform(-1, 1, (1024, 768)) / np.sqrt(768)

    def reference(x, g, b, w):
        y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
        return y @ w.T

    err = relative_error_on_gpu(_layer_norm_then_dense(300, 768, 1024), [x, g, b, w], reference, (300, 1024),
                                "float16")
    assert err < 2e-3


def _int64_indexed_norm_then_dense(norm: str, m: int = 256, k: int = 1024, n: int = 2048):
    """A norm then a dense layer indexed in int64, as Relax legalizes: TOPI's layer norm or
    rms norm (its output cast to fp16) over ``[m, k]``."""
    wide = lambda v: tvm.tirx.IntImm("int64", v)  # noqa: E731
    x = te.placeholder((wide(m), wide(k)), "float16", name="x")
    g, b = (te.placeholder((wide(k),), "float16", name=name) for name in ("gamma", "beta"))
    w = te.placeholder((wide(n), wide(k)), "float16", name="w")
    if norm == "layer_norm":
        y, params = topi.nn.layer_norm(x, g, b, axis=[1], epsilon=1e-5), [x, g, b, w]
    else:
        y, params = topi.cast(topi.nn.rms_norm(x, g, axis=[1], epsilon=1e-5), "float16"), [x, g, w]
    return te.create_prim_func([*params, topi.cast(topi.nn.dense(y, w, out_dtype="float32"), "float16")])


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_an_int64_indexed_norm_then_a_dense_layer_is_the_row_norm_and_the_gemm(norm, caplog):
    """Relax's legalization indexes in int64; the row norm's kernel is written over the operator
    narrowed to int32: the function is narrowed before it is cut into operators, so the kernel's
    tensors are the merged function's."""
    with caplog.at_level("INFO", logger="tvm_dsm.driver"):
        source = tvm_dsm.build(_int64_indexed_norm_then_dense(norm), TARGET).mod.imports[0].inspect_source()
    assert "statistics apart" not in caplog.text and "dlight's schedule whole" not in caplog.text
    assert source.count("__global__") == 4  # 2 kernels
    assert "wgmma" in source


@pytest.mark.gpu
def test_gpu_an_int64_indexed_rms_norm_then_a_dense_layer_matches_float64():
    rng = np.random.default_rng()
    x, g = rng.standard_normal((300, 1024)), rng.uniform(0.5, 1.5, 1024)
    w = rng.uniform(-1, 1, (512, 1024)) / np.sqrt(1024)

    func = _int64_indexed_norm_then_dense("rms_norm", 300, 1024, 512)
    assert relative_error_on_gpu(func, [x, g, w], _rms_norm_dense, (300, 512), "float16") < 2e-3


def _decoded_gemvs(rows: int, shared: bool = False, k: int = 64, n: int = 24):
    """``x[rows, K]`` times weights decoded in TE stages of their own (3-bit codes, 10 to a
    word, a scale per column), two products (the second over its own weight, or ``shared``
    over the first's), summed."""
    x = te.placeholder((rows, k), "float32", name="x")
    words = (k + 9) // 10

    def decoded(name):
        packed = te.placeholder((n, words), "uint32", name=f"{name}_packed")
        scale = te.placeholder((n,), "float32", name=f"{name}_scale")
        w = te.compute((n, k), lambda j, c: ((packed[j, c // 10] >> (c % 10 * 3).astype("uint32"))
                                             & te.const(7, "uint32")).astype("float32") * scale[j],
                       name=f"decode_{name}")
        return packed, scale, w

    first = decoded("a")
    second = first if shared else decoded("b")
    products = []
    for name, (_, _, w) in (("p", first), ("q", second)):
        r = te.reduce_axis((0, k), name=f"r_{name}")
        products.append(te.compute((rows, n), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name=name))
    y = te.compute((rows, n), lambda i, j: products[0][i, j] + products[1][i, j], name="y")
    weights = list(first[:2]) + ([] if shared else list(second[:2]))
    return te.create_prim_func([x, *weights, y])


def _blocks(op) -> list[str]:
    return [r.block.name_hint for r in tvm_dsm.ir.find_all(op.func.body, tvm.s_tir.SBlockRealize)
            if r.block.name_hint != "root"]


def test_a_one_row_products_unpacked_weight_is_in_its_operator():
    """At one row the unpacking stays with its GEMV (dlight's and the packed GEMV read the
    codes once); at several rows, or where two products read the unpacked weight, it is an
    operator of its own (the GEMM families read a plain operand)."""
    assert [_blocks(op) for op in split_operators(_decoded_gemvs(1))] == [["decode_a", "p"], ["decode_b", "q", "y"]]
    assert all(op.matmul for op in split_operators(_decoded_gemvs(1)))
    assert [_blocks(op) for op in split_operators(_decoded_gemvs(4))] == [
        ["decode_a"], ["p"], ["decode_b"], ["q", "y"]]
    assert [_blocks(op) for op in split_operators(_decoded_gemvs(1, shared=True))] == [
        ["decode_a"], ["p"], ["q", "y"]]


@pytest.mark.parametrize("rows", [1, 4])
def test_operators_with_their_unpacking_merge_and_compute_the_same_on_llvm(rows):
    func = _decoded_gemvs(rows)
    merged = merge_operators(func, [op.func for op in split_operators(func)])
    rng = np.random.default_rng()
    args = []
    for p in func.params[:-1]:
        shape, dtype = [int(d) for d in p.ty.shape], str(p.ty.dtype)
        args.append(rng.integers(0, 2 ** 30, shape).astype(dtype) if dtype == "uint32"
                    else rng.standard_normal(shape).astype(dtype))
    outs = []
    for f in (func, merged):
        out = tvm.runtime.tensor(np.full((rows, 24), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*[tvm.runtime.tensor(a) for a in args], out)
        outs.append(out.numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6)


def test_one_row_gemvs_over_stages_unpacking_their_weights_are_a_kernel_each():
    """3-bit GEMVs as MLC writes them (no family takes ten codes a word): a kernel a product
    over the codes, not each unpacked weight written out and read again (four kernels)."""
    lib = tvm_dsm.build(_decoded_gemvs(1, k=4096, n=256), TARGET)
    assert lib.mod.imports[0].inspect_source().count("__global__") == 2 * 2  # declaration and definition


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_gpu_gemvs_over_weights_unpacked_in_stages_match_float64(rows):
    func = _decoded_gemvs(rows, k=4000, n=256)
    rng = np.random.default_rng(4)
    args = [rng.standard_normal((rows, 4000)).astype("float32")]
    for _ in range(2):
        args += [rng.integers(0, 2 ** 30, (256, 400)).astype("uint32"), rng.uniform(0.5, 1.5, 256).astype("float32")]
    ref = 0
    for packed, scale in (args[1:3], args[3:5]):
        codes = (packed[:, :, None].astype(np.int64) >> (3 * np.arange(10))) & 7
        ref = ref + args[0].astype(np.float64) @ (codes.reshape(256, 4000) * scale[:, None].astype(np.float64)).T
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((rows, 256), np.nan, "float32"), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in args), out)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_a_weight_unpacked_in_two_stages_joins_its_one_row_product():
    """The codes converted in one nest, scaled in the next (MLC's two-stage form): both stay
    with the GEMV; the first's result, read only inside the run, is no operand of it."""
    x = te.placeholder((1, 256), "float16", name="x")
    packed = te.placeholder((64, 32), "uint32", name="packed")
    scale = te.placeholder((64, 8), "float16", name="scale")
    codes = te.compute((64, 256), lambda j, c: ((packed[j, c // 8] >> (c % 8 * 4).astype("uint32"))
                                                & te.const(15, "uint32")).astype("float16"), name="codes")
    w = te.compute((64, 256), lambda j, c: (codes[j, c] - te.const(7, "float16")) * scale[j, c // 32], name="scaled")
    r = te.reduce_axis((0, 256), name="k")
    y = te.compute((1, 64), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="y")
    func = te.create_prim_func([x, packed, scale, y])
    assert [_blocks(op) for op in split_operators(func)] == [["codes", "scaled", "y"]]
