"""Sibling projections (GEMMs of one input by weights of one shape, an output each) as one
split-K GEMM kernel, from TE and from a Relax model through tvm-dsm's pipeline."""

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.rules.split_k_gemm import find_gemm

from conftest import LLVM, TARGET, kernels


def _projections(m: int, n: int, k: int, count: int, dtype: str = "float16", bias: bool = True,
                 weight_layout: str = "nk", mix: bool = False):
    """``Y_i = X @ W_i^T (+ b_i)`` for ``count`` weights, as a user writes it in TE: each product
    summed in fp32, the bias added in fp32, rounded to ``dtype``. ``mix``: the last output also
    adds the first product (an epilogue reading two products)."""
    x = te.placeholder((m, k), dtype, name="x")
    shape = (n, k) if weight_layout == "nk" else (k, n)
    ws = [te.placeholder(shape, dtype, name=f"w{i}") for i in range(count)]
    bs = [te.placeholder((n,), dtype, name=f"b{i}") for i in range(count)] if bias else []
    r = te.reduce_axis((0, k), name="r")

    def product(w):
        def weight(j):
            return w[j, r] if weight_layout == "nk" else w[r, j]
        return te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * weight(j).astype("float32"),
                                                      axis=r), name="p")

    products = [product(w) for w in ws]

    def output(i, p):
        def value(a, j):
            v = p[a, j] + (bs[i][j].astype("float32") if bias else 0.0)
            return v + products[0][a, j] if mix and i == count - 1 else v
        return te.compute((m, n), lambda a, j: value(a, j).astype(dtype), name=f"y{i}")

    outs = [output(i, p) for i, p in enumerate(products)]
    return te.create_prim_func([x, *ws, *bs, *outs])


def test_sibling_products_are_one_kernel_with_an_output_each():
    func = _projections(1024, 768, 768, 3)
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == "split_k_gemm"
    assert (ranking.shape.products, ranking.shape.outputs) == (3, 3)
    assert "3 sibling products (an output each)" in ranking.best.explain()
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    (kernel,) = kernels(source).values()
    for i in range(3):
        assert f"y{i}_ptr + " in kernel  # each output stored by the one kernel


def test_products_an_epilogue_mixes_are_refused():
    with pytest.raises(ClusterError, match="each with an epilogue and output of its own"):
        find_gemm(s_tir.Schedule(_projections(256, 256, 256, 3, mix=True)))


@pytest.mark.parametrize("m, n, k", [(1000, 256, 256), (37, 200, 520)])
def test_sibling_products_off_the_tiles_are_padded(m, n, k):
    """Rows, columns and depth off the tiles: each product padded, X's zero-filled copy shared,
    each output copied back to its real rows and columns, still one kernel."""
    func = _projections(m, n, k, 3)
    assert tvm_dsm.plan(func).shape.outputs == 3
    (kernel,) = kernels(tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()).values()
    assert all(f"y{i}_ptr + " in kernel for i in range(3))


