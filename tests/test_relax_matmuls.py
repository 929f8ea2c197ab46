"""Relax matmuls as fp32-accumulated matrix products (tvm_dsm.relax_matmuls): same values on
llvm, and the form the GEMM families take (residual adds in the epilogue)."""

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.relax_matmuls import MatmulsAsMatrices


@I.ir_module
class _Block:
    """Two linear layers of a decoder on ``[batch, 1, hidden]`` activations: the residual stream
    kept 2-D (as nn.llm's Llama keeps it), one residual added in 3-D."""

    @R.function
    def main(x: R.Tensor(("b", 1, 64), "float16"), w1: R.Tensor((64, 64), "float16"),
             w2: R.Tensor((128, 64), "float16")):
        b = T.int64()
        with R.dataflow():
            h = R.matmul(x, R.permute_dims(w1))
            s = R.add(R.reshape(h, R.shape([b, 64])), R.reshape(x, R.shape([b, 64])))
            t = R.add(R.matmul(x, R.permute_dims(w1)), x)
            u = R.matmul(R.reshape(s, R.shape([b, 1, 64])), R.permute_dims(w2))
            R.output(t, u)
        return (t, u)


def _run_llvm(mod: tvm.IRModule, args: list[np.ndarray]) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [o.numpy() for o in vm["main"](*(tvm.runtime.tensor(a) for a in args))]


def test_the_rewrite_keeps_the_values_on_llvm():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((5, 1, 64)).astype("float16"),
            (rng.standard_normal((64, 64)) / 8).astype("float16"),
            (rng.standard_normal((128, 64)) / 8).astype("float16")]
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
