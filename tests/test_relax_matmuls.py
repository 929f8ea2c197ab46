"""Relax matmuls as fp32-accumulated matrix products (tvm_dsm.relax_matmuls): same values on
llvm, and the form the GEMM families take (residual adds in the epilogue)."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.relax_matmuls import MatmulsAsMatrices
from conftest import LLVM


@I.ir_module
class _Block:
    """Two linear layers of a decoder on ``[batch, 1, hidden]`` activations: the residual stream
    kept 2-D (as nn.llm's Llama keeps it), one residual added in 3-D."""

    @R.function
    def main(x: R.Tensor(("b", 1, 64), "float16"), w1: R.Tensor((64, 64), "float16"),
             w2: R.Tensor((128, 64), "float16"), w3: R.Tensor((64, 64), "float16")):
        b = T.int64()
        with R.dataflow():
            h = R.matmul(x, R.permute_dims(w1))
            s = R.add(R.reshape(h, R.shape([b, 64])), R.reshape(x, R.shape([b, 64])))
            t = R.add(R.matmul(x, R.permute_dims(w3)), x)
            u = R.matmul(R.reshape(s, R.shape([b, 1, 64])), R.permute_dims(w2))
            R.output(t, u)
        return (t, u)


def _run_llvm(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target=LLVM), tvm.cpu())
    return [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(a) for a in args))]


def test_the_rewrite_keeps_the_values_on_llvm():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((5, 1, 64)).astype("float16"),
            (rng.standard_normal((64, 64)) / 8).astype("float16"),
            (rng.standard_normal((128, 64)) / 8).astype("float16"), (rng.standard_normal((64, 64)) / 8).astype("float16")]
    before, after = _run_llvm(_Block, args), _run_llvm(MatmulsAsMatrices(_Block), args)
    for want, got in zip(before, after):
        assert got.shape == want.shape
        # the original accumulates in fp16: the fp32 sums differ from it by its rounding only
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)) < 5e-3


def test_products_are_matrices_accumulated_in_fp32_with_the_residual_in_their_epilogue():
    mod = lower_to_tir(_Block)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    products = [name for name in funcs if "matmul" in name]
    calls = [line for line in mod["main"].script().splitlines() if "call_tir(" in line]
    assert sum("matmul" in line for line in calls) == 3
    # both residual adds run in their product's epilogue (identical functions share a name)
    assert sum("matmul" in line and "_add" in line for line in calls) == 2
    assert not any("call_tir(add" in line for line in calls)
    for name in products:
        assert all(len(p.ty.shape) == 2 for p in funcs[name].params if hasattr(p.ty, "shape"))
        assert "float32" in funcs[name].script()  # fp32 accumulator


@I.ir_module
class _BatchAndSequence:
    """A linear layer with a residual over ``[batch, seq, hidden]``: two extent variables, whose
    product is the rows of every matrix."""

    @R.function
    def main(x: R.Tensor(("b", "s", 64), "float16"), w: R.Tensor((96, 64), "float16"),
             r: R.Tensor(("b", "s", 96), "float16"), v: R.Tensor((96, 64), "float16")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.permute_dims(w)), r)
            z = R.matmul(x, R.permute_dims(v))
            R.output(y, z)
        return (y, z)


def test_a_batch_and_a_sequence_become_one_row_variable_with_the_same_values_on_llvm():
    """Each matrix of ``b * s`` rows is cast to one variable's rows (the same for both
    products): the products' PrimFuncs take a row variable bound by their operands, and the
    module computes what it did, for several batch and sequence lengths."""
    mod = MatmulsAsMatrices(_BatchAndSequence)
    script = mod["main"].script()
    casts = [line for line in script.splitlines() if "R.match_cast(" in line]
    assert len(casts) >= 2 and all("R.Tensor((rows, " in line for line in casts)  # x and the residual, one variable
    lowered = lower_to_tir(_BatchAndSequence)
    products = [f for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    assert len(products) == 2
    for func in products:
        rows = {str(p.ty.shape[0]) for p in func.params if hasattr(p.ty, "shape") and len(p.ty.shape) == 2
                and not isinstance(p.ty.shape[0], tirx.IntImm)}
        assert rows == {"rows"}, func.params
    rng = np.random.default_rng(0)
    w, v = ((rng.standard_normal((96, 64)) / 8).astype("float16") for _ in range(2))
    for b, s in ((1, 7), (3, 5)):
        args = [rng.standard_normal((b, s, 64)).astype("float16"), w, rng.standard_normal((b, s, 96)).astype("float16"), v]
        for want, got in zip(_run_llvm(_BatchAndSequence, args), _run_llvm(mod, args)):
            assert got.shape == want.shape == (b, s, 96)
            assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)) < 5e-3


