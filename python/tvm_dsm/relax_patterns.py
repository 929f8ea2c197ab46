"""Operators a frontend spelled out, put back as the Relax operators they are, before
legalization.

``from_exported_program`` imports a torch model's ops one by one: an RMSNorm module written as
torch users (and Hugging Face's ``LlamaRMSNorm``) write it,

    x32 = x.float()
    (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight

arrives as ``astype``, ``power``, ``mean``, ``add``, ``rsqrt``, ``multiply``, ``astype``,
``multiply``. Relax's ``FuseOps`` then cuts it in three (the cast, the square, the rest reading
``x32`` again), and none of the pieces is a normalization the ``row_norm`` family takes.
``R.nn.rms_norm`` legalizes to TOPI's ``rms_norm``, one PrimFunc that family takes whole (as
``relax.frontend.nn`` models produce it). :func:`rewrite_rms_norms` puts the decomposed form
back as that operator; :data:`RewriteToRelaxOps` applies it to every Relax function of a module,
and :func:`tvm_dsm.relax_integration.lower_to_tir` runs it first. A softmax or log-softmax written
out the same way (``exp(x - max(x)) / sum(..)``, ``(x - max(x)) - log(sum(exp(..)))``, cut into
four kernels by ``FuseOps``) is put back as ``R.nn.softmax`` / ``R.nn.log_softmax``
(:func:`rewrite_softmaxes`), whose TOPI legalization is the same arithmetic.

The rewrite never changes what is computed beyond the order of the sum's terms and the rounding
of one fp32 operation: it matches only where TOPI's ``rms_norm`` does the same arithmetic (the
statistics in fp32, ``mean`` as the sum divided by the width (written so, or as ``mean``),
``x * rsqrt(mean + eps)`` (or ``x / sqrt(mean + eps)``)), or a norm written wholly in a 16-bit
type, whose statistics TOPI computes in fp32 and rounds once (never further from the exact
values than the graph's own 16-bit roundings), and where the graph rounds the normalized row
before multiplying by the weight (the ``.to(x.dtype)`` of a 16-bit model) it keeps that rounding:
the norm is taken with a weight of ones (a multiplication by 1.0, exact) and the weight is
multiplied afterwards, in the graph's type, as before (Relax fuses that multiplication into the
norm's PrimFunc). A graph it does not match is returned unchanged.

TVM's ``from_exported_program`` of a 16-bit model gives the second norm of a decoder layer an
fp32 row (its ``mm`` produces fp32, so the residual stream is fp32): there the norm reads the
fp32 row and its result is cast before the weight, all in the one PrimFunc. torch's
decomposition of ``silu`` (``x * sigmoid(x)``, in fp32 between two casts) becomes ``R.nn.silu``
(:func:`rewrite_silus`), the same product, which the gated GEMM rewrite recognizes as a gate.

Attention a model spells out (BERT's ``softmax(q @ k^T / c + mask) @ v``, Hugging Face's eager
attention with q and k widened to fp32 and the probabilities rounded back before the product
with v) becomes ``R.nn.attention`` (:func:`rewrite_attentions`; its mask, where the model
computes it from constants, is read by :mod:`tvm_dsm.relax_attention_masks`). Scaled dot-product
attention as TVM's importer lets torch decompose it (v widened too, the probabilities never
rounded) is not rewritten: the attention family would round the probabilities to 16 bits, a
change of precision, not of rounding order. :mod:`tvm_dsm.relax_torch` imports SDPA whole
instead, as ``R.nn.attention`` in the model's 16-bit type.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, rewrite_call, wildcard
from tvm.sym import Analyzer

from .relax_attention_masks import MASKED_FILL, constant_mask
from .relax_constants import closed, floating
from .relax_matmuls import SIXTEEN_BIT, is_op_call, map_functions

#: The type the statistics are computed in, by TOPI's ``rms_norm`` and by the matched graphs.
_STATS = "float32"
#: The types the normalized row may be rounded to before the weight.
_OUT_TYPES = ("float16", "bfloat16", _STATS)


def _tensor(expr) -> relax.TensorType | None:
    """``expr``'s tensor type with a known shape, or None."""
    ty = expr.ty
    return ty if isinstance(ty, relax.TensorType) and ty.shape is not None else None


def scalar_value(expr) -> float | None:
    """The value of a one-element float constant, a float immediate (``R.clip``'s bounds) or a
    scalar ``R.full`` of a constant, or None."""
    if isinstance(expr, tvm.tirx.FloatImm):
        return float(expr.value)
    if is_op_call(expr, "relax.full") and _tensor(expr) is not None and _tensor(expr).ndim == 0:
        return scalar_value(expr.args[1])
    if not isinstance(expr, tvm.ir.Constant):
        return None
    value = expr.value.numpy()
    if value.size != 1 or not floating(value):
        return None
    return float(value.reshape(()))


def _same_type(a, b) -> bool:
    """Whether two tensor types are the same dtype and (structurally) the same shape."""
    return (isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType) and a.dtype == b.dtype
            and a.shape is not None and b.shape is not None and tvm_ffi.structural_equal(a.shape, b.shape))


def rms_norm_pattern():
    """The decomposed RMSNorm: ``(x * rsqrt(mean(x ** 2, -1) + eps)) [.astype(t)] * weight``,
    the mean also written ``sum(..) / width`` (or ``* (1 / width)``), the normalization also
    ``x / sqrt(..)``.

    Returns the pattern's root and its named parts (a dict of patterns: ``x``, ``square``,
    ``mean``, ``eps``, ``normalized``, ``cast``, ``weight``, ``root``); the square is
    ``power(x, c)`` or ``x * x``, and Relax's matcher takes ``add`` and ``multiply`` in either
    operand order. What the pattern cannot say (the exponent 2, the axis, the types) the
    rewriter checks."""
    x, eps, weight = wildcard(), is_const(), wildcard()
    square = is_op("relax.power")(x, is_const()) | is_op("relax.multiply")(x, x)
    total = is_op("relax.sum")(square)
    mean = (is_op("relax.mean")(square) | is_op("relax.divide")(total, is_const())
            | is_op("relax.multiply")(total, is_const()))
    shifted = is_op("relax.add")(mean, eps)
    normalized = (is_op("relax.multiply")(x, is_op("relax.rsqrt")(shifted))
                  | is_op("relax.divide")(x, is_op("relax.sqrt")(shifted)))
    cast = is_op("relax.astype")(normalized)
    root = is_op("relax.multiply")(cast | normalized, weight)
    return root, {"x": x, "square": square, "total": total, "mean": mean, "eps": eps, "normalized": normalized,
                  "cast": cast, "weight": weight, "root": root}


