"""Import a ``torch.export`` program into Relax computing what torch computes, in its types.

TVM 0.27's importer (``tvm.relax.frontend.torch.from_exported_program``) does two things to a
16-bit model that keep it off tvm-dsm's kernels:

- every matrix product (``linear``, ``mm``, ``bmm``, ``matmul``, ``addmm``, the convolutions)
  of 16-bit operands gets an fp32 result that is never rounded back, so everything after a
  model's first linear layer runs in fp32 (the attention, the MLP's products on CUDA cores
  against a widened weight) and the model returns fp32 where torch returns fp16; a 16-bit bias
  is added to that fp32 result as it is, which fails ("Binary operators must have the same
  datatype"): a fp16 GPT-2, BERT or ViT does not import at all;
- torch's decomposition table, which it applies first, spells ``scaled_dot_product_attention``
  out as its CPU math: q, k and v widened to fp32, a causal mask built as a tensor, a softmax
  and two batched products, which no attention kernel takes (and TVM's own converter of the
  whole operator ignores its ``scale`` and ``enable_gqa`` arguments).

:func:`from_exported_program` is that importer with two changes, made through its own extension
point (``custom_convert_map``): each product's result, its bias added in fp32, rounded to the
type torch gives it (the sum still accumulated in fp32, as cuBLAS does for torch), and ``scaled_dot_product_attention``
kept whole and converted into ``R.nn.attention`` with its scale, its mask (a bool mask as an
additive one) and grouped-query heads, which the attention family takes. Dropout is refused by
name: this is inference.

One more it fixes on the way, which gives wrong values, not only other types: an arithmetic or
transcendental operator whose torch result is floating over an integer or bool tensor
(``arange(n) / 3``, ``positions * 0.5``, ``torch.log(buckets)``) is computed by TVM's converters
in the integer type (integer division, the float scalar truncated) or refused. Those operands
are cast to torch's result type first (:data:`PROMOTING`), as torch promotes them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable

import tvm
from tvm import relax

from .relax_fills import NonFiniteFills
from .relax_matmuls import SIXTEEN_BIT
from .relax_patterns import attention_bias

#: torch operators (fx target names) that TVM converts into products with fp32 results, with
#: the position of the addend (a bias) each takes, if any.
PRODUCTS = {"linear.default": 2, "mm.default": None, "bmm.default": None, "matmul.default": None,
            "addmm.default": 0, "conv1d.default": 2, "conv2d.default": 2, "conv3d.default": 2,
            "convolution.default": 2}
ATTENTION = "scaled_dot_product_attention.default"
#: Elementwise torch operators whose integer or bool tensor operands torch promotes to a floating
#: result type (true division; a float scalar or tensor operand; the transcendental functions).
PROMOTING = ("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Tensor", "rsub.Scalar", "mul.Tensor",
             "mul.Scalar", "div.Tensor", "div.Scalar", "reciprocal.default", "pow.Tensor_Scalar",
             "pow.Tensor_Tensor", "pow.Scalar", "exp.default", "expm1.default", "log.default", "log2.default",
             "log10.default", "log1p.default", "sqrt.default", "rsqrt.default", "sigmoid.default", "erf.default",
             "sin.default", "cos.default", "tanh.default", "sinh.default", "cosh.default", "asin.default",
             "acos.default", "asinh.default", "acosh.default", "atanh.default")

_stock_converters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def from_exported_program(program, **kwargs) -> "relax.IRModule":
    """``program`` (a ``torch.export.ExportedProgram``) as a Relax module, as TVM's
    ``from_exported_program`` makes it (its keyword arguments too) but with torch's types kept
    and its attention whole (see the module docstring), and its fills of infinity or NaN as
    broadcasts, which any pipeline legalizes (:mod:`tvm_dsm.relax_fills`). A
    ``custom_convert_map`` given is applied over this one's."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program as tvm_import

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    # decomposed, one_hot's range checks become assertions: an impure function that nothing fuses
    table.pop(torch.ops.aten.one_hot.default, None)
    converters = {**torch_converters(), **(kwargs.pop("custom_convert_map", None) or {})}
    kwargs.pop("run_ep_decomposition", None)
    return NonFiniteFills(tvm_import(program.run_decompositions(table), custom_convert_map=converters,
                                     run_ep_decomposition=False, **kwargs))


