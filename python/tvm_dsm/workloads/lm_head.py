"""Sparton's LM-head max, as a user writes it in TE: the vocabulary-sized logits of every token
exist only inside the kernel that reduces them."""

from __future__ import annotations

from tvm import te, tirx


def lm_head_max(batch: int, seq: int, hidden: int, vocab: int) -> tirx.PrimFunc:
    """``Y[b, v] = max_s log(1 + relu(H[b, s] . W[v] + bias[v]))`` (SPLADE-style term weights):
    ``H[batch * seq, hidden]`` (the encoder's last hidden states, rows of one sequence adjacent),
    ``W[vocab, hidden]``, ``bias[vocab]`` in fp16, accumulated and reduced in fp32."""
    h = te.placeholder((batch * seq, hidden), "float16", name="H")
    w = te.placeholder((vocab, hidden), "float16", name="W")
    b = te.placeholder((vocab,), "float16", name="bias")
    r = te.reduce_axis((0, hidden), name="k")
    logits = te.compute(
        (batch * seq, vocab),
        lambda i, j: te.sum(h[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
        name="logits",
    )
    zero = tirx.const(0, "float32")
    weight = te.compute(
        (batch * seq, vocab),
        lambda i, j: tirx.log(tirx.const(1, "float32") + tirx.max(logits[i, j] + b[j].astype("float32"), zero)),
        name="weight",
    )
    s = te.reduce_axis((0, seq), name="s")
    y = te.compute((batch, vocab), lambda i, j: te.max(weight[i * seq + s, j], axis=s), name="Y")
    return te.create_prim_func([h, w, b, y])