def _rms_norm_replacement(orig: relax.Call, m: dict, parts: dict) -> relax.Expr:
    """The ``R.nn.rms_norm`` form of a match (see the module docstring), or ``orig`` where
    TOPI's ``rms_norm`` would not compute the same thing."""
    x, weight, normalized = m[parts["x"]], m[parts["weight"]], m[parts["normalized"]]
    x_ty, w_ty = _tensor(x), _tensor(weight)
    if x_ty is None or w_ty is None or x_ty.dtype not in _OUT_TYPES or x_ty.ndim < 1 or w_ty.ndim != 1:
        return orig
    width = x_ty.shape.values[-1]
    if not Analyzer().can_prove_equal(w_ty.shape.values[0], width):
        return orig
    square = m[parts["square"]]
    if is_op_call(square, "relax.power") and scalar_value(square.args[1]) != 2.0:
        return orig
    if not _mean_over_last_axis(m[parts["mean"]], m.get(parts["total"]), x_ty.ndim, width):
        return orig
    eps = scalar_value(m[parts["eps"]])
    if eps is None or not math.isfinite(eps) or _tensor(m[parts["eps"]]).dtype != x_ty.dtype:
        return orig
    cast = m.get(parts["cast"])
    if x_ty.dtype != _STATS:  # the whole norm in 16 bits: TOPI's, in fp32 rounded once, is closer
        if cast is not None or w_ty.dtype != x_ty.dtype or _tensor(normalized) is None \
                or _tensor(normalized).dtype != x_ty.dtype:
            return orig
        new = relax.op.nn.rms_norm(x, weight, axes=[-1], epsilon=eps)
        return new if _same_type(relax.TensorType(x_ty.shape, w_ty.dtype), orig.ty) else orig
    out_dtype = str(cast.attrs.dtype) if cast is not None else _STATS
    if out_dtype not in _OUT_TYPES or w_ty.dtype != out_dtype or _tensor(normalized) is None \
            or _tensor(normalized).dtype != _STATS:
        return orig
    data = x
    while is_op_call(data, "relax.astype") and _tensor(data.args[0]) is not None \
            and _tensor(data.args[0]).dtype == _STATS:  # a cast of fp32 to fp32 does nothing
        data = data.args[0]
    if out_dtype == _STATS:  # no rounding between the norm and the weight: TOPI's own form
        new = relax.op.nn.rms_norm(data, weight, axes=[-1], epsilon=eps)
    elif not isinstance(width, tvm.tirx.IntImm):  # the ones need a constant width
        return orig
    else:  # rounded to out_dtype before the weight: a norm of unit weight, then the weight
        source = data.args[0] if is_op_call(data, "relax.astype") else None
        if source is not None and _tensor(source) is not None and _tensor(source).dtype == out_dtype:
            # TOPI widens a 16-bit row to fp32 itself and rounds its result to the row's type
            norm = relax.op.nn.rms_norm(source, _ones(width, out_dtype), axes=[-1], epsilon=eps)
        else:
            norm = relax.op.astype(relax.op.nn.rms_norm(data, _ones(width, _STATS), axes=[-1], epsilon=eps),
                                   out_dtype)
        new = relax.op.multiply(norm, weight)
    # The result has x's shape and the weight's type: the matched expression's, or no rewrite.
    return new if _same_type(relax.TensorType(x_ty.shape, w_ty.dtype), orig.ty) else orig


def _over_last_axis(reduction: relax.Call, ndim: int) -> bool:
    """Whether ``reduction`` (a mean, max or sum) is over the last axis of ``ndim``, dimensions
    kept."""
    axes = [int(a) for a in reduction.attrs.axis] if reduction.attrs.axis is not None else None
    return bool(reduction.attrs.keepdims) and axes in ([-1], [ndim - 1])


def _mean_over_last_axis(mean: relax.Call, total: relax.Call | None, ndim: int, width) -> bool:
    """Whether ``mean`` (``mean(square)``, or ``total / c`` or ``total * c`` of ``total =
    sum(square)``) is the mean over the last axis of ``ndim``, dimensions kept: ``c`` the width
    (or its reciprocal, to fp32's precision) where it is a sum."""
    if is_op_call(mean, "relax.mean"):
        return _over_last_axis(mean, ndim)
    c = scalar_value(mean.args[1])
    if total is None or c is None or not isinstance(width, tvm.tirx.IntImm):
        return False
    want = int(width) if is_op_call(mean, "relax.divide") else 1.0 / int(width)
    return abs(c - want) <= want * 2.0 ** -23 and _over_last_axis(total, ndim)


def _ones(width, dtype: str) -> relax.Expr:
    """A constant ``[width]`` tensor of ones."""
    return relax.const(np.ones(int(width), dtype=dtype), dtype)


def rewrite_rms_norms(func: relax.Function) -> relax.Function:
    """``func`` with every decomposed RMSNorm (:func:`rms_norm_pattern`) that TOPI's
    ``rms_norm`` computes the same way as ``R.nn.rms_norm`` (see the module docstring); ``func``
    itself where none matches."""
    root, parts = rms_norm_pattern()
    return _rewrite(root, lambda orig, m: _rms_norm_replacement(orig, m, parts), func)


def _rewrite(pattern, rewriter, func: relax.Function) -> relax.Function:
    """``rewrite_call`` of ``pattern``, returning ``func`` itself (not a rebuilt copy) where
    ``rewriter`` returned every match unchanged."""
    changed = []

    def rewrite(orig, matches):
        new = rewriter(orig, matches)
        if not new.same_as(orig):
            changed.append(orig)
        return new

    new = rewrite_call(pattern, rewrite, func)
    return new if changed else func


def softmax_patterns() -> dict:
    """The softmax and log-softmax over a row spelled out, ``exp(x - max(x)) / sum(exp(x -
    max(x)))`` and ``(x - max(x)) - log(sum(exp(x - max(x))))``: {name: (root, parts)} (parts:
    ``x``, ``max``, ``sum``), as TOPI's ``softmax`` and ``log_softmax`` compute them."""
    x = wildcard()
    row_max = is_op("relax.max")(x)
    shifted = is_op("relax.subtract")(x, row_max)
    exp = is_op("relax.exp")(shifted)
    total = is_op("relax.sum")(exp)
    softmax = is_op("relax.divide")(exp, total)
    log_softmax = is_op("relax.subtract")(shifted, is_op("relax.log")(total))
    parts = {"x": x, "max": row_max, "sum": total}
    return {"softmax": (softmax, parts), "log_softmax": (log_softmax, parts)}


def rewrite_softmaxes(func: relax.Function) -> relax.Function:
    """``func`` with every spelled-out softmax and log-softmax over the last axis
    (:func:`softmax_patterns`) as ``R.nn.softmax`` / ``R.nn.log_softmax`` (legalized to the same
    arithmetic, one function the row norm family takes); ``func`` itself where none matches."""
    operators = {"softmax": relax.op.nn.softmax, "log_softmax": relax.op.nn.log_softmax}
    for name, (root, parts) in softmax_patterns().items():
        def replacement(orig, m, parts=parts, operator=operators[name]):
            x_ty = _tensor(m[parts["x"]])
            if x_ty is None or x_ty.ndim < 1 or x_ty.dtype not in _OUT_TYPES or not all(
                    _over_last_axis(m[parts[r]], x_ty.ndim) for r in ("max", "sum")):
                return orig
            return operator(m[parts["x"]], axis=-1)
        func = _rewrite(root, replacement, func)
    return func


def rewrite_row_max_values(func: relax.Function) -> relax.Function:
    """``func`` with the values of every largest-1 ``topk`` as a ``max`` over that axis kept
    (torch's ``x.max(dim, keepdim=True).values`` imports as ``topk``: a softmax written with it
    is then :func:`softmax_patterns`' form); ``func`` itself where none matches. The indices,
    where something reads them, still come from the ``topk``."""
    x = wildcard()
    top = is_op("relax.topk")(x)
    root = is_tuple_get_item(top, 0)

    def replacement(orig, m):
        attrs = m[top].attrs
        if int(attrs.k) != 1 or not bool(attrs.largest):
            return orig
        return relax.op.max(m[x], axis=[int(attrs.axis)], keepdims=True)
    return _rewrite(root, replacement, func)


def rewrite_silus(func: relax.Function) -> relax.Function:
    """``func`` with every ``x * sigmoid(x)`` (torch's decomposition of ``silu``) as
    ``R.nn.silu(x)``, which TOPI legalizes to that product in ``x``'s type (so the gated GEMM
    rewrite, :mod:`tvm_dsm.relax_gated`, sees a gate); ``func`` itself where none matches."""
    x = wildcard()
    root = is_op("relax.multiply")(x, is_op("relax.sigmoid")(x))  # the matcher takes either operand order
    return _rewrite(root, lambda orig, m: relax.op.nn.silu(m[x]), func)