def torch_converters() -> dict:
    """The converters :func:`from_exported_program` adds to TVM's importer, by torch operator:
    products in torch's result type, attention as ``R.nn.attention``, the reductions to a bool
    TVM has no converter for (:data:`ANY_ALL`), clamps by bounds of another type (:data:`BOUNDED`),
    writes along one indexed axis (:data:`INDEX_PUT`), unsorted top-k (:data:`TOP_K`)."""
    return {**{name: _in_torch_type(name) for name in PRODUCTS}, ATTENTION: _attention,
            **{name: _promoted(name) for name in PROMOTING}, POWER: _power,
            **{name: _any_all(name) for name in ANY_ALL},
            **{name: _operands_in_result_type(name) for name in BOUNDED},
            **{name: _index_put(name) for name in INDEX_PUT}, TOP_K: _top_k}


#: ``x[:, :, positions] = values`` (a static KV cache's update: ``index_copy_`` and the
#: assignment both export as ``index_put`` with ``None`` for the whole axes, the trailing ones
#: left out): TVM 0.27's converter wants an index tensor per axis and fails.
INDEX_PUT = ("index_put.default", "index_put_.default")
#: ``torch.topk``; TVM's converter refuses ``sorted=False`` (DeepSeek's router), whose order
#: torch leaves unspecified: the sorted order is one.
TOP_K = "topk.default"


#: Clamps whose bounds may be tensors of another type than the clamped one, which torch
#: reads in the clamped one's (T5's fp16 ``clamp(x, -c, c)`` with ``c`` an fp32 0-d tensor):
#: TVM's converter compares across the types and fails ("must have the same datatype").
BOUNDED = ("clamp.Tensor", "clamp_min.Tensor", "clamp_max.Tensor")

#: ``torch.any`` / ``torch.all`` (T5's fp16 guard ``where(isinf(x).any(), clamp(x), x)``), all
#: elements or along dims: TVM 0.27's importer stops on them ("Unsupported function types").
ANY_ALL = ("any.default", "any.dim", "any.dims", "all.default", "all.dim", "all.dims")


def _operands_in_result_type(name: str):
    """TVM's converter of ``name`` with each tensor operand of another type cast to torch's
    result type first."""
    return _with_operands_cast(name, lambda operand, result: operand != result)


def _any_all(name: str):
    """Whether any (all) element is nonzero: the max (min) of the operand as 0 / 1, over every
    axis (each row's first, then the rows': a reduction of a tensor to a scalar is scheduled as
    one thread's loop, 3.6 ms where T5's layer takes 0.06) or the named ones (``keepdim``),
    compared with 0."""
    def convert(node, importer) -> relax.Var:
        bb = importer.block_builder
        x = importer.env[node.args[0]]
        dims = _argument(node, 1, "dim")
        axes = None if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        keep = bool(_argument(node, 2, "keepdim", False))
        nonzero = x if x.ty.dtype == "bool" else relax.op.not_equal(x, relax.const(0, x.ty.dtype))
        flags = bb.emit(relax.op.astype(nonzero, "int8"))
        reduce = relax.op.max if name.startswith("any") else relax.op.min
        if axes is None and x.ty.ndim >= 2:  # rows first: one reduction to a scalar is one thread's loop
            flags = bb.emit(reduce(relax.op.reshape(flags, [-1, x.ty.shape.values[-1]]), axis=[1]))
        return bb.emit(relax.op.greater(reduce(flags, axis=axes, keepdims=keep), relax.const(0, "int8")))
    return convert


def _index_put(name: str):
    """``data`` with ``values`` written (or added, ``accumulate``) at the positions of one
    1-D index tensor along one axis, every other axis whole: a scatter along that axis, the
    index broadcast over the written block; any other ``index_put`` TVM's converter's."""
    def convert(node, importer) -> relax.Var:
        indices = _argument(node, 1, "indices")
        given = [(axis, i) for axis, i in enumerate(indices) if i is not None]
        data = importer.env[node.args[0]]
        if len(given) != 1 or len(given) == data.ty.ndim or data.ty.shape is None:
            return _stock(importer, name)(node)
        (axis, index), = given
        index = importer.env[index]
        if index.ty.ndim != 1 or index.ty.shape is None or str(index.ty.dtype) in ("bool", "uint8"):
            return _stock(importer, name)(node)  # (a bool or uint8 index is a mask, not positions)
        bb = importer.block_builder
        dims = list(data.ty.shape.values)
        block = dims[:axis] + [index.ty.shape.values[0]] + dims[axis + 1:]
        values = importer.env[_argument(node, 2, "values")]
        values = bb.emit(relax.op.broadcast_to(relax.op.astype(values, data.ty.dtype), block))
        at = relax.op.reshape(index, [1] * axis + [-1] + [1] * (len(dims) - axis - 1))
        at = bb.emit(relax.op.broadcast_to(relax.op.astype(at, "int64"), block))
        reduction = "add" if _argument(node, 3, "accumulate", False) else "update"
        return bb.emit(relax.op.scatter_elements(data, at, values, axis=axis, reduction=reduction))
    return convert


