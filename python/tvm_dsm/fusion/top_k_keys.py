"""Top-k of floats as one unsigned integer key per (value, index) pair.

A top-k scan compares pairs by value, then by index (lower first). When the value is a 16-bit
float (or its exact fp32 cast) and indices fit 16 bits, ``key = order(value) << 16 | (0xFFFF -
index)`` orders the pairs the same way as one unsigned 32-bit integer, so inserting an element
into the k best becomes a branch-free network of k max/min pairs instead of k comparisons with
selects under a branch that some lane of a warp almost always takes. fp32 values take 64-bit
keys the same way (``order(value) << 32 | (0xFFFFFFFF - index)``), for kernels that insert
few elements (:mod:`tvm_dsm.kernels.top_k_rows`). ``order`` maps the float's bits to an
unsigned order (sign bit flipped for positives, all bits for negatives; -0 as +0, so they tie
as floats do). Values that never beat the level's initial value (NaN, -inf, and for a 16-bit
level its lowest value) get key 0, the empty slot, so the result is the one the comparisons
give.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx.script.builder import ir as T

_FLOAT16 = ("float16", "bfloat16")


def key_dtype(source: str) -> str:
    """The key type of ``source``-typed values: 32 bits for 16-bit floats, else 64."""
    return "uint32" if tvm.DataType(source).bits == 16 else "uint64"


def _key_format(source: str) -> tuple[str, int]:
    """(key dtype, value bits) of the keys of ``source``-typed values."""
    return key_dtype(source), tvm.DataType(source).bits


def _dtype(buffer) -> str:
    return str(buffer.ty.dtype)


def packable_value(value: tvm.ir.PrimExpr, extent: int, wide: bool = False) -> tvm.ir.PrimExpr | None:
    """The float a top-k level's ``value`` is (exactly), if keys can order its pairs: 16-bit
    (32-bit keys), or with ``wide`` also an fp32 element as loaded (64-bit keys)."""
    if str(value.ty.dtype) in _FLOAT16 and extent <= 0xFFFF:
        return value
    if isinstance(value, tirx.Cast) and str(value.ty.dtype) == "float32" \
            and str(value.value.ty.dtype) in _FLOAT16 and extent <= 0xFFFF:
        return value.value
    if wide and isinstance(value, tvm.ir.TensorLoad) and str(value.ty.dtype) == "float32" \
            and extent <= 0xFFFFFFFF:
        return value
    return None


def insert(keys, raw: tvm.ir.PrimExpr, index: tvm.ir.PrimExpr, k: int, init: tvm.ir.PrimExpr) -> None:
    """Insert the pair (``raw``, ``index``) into the ``k`` keys held best first (a local
    buffer of the key type), dropping the least: slot c keeps the larger of itself and the
    carried key, the smaller moves on. The key is built without branches (the sign selects an
    XOR mask). ``init`` is the level's initial value (in the level's type, which ``raw``
    converts to exactly): a value not above it never enters."""
    key_type, n = _key_format(str(raw.ty.dtype))
    top_bit, low = tirx.const(1 << (n - 1), key_type), tirx.const((1 << (n - 1)) - 1, key_type)
    bits = T.sblock_alloc_buffer([1], key_type, scope="local")
    carry = T.sblock_alloc_buffer([1], key_type, scope="local")
    T.buffer_store(bits, tirx.Cast(key_type, tirx.call_intrin(f"uint{n}", "tirx.reinterpret", raw)), [0])
    b = bits[0]
    T.buffer_store(bits, b * tirx.Cast(key_type, b != top_bit), [0])  # -0 ties with +0
    b = bits[0]
    sign = tirx.shift_right(b, tirx.const(n - 1, key_type))
    order = tirx.bitwise_xor(b, tirx.bitwise_or(top_bit, sign * low))
    key = tirx.bitwise_or(tirx.shift_left(order, tirx.const(n, key_type)),
                          tirx.const((1 << n) - 1, key_type) - tirx.Cast(key_type, index))
    beats_init = tirx.Cast(key_type, tirx.Cast(str(init.ty.dtype), raw) > init)
    T.buffer_store(carry, key * beats_init, [0])
    _absorb(keys, carry, k)


def _absorb(keys, carry, k: int) -> None:
    """Insert the key held in ``carry`` into the ``k`` sorted keys: slot c keeps the larger of
    itself and the carried key, the smaller moves on."""
    held = T.sblock_alloc_buffer([1], _dtype(keys), scope="local")
    for c in range(k):
        T.buffer_store(held, keys[c], [0])
        T.buffer_store(keys, tirx.max(held[0], carry[0]), [c])
        T.buffer_store(carry, tirx.min(held[0], carry[0]), [0])


def merge_sorted(keys, partner, k: int) -> None:
    """The best ``k`` of the sorted keys held and another thread's (``partner(key)`` reads
    its key in the same slot, e.g. a warp shuffle). k a power of two: bitonically (the larger
    of keys[c] and theirs[k-1-c] are the best k as a bitonic sequence, log2 k rounds of max/min
    sort them); else by k insertions."""
    theirs = T.sblock_alloc_buffer([k], _dtype(keys), scope="local")
    for c in range(k):
        T.buffer_store(theirs, partner(keys[c]), [c])
    if k & (k - 1):
        carry = T.sblock_alloc_buffer([1], _dtype(keys), scope="local")
        for c in range(k):
            T.buffer_store(carry, theirs[c], [0])
            _absorb(keys, carry, k)
        return
    for c in range(k):
        T.buffer_store(keys, tirx.max(keys[c], theirs[k - 1 - c]), [c])
    held = T.sblock_alloc_buffer([1], _dtype(keys), scope="local")
    stride = k // 2
    while stride:
        for c in (c for c in range(k) if not c & stride):
            T.buffer_store(held, keys[c], [0])
            T.buffer_store(keys, tirx.max(held[0], keys[c + stride]), [c])
            T.buffer_store(keys, tirx.min(held[0], keys[c + stride]), [c + stride])
        stride //= 2


def unpack_pair(key: tvm.ir.PrimExpr, source: str, dtype: str, empty_value, empty_index: int):
    """(value as ``dtype``, index) of a key made from a ``source``-typed value; key 0 (an empty
    slot) is ``(empty_value, empty_index)``."""
    key_type, n = _key_format(source)
    ones = tirx.const((1 << n) - 1, key_type)
    order = tirx.shift_right(key, tirx.const(n, key_type))
    positive = tirx.bitwise_and(order, tirx.const(1 << (n - 1), key_type)) != tirx.const(0, key_type)
    bits = tirx.Select(positive, tirx.bitwise_and(order, tirx.const((1 << (n - 1)) - 1, key_type)),
                       tirx.bitwise_xor(order, ones))
    raw = tirx.call_intrin(source, "tirx.reinterpret", tirx.Cast(f"uint{n}", bits))
    value = raw if source == dtype else tirx.Cast(dtype, raw)
    index = tirx.Cast("int32", ones - tirx.bitwise_and(key, ones))
    empty = key == tirx.const(0, key_type)
    return tirx.Select(empty, empty_value, value), tirx.Select(empty, tirx.const(empty_index, "int32"), index)