def _permutation(call: relax.Call, ndim: int) -> list[int]:
    """The axes of a ``permute_dims`` (all of them reversed where it names none)."""
    return list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def _permuted(x: relax.Expr, perm: list[int]) -> relax.Expr:
    """``permute_dims(x, perm)``, or ``x`` where ``perm`` keeps every axis in place."""
    return x if perm == sorted(perm) else relax.op.permute_dims(x, perm)


def rewrite_permutes(func: relax.Function, where=None) -> relax.Function:
    """``func`` with every transpose of a transpose as one transpose, or none where they undo
    each other (torch's ``transpose(1, 2)`` into ``[batch, heads, tokens, dim]`` and the
    attention operator's own layout back, :mod:`tvm_dsm.relax_torch`): a copy kernel fewer each;
    only those for which ``where(source, composed permutation)`` holds, where given; ``func``
    itself where none matches."""
    x = wildcard()
    inner = is_op("relax.permute_dims")(x)
    root = is_op("relax.permute_dims")(inner)

    def replacement(orig, m):
        ndim = _tensor(m[x]).ndim if _tensor(m[x]) is not None else -1
        first, second = (_permutation(c, ndim) for c in (m[inner], orig))
        composed = [first[a] for a in second]
        return orig if where is not None and not where(m[x], composed) else _permuted(m[x], composed)
    return _rewrite(root, replacement, func)


def _last_two_swapped(ndim: int) -> list[int]:
    """The permutation of ``ndim`` axes that swaps the last two: the transpose of a matrix
    product's operand (``k.transpose(-1, -2)``)."""
    return [*range(ndim - 2), ndim - 1, ndim - 2]


def rewrite_transposed_operands(func: relax.Function) -> relax.Function:
    """``func`` with each matrix product's operand permuted so that its last two axes swap
    (``k.permute(0, 2, 3, 1)``, as GPT-2's attention writes ``k^T`` of ``[batch, tokens, heads,
    dim]``, or BERT's two permutes once :func:`rewrite_permutes` composed them) as that swap of a
    permutation keeping them in order: the product reads the swap in
    place (``FuseTransposeMatmul``), the rest is the layout change q and v get, and attention is
    the ``q @ k^T`` the attention family takes, not a product of a transposed copy; ``func``
    itself where none matches."""
    operands = [is_op("relax.permute_dims")(wildcard()) for _ in range(2)]
    root = is_op("relax.matmul")(*(operand | wildcard() for operand in operands))

    def split(permute: relax.Call) -> relax.Expr | None:
        ty = _tensor(permute.args[0])
        perm = _permutation(permute, ty.ndim) if ty is not None else []
        if len(perm) < 2 or perm[-1] > perm[-2] or perm == _last_two_swapped(len(perm)):
            return None
        inner = [*perm[:-2], perm[-1], perm[-2]]
        return relax.op.permute_dims(_permuted(permute.args[0], inner), _last_two_swapped(len(perm)))

    def replacement(orig, m):
        split_args = [split(m[operand]) if operand in m else None for operand in operands]
        if split_args == [None, None]:
            return orig
        return relax.Call(orig.op, [new if new is not None else arg for new, arg in zip(split_args, orig.args)],
                          orig.attrs)
    return _rewrite(root, replacement, func)


def _is_unit(extent) -> bool:
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == 1


def _non_unit(shape) -> list:
    """The extents of ``shape`` other than the constant 1s."""
    return [d for d in shape.values if not _is_unit(d)]


def _same_extents(a, b) -> bool:
    analyzer = Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


def _keeps_order(permute: relax.Call) -> bool:
    """Whether ``permute`` moves only axes of extent 1: the elements stay in their order (a view)."""
    ty = _tensor(permute.args[0])
    if ty is None:
        return False
    moved = [a for a in _permutation(permute, ty.ndim) if not _is_unit(ty.shape.values[a])]
    return moved == sorted(moved)


def _reshaped(x: relax.Expr, extents: list, shape) -> relax.Expr:
    """``reshape(x, shape)``, or ``x`` where its ``extents`` are that shape already."""
    return x if _same_extents(extents, list(shape)) else relax.op.reshape(x, list(shape))


def rewrite_unit_axis_views(func: relax.Function) -> relax.Function:
    """``func`` with the views torch's ``einsum`` decomposition writes around its products
    (``expand_dims`` of a unit axis, transposes that move it, reshapes back) as the views they
    are: a reshape of a view (a reshape, ``expand_dims``, ``squeeze``, or a transpose of unit axes
    alone) as one reshape of its source, none where the shapes match; two transposes that undo
    each other as none, of an ``expand_dims`` as one; a transpose of a tensor with unit axes
    inserted by ``expand_dims`` as the transpose of the tensor itself, then its reshape (Stable
    Diffusion's ``einsum('b i d, b j d -> b i j', q, k)``: ``k``'s transpose). The
    elements and their order are the same; :func:`attention_pattern` then reads the products;
    ``func`` itself where none matches."""
    y = wildcard()
    view = (is_op("relax.reshape")(y, wildcard()) | is_op("relax.expand_dims")(y) | is_op("relax.squeeze")(y)
            | is_op("relax.permute_dims")(y))
    of_view = is_op("relax.reshape")(view, wildcard())

    def one_reshape(orig, m):
        if is_op_call(m[view], "relax.permute_dims") and not _keeps_order(m[view]):
            return orig
        source = _tensor(m[y])
        return orig if source is None else _reshaped(m[y], list(source.shape.values), orig.args[1].values)

    # expand_dims alone: a reshape that inserts a unit axis is also torch's view of a batch of one
    # (``[B * H, ..]`` back to ``[1, H, ..]``), which the viewed products' patterns read
    unit_view = is_op("relax.expand_dims")(y)
    permuted = is_op("relax.permute_dims")(unit_view)

    def permute_first(orig, m):
        source, inner, out = _tensor(m[y]), _tensor(m[unit_view]), _tensor(orig)
        if None in (source, inner, out) or _keeps_order(orig) \
                or not _same_extents(_non_unit(source.shape), _non_unit(inner.shape)):
            return orig
        # the source's axes of extent other than 1, in the order the transpose puts the view's
        kept = [n for n, d in enumerate(source.shape.values) if not _is_unit(d)]
        inner_kept = [n for n, d in enumerate(inner.shape.values) if not _is_unit(d)]
        order = [kept[inner_kept.index(a)] for a in _permutation(orig, inner.ndim) if a in inner_kept]
        units = [n for n, d in enumerate(source.shape.values) if _is_unit(d)]
        perm = order[:]
        for n in units:  # the source's own unit axes stay where they are
            perm.insert(n, n)
        return _reshaped(_permuted(m[y], perm), [source.shape.values[a] for a in perm], out.shape.values)

    def undone_or_expanded(source, composed) -> bool:
        # the attention pattern reads other chains of transposes as they are: BERT's k,
        # transposed into heads, then its last two axes swapped
        return composed == sorted(composed) or is_op_call(source, "relax.expand_dims")

    for _ in range(8):  # each pass shortens every chain of views by one
        new = _rewrite(of_view, one_reshape, _rewrite(permuted, permute_first,
                                                      rewrite_permutes(func, undone_or_expanded)))
        if new.same_as(func):
            break
        func = new
    return func


