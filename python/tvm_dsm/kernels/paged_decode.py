"""Decode attention over ``nn.llm``'s paged KV cache, each sequence's KV heads split over a
thread-block cluster.

``nn.llm``'s TIR decode kernel (``batch_decode_paged_kv``) runs one CTA per sequence and KV head:
at batch 1 with 8 KV heads that is 8 CTAs on 132 SMs, 24 us a layer at a context of 531 tokens
(H200) where its K and V take under a microsecond at HBM rate. This kernel keeps that function's
parameters, so the KV cache calls it unchanged, and changes how the work is spread:

- a cluster of ``ranks`` CTAs per (sequence, KV head), each CTA reading one contiguous share of
  the sequence's tokens, once for all the query heads of the group (GQA); smaller clusters for
  larger batches (one kernel per range of batch sizes, :func:`paged_decode_dispatch`);
- in a CTA, each warp is ``32 / (D / 8)`` token slots of ``D / 8`` lanes; a lane loads 8
  elements (16 bytes, one vector load) of a token's K and V rows (pages are looked up per
  token; four tokens' loads are issued before the first is used), the slot's lanes reduce the scores
  of every query head of the group by shuffles, and each slot keeps an online softmax (running
  max, sum and output) per query head;
- the slots of a warp merge by shuffles, the warps through shared memory; each CTA stores its
  state into rank 0's shared memory (DSM stores, which do not wait on the peer as loads would),
  and rank 0 merges them and writes the output and the log-sum-exp
  (base 2, with scores scaled by ``sm_scale * log2(e)``, as ``nn.llm``'s merge kernels read it).

It takes the cache whose RoPE is applied before K is appended (``rotary_mode == 0``); a call
with in-kernel RoPE stops with an error before launch. Sliding-window caches keep ``nn.llm``'s
kernel (:func:`find_paged_decode` does not match them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as B

from ..annotations import CLUSTER_LAUNCH_KEY
from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import branch_on, shuffle_xor, tree_reduce
from ..schedule.cluster import MAX_PORTABLE_CLUSTER_SIZE

#: The function ``nn.llm`` builds for decode attention over its paged KV cache, and its
#: parameters in order.
SYMBOL = "batch_decode_paged_kv"
PARAMS = ("Q", "pages", "page_table_indptr", "page_table_values", "length_info",
          "k_rope_pos_offset", "q_rope_position", "output", "lse", "rotary_mode", "rope_scale",
          "rope_theta", "sm_scale")

_WARP = 32
_LOAD_BYTES = 16
_WORDS = _LOAD_BYTES // 4  # 32-bit words of one load
_WARPS = 4
#: Tokens a slot loads per step before it uses the first (HBM latency is what a short share
#: of a sequence waits on).
_UNROLL = 4
#: A lane holds the group's query and output pieces in fp32 registers: up to this many floats
#: each (8 query heads of 8 elements).
_HELD_FLOATS = 64
#: The running max of a slot before its first token: finite, so that ``exp2`` of differences
#: stays 0 rather than NaN (``nn.llm``'s kernels use the same value; it is also the
#: log-sum-exp of an empty sequence).
_EMPTY_MAX = -5e4
_LOG2E = math.log2(math.e)
#: Static shared memory a CTA may declare.
_STATIC_SHARED_BYTES = 48 * 1024


@dataclass(frozen=True)
class PagedDecode:
    """An ``nn.llm`` paged decode-attention function and the sizes its kernel needs."""

    func: tirx.PrimFunc
    qo_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    dtype: str

    @property
    def group(self) -> int:
        return self.qo_heads // self.kv_heads

    @property
    def vector(self) -> int:
        return _LOAD_BYTES * 8 // tvm.DataType(self.dtype).bits

    @property
    def lanes(self) -> int:
        """Lanes sharing one token's row."""
        return self.head_dim // self.vector


