"""Dense layers as a user writes them in TE: the GEMM every fused kernel's main loop is."""

from __future__ import annotations

from tvm import te, tirx

#: Epilogues a dense layer may end with (applied to the fp32 accumulator, before the cast).
ACTIVATIONS = {
    "identity": lambda x: x,
    "relu": lambda x: tirx.max(x, tirx.const(0, x.dtype)),
    "silu": lambda x: x * tirx.sigmoid(x),
    "gelu": lambda x: x * tirx.const(0.5, x.dtype) * (tirx.const(1, x.dtype) + tirx.erf(x * tirx.const(0.7071067811865476, x.dtype))),
    "gelu_tanh": lambda x: x * tirx.const(0.5, x.dtype) * (tirx.const(1, x.dtype) + tirx.tanh(
        tirx.const(0.7978845608028654, x.dtype) * (x + tirx.const(0.044715, x.dtype) * x * x * x))),
}


def dense(
    m: int,
    n: int,
    k: int,
    dtype: str = "float16",
    out_dtype: str | None = None,
    weight_layout: str = "nk",
    bias: bool = False,
    activation: str = "identity",
) -> tirx.PrimFunc:
    """``Y = act(X @ W^T + b)`` with ``X[m, k]``, ``W[n, k]`` (``weight_layout="nk"``, torch's
    ``nn.Linear``) or ``W[k, n]`` (``"kn"``), accumulated in float32 and cast to ``out_dtype``
    (default: the input dtype)."""
    out_dtype = out_dtype or dtype
    x = te.placeholder((m, k), dtype, name="X")
    w = te.placeholder((n, k) if weight_layout == "nk" else (k, n), dtype, name="W")
    acc = matmul(x, w, weight_layout)
    params = [x, w]
    if bias:
        b = te.placeholder((n,), dtype, name="bias")
        params.append(b)
        biased = te.compute((m, n), lambda i, j: acc[i, j] + b[j].astype("float32"), name="biased")
    else:
        biased = acc
    act = ACTIVATIONS[activation]
    y = te.compute((m, n), lambda i, j: act(biased[i, j]).astype(out_dtype), name="Y")
    return te.create_prim_func([*params, y])


def gated_dense(m: int, n: int, k: int, dtype: str = "float16", fused_weight: bool = False,
                activation: str = "silu") -> tirx.PrimFunc:
    """``H = silu(X @ Wg^T) * (X @ Wu^T)`` (the first half of Llama's MLP; another of
    ACTIVATIONS of the gate: GeGLU's ``gelu_tanh``) with ``X[m, k]``, ``Wg, Wu[n, k]``, both
    products accumulated in float32 and the result cast to ``dtype``. ``fused_weight``: one
    weight ``W[2n, k]``, the gate's rows first (``Wg = W[:n]``, ``Wu = W[n:]``), as a model with
    one gate/up projection stores it."""
    x = te.placeholder((m, k), dtype, name="X")
    if fused_weight:
        w = te.placeholder((2 * n, k), dtype, name="W")
        weights = [w]
        gate, up = matmul(x, w, rows=(0, n)), matmul(x, w, rows=(n, n))
    else:
        weights = [te.placeholder((n, k), dtype, name=name) for name in ("Wg", "Wu")]
        gate, up = (matmul(x, w) for w in weights)
    act = ACTIVATIONS[activation]
    h = te.compute((m, n), lambda i, j: (act(gate[i, j]) * up[i, j]).astype(dtype), name="H")
    return te.create_prim_func([x, *weights, h])


def matmul(x: te.Tensor, w: te.Tensor, weight_layout: str = "nk", rows: tuple | None = None) -> te.Tensor:
    """``acc[i, j] = sum_k X[i, k] * W[j, k]`` (or ``W[k, j]``) in float32; ``rows`` (first,
    count): of W's rows (``"nk"``) those alone, ``W[first + j, k]``."""
    (m, k), n = x.shape, w.shape[0] if weight_layout == "nk" else w.shape[1]
    first, n = rows or (0, n)
    r = te.reduce_axis((0, k), name="k")

    def weight(j, kk):
        return w[first + j, kk] if weight_layout == "nk" else w[kk, j]

    return te.compute(
        (m, n),
        lambda i, j: te.sum(x[i, r].astype("float32") * weight(j, r).astype("float32"), axis=r),
        name="acc",
    )