def rewrite_slices_before_permutes(func: relax.Function) -> relax.Function:
    """``func`` with every slice and squeeze of a transpose taken before it: ``strided_slice(
    permute_dims(x, p), axes)`` as ``permute_dims(strided_slice(x, p[axes]), p)``, and
    ``squeeze(permute_dims(x, p), axes)`` as a squeeze of ``x`` then the rest of ``p``. A packed
    QKV projection unbound after its transpose (timm's ViT: ``qkv.reshape(B, N, 3, H,
    D).permute(2, 0, 3, 1, 4).unbind(0)``) then slices the projection where it lies, in 16-byte
    vectors, and its transpose meets the attention's own and cancels (:func:`rewrite_permutes`):
    the whole-tensor transpose kernel is gone; ``func`` itself where none matches."""
    x = wildcard()
    permuted = is_op("relax.permute_dims")(x)
    sliced = is_op("relax.strided_slice")(permuted, varg_default_wildcard=True)
    squeezed = is_op("relax.squeeze")(permuted)

    def slice_first(orig, m):
        ty = _tensor(m[x])
        if ty is None or not isinstance(orig.args[1], relax.Tuple):
            return orig
        perm = _permutation(m[permuted], ty.ndim)
        axes = [perm[int(a) % ty.ndim] for a in orig.args[1].fields]
        inner = relax.op.strided_slice(m[x], axes, *orig.args[2:], assume_inbound=orig.attrs.assume_inbound)
        return _permuted(inner, perm)

    def squeeze_first(orig, m):
        ty = _tensor(m[x])
        if ty is None or orig.attrs.axis is None:
            return orig
        perm = _permutation(m[permuted], ty.ndim)
        gone = {perm[int(a) % ty.ndim] for a in orig.attrs.axis}
        kept = [a for a in perm if a not in gone]
        renumbered = [sorted(kept).index(a) for a in kept]
        return _permuted(relax.op.squeeze(m[x], sorted(gone)), renumbered)

    return _rewrite(squeezed, squeeze_first, _rewrite(sliced, slice_first, func))


def rewrite_batched_views(func: relax.Function) -> relax.Function:
    """``func`` with every product of 4-D tensors through ``[batch * heads, ..]`` views (torch's
    ``bmm`` of ``matmul`` over ``[batch, heads, m, k]``: ``reshape(broadcast_to(a))`` of each
    operand, the product (cast perhaps) viewed back to ``[batch, heads, m, n]``) as Relax's 4-D
    ``matmul``, which broadcasts the batch axes itself: the views' copies are gone, and
    attention spelled out with operators between its scores and softmax that
    :func:`attention_pattern` does not name (Gemma-2's tanh soft cap) reaches
    :class:`tvm_dsm.relax_attention.FuseAttention` as one index space; ``func`` itself where
    none matches."""
    a, b = wildcard(), wildcard()

    def view(x):
        return is_op("relax.reshape")(is_op("relax.broadcast_to")(x, wildcard()), wildcard())

    product = is_op("relax.matmul")(view(a), view(b))
    cast = is_op("relax.astype")(product)
    root = is_op("relax.reshape")(cast | product, wildcard())

    def replacement(orig, m):
        tys = [_tensor(e) for e in (m[a], m[b], orig, m[product])]
        if any(t is None for t in tys) or [t.ndim for t in (tys[0], tys[1], tys[3])] != [4, 4, 3]:
            return orig
        (a_ty, b_ty, out_ty, product_ty), analyzer = tys, Analyzer()
        # the batch axes: each operand's, or 1 where the other's is broadcast to it
        lead = [d if not analyzer.can_prove_equal(d, 1) else e for d, e in zip(a_ty.shape.values[:2],
                                                                              b_ty.shape.values[:2])]
        for ty in (a_ty, b_ty):
            if not all(analyzer.can_prove_equal(d, o) or analyzer.can_prove_equal(d, 1)
                       for d, o in zip(ty.shape.values[:2], lead)):
                return orig
        rows, columns = a_ty.shape.values[2], b_ty.shape.values[3]
        if not (analyzer.can_prove_equal(product_ty.shape.values[0], lead[0] * lead[1])
                and analyzer.can_prove_equal(product_ty.shape.values[1], rows)
                and analyzer.can_prove_equal(product_ty.shape.values[2], columns)):
            return orig
        out = relax.op.matmul(m[a], m[b], out_dtype=m[product].attrs.out_dtype)
        out = relax.op.astype(out, m[cast].attrs.dtype) if cast in m else out
        shape = out_ty.shape.values
        if len(shape) == 4 and all(analyzer.can_prove_equal(x, y) for x, y in zip(shape, (*lead, rows, columns))):
            return out
        # viewed back to another shape of its elements (a later view folded into this one)
        return relax.op.reshape(out, out_ty.shape)
    return _rewrite(root, replacement, func)


def rewrite_broadcast_operands(func: relax.Function) -> relax.Function:
    """``func`` with every ``broadcast_to`` of a product's operand along its batch axes (torch's
    ``matmul`` of a 3-D input by a Linear's weight, which the importer writes as ``bmm`` of both
    operands expanded to the batch: MLP-Mixer's token mixing over a transposed input) dropped
    where Relax's ``matmul``, which broadcasts batch axes itself, gives the same shape without
    it: no copy of the weight for every batch element, and a product of a matrix that the GEMM
    families take with its rows merged; ``func`` itself where none matches."""
    a, b = wildcard(), wildcard()
    root = is_op("relax.matmul")(a, b)

    def unbroadcast(x):
        if not is_op_call(x, "relax.broadcast_to") or _tensor(x.args[0]) is None or _tensor(x) is None:
            return x
        inner, outer = _tensor(x.args[0]).shape.values, _tensor(x).shape.values
        analyzer = Analyzer()  # the matrix axes kept, only batch axes broadcast
        same = len(inner) >= 2 and all(analyzer.can_prove_equal(d, o) for d, o in zip(inner[-2:], outer[-2:]))
        return x.args[0] if same else x

    def same_shape(operands, orig) -> bool:
        """Whether Relax's product of ``operands`` has ``orig``'s shape (its own shape
        inference, on variables of the operands' types)."""
        leaves = [relax.Var("operand", o.ty) for o in operands]
        ty = relax.BlockBuilder().normalize(relax.op.matmul(*leaves)).ty
        out, analyzer = _tensor(orig).shape.values, Analyzer()
        return (ty.shape is not None and len(ty.shape.values) == len(out)
                and all(analyzer.can_prove_equal(p, q) for p, q in zip(ty.shape.values, out)))

    def replacement(orig, m):
        if _tensor(orig) is None:
            return orig
        x, w = m[a], m[b]  # both unbroadcast, else the weight's side, else the input's
        for operands in ((unbroadcast(x), unbroadcast(w)), (x, unbroadcast(w)), (unbroadcast(x), w)):
            if not (operands[0].same_as(x) and operands[1].same_as(w)) and same_shape(operands, orig):
                return relax.op.matmul(*operands, out_dtype=orig.attrs.out_dtype)
        return orig
    return _rewrite(root, replacement, func)


def rewrite_scaled_views(func: relax.Function) -> relax.Function:
    """``func`` with every view of scaled scores (``reshape(cast(x * c))``, ``x`` a product perhaps
    cast: torch's ``baddbmm`` with ``alpha = c`` over ``[batch * heads]`` views, then viewed back,
    as Megatron's and ChatGLM's attention writes it) as the scale and cast of the view
    (``cast(reshape(x) * c)``, the same values: a scalar factor and a cast commute with a view),
    the form in which :func:`attention_pattern` reads a viewed product then its scale; ``func``
    itself where none matches."""
    product = is_op("relax.matmul")(wildcard(), wildcard())
    x = is_op("relax.astype")(product) | product
    scaled = is_op("relax.multiply")(x, is_const()) | is_op("relax.divide")(x, is_const())
    cast = is_op("relax.astype")(scaled)
    root = is_op("relax.reshape")(cast | scaled, wildcard())

    def replacement(orig, m):
        scale = m[scaled]
        if scalar_value(scale.args[1]) is None:
            return orig
        out = relax.Call(scale.op, [relax.op.reshape(m[x], orig.args[1]), scale.args[1]])
        return relax.op.astype(out, m[cast].attrs.dtype) if cast in m else out
    return _rewrite(root, replacement, func)


