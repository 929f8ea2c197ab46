"""Attention masks a model computes from constants, read for what they are.

A traced model passes its causal mask as a tensor: Hugging Face's decoders build it from
``arange`` comparisons or ``triu`` of a ``full`` of the type's minimum, Mistral's sliding window
from ``arange`` too, and ``R.nn.attention`` then adds it to every score (the attention kernel
reads it for every key and computes every key tile). Such a mask depends on no input of the
model: :class:`AttentionMasksFromConstants` evaluates it on the host (Relax's own legalization,
built for LLVM) and, where it keeps exactly the keys of a causal mask, gives the attention the
causal flag instead (the kernel skips the tiles past the diagonal); where it keeps a causal band
of the ``window`` newest keys (a sliding window shorter than the sequence), the attention
becomes a TIR function that writes the band as an index condition, which the attention family
reads as a mask of the scores (:class:`tvm_dsm.kernels.attention_pattern.ScoreTerms`: the tiles
past the diagonal skipped, the window computed per key); TVM cannot legalize
``R.nn.attention(window_size=)``. A bias that is ALiBi (``slope[h] * key`` plus a constant per
query, as BLOOM adds it) over a causal band becomes such a function too, with the slopes its
input and ALiBi computed per key, instead of a ``[heads, tokens, tokens]`` tensor written once
and read for every score. A mask of zeros (BERT's, called without one) is dropped. A mask of
one row is every query's. Any other mask stays the bias it was. Each mask is evaluated
once a function (the layers of a model share it): a Mistral-7B layer of 8192 tokens, its [8192,
8192] mask evaluated, exported and planned in 14 s with 2.3 GB at most on a 2-core host; larger
masks (:data:`MAX_MASK_ELEMENTS`) and masks of symbolic extents stay biases.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .relax_constants import closed, elements, evaluate, floating, static

#: A mask's value at or below this masks its key: the fills models use (-inf, the 16- and 32-bit
#: types' minimum) lie below it, and exp of a score shifted by it underflows to 0 in fp32 for
#: any score a 16-bit model's product yields.
MASKED_FILL = -3.0e4
#: The most elements of a mask evaluated on the host (an [8192, 8192] mask).
MAX_MASK_ELEMENTS = 1 << 26
#: The fill of a masked score in the windowed attention function: fp32's lowest value, whose
#: exponent underflows beside any kept key.
_LOWEST = -3.4028234663852886e38
_ATTENTION_BIAS = "relax.nn.attention_bias"


def constant_mask(expr: relax.Expr, values: dict) -> np.ndarray | None:
    """The value of ``expr`` (a constant, or a variable or call over ``values``, a function's
    bindings) where it is computed from constants alone, of static shape and at most
    :data:`MAX_MASK_ELEMENTS` elements, evaluated on the host; else None."""
    if isinstance(expr, tvm.ir.Constant) and hasattr(expr.value, "numpy"):
        return expr.value.numpy()
    bindings = closed(expr, values) if isinstance(expr, (relax.Var, relax.Call)) else None
    ty = expr.ty
    small = static(ty) and elements(ty) <= MAX_MASK_ELEMENTS
    return evaluate([expr], bindings)[0] if bindings is not None and small else None


def causal_band(mask: np.ndarray) -> tuple[str, int | None] | None:
    """``(alignment, window)`` where ``mask`` (an additive bias over ``[.., queries, keys]``,
    the same in every leading slice) keeps (0) exactly the keys of a causal mask of that
    alignment (``"TopLeft"``: key ``j`` of query ``i`` where ``j <= i``; ``"BottomRight"``:
    ``j <= i + keys - queries``) within the ``window`` newest of them (None: all of them) and
    masks the others (at most :data:`MASKED_FILL`); else None."""
    if mask.ndim < 2 or not floating(mask):
        return None
    kept, masked = mask == 0, mask <= MASKED_FILL
    if not np.all(kept | masked):
        return None
    queries, keys = mask.shape[-2:]
    rows = kept.reshape(-1, queries, keys)
    if not all(np.array_equal(rows[0], r) for r in rows[1:]):
        return None
    kept = rows[0]
    for alignment, shift in (("TopLeft", 0), ("BottomRight", keys - queries)):
        causal = np.tri(queries, keys, shift, dtype=bool)
        if not np.any(causal) or np.any(kept & ~causal):
            continue
        window = int(kept.sum(axis=1).max())
        if np.array_equal(kept, causal & ~np.tri(queries, keys, shift - window, dtype=bool)):
            return alignment, None if np.array_equal(kept, causal) else window
    return None


def alibi_slopes(bias: np.ndarray, heads: int) -> np.ndarray | None:
    """Per-head slopes ``s`` where ``bias`` (``[batch or 1, heads or 1, queries, keys]``, the
    same in every batch slice) is ``s[h] * j`` plus a constant per query row (the softmax
    ignores it: ``-s[h] * (i - j)`` is ALiBi too) on the keys it keeps (above
    :data:`MASKED_FILL`), within the rounding of its own type (a model that builds ALiBi in fp16
    rounds ``s[h] * j``; the slopes, read from the smallest keys, are exact); else None."""
    if bias.ndim != 4 or bias.shape[1] not in (1, heads) or not floating(bias):
        return None
    if not all(np.array_equal(bias[0], b) for b in bias[1:]):
        return None
    values = bias[0].astype(np.float64)
    kept = values > MASKED_FILL
    keys = np.arange(values.shape[-1])
    slopes = []
    for head, kept_head in zip(values, kept):
        last = np.flatnonzero(kept_head[-1])
        if len(last) < 2:
            return None
        slope = (head[-1, last[1]] - head[-1, last[0]]) / (last[1] - last[0])
        rows = np.where(kept_head, head - slope * keys, np.nan)
        first = rows[np.arange(len(rows)), kept_head.argmax(axis=1)][:, None]
        tolerance = np.finfo(bias.dtype).eps * np.abs(np.where(kept_head, head, 0)).max()
        if not np.all(np.where(kept_head, np.abs(rows - first) <= tolerance, True)):
            return None
        slopes.append(slope)
    return np.broadcast_to(np.array(slopes, "float32"), (heads,)).copy()


def band_attention(q_ty: relax.TensorType, k_ty: relax.TensorType, v_ty: relax.TensorType, scale: float,
                   shift: int, window: int | None, alibi: bool) -> tirx.PrimFunc:
    """Attention over ``[batch, tokens, heads, dim]`` operands (``R.nn.attention``'s layout; k
    and v may have fewer heads, each shared by a group of q's) in which query ``i`` sees the keys
    ``i + shift - window < j <= i + shift`` (``window`` None: every key up to ``i + shift``),
    the scores scaled by ``scale``, with ``alibi`` ALiBi's ``slopes[h] * (j - i)`` added (the
    function's fourth parameter, fp32 ``[heads]``), and the softmax in fp32, as a TIR function
    (q, k, v[, slopes], out)."""
    batch, queries, heads, dim = (int(x) for x in q_ty.shape.values)
    _, keys, kv_heads, _ = (int(x) for x in k_ty.shape.values)
    dim_v = int(v_ty.shape.values[-1])
    group = heads // kv_heads
    q = te.placeholder(q_ty.shape.values, q_ty.dtype, name="q")
    k = te.placeholder(k_ty.shape.values, k_ty.dtype, name="k")
    v = te.placeholder(v_ty.shape.values, v_ty.dtype, name="v")
    slopes = te.placeholder((heads,), "float32", name="slopes") if alibi else None
    d = te.reduce_axis((0, dim), "d")
    raw = te.compute((batch, heads, queries, keys), lambda b, h, i, j: te.sum(
        q[b, i, h, d].astype("float32") * k[b, j, h // group, d].astype("float32"), axis=d), name="scores")

    def logit(b, h, i, j):
        value = raw[b, h, i, j] * tirx.const(scale, "float32")
        if alibi:
            value = value + slopes[h] * (j - i).astype("float32")
        inside = j <= i + shift if window is None else tirx.all(j <= i + shift, j > i + shift - window)
        return te.if_then_else(inside, value, tirx.const(_LOWEST, "float32"))

    logits = te.compute(raw.shape, logit, name="logits")
    t1, t2, t3 = (te.reduce_axis((0, keys), n) for n in ("t1", "t2", "t3"))
    top = te.compute(raw.shape[:3], lambda b, h, i: te.max(logits[b, h, i, t1], axis=t1), name="row_max")
    weights = te.compute(raw.shape, lambda b, h, i, j: te.exp(logits[b, h, i, j] - top[b, h, i]), name="weights")
    total = te.compute(raw.shape[:3], lambda b, h, i: te.sum(weights[b, h, i, t2], axis=t2), name="row_sum")
    summed = te.compute((batch, heads, queries, dim_v), lambda b, h, i, c: te.sum(
        weights[b, h, i, t3] * v[b, t3, h // group, c].astype("float32"), axis=t3), name="weighted")
    out = te.compute((batch, queries, heads, dim_v), lambda b, i, h, c: (
        summed[b, h, i, c] / total[b, h, i]).astype(q_ty.dtype), name="out")
    return te.create_prim_func([q, k, v, *([slopes] if alibi else []), out]).without_attr("global_symbol")


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.AttentionMasksFromConstants")
def AttentionMasksFromConstants(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every ``R.nn.attention`` of ``mod``'s Relax functions whose bias is computed from
    constants alone read as the module docstring says: the causal flag, a windowed attention
    function, or left as it was; ``mod`` itself where none changes."""
    builder = relax.BlockBuilder(mod)
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = _rewrite_masks(func, builder)
            if not new.same_as(func):
                updates[gv] = new
    if not updates:
        return mod
    for gv, func in updates.items():
        builder.update_func(gv, func)
    return builder.get()


def _rewrite_masks(func: relax.Function, builder: relax.BlockBuilder) -> relax.Function:
    values = relax.analysis.get_var2val(func)
    bands: dict = {}
    changed = []

    def band_of(bias, heads: int, queries: int, keys: int) -> tuple[str | None, int | None, np.ndarray | None] | None:
        """(alignment, window, ALiBi's slopes or None) of a bias computed from constants, over
        the attention's ``queries`` and ``keys`` (a bias of one row is every query's); the
        alignment None where it masks nothing."""
        if (bias, queries, keys) not in bands:
            mask, band = constant_mask(bias, values), None
            if mask is not None and mask.ndim >= 2:
                mask = np.broadcast_to(mask, (*mask.shape[:-2], queries, keys))
                band = (None, None) if not np.any(mask) else causal_band(mask)
                if band is not None:
                    band = (*band, None)
                elif (kept := causal_band(np.where(mask > MASKED_FILL, 0.0, -math.inf))) is not None:
                    slopes = alibi_slopes(mask, heads)
                    band = None if slopes is None else (*kept, slopes if np.any(slopes) else None)
            bands[bias, queries, keys] = band
        return bands[bias, queries, keys]

    def replacement(orig: relax.Call, _matches) -> relax.Expr:
        q, k, v, bias = orig.args
        if orig.attrs.causal_mask is not None or orig.attrs.window_size is not None:
            return orig
        q_ty, k_ty, v_ty = q.ty, k.ty, v.ty
        if not (static(q_ty) and static(k_ty)):
            return orig
        band = band_of(bias, int(q_ty.shape.values[2]), int(q_ty.shape.values[1]), int(k_ty.shape.values[1]))
        if band is None:
            return orig
        alignment, window, slopes = band
        if window is None and slopes is None:
            changed.append(orig)
            return relax.op.nn.attention(q, k, v, scale=orig.attrs.scale, causal_mask=alignment)
        if not static(v_ty) or int(q_ty.shape.values[2]) % int(k_ty.shape.values[2]):
            return orig
        changed.append(orig)
        scale = float(orig.attrs.scale) if orig.attrs.scale is not None else 1.0 / math.sqrt(int(q_ty.shape.values[3]))
        shift = 0 if alignment == "TopLeft" else int(k_ty.shape.values[1]) - int(q_ty.shape.values[1])
        name = "alibi_attention" if slopes is not None else "windowed_attention"
        gv = builder.add_func(band_attention(q_ty, k_ty, v_ty, scale, shift, window, slopes is not None), name)
        out_shape = [*q_ty.shape.values[:3], v_ty.shape.values[3]]
        args = [q, k, v] + ([relax.const(slopes)] if slopes is not None else [])
        return relax.call_tir(gv, args, relax.TensorType(out_shape, q_ty.dtype))

    new = rewrite_call(is_op(_ATTENTION_BIAS)(wildcard(), wildcard(), wildcard(), wildcard()), replacement, func)
    return new if changed else func
