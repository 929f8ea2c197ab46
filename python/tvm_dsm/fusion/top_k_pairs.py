"""Top-k (value, index) pairs held sorted best first in local buffers, as the fused loop keeps them.

An element enters the pairs by :func:`insert` (only when it beats the last pair); two sorted lists
of pairs meet by :func:`merge_sorted` (bitonic, k a power of two) or by inserting one list's
pairs into the other. Best = larger value, then smaller index (:func:`tvm_dsm.fusion.top_k.beats`).
Pairs read from another part come from shared memory: they are first copied into registers, since
TVM's ThreadSync rejects shared-memory reads in a condition.
"""

from __future__ import annotations

from tvm import tirx
from tvm.tirx.script.builder import ir as T

from .top_k import beats


def insert(values, indices, k: int, value, index, later: bool = False) -> None:
    """Insert (value, index) into the sorted pairs if it beats the last. From the end, slot c
    takes its predecessor if the new pair beats that, else the new pair if it beat slot c
    (the previous step's test), else stays. ``later``: the index exceeds every index held (a
    part's own scan), so a tie never beats and one comparison decides. The pair is staged in
    registers (merged pairs come from shared memory)."""
    new_value = T.sblock_alloc_buffer([1], str(values.ty.dtype), scope="local")
    new_index = T.sblock_alloc_buffer([1], "int32", scope="local")
    won, moves = (T.sblock_alloc_buffer([1], "int32", scope="local") for _ in range(2))
    T.buffer_store(new_value, value, [0])
    T.buffer_store(new_index, index, [0])
    value, index = new_value[0], new_index[0]

    def wins(c):
        return value > values[c] if later else beats(value, index, values[c], indices[c])

    with T.If(wins(k - 1)):
        with T.Then():
            T.buffer_store(won, tirx.const(1, "int32"), [0])
            for c in reversed(range(k)):
                T.buffer_store(moves, tirx.Cast("int32", wins(c - 1)) if c else tirx.const(0, "int32"), [0])
                for buf, new in ((values, value), (indices, index)):
                    previous = buf[c - 1] if c else new
                    T.buffer_store(buf, tirx.Select(moves[0] == 1, previous, tirx.Select(
                        won[0] == 1, new, buf[c])), [c])
                T.buffer_store(won, moves[0], [0])


def merge_sorted(values, indices, k: int, other_values, other_indices, p) -> None:
    """The best k of the sorted pairs held and part ``p``'s sorted pairs (k a power of two),
    by a bitonic merge: the better of held[c] and other[k-1-c] for each c is the best k as a
    bitonic sequence, which log2(k) rounds of compare-exchanges sort. 2k + (k/2) log2 k
    independent comparisons instead of k insertions of k dependent ones; the other part's
    pairs are first copied into registers."""
    dtype = str(values.ty.dtype)
    theirs_v = T.sblock_alloc_buffer([k], dtype, scope="local")
    theirs_i = T.sblock_alloc_buffer([k], "int32", scope="local")
    held_v = T.sblock_alloc_buffer([1], dtype, scope="local")
    held_i = T.sblock_alloc_buffer([1], "int32", scope="local")
    swap = T.sblock_alloc_buffer([1], "int32", scope="local")
    for c in range(k):
        T.buffer_store(theirs_v, tirx.BufferLoad(other_values, [p, c]), [c])
        T.buffer_store(theirs_i, tirx.BufferLoad(other_indices, [p, c]), [c])

    def exchange(a: tuple, b: tuple, both: bool) -> None:
        """Slot a = (values, indices, position) takes the better pair of a and b; with
        ``both``, slot b takes the other."""
        (a_v, a_i, x), (b_v, b_i, y) = a, b
        T.buffer_store(swap, tirx.Cast("int32", beats(b_v[y], b_i[y], a_v[x], a_i[x])), [0])
        T.buffer_store(held_v, a_v[x], [0])
        T.buffer_store(held_i, a_i[x], [0])
        take = swap[0] == 1
        T.buffer_store(a_v, tirx.Select(take, b_v[y], held_v[0]), [x])
        T.buffer_store(a_i, tirx.Select(take, b_i[y], held_i[0]), [x])
        if both:
            T.buffer_store(b_v, tirx.Select(take, held_v[0], b_v[y]), [y])
            T.buffer_store(b_i, tirx.Select(take, held_i[0], b_i[y]), [y])

    for c in range(k):
        exchange((values, indices, c), (theirs_v, theirs_i, k - 1 - c), both=False)
    stride = k // 2
    while stride:
        for c in (c for c in range(k) if not c & stride):
            exchange((values, indices, c), (values, indices, c + stride), both=True)
        stride //= 2