def batched_matmul(batch: tuple[int, ...], m, n: int, k: int, dtype: str = "float16", weight_layout: str = "nk",
                   shared_x: bool = False) -> tirx.PrimFunc:
    """``Y[b..., i, j] = X[b..., i, :] . W[b..., j, :]`` (``W[b..., :, j]`` for ``"kn"``) in float32,
    cast to ``dtype``, over the batch axes ``batch`` (``torch.bmm``; two axes: ``q @ k^T`` over
    batch and heads); ``shared_x``: X is ``[m, k]``, read by every product (an expert einsum's
    tokens, ``nd,edf->enf``)."""
    x = te.placeholder((m, k) if shared_x else (*batch, m, k), dtype, name="x")
    w = te.placeholder((*batch, n, k) if weight_layout == "nk" else (*batch, k, n), dtype, name="w")
    r = te.reduce_axis((0, k), name="k")

    def product(*index):
        *b, i, j = index
        xs = x[i, r] if shared_x else x[(*b, i, r)]
        ws = w[(*b, j, r)] if weight_layout == "nk" else w[(*b, r, j)]
        return te.sum(xs.astype("float32") * ws.astype("float32"), axis=r)

    acc = te.compute((*batch, m, n), product, name="acc")
    y = te.compute(acc.shape, lambda *i: acc(*i).astype(dtype), name="Y")
    return te.create_prim_func([x, w, y])


def scaled_dense(m: int, n: int, k: int, dtype: str = "float8_e4m3fn",
                 out_dtype: str = "float16") -> tirx.PrimFunc:
    """``Y = (Xq @ Wq^T) * sx[i] * sw[j]``: a GEMM on quantized operands (fp8 e4m3 by default)
    with per-token scales ``sx[m]`` and per-channel scales ``sw[n]`` (float32), as
    ``torch._scaled_mm`` computes it with row-wise scales."""
    x = te.placeholder((m, k), dtype, name="Xq")
    w = te.placeholder((n, k), dtype, name="Wq")
    sx = te.placeholder((m,), "float32", name="sx")
    sw = te.placeholder((n,), "float32", name="sw")
    acc = matmul(x, w)
    y = te.compute((m, n), lambda i, j: (acc[i, j] * sx[i] * sw[j]).astype(out_dtype), name="Y")
    return te.create_prim_func([x, w, sx, sw, y])


#: Largest finite float8_e4m3fn: per-token quantization maps each row's max |x| onto it.
FP8_MAX = 448.0


def quantized_dense(m: int, n: int, k: int, out_dtype: str = "float16") -> tirx.PrimFunc:
    """Per-token FP8 quantization of ``X`` followed by the scaled fp8 GEMM, as a user writes it:
    ``amax[i] = max_k |X[i, k]|``, ``Xq = e4m3(X * (448 / amax))``, then
    ``Y = (Xq @ Wq^T) * (amax / 448)[i] * sw[j]`` with ``Wq`` quantized per output channel
    beforehand (scales ``sw``). A cascaded reduction: the GEMM's K loop reads the row max over
    the same K. (Multiplying by the inverse scale is what quantization kernels do: a division
    per element costs more than the fp8 GEMM's main loop.)"""
    x = te.placeholder((m, k), "float16", name="X")
    w = te.placeholder((n, k), "float8_e4m3fn", name="Wq")
    sw = te.placeholder((n,), "float32", name="sw")
    r = te.reduce_axis((0, k), name="k")
    amax = te.compute((m,), lambda i: te.max(te.abs(x[i, r].astype("float32")), axis=r), name="amax")
    tiny, top = tirx.const(1e-12, "float32"), tirx.const(FP8_MAX, "float32")  # zero rows: zeros
    inverse = te.compute((m,), lambda i: top / tirx.max(amax[i], tiny), name="inverse_scale")
    sx = te.compute((m,), lambda i: tirx.max(amax[i], tiny) / top, name="sx")
    xq = te.compute((m, k), lambda i, kk: (x[i, kk].astype("float32") * inverse[i]).astype("float8_e4m3fn"),
                    name="Xq")
    acc = matmul(xq, w)
    y = te.compute((m, n), lambda i, j: (acc[i, j] * sx[i] * sw[j]).astype(out_dtype), name="Y")
    return te.create_prim_func([x, w, sw, y])