def _linear_layer(rows: int, width: int, heads_width: int, later_weight: bool = False,
                  widened_bias: bool = False) -> tvm.IRModule:
    """``q, k, v`` projections (``nn.Linear`` with bias, fp16) of one ``x``, as Relax writes a
    model's layer; ``later_weight``: v's weight is computed (doubled) after q's
    projection, so its call cannot join the others; ``widened_bias``: as torch's importer writes
    a 16-bit ``Linear`` whose weights stay parameters (the product in fp32, the bias widened to
    fp32 and added, the sum rounded back), which Relax fuses with the bias's cast first."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, width), "float16"))
    ws = [relax.Var(f"w{i}", relax.TensorType((heads_width, width), "float16")) for i in range(3)]
    bs = [relax.Var(f"b{i}", relax.TensorType((heads_width,), "float16")) for i in range(3)]
    with bb.function("main", [x, *ws, *bs]):
        with bb.dataflow():
            outs = []
            for i, (w, b) in enumerate(zip(ws, bs)):
                if later_weight and i == 2:
                    w = bb.emit(relax.op.multiply(w, relax.const(2.0, "float16")))
                if widened_bias:
                    product = relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="float32")
                    y = relax.op.astype(relax.op.add(relax.op.astype(b, "float32"), product), "float16")
                else:
                    y = relax.op.add(relax.op.matmul(x, relax.op.permute_dims(w)), b)
                outs.append(bb.emit(y))
            qkv = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(qkv)
    return bb.get()


def _calls(mod: tvm.IRModule) -> list[str]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.args[0].name_hint) if isinstance(
        e, relax.Call) and isinstance(e.args[0] if e.args else None, tvm.ir.GlobalVar) else None)
    return found


@pytest.mark.parametrize("later_weight, widened_bias", [(False, False), (True, False), (False, True)])
def test_relax_projections_of_one_input_become_one_call(later_weight, widened_bias):
    """Three projections of one input are one call (computing what they computed, on the CPU),
    also where each function widens its bias before its product; a weight computed after the
    first projection keeps its projection apart."""
    rows, width = 128, 256
    mod = _linear_layer(rows, width, width, later_weight, widened_bias)
    with tvm.target.Target(TARGET):
        lowered = lower_to_tir(mod)
    siblings = [c for c in _calls(lowered) if c.startswith("siblings_")]
    assert len(siblings) == 1
    merged = s_tir.Schedule(lowered[siblings[0]])
    assert find_gemm(merged)[2].products == (2 if later_weight else 3)
    rng = np.random.default_rng()
    x = rng.standard_normal((rows, width)).astype("float16")
    ws = [(rng.standard_normal((width, width)) / 16).astype("float16") for _ in range(3)]
    bs = [rng.standard_normal(width).astype("float16") for _ in range(3)]
    vm = relax.VirtualMachine(tvm.compile(lowered, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, *ws, *bs)))
    for y, scale, w, b in zip(got, [1, 1, 2 if later_weight else 1], ws, bs):
        ref = x.astype(np.float64) @ (scale * w.astype(np.float64)).T + b
        assert np.linalg.norm(y.numpy().astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def _run(func, inputs: list[np.ndarray], outputs: list[tuple], dtype) -> list[np.ndarray]:
    """``func`` built by tvm-dsm, run on the GPU: fresh ``inputs``, NaN-poisoned outputs."""
    dev = tvm.cuda(0)
    lib = tvm_dsm.build(func, TARGET)
    outs = [tvm.runtime.tensor(np.full(shape, np.nan, dtype), dev) for shape in outputs]
    lib(*(tvm.runtime.tensor(a, dev) for a in inputs), *outs)
    return [o.numpy().astype(np.float64) for o in outs]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, count, dtype, bias, layout", [
    (1024, 768, 768, 3, "float16", True, "nk"),
    (512, 512, 2048, 2, "float16", False, "nk"),
    (256, 256, 1024, 3, "bfloat16", True, "nk"),
    (512, 256, 1024, 2, "float16", True, "kn"),
    (1000, 768, 760, 3, "float16", True, "nk"),
    (37, 200, 520, 2, "bfloat16", False, "nk"),
])
def test_gpu_sibling_products_match_float64(m, n, k, count, dtype, bias, layout):
    func = _projections(m, n, k, count, dtype, bias, layout)
    assert tvm_dsm.plan(func).shape.outputs == count
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np_dtype)
    ws = [(rng.standard_normal((n, k) if layout == "nk" else (k, n)) / 16).astype(np_dtype) for _ in range(count)]
    bs = [rng.standard_normal(n).astype(np_dtype) for _ in range(count)] if bias else []
    got = _run(func, [x, *ws, *bs], [(m, n)] * count, np_dtype)
    for i, y in enumerate(got):
        w = ws[i].astype(np.float64)
        ref = x.astype(np.float64) @ (w.T if layout == "nk" else w) + (bs[i].astype(np.float64) if bias else 0)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 2e-3, i


@pytest.mark.gpu
@pytest.mark.parametrize("rows, widened_bias", [(1024, False), (1000, False), (1024, True)])
def test_gpu_relax_projections_of_one_input_match_float64(rows, widened_bias):
    width = 768
    mod = _linear_layer(rows, width, width, widened_bias=widened_bias)
    coverage = {}
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline(
        "tvm_dsm", coverage=coverage)), tvm.cuda())
    assert [f for f, family in coverage.items() if f.startswith("siblings_") and family == "split_k_gemm"]
    rng = np.random.default_rng()
    x = rng.standard_normal((rows, width)).astype("float16")
    ws = [(rng.standard_normal((width, width)) / 16).astype("float16") for _ in range(3)]
    bs = [rng.standard_normal(width).astype("float16") for _ in range(3)]
    got = vm["main"](*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, *ws, *bs)))
    for y, w, b in zip(got, ws, bs):
        ref = x.astype(np.float64) @ w.astype(np.float64).T + b
        assert np.linalg.norm(y.numpy().astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3