def _top_k(node, importer) -> relax.Var:
    """``torch.topk(x, k, dim, largest, sorted)``: values and int64 indices, best first whether
    or not ``sorted`` asks for an order."""
    x = importer.env[node.args[0]]
    k, dim = _argument(node, 1, "k", 1), _argument(node, 2, "dim", -1)
    largest = _argument(node, 3, "largest", True)
    return importer.block_builder.emit(relax.op.topk(x, k=k, axis=dim, largest=largest, ret_type="both",
                                                     dtype="int64"))


def _stock(importer, name: str):
    """TVM's own converter of ``name`` (the importer's map holds this module's in its place)."""
    if importer not in _stock_converters:
        _stock_converters[importer] = importer.create_convert_map()
    return _stock_converters[importer][name]


def _torch_dtype(importer, node) -> str:
    return importer._convert_data_type(node.meta["val"].dtype)  # noqa: SLF001 - the importer's own mapping


def _stock_with_operands_cast(importer, name: str, node, casts: dict):
    """TVM's converter of ``name`` on ``node`` with each operand of ``casts`` (an fx node: the
    dtype to read it in) cast first; the importer's own values of them are restored after."""
    originals = {arg: importer.env[arg] for arg in casts}
    for arg, dtype in casts.items():
        importer.env[arg] = importer.block_builder.emit(relax.op.astype(originals[arg], dtype))
    try:
        return _stock(importer, name)(node)
    finally:
        importer.env.update(originals)


def _in_torch_type(name: str):
    def convert(node, importer) -> relax.Var:
        dtype = _torch_dtype(importer, node)
        addend = PRODUCTS[name]
        addend = node.args[addend] if addend is not None and len(node.args) > addend else None
        # TVM adds a 16-bit addend, as it is, to the fp32 product (and fails on the mismatch)
        widened = addend in importer.env and str(getattr(importer.env[addend].ty, "dtype", "")) in SIXTEEN_BIT
        result = _stock_with_operands_cast(importer, name, node, {addend: "float32"} if widened else {})
        if dtype in SIXTEEN_BIT and result.ty.dtype == "float32":
            result = importer.block_builder.emit(relax.op.astype(result, dtype))
        return result
    return convert


#: ``x ** c`` of a tensor and a number: TVM's converter gives ``R.power``, whose legalization
#: (TOPI's ``power``) stops on bfloat16 ("power only applies to float").
POWER = "pow.Tensor_Scalar"


def _power(node, importer) -> relax.Var:
    """``x ** c``: a bfloat16 ``x`` squared as ``x * x`` (the RMSNorm and LayerNorm patterns read
    it; the same rounding as torch's, which squares in fp32 and rounds once), raised to another
    power in fp32 and rounded back, as torch computes it; others through :func:`_promoted`."""
    x, exponent = importer.env.get(node.args[0]), _argument(node, 1, "exponent")
    if not (isinstance(getattr(x, "ty", None), relax.TensorType) and x.ty.dtype == "bfloat16"
            and isinstance(exponent, (int, float))):
        return _promoted(POWER)(node, importer)
    bb = importer.block_builder
    if exponent == 2:
        return bb.emit(relax.op.multiply(x, x))
    wide = relax.op.power(relax.op.astype(x, "float32"), relax.const(float(exponent), "float32"))
    return bb.emit(relax.op.astype(wide, "bfloat16"))


def _promoted(name: str):
    """TVM's converter of ``name`` with each integer or bool tensor operand cast to torch's
    result type first, where that type is floating (see the module docstring)."""
    def floating(dtype: str) -> bool:
        return dtype.startswith(("float", "bfloat"))

    return _with_operands_cast(name, lambda operand, result: floating(result) and not floating(operand))