@I.ir_module
class _Epilogues:
    """Linear layers over ``[batch, seq, hidden]`` as ``nn.Linear`` with a bias writes them, each
    followed by element-wise operators: a bias and GELU, a bias ``[1, 1, N]`` subtracted from
    the product (operand order kept) and scaled, a bias and a residual."""

    @R.function
    def main(x: R.Tensor(("b", "s", 64), "float16"), w1: R.Tensor((128, 64), "float16"),
             b1: R.Tensor((128,), "float16"), c1: R.Tensor((1, 1, 128), "float16"),
             w2: R.Tensor((64, 128), "float16"), b2: R.Tensor((64,), "float16"),
             scale: R.Tensor((1, 1, 1), "float16"), w3: R.Tensor((128, 64), "float16")):
        with R.dataflow():
            h = R.nn.gelu_tanh(R.add(R.matmul(x, R.permute_dims(w1)), b1))
            g = R.multiply(R.multiply(R.subtract(c1, R.matmul(x, R.permute_dims(w3))), R.const(0.5, "float16")), scale)
            y = R.add(R.add(R.matmul(h, R.permute_dims(w2)), b2), x)
            R.output(y, g)
        return (y, g)


def test_biases_activations_and_residuals_run_in_the_products_epilogues_with_the_same_values():
    mod = lower_to_tir(_Epilogues)
    calls = [line for line in mod["main"].script().splitlines() if "call_tir(" in line]
    products = [line for line in calls if "matmul" in line]
    assert len(products) == 3, calls
    assert any("_add" in line and "gelu_tanh" in line for line in products), calls
    assert any("subtract" in line and "multiply" in line for line in products), calls
    assert any(line.count("_add") == 2 for line in products), calls
    assert not [line for line in calls if "matmul" not in line and any(
        op in line for op in ("add", "gelu", "subtract", "multiply"))], calls
    funcs = [f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    rows = [p for f in funcs for p in f.params
            if hasattr(p.ty, "shape") and not all(isinstance(d, tirx.IntImm) for d in p.ty.shape)]
    assert len(rows) >= 6 and all(len(p.ty.shape) == 2 for p in rows)  # activations as matrices
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 3, 64)).astype("float16"), (rng.standard_normal((128, 64)) / 8).astype("float16"),
            rng.standard_normal(128).astype("float16"), rng.standard_normal((1, 1, 128)).astype("float16"),
            (rng.standard_normal((64, 128)) / 8).astype("float16"), rng.standard_normal(64).astype("float16"),
            np.full((1, 1, 1), 1.5, "float16"), (rng.standard_normal((128, 64)) / 8).astype("float16")]
    for want, got in zip(_run_llvm(_Epilogues, args), _run_llvm(MatmulsAsMatrices(_Epilogues), args)):
        assert got.shape == want.shape
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)) < 5e-3


@I.ir_module
class _RowWise:
    """Norms over the last axis of ``[batch, seq, hidden]`` tensors, a residual stream through a
    linear layer between them, and a softmax."""

    @R.function
    def main(x: R.Tensor(("b", "s", 64), "float16"), w: R.Tensor((64, 64), "float16"),
             g: R.Tensor((64,), "float16"), beta: R.Tensor((64,), "float16")):
        with R.dataflow():
            h = R.nn.layer_norm(x, g, beta, axes=[-1], epsilon=1e-5)
            y = R.add(R.matmul(h, R.permute_dims(w)), x)
            z = R.nn.rms_norm(y, g, axes=[2], epsilon=1e-6)
            q = R.nn.softmax(z, axis=-1)  # left as it is (attention's softmax, grouped whole)
            R.output(z, q)
        return (z, q)


def test_norms_over_the_last_axis_are_row_functions_of_one_row_variable():
    mod = lower_to_tir(_RowWise)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    row_wise = {name: f for name, f in funcs.items() if any(op in name for op in ("norm", "softmax"))}
    over_rows = [name for name, f in row_wise.items()
                 if all(len(p.ty.shape) <= 2 for p in f.params if hasattr(p.ty, "shape"))]
    assert len(over_rows) == 2 and len(row_wise) == 3, list(row_wise)  # the softmax keeps its rank
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 3, 64)).astype("float16"), (rng.standard_normal((64, 64)) / 8).astype("float16"),
            rng.standard_normal(64).astype("float16"), rng.standard_normal(64).astype("float16")]
    for want, got in zip(_run_llvm(_RowWise, args), _run_llvm(MatmulsAsMatrices(_RowWise), args)):
        assert got.shape == want.shape
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)) < 5e-3