def rewrite_widened_products(func: relax.Function) -> relax.Function:
    """``func`` with every product of two 16-bit tensors of one type widened to fp32 first
    (``q.float() @ k.float()``, as GPT-BigCode and GPT-J write their scores) as the product of
    the 16-bit tensors accumulated in fp32: the same values (a product of two 16-bit values is
    exact in fp32, the sum is fp32 in both), without the widened copies, and in the form the
    families take (16-bit operands); ``func`` itself where none matches."""
    a, b = wildcard(), wildcard()
    wide_a, wide_b = is_op("relax.astype")(a), is_op("relax.astype")(b)
    root = is_op("relax.matmul")(wide_a, wide_b)

    def replacement(orig, m):
        tys = [_tensor(m[x]) for x in (a, b)]
        if any(t is None or t.dtype not in SIXTEEN_BIT for t in tys) or tys[0].dtype != tys[1].dtype \
                or any(m[w].attrs.dtype != "float32" for w in (wide_a, wide_b)) or _tensor(orig).dtype != "float32":
            return orig
        return relax.op.matmul(m[a], m[b], out_dtype="float32")
    return _rewrite(root, replacement, func)


def rewrite_window_biases(func: relax.Function) -> relax.Function:
    """``func`` with a bias added over the scores' batch viewed as ``[batch / windows, windows,
    ..]`` (Swin's shifted-window mask: ``scores.view(b // w, w, heads, n, n) +
    mask.unsqueeze(1).unsqueeze(0)``, viewed back) as the bias over the scores' own batch (the
    mask repeated for each group of windows), and two biases computed from constants alone added
    one after the other (Swin's relative position bias, then its mask) as their sum added once:
    the form in which :func:`attention_pattern` reads a mask; ``func`` itself where none
    matches."""
    x, bias = wildcard(), wildcard()
    view = is_op("relax.reshape")(x, wildcard())
    grouped = is_op("relax.reshape")(is_op("relax.add")(view, bias), wildcard())

    def ungrouped(orig, m):
        x_ty, view_ty, bias_ty, out_ty = (_tensor(e) for e in (m[x], m[view], m[bias], orig))
        if None in (x_ty, view_ty, bias_ty, out_ty) or x_ty.ndim != 4 or view_ty.ndim != 5 or bias_ty.ndim != 5 \
                or not _same_type(x_ty, out_ty):
            return orig
        (batch, heads, *rows), (groups, windows, *rest) = x_ty.shape.values, view_ty.shape.values
        analyzer = Analyzer()
        if not (analyzer.can_prove_equal(groups * windows, batch) and _same_extents(rest, [heads, *rows])):
            return orig
        lead, heads_of_bias = list(bias_ty.shape.values[:2]), bias_ty.shape.values[2]
        if not all(analyzer.can_prove_equal(b, o) or _is_unit(b) for b, o in zip(lead, (groups, windows))) \
                or not (_is_unit(heads_of_bias) or analyzer.can_prove_equal(heads_of_bias, heads)):
            return orig
        repeated = relax.op.broadcast_to(m[bias], relax.ShapeExpr([groups, windows, heads_of_bias, *rows]))
        return relax.op.add(m[x], relax.op.reshape(repeated, [batch, heads_of_bias, *rows]))

    first, second = wildcard(), wildcard()
    twice = is_op("relax.add")(is_op("relax.add")(x, first), second)

    def summed(orig, m):
        if any(closed(m[b], values) is None for b in (first, second)) or any(
                _tensor(m[b]) is None or _tensor(m[b]).ndim > 4 for b in (first, second)):
            return orig
        return relax.op.add(m[x], relax.op.add(m[first], m[second]))

    func = _rewrite(grouped, ungrouped, func)
    values = relax.analysis.get_var2val(func)  # of the function with the window biases ungrouped
    return _rewrite(twice, summed, func)


def _through(call: relax.Call, bound) -> relax.Expr | None:
    """The scores' operand of an operator between an attention's two products: the operand of a
    cast or softmax, the first of a sum or a scaling by a scalar, the tensor a ``where`` selects
    against a scalar fill (``bound``: a variable's value); None for anything else."""
    name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
    if name in ("relax.astype", "relax.nn.softmax", "relax.add"):
        return call.args[0]
    if name in ("relax.multiply", "relax.divide"):
        return call.args[0] if scalar_value(bound(call.args[1])) is not None else None
    if name == "relax.where":
        return call.args[1] if scalar_value(bound(call.args[2])) is not None else \
            call.args[2] if scalar_value(bound(call.args[1])) is not None else None
    return None


def _folded_scales(ops: list) -> list:
    """``ops`` (the operators between the products, in order) with a scaling by a scalar whose
    result is rounded to 16 bits, widened back to fp32 and scaled again as one scaling: ``(op,
    factor)`` pairs, the factor that of the scalings folded into ``op`` (None for other
    operators). The rounding between them is dropped: no less accurate, and the attention
    kernel keeps its scores in fp32."""
    steps: list = []
    for op in ops:
        factor = scalar_value(op.args[1]) if is_op_call(op, "relax.multiply") else None
        casts = [s for s, _ in steps[-2:]]
        if factor is not None and len(steps) >= 3 and steps[-3][1] is not None \
                and all(is_op_call(c, "relax.astype") for c in casts) \
                and casts[0].attrs.dtype in SIXTEEN_BIT and casts[1].attrs.dtype == "float32" \
                and _tensor(steps[-3][0].args[0]).dtype == "float32":
            first, folded = steps[-3]
            steps[-3:] = [(first, folded * factor)]
            continue
        steps.append((op, factor))
    return steps


def _narrowed(x: relax.Expr, bound) -> relax.Expr:
    """``x``'s 16-bit source where ``x`` widens it to fp32 (a product of the widened values is
    the 16-bit product accumulated in fp32: :func:`rewrite_widened_products`), else ``x``."""
    if is_op_call(x, "relax.astype") and x.attrs.dtype == "float32" and _tensor(x.args[0]) is not None \
            and _tensor(x.args[0]).dtype in SIXTEEN_BIT:
        return bound(x.args[0])
    return x