def find_paged_decode(func: tirx.PrimFunc) -> PagedDecode:
    """The sizes of ``nn.llm``'s (non-sliding-window) paged decode function ``func``;
    ClusterError naming what does not match or which limit the kernel has."""
    symbol = str((func.attrs or {}).get("global_symbol", ""))
    names = tuple(p.name for p in func.params)
    if symbol != SYMBOL or names != PARAMS:
        raise ClusterError(f"not nn.llm's paged decode attention ({SYMBOL} with parameters {PARAMS})")
    q, pages = func.params[0].ty, func.params[1].ty
    try:
        _, qo_heads, head_dim = (int(x) if i else x for i, x in enumerate(q.shape))
        _, two, kv_heads, page_size, pages_dim = (int(x) if i else x for i, x in enumerate(pages.shape))
    except (TypeError, ValueError) as err:
        raise ClusterError(f"paged decode: heads, head dim and page size must be constants ({err})") from err
    dtype = str(q.dtype)
    found = PagedDecode(func, qo_heads, kv_heads, head_dim, page_size, dtype)
    limits = [
        (two == 2 and pages_dim == head_dim and str(pages.dtype) == dtype, "pages [P, 2, Hkv, page, D] of Q's dtype"),
        (dtype in ("float16", "bfloat16"), f"16-bit Q and KV (not {dtype})"),
        (qo_heads % kv_heads == 0, "query heads a multiple of the KV heads"),
        (head_dim % found.vector == 0 and _WARP % (head_dim // found.vector) == 0,
         f"a head dim of 8 times a power of two up to {_WARP * found.vector} (not {head_dim})"),
        (found.group * found.vector <= _HELD_FLOATS,
         f"at most {_HELD_FLOATS // found.vector} query heads per KV head (not {found.group})"),
    ]
    for ok, limit in limits:
        if not ok:
            raise ClusterError(f"paged decode: needs {limit}")
    return found


def shared_bytes(found: PagedDecode, ranks: int) -> int:
    """Static shared memory of a CTA: each warp's softmax states, and (rank 0's, in a cluster)
    every CTA's."""
    state = found.group * (found.head_dim + 2) * 4
    return _WARPS * state + (ranks * state if ranks > 1 else 0)


def default_ranks(found: PagedDecode, hw: Hardware) -> int:
    """CTAs per (sequence, KV head): enough for one sequence's KV heads to fill the SMs,
    within a portable cluster and the static shared memory of a CTA."""
    ranks = 1
    while (ranks < MAX_PORTABLE_CLUSTER_SIZE and found.kv_heads * ranks < hw.sm_count
           and shared_bytes(found, ranks * 2) <= _STATIC_SHARED_BYTES):
        ranks *= 2
    return ranks


#: CTAs of the kernel an SM holds at once (127 registers a thread, 128 threads a CTA).
_RESIDENT_CTAS = 4


def batch_ranks(found: PagedDecode, hw: Hardware) -> list[tuple[int | None, int]]:
    """Cluster sizes by batch size, ``[(largest batch, ranks), ..., (None, ranks)]``: the most
    CTAs per (sequence, KV head) that keep the grid within one wave of resident CTAs (the merge
    through DSM only pays where the sequences and heads alone leave SMs idle), from
    :func:`default_ranks` down to 1."""
    slots = hw.sm_count * _RESIDENT_CTAS
    ranges, ranks = [], default_ranks(found, hw)
    while ranks > 1:
        bound = slots // (found.kv_heads * ranks)
        if bound >= 1 and (not ranges or bound > ranges[-1][0]):
            ranges.append((bound, ranks))
        ranks //= 2
    return ranges + [(None, 1)]


def paged_decode_dispatch(found: PagedDecode, hw: Hardware) -> tirx.PrimFunc:
    """``found``'s function as one kernel per range of batch sizes (:func:`batch_ranks`), the
    batch size tested on the host before each launch."""
    ranges = batch_ranks(found, hw)
    kernels = [(bound, paged_decode_kernel(found, ranks)) for bound, ranks in ranges]
    return kernels[-1][1].with_body(branch_on(found.func.params[0].ty.shape[0], kernels))


def paged_decode_kernel(found: PagedDecode, ranks: int) -> tirx.PrimFunc:
    """The kernel of the module docstring: ``found``'s parameters, a cluster of ``ranks``."""
    if not 1 <= ranks <= MAX_PORTABLE_CLUSTER_SIZE or ranks & (ranks - 1):
        raise ClusterError(f"paged decode: a cluster of 1 to {MAX_PORTABLE_CLUSTER_SIZE} CTAs, a power of two (not {ranks})")
    if shared_bytes(found, ranks) > _STATIC_SHARED_BYTES:
        raise ClusterError(f"paged decode: a cluster of {ranks} needs {shared_bytes(found, ranks)} B of "
                           f"static shared memory per CTA, more than the {_STATIC_SHARED_BYTES} B CUDA allows")
    params = list(found.func.params)
    q = params[0]
    batch = q.ty.shape[0]
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name(SYMBOL)
            pages_offset = params[PARAMS.index("pages")].ty.elem_offset
            with B.Assert(params[PARAMS.index("rotary_mode")] == 0,
                          "tvm-dsm's paged decode attention takes K stored rotated (RoPE mode "
                          "NORMAL or NONE), not RoPE applied in the kernel"), \
                    B.Assert(tirx.floormod(pages_offset, found.vector) == 0,
                             "tvm-dsm's paged decode attention loads 16-byte pieces of the pages: "
                             "their offset must be a multiple of 16 bytes"):
                with B.thread_binding(batch * found.kv_heads * ranks, thread="blockIdx.x") as bx:
                    with B.thread_binding(_WARPS * _WARP, thread="threadIdx.x") as tx:
                        with B.sblock("paged_decode"):
                            B.reads()
                            B.writes()
                            _Body(found, ranks, params, bx, tx).emit()
    built = ib.get()
    attrs = {**dict(found.func.attrs), "tirx.noalias": True}
    return tirx.PrimFunc(params, built.body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))