def _nn_mlp(hidden: int, inner: int):
    """A ``relax.frontend.nn`` MLP (``down(silu(up(x)))``, fp16, no bias) exported with
    ``[batch, seq, hidden]`` activations: the module and its parameter spec."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.up = nn.Linear(hidden, inner, bias=False, dtype="float16")
            self.down = nn.Linear(inner, hidden, bias=False, dtype="float16")

        def forward(self, x):
            return self.down(nn.op.silu(self.up(x)))

    return MLP().export_tvm({"forward": {"x": nn.spec.Tensor(["batch", "seq", hidden], "float16")}})


def test_an_nn_mlp_over_a_batch_and_a_sequence_gets_gemm_kernels():
    """A ``relax.frontend.nn`` MLP exported with ``[batch, seq, in]`` activations: both linear
    layers planned per range of rows by the split-K GEMM family, one row by the row GEMV."""
    from tvm_dsm.model_report import relax_report

    mod, _ = _nn_mlp(256, 512)
    report = relax_report(mod).format()
    products = [line for line in report.splitlines() if "NT_matmul" in line]
    assert len(products) == 2 and all("rows <= 1: row_gemv" in line and "<= 16: split_k_gemm" in line for line in products), report


@pytest.mark.parametrize(("dtype", "out_dtype", "family"), [("float32", None, "simt_gemm"),
                                                           ("float16", "float32", "split_k_gemm")])
def test_fp32_and_fp32_result_linears_over_tokens_get_gemm_kernels(dtype, out_dtype, family):
    """``nn.Linear`` over ``[1, tokens, in]`` in fp32, or 16-bit with ``out_dtype="float32"``:
    the product of a matrix of rows, which a GEMM family takes (a 3-D product goes to dlight)."""
    from tvm.relax.frontend import nn
    from tvm_dsm.model_report import relax_report

    class Linear(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(512, 1024, bias=False, dtype=dtype, out_dtype=out_dtype)

        def forward(self, x):
            return self.fc(x)

    mod, _ = Linear().export_tvm({"forward": {"x": nn.spec.Tensor([1, 64, 512], dtype)}})
    report = relax_report(mod)
    assert [row.where for row in report.rows if "matmul" in row.name] == [family], report.format()


@pytest.mark.gpu
def test_gpu_an_nn_mlp_over_a_batch_and_a_sequence_matches_float64():
    """The MLP compiled by tvm-dsm's pipeline, run at several batch and sequence lengths (a
    range's kernel each), against a float64 evaluation of the same weights."""
    mod, spec = _nn_mlp(512, 1024)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("tvm_dsm")), tvm.cuda())
    rng = np.random.default_rng()
    weights = {name: (rng.standard_normal([int(d) for d in p.shape]) / 16).astype("float16") for name, p in spec}
    up, down = (weights[name].astype(np.float64) for name in ("up.weight", "down.weight"))
    for b, s in ((1, 1), (2, 37), (3, 300)):
        x = rng.standard_normal((b, s, 512)).astype("float16")
        h = x.astype(np.float64) @ up.T
        ref = (h / (1 + np.exp(-h))) @ down.T
        out = vm["forward"](tvm.runtime.tensor(x, tvm.cuda()), *(tvm.runtime.tensor(weights[n], tvm.cuda()) for n, _ in spec))
        got = out.numpy().astype(np.float64)
        assert got.shape == (b, s, 512) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, (b, s)


@I.ir_module
class _SharedTranspose:
    """One transposed weight read by two matmuls (DeBERTa projects its tokens and its relative
    positions by the same query weight)."""

    @R.function
    def main(x: R.Tensor((128, 768), "float16"), p: R.Tensor((512, 768), "float16"),
             w: R.Tensor((768, 768), "float16")):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])
            a = R.matmul(x, wt, out_dtype="float32")
            b = R.matmul(p, wt, out_dtype="float32")
            R.output(a, b)
        return (a, b)


def test_a_transpose_two_matmuls_read_is_folded_into_each():
    """TVM's FuseTransposeMatmul fails on the shared transpose ('TupleType' has no dtype); each
    matmul gets its own, folded into it: no transpose kernel left, the values on llvm kept."""
    lowered = lower_to_tir(_SharedTranspose)
    kernels = [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)]
    assert not [k for k in kernels if "transpose" in k] and len([k for k in kernels if "matmul" in k]) == 2, kernels
    rng = np.random.default_rng()
    x, p, w = (rng.standard_normal(s).astype("float16") for s in ((128, 768), (512, 768), (768, 768)))
    executable = tvm.compile(lower_to_tir(_SharedTranspose), tvm.target.Target("llvm"), tir_pipeline="s_tir_stock")
    a, b = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(t) for t in (x, p, w)))
    for got, rows in ((a, x), (b, p)):
        want = rows.astype(np.float64) @ w.astype(np.float64).T
        assert np.linalg.norm(got.numpy() - want) / np.linalg.norm(want) < 1e-5


def test_tensors_of_the_product_rows_made_elsewhere_meet_the_products_rows():
    """A MoE block over flattened ``batch * seq_len`` rows: the down projection's rows become the
    row variable, and the routing weight from a sorted top-k (a call whose shape keeps the
    product) is cast to it too, so their product has a shape and the model compiles (it had
    none, and the VM could not emit the unlegalized multiply)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op

    class Routed(nn.Module):
        def __init__(self):
            self.router = nn.Linear(256, 4, bias=False, dtype="float16")
            self.down_proj = nn.Linear(256, 256, bias=False, dtype="float16")

        def forward(self, x):
            b, s, h = x.shape
            flat = op.reshape(x, (b * s, h))
            top, _ = op.topk(op.softmax(self.router(flat), axis=-1), 2, axis=-1)
            return op.reshape(self.down_proj(flat) * op.sum(top, axis=-1, keepdims=True), (b, s, h))

    mod, _ = Routed().export_tvm(spec={"forward": {"x": nn.spec.Tensor(["batch", "seq_len", 256], "float16")}})
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
    tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("tvm_dsm"))