def rewrite_head_rows(func: relax.Function) -> relax.Function:
    """``func`` with attention whose query rows hold the heads over one KV head (GPT-BigCode's
    multi-query attention: ``q.reshape(b, t * h, d)`` against ``k^T [b, d, keys]``, the scores
    viewed as ``[b, t, h, keys]`` for their scaling, mask and softmax, viewed back for the product
    with ``v [b, keys, d]``) as the same over ``[b, h, t, ..]`` tensors: q viewed as its heads and
    transposed, k and v of one head (a unit axis), each operator between the products taken over
    the transposed scores (a mask transposed with them; a scaling, rounded to 16 bits and widened,
    then scaled again, as one scaling: :func:`_folded_scales`), the output transposed back. The
    values are the same up to that one rounding; :func:`attention_pattern` then reads it as
    multi-query attention (its transposes cancel: q and the output are read in place); ``func``
    itself where none matches."""
    values = relax.analysis.get_var2val(func)

    def bound(e):
        return values.get(e, e) if isinstance(e, relax.Var) else e

    probs, v = wildcard(), wildcard()
    product = is_op("relax.matmul")(is_op("relax.reshape")(probs, wildcard()), v)
    cast = is_op("relax.astype")(product)
    bshd = [0, 2, 1, 3]

    def replacement(orig, m):
        chain, x = [], bound(m[probs])
        while isinstance(x, relax.Call) and not is_op_call(x, "relax.reshape") and _through(x, bound) is not None:
            chain.append(x)
            x = bound(_through(x, bound))
        scores_ty, v_ty = _tensor(x) if is_op_call(x, "relax.reshape") else None, _tensor(m[v])
        scores = bound(x.args[0]) if scores_ty is not None else None
        if not chain or scores_ty is None or scores_ty.ndim != 4 or v_ty is None or v_ty.ndim != 3 \
                or not is_op_call(scores, "relax.matmul"):
            return orig
        b, t, h, keys = scores_ty.shape.values
        q_rows, kt = (_narrowed(bound(a), bound) for a in scores.args)
        q_ty, kt_ty, rows_ty = (_tensor(e) for e in (q_rows.args[0] if is_op_call(q_rows, "relax.reshape") else q_rows,
                                                      kt, q_rows))
        analyzer = Analyzer()
        if not is_op_call(q_rows, "relax.reshape") or None in (q_ty, kt_ty, rows_ty) or kt_ty.ndim != 3 \
                or rows_ty.ndim != 3 or q_ty.dtype not in SIXTEEN_BIT or kt_ty.dtype != q_ty.dtype or not all(
                analyzer.can_prove_equal(a, c) for a, c in zip(rows_ty.shape.values[:2], (b, t * h))):
            return orig
        dim, v_dim = rows_ty.shape.values[2], v_ty.shape.values[2]

        def batched(x, rows, columns):  # torch's bmm of [b, h, ..] tensors, as attention_pattern reads it
            return relax.op.reshape(relax.op.broadcast_to(x, relax.ShapeExpr([b, h, rows, columns])),
                                    [b * h, rows, columns])

        def over_heads(x):  # a mask over [b, t, h, keys] scores (broadcast to them) as one over [b, h, t, keys]
            ty = _tensor(x)
            return relax.op.permute_dims(relax.op.reshape(x, [1] * (4 - ty.ndim) + list(ty.shape.values)), bshd)

        k = kt.args[0] if is_op_call(kt, "relax.permute_dims") and _permutation(kt, 3) == [0, 2, 1] \
            else relax.op.permute_dims(kt, [0, 2, 1])
        q = relax.op.permute_dims(relax.op.reshape(q_rows.args[0], [b, t, h, dim]), bshd)
        kt = relax.op.permute_dims(relax.op.expand_dims(k, 1), [0, 1, 3, 2])
        y = relax.op.reshape(relax.op.matmul(batched(q, t, dim), batched(kt, dim, keys),
                                             out_dtype=str(_tensor(scores).dtype)), [b, h, t, keys])
        chain = [relax.Call(op.op, [bound(a) if scalar_value(bound(a)) is not None else a for a in op.args], op.attrs)
                 for op in chain[::-1]]  # in order, scalars in place of their variables
        for op, factor in _folded_scales(chain):
            through = _through(op, bound)
            masks = [a for a in op.args if not a.same_as(through) and scalar_value(a) is None]
            if any(_tensor(a) is None or _tensor(a).ndim > 4 for a in masks):
                return orig
            if factor is not None:
                y = relax.op.multiply(y, relax.const(factor, str(_tensor(op.args[0]).dtype)))
            elif is_op_call(op, "relax.nn.softmax"):
                if int(op.attrs.axis) not in (-1, 3):
                    return orig
                y = relax.op.nn.softmax(y, axis=-1)
            else:
                y = relax.Call(op.op, [y if a.same_as(through) else over_heads(a) if any(a.same_as(x) for x in masks)
                                       else a for a in op.args], op.attrs)
        out = relax.op.matmul(batched(y, t, keys), batched(relax.op.expand_dims(m[v], 1), keys, v_dim),
                              out_dtype=m[product].attrs.out_dtype)
        if cast in m:
            out = relax.op.astype(out, m[cast].attrs.dtype)
        out = relax.op.reshape(out, [b, h, t, v_dim])
        return relax.op.reshape(relax.op.permute_dims(out, bshd), _tensor(orig).shape)
    return _rewrite(cast | product, replacement, func)


def attention_pattern():
    """Attention spelled out over ``[batch, heads, tokens, dim]`` tensors as torch exports
    ``softmax(q @ k.transpose(-1, -2) / c + mask) @ v``: each product over batched views
    (``reshape(broadcast_to(..))``, torch's ``bmm`` of 4-D tensors), its result perhaps cast and viewed back, the scores scaled
    by a constant (divided or multiplied; before a ``where`` mask or after it) and a mask added,
    either optional. q and k may be
    widened to fp32 before the scores and the probabilities rounded back before the second
    product, as Hugging Face's eager attention writes it (``q.float() @ k.float().transpose(2,
    3)``, ``softmax(.., dtype=float32).to(v.dtype)``). Returns the root and its named parts
    (``q``, ``k``, ``kt``, ``v``, ``scale``, ``scaling``, ``mask``, ``softmax``, and the casts
    ``q_wide``, ``k_wide``, ``kt_wide``, ``rounded``)."""
    def scalar():  # a constant, or ``torch.full([], c)`` (GPT-2's divisor and fill)
        return is_const() | is_op("relax.full")(wildcard(), is_const())

    q, k, v, scale, mask = wildcard(), wildcard(), wildcard(), scalar(), wildcard()
    q_wide, k_wide = is_op("relax.astype")(q), is_op("relax.astype")(k)
    kt = is_op("relax.permute_dims")(k_wide | k)
    kt_wide = is_op("relax.astype")(kt)

    def batched(a):  # torch's bmm of 4-D tensors (Relax's own 4-D matmul is left to FuseAttention)
        return is_op("relax.reshape")(is_op("relax.broadcast_to")(a, wildcard()), wildcard())

    def viewed(product):
        cast = is_op("relax.astype")(product) | product
        return is_op("relax.reshape")(cast, wildcard()) | cast

    # or as GPT-NeoX's baddbmm: [batch * heads, tokens, dim] views, k's transposed after its view
    q_view, k_view = is_op("relax.reshape")(q, wildcard()), is_op("relax.reshape")(k, wildcard())
    q_view_wide, kt_view = is_op("relax.astype")(q_view), is_op("relax.permute_dims")(k_view)
    # or as BLOOM's: k ([batch, tokens, heads, dim]) transposed to [batch, heads, dim, tokens], then viewed
    k_tokens_last = is_op("relax.permute_dims")(k)
    kt_view = kt_view | is_op("relax.reshape")(k_tokens_last, wildcard())
    kt_view_wide = is_op("relax.astype")(kt_view)
    scores = viewed(is_op("relax.matmul")(batched(q_wide | q) | q_view_wide | q_view,
                                          batched(kt_wide | kt) | kt_view_wide | kt_view))
    scaling = is_op("relax.divide")(scores, scale) | is_op("relax.multiply")(scores, scale)
    # MPT's: the scores scaled in 16 bits, widened to fp32 before its ALiBi bias is added
    scaled_wide = is_op("relax.astype")(scaling)
    masked = is_op("relax.add")(scaled_wide | scaling | scores, mask)
    # baddbmm's addend (a zero tensor, ALiBi's bias) added over the batched product, viewed after
    biased = viewed(masked) | masked
    keep, fill = wildcard(), scalar()
    # Megatron's: the scaled scores rounded to the 16-bit type before the mask (kept in fp32 here)
    scaled_rounded = is_op("relax.astype")(scaling)
    kept = is_op("relax.where")(keep, biased | scaled_rounded | scaling | scores, fill)
    selected = kept | is_op("relax.where")(keep, fill, biased | scaled_rounded | scaling | scores)  # masked_fill
    # GPT-J's: the mask selected before the scale, the fill scaled with the scores
    rescaled = is_op("relax.divide")(selected, scale) | is_op("relax.multiply")(selected, scale)
    # OPT's clamp of the masked scores at the type's minimum (the sum overflows to -inf in fp16)
    clamped = is_op("relax.clip")(masked, wildcard(), wildcard())
    logits = rescaled | selected | viewed(clamped) | biased | scaling | scores
    softmax = is_op("relax.nn.softmax")(is_op("relax.astype")(logits) | logits)
    rounded = is_op("relax.astype")(softmax)
    v_view = is_op("relax.reshape")(v, wildcard())
    root = viewed(is_op("relax.matmul")(batched(rounded | softmax) | is_op("relax.reshape")(rounded | softmax, wildcard())
                                        | rounded | softmax,  # the softmax over [batch * heads] views
                                        batched(v) | v_view))
    return root, {"q": q, "k": k, "kt": kt, "v": v, "scale": scale, "scaling": scaling, "rescaled": rescaled,
                  "scaled_wide": scaled_wide, "scaled_rounded": scaled_rounded, "mask": mask,
                  "masked": masked, "clamped": clamped, "selected": selected, "kept": kept, "keep": keep, "fill": fill,
                  "softmax": softmax, "q_wide": q_wide, "k_wide": k_wide, "kt_wide": kt_wide, "rounded": rounded,
                  "q_view": q_view, "k_view": k_view, "kt_view": kt_view, "q_view_wide": q_view_wide,
                  "kt_view_wide": kt_view_wide, "k_tokens_last": k_tokens_last, "v_view": v_view}