class _Body:
    """The statements of thread ``tx`` of CTA ``bx``, emitted into the open block."""

    def __init__(self, found: PagedDecode, ranks: int, params: list, bx, tx):
        self.found, self.ranks = found, ranks
        (self.q, self.pages, self.indptr, self.values, self.length_info, _, _, self.output,
         self.lse, _, _, _, sm_scale) = params
        g, vec = found.group, found.vector
        self.slots = _WARP // found.lanes  # token slots of a warp
        self.stride = _WARPS * self.slots  # tokens a CTA takes per step
        local = lambda shape, dtype="float32": B.sblock_alloc_buffer(shape, dtype, scope="local")  # noqa: E731
        self.q_reg, self.o = local((g * vec,)), local((g * vec,))
        self.m, self.d, self.s = local((g,)), local((g,)), local((g,))
        # K and V pieces as loaded (16-byte words) and as read (the head dim's type), one register file
        self.k_words, self.v_words = (local((_UNROLL * _WORDS,), "uint32") for _ in range(2))
        self.state = local((3,), "int32")  # first page slot, first token, past the last token
        self.page = local((_UNROLL,), "int32")
        self.merged = local((2,))  # a merge's running max and sum
        self.peer = local((1,), "uint32")
        self.warp_o = B.sblock_alloc_buffer((_WARPS, g, found.head_dim), "float32", scope="shared")
        self.warp_md = B.sblock_alloc_buffer((_WARPS, g, 2), "float32", scope="shared")
        if ranks > 1:  # rank 0's: every CTA's state, pushed there through DSM
            self.cta_o = B.sblock_alloc_buffer((ranks, g, found.head_dim), "float32", scope="shared")
            self.cta_md = B.sblock_alloc_buffer((ranks, g, 2), "float32", scope="shared")
        self.tx = tx
        self.seq = bx // (found.kv_heads * ranks)
        self.head = bx // ranks % found.kv_heads
        self.rank = bx % ranks
        self.lane = tx % _WARP
        self.warp = tx // _WARP
        self.slot = self.warp * self.slots + self.lane // found.lanes
        self.part = self.lane % found.lanes
        self.scale = sm_scale * _LOG2E

    def emit(self) -> None:
        if self.ranks == 1:
            self._emit_cta()
            return
        with B.attr(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, self.ranks):
            # Peers push into rank 0's buffers while it may still be in its token loop, through
            # addresses TVM does not see: touched here, the buffers are live from the start, so
            # TVM's storage reuse cannot place them over the warps' (it did: warp_md and cta_md
            # shared one allocation, and an early push overwrote rank 0's warp states).
            for buffer in (self.cta_o, self.cta_md):
                B.evaluate(buffer.access_ptr("rw"))
            # Every CTA of the cluster has started before any writes into rank 0's shared
            # memory: arrive now, wait just before the first push.
            B.evaluate(T.ptx.barrier.cluster.arrive.relaxed.aligned())
            self._emit_cta()

    def _emit_cta(self) -> None:
        found, g, vec = self.found, self.found.group, self.found.vector
        begin, end = self.indptr[self.seq], self.indptr[self.seq + 1]
        length = T.if_then_else(begin != end, (end - begin - 1) * found.page_size + self.length_info[self.seq], 0)
        share = (length + self.ranks - 1) // self.ranks
        first, stop = self.state[1], self.state[2]
        B.buffer_store(self.state, begin, [0])
        B.buffer_store(self.state, self.rank * share, [1])
        B.buffer_store(self.state, T.min(length, self.rank * share + share), [2])
        for h in range(g):
            B.buffer_store(self.m, tirx.const(_EMPTY_MAX, "float32"), [h])
            B.buffer_store(self.d, tirx.const(0.0, "float32"), [h])
            with B.unroll(0, vec) as e:
                B.buffer_store(self.o, tirx.const(0.0, "float32"), [h * vec + e])
                B.buffer_store(self.q_reg, T.Cast("float32", self.q[
                    self.seq, self.head * g + h, self.part * vec + e]) * self.scale, [h * vec + e])
        with B.If(first < stop):  # the same for every thread of the CTA
            with B.Then():
                step_tokens = self.stride * _UNROLL
                with B.serial(0, (stop - first + step_tokens - 1) // step_tokens) as step:
                    self._emit_tokens([first + (step * _UNROLL + u) * self.stride + self.slot
                                       for u in range(_UNROLL)])
        self._merge_slots()
        if self.ranks == 1:
            self._merge_warps(self._write)
            return
        B.evaluate(T.ptx.barrier.cluster.wait.aligned())
        self._merge_warps(self._push)
        # every CTA's state is in rank 0's shared memory (release, then acquire; PTX's own
        # instructions, which the compiler does not move loads across)
        B.evaluate(T.ptx.barrier.cluster.arrive.aligned())
        B.evaluate(T.ptx.barrier.cluster.wait.aligned())
        with B.If(self.rank == 0):
            with B.Then():
                self._each_element(lambda h, column: self._combine(
                    self.ranks, lambda r: self.cta_md[r, h, 0], lambda r: self.cta_md[r, h, 1],
                    lambda r: self.cta_o[r, h, column], lambda o, md: self._write(h, column, o, md)))

    def _emit_tokens(self, tokens: list) -> None:
        """The slot's ``tokens`` (one step): their page numbers, then all their K and V
        pieces (loads in flight together), then per token the scores and the online softmax
        update. Past the share's end a slot reads its last token and weighs it 0 (the shuffles
        need every lane)."""
        found, vec = self.found, self.found.vector
        stop = self.state[2]
        clamped = [T.min(token, stop - 1) for token in tokens]
        for u, token in enumerate(clamped):
            B.buffer_store(self.page, self.values[self.state[0] + token // found.page_size], [u])
        for u, token in enumerate(clamped):
            page, offset = self.page[u], token % found.page_size
            for kv, words in ((0, self.k_words), (1, self.v_words)):
                flat = (((page * 2 + kv) * found.kv_heads + self.head) * found.page_size + offset) \
                    * found.head_dim + self.part * vec
                B.evaluate(T.ptx.ld.global_.nc.v4.b32(
                    *(words[u * _WORDS + w] for w in range(_WORDS)), self.pages.access_ptr("r", offset=flat)))
        k_reg, v_reg = (B.decl_buffer((_UNROLL * vec,), found.dtype, data=words.data, scope="local")
                        for words in (self.k_words, self.v_words))
        for u, token in enumerate(tokens):
            self._update(u, token < stop, k_reg, v_reg)

    def _update(self, u: int, valid, k_reg, v_reg) -> None:
        """The online softmax of every query head of the group, by the ``u``-th loaded token
        (its K and V pieces in ``k_reg`` and ``v_reg``)."""
        found, g, vec = self.found, self.found.group, self.found.vector
        for h in range(g):
            terms = [self.q_reg[h * vec + e] * T.Cast("float32", k_reg[u * vec + e]) for e in range(vec)]
            B.buffer_store(self.s, _tree_sum(terms), [h])
        mask = 1
        while mask < found.lanes:
            for h in range(g):
                B.buffer_store(self.s, self.s[h] + shuffle_xor(self.s[h], mask), [h])
            mask *= 2
        for h in range(g):
            new_max = T.if_then_else(valid, T.max(self.m[h], self.s[h]), self.m[h])
            B.buffer_store(self.merged, new_max, [0])
            alpha = T.exp2(self.m[h] - self.merged[0])
            p = T.if_then_else(valid, T.exp2(self.s[h] - self.merged[0]), tirx.const(0.0, "float32"))
            B.buffer_store(self.merged, p, [1])
            B.buffer_store(self.d, self.d[h] * alpha + self.merged[1], [h])
            with B.unroll(0, vec) as e:
                B.buffer_store(self.o, self.o[h * vec + e] * alpha
                               + self.merged[1] * T.Cast("float32", v_reg[u * vec + e]), [h * vec + e])
            B.buffer_store(self.m, self.merged[0], [h])

    def _merge_slots(self) -> None:
        """The warp's slots into its first slot's lanes, by xor shuffles across slots."""
        found, vec = self.found, self.found.vector
        mask = found.lanes
        while mask < _WARP:
            for h in range(found.group):
                other_m = shuffle_xor(self.m[h], mask)
                B.buffer_store(self.merged, T.max(self.m[h], other_m), [0])
                mine, theirs = T.exp2(self.m[h] - self.merged[0]), T.exp2(other_m - self.merged[0])
                B.buffer_store(self.d, self.d[h] * mine + shuffle_xor(self.d[h], mask) * theirs, [h])
                for e in range(vec):
                    o = self.o[h * vec + e]
                    B.buffer_store(self.o, o * mine + shuffle_xor(o, mask) * theirs, [h * vec + e])
                B.buffer_store(self.m, self.merged[0], [h])
            mask *= 2
        with B.If(self.lane < found.lanes):
            with B.Then():
                for h in range(found.group):
                    with B.unroll(0, vec) as e:
                        B.buffer_store(self.warp_o, self.o[h * vec + e], [self.warp, h, self.part * vec + e])
                    with B.If(self.part == 0):
                        with B.Then():
                            B.buffer_store(self.warp_md, self.m[h], [self.warp, h, 0])
                            B.buffer_store(self.warp_md, self.d[h], [self.warp, h, 1])
        B.evaluate(T.tvm_storage_sync("shared"))

    def _merge_warps(self, use) -> None:
        """The CTA's warps merged, element by element: ``use(h, column, o, (max, sum))``."""
        self._each_element(lambda h, column: self._combine(
            _WARPS, lambda w: self.warp_md[w, h, 0], lambda w: self.warp_md[w, h, 1],
            lambda w: self.warp_o[w, h, column], lambda o, md: use(h, column, o, md)))

    def _push(self, h, column, o, md) -> None:
        """This CTA's state of (``h``, ``column``) stored into rank 0's shared memory (stores do
        not wait for the peer, loads would)."""
        state = self.rank * self.found.group + h  # this CTA's state of h in rank 0's buffers
        self._store_to_rank0(self.cta_o, state * self.found.head_dim + column, o)
        with B.If(column == 0):
            with B.Then():
                for k in range(2):
                    self._store_to_rank0(self.cta_md, state * 2 + k, md[k])

    def _store_to_rank0(self, buffer, offset, value) -> None:
        """``value`` into element ``offset`` of rank 0's ``buffer`` (a DSM store)."""
        B.evaluate(T.ptx.mapa.shared__cluster.u32(
            self.peer[0], T.cuda.cvta_generic_to_shared(buffer.access_ptr("w", offset=offset)),
            T.Cast("uint32", 0)))
        B.evaluate(T.ptx.st.shared__cluster.f32(self.peer[0], value))

    def _write(self, h, column, o, md) -> None:
        """The output of query head ``h`` of the group at ``column`` from its merged state (and
        its log-sum-exp, once a head)."""
        head = self.head * self.found.group + h
        total = md[1]
        B.buffer_store(self.output, T.Cast(self.found.dtype, T.if_then_else(
            total > 0, o / total, tirx.const(0.0, "float32"))), [self.seq, head, column])
        with B.If(column == 0):
            with B.Then():
                B.buffer_store(self.lse, T.if_then_else(
                    total > 0, md[0] + T.log2(total), tirx.const(_EMPTY_MAX, "float32")), [self.seq, head])

    def _each_element(self, body) -> None:
        """``body(h, column)`` for every (query head, column) of the group, spread over the
        CTA's threads."""
        found = self.found
        elements = found.group * found.head_dim
        threads = _WARPS * _WARP
        with B.serial(0, (elements + threads - 1) // threads) as i:
            index = i * threads + self.tx
            with B.If(index < elements):
                with B.Then():
                    body(index // found.head_dim, index % found.head_dim)

    def _combine(self, sources: int, max_of, sum_of, o_of, use) -> None:
        """Online-softmax states ``0..sources-1`` merged: ``use(o, (max, sum))``."""
        merged = self.merged
        B.buffer_store(merged, tirx.const(_EMPTY_MAX, "float32"), [0])
        for r in range(sources):
            B.buffer_store(merged, T.max(merged[0], max_of(r)), [0])
        weights = [T.exp2(max_of(r) - merged[0]) for r in range(sources)]
        B.buffer_store(merged, _tree_sum([sum_of(r) * w for r, w in enumerate(weights)]), [1])
        use(_tree_sum([o_of(r) * w for r, w in enumerate(weights)]), (merged[0], merged[1]))


def _tree_sum(values: list):
    return tree_reduce(lambda a, b: a + b, values)
