"""Relax models as a user writes them (``torch.nn.Linear`` weights ``[out, in]``), for
:mod:`tvm_dsm.relax_integration`."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.script import relax as R


def linear(a, w):
    """``torch.nn.Linear`` without bias: ``a @ w^T`` accumulated in fp32."""
    return relax.op.matmul(a, relax.op.permute_dims(w), out_dtype="float32")


def ffn(m: int, n: int, k: int, l: int, activation: str = "relu") -> tvm.IRModule:
    """A transformer FFN ``act(x @ W1^T) @ W2^T`` on ``x[m, k]`` (fp16 in, fp32 accumulation,
    fp16 intermediate and output)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, k), "float16"))
    w1 = relax.Var("w1", R.Tensor((n, k), "float16"))
    w2 = relax.Var("w2", R.Tensor((l, n), "float16"))
    act = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu, "silu": relax.op.nn.silu}[activation]
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            h = bb.emit(relax.op.astype(act(linear(x, w1)), "float16"))
            out = bb.emit_output(relax.op.astype(linear(h, w2), "float16"))
        bb.emit_func_output(out)
    return bb.get()


def swiglu_mlp(m: int, n: int, k: int, l: int, softmax: bool = False) -> tvm.IRModule:
    """Llama's MLP ``(silu(x @ Wg^T) * (x @ Wu^T)) @ W2^T`` on ``x[m, k]`` (fp16 in, fp32
    accumulation, fp16 out), optionally followed by a softmax over the output row (an operator
    no tvm-dsm family schedules)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((m, k), "float16"))
    wg, wu = (relax.Var(name, R.Tensor((n, k), "float16")) for name in ("wg", "wu"))
    w2 = relax.Var("w2", R.Tensor((l, n), "float16"))
    with bb.function("main", [x, wg, wu, w2]):
        with bb.dataflow():
            gate = bb.emit(linear(x, wg))
            up = bb.emit(linear(x, wu))
            h = bb.emit(relax.op.astype(relax.op.multiply(relax.op.nn.silu(gate), up), "float16"))
            y = bb.emit(linear(h, w2))
            if softmax:
                y = bb.emit(relax.op.nn.softmax(y, axis=-1))
            out = bb.emit_output(relax.op.astype(y, "float16"))
        bb.emit_func_output(out)
    return bb.get()