def _merges_heads(view: relax.Expr, tensor: relax.Expr, first: int = 0) -> bool:
    """Whether ``view`` reshapes the 4-D ``tensor`` (``[batch, heads, x, y]``) into ``[batch *
    heads, x, y]`` (``first``: the expression is the view's own operand, at this position)."""
    ty, out = _tensor(tensor if not first else view.args[0]), _tensor(view)
    if ty is None or out is None or ty.ndim != 4 or out.ndim != 3:
        return False
    b, h, x, y = ty.shape.values
    analyzer = Analyzer()
    return all(analyzer.can_prove_equal(p, r) for p, r in zip(out.shape.values, (b * h, x, y)))


def _exact_casts(m: dict, parts: dict, dtype: str) -> bool:
    """Whether the matched casts of q and k widen them to fp32 (exact), the scaled scores' cast
    rounds them to ``dtype`` (the kernel keeps them in fp32: no less accurate) and the
    probabilities' cast rounds them to the operands' ``dtype`` (the attention kernel's own
    rounding)."""
    widened = all(m[parts[name]].attrs.dtype == "float32" for name in ("q_wide", "k_wide", "kt_wide", "q_view_wide",
                                                                          "kt_view_wide", "scaled_wide")
                  if parts[name] in m)
    return widened and all(parts[name] not in m or m[parts[name]].attrs.dtype == dtype
                           for name in ("rounded", "scaled_rounded"))


def _attention_replacement(orig: relax.Expr, m: dict, parts: dict, values: dict) -> relax.Expr:
    """``R.nn.attention`` of a match (:func:`attention_pattern`), or ``orig`` where it is not
    16-bit attention over ``[batch, heads, tokens, dim]`` with ``kt`` the transpose of k's last
    two axes, the softmax over the keys, a mask broadcast over the scores and casts that change
    no value (:func:`_exact_casts`)."""
    q, k, v = m[parts["q"]], m[parts["k"]], m[parts["v"]]
    out_ty, q_ty, v_ty = _tensor(orig), _tensor(q), _tensor(v)
    k_heads_first = None  # the permutation taking k to [batch, heads, tokens, dim], where it is not
    if None in (out_ty, q_ty, v_ty) or q_ty.ndim != 4 or q_ty.dtype not in SIXTEEN_BIT:
        return orig
    if parts["kt"] in m:  # k's last two axes swapped
        kt = m[parts["kt"]]
        if kt.attrs.axes is None or [int(a) for a in kt.attrs.axes] != [0, 1, 3, 2]:
            return orig
    elif parts["k_tokens_last"] in m:  # k [batch, tokens, heads, dim] transposed to [.., dim, tokens], viewed
        kt = m[parts["k_tokens_last"]]
        if kt.attrs.axes is None or [int(a) for a in kt.attrs.axes] != [0, 2, 3, 1] \
                or not _merges_heads(m[parts["q_view"]], q) or not _merges_heads(m[parts["kt_view"]], kt, 2):
            return orig
        k_heads_first = [0, 2, 1, 3]  # [batch, heads, tokens, dim], like q
    else:  # [batch * heads, tokens, dim] views, k's swapped after its view
        kt = m[parts["kt_view"]]
        if kt.attrs.axes is None or [int(a) for a in kt.attrs.axes] != [0, 2, 1] \
                or not all(_merges_heads(m[parts[view]], t) for view, t in (("q_view", q), ("k_view", k))):
            return orig
    if parts["v_view"] in m and not _merges_heads(m[parts["v_view"]], v):
        return orig
    if not (_tensor(k) is not None and _tensor(k).dtype == v_ty.dtype == q_ty.dtype == out_ty.dtype
            and out_ty.ndim == 4 and int(m[parts["softmax"]].attrs.axis) in (-1, 3)
            and _exact_casts(m, parts, q_ty.dtype)):
        return orig
    scale = 1.0
    scaling = next((m[parts[name]] for name in ("scaling", "rescaled") if parts[name] in m), None)
    if scaling is not None:
        factor = scalar_value(m[parts["scale"]])
        if factor is None or factor == 0.0 or (parts["rescaled"] in m and (parts["masked"] in m or parts["scaling"] in m)):
            return orig  # an added mask (or the scores twice) scaled: not R.nn.attention's bias and scale
        scale = 1.0 / factor if is_op_call(scaling, "relax.divide") else factor
    bias = None
    if parts["mask"] in m:
        mask, mask_ty = m[parts["mask"]], _tensor(m[parts["mask"]])
        if mask_ty is None or mask_ty.ndim > 4 or mask_ty.dtype not in (*SIXTEEN_BIT, "float32"):
            return orig
        if _tensor(m[parts["masked"]]).ndim == 3:  # added over [batch * heads, queries, keys]
            bias = _unbatched(mask, q_ty)
            if bias is None or mask_ty.dtype == "bool":
                return orig
            bias = _floored(bias, str(mask_ty.dtype), str(q_ty.dtype))
        else:
            bias = attention_bias(mask, q_ty.dtype)
    if parts["clamped"] in m and not _clamps_masked_keys_alone(m[parts["clamped"]], m.get(parts["mask"]), values):
        return orig
    if parts["selected"] in m:  # where(keep, scores, fill) or where(masked, fill, scores)
        keep = m[parts["keep"]]
        fill = scalar_value(m[parts["fill"]])
        if fill is not None and parts["rescaled"] in m:  # selected, then scaled with the scores
            fill *= scale
        if fill is None or fill > MASKED_FILL or _tensor(keep) is None or _tensor(keep).dtype != "bool" \
                or _tensor(keep).ndim > 4:
            return orig
        # which form matched, not which argument is the fill's node: an imported fill is a
        # variable bound to the constant the match names
        where = attention_bias(keep, q_ty.dtype, keep_when=parts["kept"] in m, fill=fill)
        bias = where if bias is None else relax.op.add(bias, where)
    if k_heads_first is not None:
        k = relax.op.permute_dims(k, k_heads_first)
    k, v = (_with_heads_of(q_ty, t, _tensor(m[parts[name]]), heads_first)
            for t, name, heads_first in ((k, "k", k_heads_first), (v, "v", None)))
    if k is None or v is None:
        return orig
    bshd = [0, 2, 1, 3]
    out = relax.op.nn.attention(*(relax.op.permute_dims(t, bshd) for t in (q, k, v)), bias=bias, scale=scale)
    return relax.op.permute_dims(out, bshd)