def _with_operands_cast(name: str, cast) -> Callable:
    """TVM's converter of ``name`` with each tensor operand whose type ``cast(its type, torch's
    result type)`` picks cast to the result type first."""
    def convert(node, importer) -> relax.Var:
        dtype = str(_torch_dtype(importer, node))
        casts = {}
        for arg in node.args:
            value = importer.env.get(arg) if isinstance(arg, Hashable) else None
            if isinstance(getattr(value, "ty", None), relax.TensorType) and cast(str(value.ty.dtype), dtype):
                casts[arg] = dtype
        return _stock_with_operands_cast(importer, name, node, casts)
    return convert


def _argument(node, position: int, name: str, default=None):
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _with_shape(bb, tensor: relax.Expr, arg, operands) -> relax.Expr:
    """``tensor`` with its shape, where an operator of symbolic extents left it unknown (its rank
    known): the shape torch traced for ``arg`` (``meta["val"]``), each symbolic extent the
    variable of that name in the other ``operands``' shapes, cast to it (checked when the model
    runs); ``tensor`` itself where its shape is known or torch's cannot be spelled so (TVM's
    attention operator cannot infer its result from an operand of unknown shape)."""
    val = getattr(arg, "meta", {}).get("val")
    if tensor.ty.shape is not None or val is None:
        return tensor
    named = {str(x): x for t in operands if t.ty.shape is not None for x in t.ty.shape.values
             if isinstance(x, tvm.tirx.Var)}
    dims = [int(d) if isinstance(d, int) else named.get(str(d)) for d in val.shape]
    if None in dims:
        return tensor
    return bb.match_cast(tensor, relax.TensorType(dims, tensor.ty.dtype))


def _attention(node, importer) -> relax.Var:
    """``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=,
    enable_gqa=)`` over ``[..., heads, length, dim]`` tensors (rank 2 to 4) as ``R.nn.attention``
    over ``[batch, length, heads, dim]`` ones."""
    bb = importer.block_builder
    q, k, v = (importer.env[a] for a in node.args[:3])
    if _argument(node, 4, "dropout_p", 0.0):
        raise ValueError("scaled_dot_product_attention with dropout_p > 0 is training; tvm-dsm imports inference")
    q, k, v = (_with_shape(bb, t, arg, (q, k, v)) for t, arg in zip((q, k, v), node.args[:3]))
    rank = q.ty.ndim
    if not 2 <= rank <= 4 or {k.ty.ndim, v.ty.ndim} != {rank}:
        raise ValueError(f"scaled_dot_product_attention over rank-{rank} tensors: tvm-dsm imports ranks 2 to 4 "
                         "([..., heads, length, dim], q, k and v of one rank)")
    q, k, v = (bb.emit(relax.op.expand_dims(t, list(range(4 - rank)))) if rank < 4 else t for t in (q, k, v))
    if node.kwargs.get("enable_gqa", False):
        heads, kv_heads = (t.ty.shape.values[1] if t.ty.shape is not None else None for t in (q, k))
        if not isinstance(heads, tvm.tirx.IntImm) or not isinstance(kv_heads, tvm.tirx.IntImm):
            raise ValueError("scaled_dot_product_attention(enable_gqa=True) over tensors whose head counts are "
                             "not known when the model is imported: tvm-dsm repeats the KV heads by a constant")
        if int(heads) != int(kv_heads):
            k, v = (bb.emit(relax.op.repeat(t, int(heads) // int(kv_heads), axis=1)) for t in (k, v))
    to_bshd = [0, 2, 1, 3]
    q, k, v = (bb.emit(relax.op.permute_dims(t, to_bshd)) for t in (q, k, v))
    mask = _argument(node, 3, "attn_mask")
    bias = None if mask is None else bb.emit(attention_bias(importer.env[mask], q.ty.dtype))
    scale = node.kwargs.get("scale")
    out = bb.emit(relax.op.nn.attention(q, k, v, bias=bias, scale=None if scale is None else float(scale),
                                        causal_mask="TopLeft" if _argument(node, 5, "is_causal", False) else None))
    out = bb.emit(relax.op.permute_dims(out, to_bshd))
    return out if rank == 4 else bb.emit(relax.op.squeeze(out, list(range(4 - rank))))