def _with_heads_of(q_ty: relax.TensorType, x: relax.Expr, ty: relax.TensorType, heads_first: list | None):
    """``x`` (k or v as ``[batch, heads, tokens, dim]``; ``ty`` its type before ``heads_first``,
    the permutation that took it there, where one did) with q's batch and heads: as it is, or
    broadcast where the product broadcasts one KV head or batch over q's (multi-query attention
    written as ``matmul(q, k.transpose(-1, -2))`` with ``k [batch, 1, tokens, dim]``, Falcon's),
    a copy ``R.nn.attention`` needs and :mod:`tvm_dsm.relax_packed_attention` reads in place;
    None where an extent is neither q's nor 1."""
    dims = list(ty.shape.values)
    if heads_first is not None:
        dims = [dims[a] for a in heads_first]
    analyzer = Analyzer()
    lead = list(q_ty.shape.values[:2])
    if all(analyzer.can_prove_equal(a, b) for a, b in zip(lead, dims[:2])):
        return x
    if not all(analyzer.can_prove_equal(a, b) or analyzer.can_prove_equal(b, 1) for a, b in zip(lead, dims[:2])):
        return None
    return relax.op.broadcast_to(x, relax.ShapeExpr(lead + dims[2:]))


def _clamps_masked_keys_alone(clip: relax.Call, mask: relax.Expr | None, values: dict) -> bool:
    """Whether ``clip`` (of the scores plus ``mask``) raises nothing but masked scores and leaves
    no row without a kept key, so the softmax after it is the softmax without it: its lower
    bound masks (at most :data:`~tvm_dsm.relax_attention_masks.MASKED_FILL`, and no upper bound
    below fp16's largest value), and ``mask`` is computed from constants alone and keeps a key (0) in every query's row. The
    attention kernel computes the scores in fp32, where the sum the clamp guards does not
    overflow."""
    low, high = (scalar_value(a) for a in clip.args[1:])
    if mask is None or low is None or high is None or low > MASKED_FILL or high < 65504.0:
        return False
    value = constant_mask(mask, values)
    return value is not None and value.ndim >= 2 and bool(np.all(np.any(value == 0, axis=-1))) \
        and bool(np.all((value == 0) | (value <= MASKED_FILL)))


def _unbatched(mask: relax.Expr, q_ty: relax.TensorType) -> relax.Expr | None:
    """A bias added over ``[batch * heads, queries, keys]`` products (baddbmm's addend, as BLOOM
    adds ALiBi) viewed over ``[batch, heads, queries, keys]``, or None where its leading axis is
    neither that product nor 1."""
    ty = _tensor(mask)
    batch, heads = q_ty.shape.values[:2]
    if ty.ndim != 3:
        return relax.op.reshape(mask, [1] * (4 - ty.ndim) + list(ty.shape.values)) if ty.ndim < 3 else None
    lead, rest = ty.shape.values[0], list(ty.shape.values[1:])
    analyzer = Analyzer()
    if analyzer.can_prove_equal(lead, 1):
        return relax.op.reshape(mask, [1, 1, *rest])
    if analyzer.can_prove_equal(lead, batch * heads):
        return relax.op.reshape(mask, [batch, heads, *rest])
    return None


#: The most negative value a bias of each type holds where it masks a key: in 16 bits half of
#: fp16's range, so a 16-bit score added to it stays finite (fp16's lowest, -65504, plus -20
#: rounds to -inf) while its exponent still underflows (below
#: :data:`~tvm_dsm.relax_attention_masks.MASKED_FILL`).
_MASK_FLOOR = {"float16": -32768.0, "bfloat16": -32768.0, "float32": -3.4028234663852886e38}


def attention_bias(mask: relax.Expr, dtype: str, keep_when: bool = True, fill: float = -math.inf) -> relax.Expr:
    """A mask over attention scores (up to four dimensions, broadcast over them) as
    ``R.nn.attention``'s bias: four dimensions (leading ones added), in the scores' ``dtype``;
    a bool mask as 0 where it is ``keep_when`` (the key takes part), else ``fill`` raised to
    :data:`_MASK_FLOOR`, and a wider float mask raised to it too (a query whose every key it
    masks then weighs its keys by finite scores, as a model's finite fill does, instead of
    dividing 0 by 0)."""
    ty, dtype = mask.ty, str(dtype)
    if ty.ndim < 4:
        mask = relax.op.reshape(mask, [1] * (4 - ty.ndim) + list(ty.shape.values))
    if ty.dtype == "bool":
        kept, masked = relax.const(0.0, dtype), relax.const(max(fill, _MASK_FLOOR.get(dtype, -math.inf)), dtype)
        return relax.op.where(mask, *((kept, masked) if keep_when else (masked, kept)))
    return _floored(mask, str(ty.dtype), dtype)


def _floored(mask: relax.Expr, from_dtype: str, dtype: str) -> relax.Expr:
    """A float ``mask`` of ``from_dtype`` in ``dtype``, raised to :data:`_MASK_FLOOR` where it
    changes type (fp32's minimum would round to -inf in 16 bits)."""
    if from_dtype == dtype:
        return mask
    if dtype in _MASK_FLOOR:
        mask = relax.op.clip(mask, _MASK_FLOOR[dtype], math.inf)
    return relax.op.astype(mask, dtype)


def rewrite_attentions(func: relax.Function) -> relax.Function:
    """``func`` with every 16-bit attention spelled out (:func:`attention_pattern`) as
    ``R.nn.attention``, which the attention family takes: the scores and softmax in fp32
    there, only the probabilities rounded for the second product (the spelled-out graph
    rounds the scores, the scaled scores and the probabilities to 16 bits); ``func`` itself
    where none matches."""
    root, parts = attention_pattern()
    values = relax.analysis.get_var2val(func)
    return _rewrite(root, lambda orig, m: _attention_replacement(orig, m, parts, values), func)


#: The rewrites :data:`RewriteToRelaxOps` applies, in order.
REWRITES = (rewrite_rms_norms, rewrite_row_max_values, rewrite_softmaxes, rewrite_silus, rewrite_unit_axis_views,
            rewrite_scaled_views, rewrite_head_rows, rewrite_window_biases, rewrite_attentions, rewrite_batched_views,
            rewrite_broadcast_operands, rewrite_widened_products, rewrite_slices_before_permutes,
            rewrite_permutes,  # attention matches k's transpose alone; its own layout cancels torch's
            rewrite_transposed_operands)


def _rewritten(mod: tvm.IRModule, rewrites) -> tvm.IRModule:
    """Every Relax function of ``mod`` with ``rewrites`` applied in order; ``mod`` itself where
    nothing matched."""
    def rewrite(func: relax.Function) -> relax.Function:
        for each in rewrites:
            func = each(func)
        return func
    return map_functions(mod, rewrite)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.RewriteToRelaxOps")
def RewriteToRelaxOps(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every Relax function of ``mod`` with :data:`REWRITES` applied; ``mod`` itself where
    nothing matched."""
    return _rewritten(mod, REWRITES)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.RowMaxValues")
def RowMaxValues(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`rewrite_row_max_values` alone, for pipelines that dispatch ``R.topk`` to a library
    before :data:`RewriteToRelaxOps` runs (TVM's CUDA pipeline: its sort kernels)."""
    return _rewritten(mod, (rewrite_row_max_values,))
