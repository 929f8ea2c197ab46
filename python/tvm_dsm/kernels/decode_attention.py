"""Decode attention (one query a head) with each (sequence, KV head) pair's tokens split over a
thread-block cluster, every KV row read once for all the query heads of its group.

The kernel is the same wherever the K and V rows come from; :class:`DecodeOperands` says where
(``nn.llm``'s paged cache, :mod:`tvm_dsm.kernels.paged_decode`; a user's dense ``[B, H, S, D]``
or other layout, :mod:`tvm_dsm.kernels.dense_decode`):

- a cluster of ``ranks`` CTAs per pair, each CTA reading one contiguous share of the pair's
  tokens;
- in a CTA, each warp goes through its tokens with an online softmax (running max, sum and
  output) per query head, scores scaled by ``scale * log2(e)`` (base 2), the loads of the next
  ``files - 1`` steps in flight while this step computes (a register file a step); its
  products on CUDA cores (:class:`_LaneBody`: a token's row on ``D / 8`` lanes, the scores
  reduced by shuffles) or on tensor cores (:class:`_MmaBody`: the group's query heads the rows
  of ``mma.sync`` tiles, 16 tokens a step; where a group shares each row, CUDA cores would do a
  multiply-add per byte per head);
- the warps merge through shared memory; each CTA stores its
  state into rank 0's shared memory (DSM stores, which do not wait on the peer as loads would),
  and rank 0 merges them and writes the output (and, where the operands keep one, the base-2
  log-sum-exp).
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as B

from ..annotations import CLUSTER_LAUNCH_KEY, PROGRAMMATIC_WAIT_KEY
from ..errors import ClusterError, passes
from ..ir import shuffle_xor, tree_reduce
from ..schedule.cluster import MAX_PORTABLE_CLUSTER_SIZE

_WARP = 32
LOAD_BYTES = 16
_WORDS = LOAD_BYTES // 4  # 32-bit words of one load
#: Warps a CTA may have.
WARPS = (4, 8)
#: The most tokens a slot loads a step (two steps' loads in flight): four where a lane holds
#: few query heads, two where holding twice four tokens' rows would leave too few registers for
#: enough CTAs an SM (H200, bench/results/decode_forms: 32 heads without groups at 4096 keys 66
#: us with four, 72 with two; 4 query heads a group at a batch of 32, 117 with four, 79 with two).
MAX_UNROLL = 4
#: A lane holds the group's query and output pieces in fp32 registers: up to this many floats
#: each (8 query heads of 8 elements).
HELD_FLOATS = 64
#: The running max of a slot before its first token: finite, so that ``exp2`` of differences
#: stays 0 rather than NaN (``nn.llm``'s kernels use the same value; it is also the
#: log-sum-exp of an empty sequence).
EMPTY_MAX = -5e4
#: log2(e): the kernels' exponentials are base 2.
LOG2E = math.log2(math.e)
#: The most distinct tokens' rows a thread loads in one step (tensor cores: two of K, four of V).
ROW_SLOTS = 6
#: Register files of a thread's K and V rows a configuration may have (``DecodeConfig.files``):
#: a step's loads are issued ``files - 1`` steps before it computes. What the loads of a step need
#: (a page lookup) is kept per file, in ``files * ROW_SLOTS`` slots, and looked up one step
#: before they are issued.
FILES = (2, 3)
#: Head dims the tensor-core body takes: a thread's share of a V row (``D / 8`` columns) whole
#: 16-byte loads (not 32, 80 or 96), both register files of K and V rows within the 255
#: registers of a thread (not 256).
MMA_HEAD_DIMS = (64, 128)
#: Static shared memory a CTA may declare.
STATIC_SHARED_BYTES = 48 * 1024
#: CTAs of the CUDA-core kernel an SM holds at once (127 registers a thread, 128 threads a CTA).
RESIDENT_CTAS = 4
#: Head dims at which two tensor-core CTAs of 8 warps and two register files fit an SM's 64K
#: registers (ptxas: 112-114 registers a thread at 64 with 4 or 8 query heads a group, fp16 or
#: bf16; 199-201 at 128; checked in tests/test_dense_decode.py).
TWICE_RESIDENT_HEAD_DIMS = (64,)


class DecodeOperands(ABC):
    """Where a decode kernel's operands live: the sizes, and the loads and stores of one
    (sequence, KV head) pair, emitted into the kernel as it is built."""

    group: int  # query heads per KV head, held together by a CTA
    head_dim: int
    dtype: str  # of q, K and V (16-bit)

    @property
    def vector(self) -> int:
        """Elements of one 16-byte load."""
        return LOAD_BYTES * 8 // tvm.DataType(self.dtype).bits

    @property
    def unroll(self) -> int:
        """Tokens a slot loads a step (see :data:`MAX_UNROLL`)."""
        return MAX_UNROLL if self.group * self.vector <= 16 else 2

    @property
    def pieces(self) -> int:
        """16-byte pieces of one row."""
        return self.head_dim // self.vector

    @property
    def lanes(self) -> int:
        """Lanes sharing one token's row: its pieces, rounded up to a power of two."""
        return 1 << (self.pieces - 1).bit_length()

    def limits(self) -> list[tuple[bool, str]]:
        """(holds, the limit named) for what every decode kernel needs."""
        vec = self.vector
        return [
            (self.dtype in ("float16", "bfloat16"), f"16-bit q, K and V (not {self.dtype})"),
            (self.head_dim % vec == 0 and self.head_dim <= _WARP * vec,
             f"a head dim that is a multiple of {vec} up to {_WARP * vec} (not {self.head_dim})"),
            (self.group * vec <= HELD_FLOATS, f"at most {HELD_FLOATS // vec} query heads per KV head (not {self.group})"),
        ]

    @abstractmethod
    def pairs(self):
        """How many (sequence, KV head) pairs the kernel takes (an expression)."""

    @abstractmethod
    def begin(self, pair) -> None:
        """Emit what the CTAs of ``pair`` look up once, before anything else reads."""

    @abstractmethod
    def length(self):
        """The pair's tokens."""

    @abstractmethod
    def query(self, h, column):
        """Element ``column`` of the query of the group's ``h``-th head (q's dtype)."""

    @abstractmethod
    def scale(self):
        """The softmax scale (of the scores, before the exponential)."""

    #: Whether :meth:`exponent` computes more than the scaled score.
    has_terms = False

    def exponent(self, h, token, score):
        """The base-2 exponent of ``token``'s key for the group's ``h``-th head, whose score
        times ``scale() * log2 e`` is ``score``: that score, unless the operands have score
        terms (a soft cap, a bias, a mask) to compute (:attr:`has_terms`)."""
        return score

    def before_loads(self, slot: int, token) -> None:
        """Emit what the loads of ``token``'s rows need (a page lookup) into ``slot`` of
        ``files * ROW_SLOTS`` (a register file's rows of one step); nothing by default."""

    #: Whether what :meth:`begin`, :meth:`length` and :meth:`before_loads` read is written before
    #: the program runs, by no kernel (a paged cache's page tables, copied by the host before the
    #: step): a kernel launched programmatically then reads it, and prefetches its first rows
    #: into L2 (:meth:`prefetch_rows`), before it waits for the kernel before it.
    tables_ready = False

    def prefetch_rows(self, tx, begin, end) -> None:
        """Emit thread ``tx``'s part of the L2 prefetches of the K and V rows of tokens ``begin``
        to ``end`` (where :attr:`tables_ready`)."""
        raise NotImplementedError(f"{type(self).__name__} has no tables to read early")

    @abstractmethod
    def row_pointer(self, slot: int, kv: int, token, column):
        """The address of ``token``'s K (``kv`` 0) or V (1) row at ``column``, what
        :meth:`before_loads` emitted for it in ``slot``."""

    @abstractmethod
    def write(self, h: int, column, value, lse) -> None:
        """Emit the stores of the group's ``h``-th head's output ``value`` at ``column`` (and its
        base-2 log-sum-exp where kept; ``column`` 0 stores it)."""


@dataclass(frozen=True)
class DecodeConfig:
    """CTAs per pair (a cluster), products on tensor cores or CUDA cores, warps a CTA, register
    files of K and V rows (steps whose loads are in flight, the one computing included)."""

    ranks: int
    tensor_cores: bool = False
    warps: int = 4
    files: int = 2

    def explain(self) -> str:
        split = f"its keys split over a cluster of {self.ranks}, merged through DSM" if self.ranks > 1 else "one CTA"
        cores = "tensor cores" if self.tensor_cores else "CUDA cores"
        return (f"cluster decode attention: a CTA of {self.warps} warps per group of query heads sharing K/V rows, "
                f"{split}, on {cores}")


def shared_bytes(operands: DecodeOperands, config: DecodeConfig) -> int:
    """Static shared memory of a CTA: each warp's softmax states, and (rank 0's, in a cluster)
    every CTA's."""
    state = operands.group * (operands.head_dim + 2) * 4
    return config.warps * state + (config.ranks * state if config.ranks > 1 else 0)


def most_ranks(operands: DecodeOperands, pairs: int, hw) -> int:
    """The largest cluster a pair may take where ``pairs`` run at once: a portable one, within
    the static shared memory of a CTA (of the default warps), no more CTAs in all than the SMs."""
    ranks = 1
    while (ranks < MAX_PORTABLE_CLUSTER_SIZE and pairs * ranks < hw.sm_count
           and shared_bytes(operands, DecodeConfig(ranks * 2)) <= STATIC_SHARED_BYTES):
        ranks *= 2
    return ranks


def tensor_core_limits(operands: DecodeOperands) -> list[tuple[bool, str]]:
    """(holds, the limit named) for the tensor-core body (see :class:`_MmaBody`)."""
    return [(operands.head_dim in MMA_HEAD_DIMS, f"a head dim in {MMA_HEAD_DIMS} (not {operands.head_dim})"),
            (operands.group <= 8, f"at most 8 query heads per KV head (not {operands.group})")]


def prefers_tensor_cores(operands: DecodeOperands) -> bool:
    """Whether the tensor-core body is the default: where a CTA holds several query heads of a
    group (CUDA cores would do that many multiply-adds per byte read) and it takes them."""
    return operands.group > 1 and all(ok for ok, _ in tensor_core_limits(operands))


def wave_ctas(operands: DecodeOperands, hw, ranks: int, tensor_cores: bool) -> int:
    """The most CTAs a grid in clusters of ``ranks`` should have, the cluster sizes chosen to stay
    within it (the merge through DSM pays only where the pairs alone leave SMs idle): a wave of
    resident CTAs on CUDA cores; on tensor cores, whose CTAs each stream faster, those that run at
    once two an SM where two CTAs of 8 warps fit an SM's registers
    (:data:`TWICE_RESIDENT_HEAD_DIMS`), else one an SM. H200, the 1B Llama's 32/8 heads of 64 at
    a batch of 3 (``bench/results/llama_decode_small_batches``): clusters of 8 (192 CTAs, two an
    SM, two files) 17.3 us at 8192 keys and 7.2 at 2048, against 19.0 and 8.4 in clusters of 4
    (96 CTAs, three files)."""
    if not tensor_cores:
        return hw.sm_count * RESIDENT_CTAS
    return hw.concurrent_ctas(ranks, 2 if operands.head_dim in TWICE_RESIDENT_HEAD_DIMS else 1)


def with_depth(operands: DecodeOperands, config: DecodeConfig, pairs: int, hw, keys: int | None = None) -> DecodeConfig:
    """``config`` with the warps and register files that keep the most K/V loads in flight on
    each SM while the grid of ``pairs`` pairs stays one wave, on tensor cores (CUDA-core configs
    are returned as they are):

    - the grid runs at once at one CTA an SM: 8 warps, and three register files where the head
      dim allows them;
    - at two CTAs an SM: 8 warps where two such CTAs fit an SM's registers
      (:data:`TWICE_RESIDENT_HEAD_DIMS`);
    - otherwise as it is (4 warps, two files: a third file or 8 warps would push the grid past
      a wave).

    A cluster's CTAs share a GPC, so clusters of 3 or more strand SMs
    (:meth:`~tvm_dsm.hardware.Hardware.concurrent_ctas`): a batch of 4 in clusters of 4 is 128
    CTAs, more than the 120 that run at once at one an SM; with three files it took 33.9 us at
    8192 keys against 24.8 with two (H200, ``bench/results/llama_decode_small_batches``).

    Where the key count is known, a CTA keeps at least two steps of 8 warps (short shares lose
    more to the merge than they gain). H200, the 1B Llama's shapes (32/8 heads of 64,
    ``bench/results/llama_decode_clusters``): a batch of 8 in clusters of 2 (128 CTAs) at 8192 keys
    36.9 us with 8 warps and three files, 42.4 with two, 68.4 with 4 warps; a batch of 32 (256
    CTAs) 124.4 us with 8 warps, 153.5 with 4, 130.0 with 8 warps and three files (one CTA an
    SM); a batch of 64 (512 CTAs) 245.9 with 4 warps, 244.3 with 8."""
    if not config.tensor_cores:
        return config
    wide = replace(config, warps=max(WARPS))
    if ((isinstance(keys, int) and keys < config.ranks * 2 * tokens_per_step(operands, wide))
            or shared_bytes(operands, wide) > STATIC_SHARED_BYTES):
        return config
    ctas = pairs * config.ranks
    if ctas <= hw.concurrent_ctas(config.ranks, 1):
        deeper = replace(wide, files=max(FILES))
        return deeper if passes(check_config, operands, deeper) else wide
    if ctas <= hw.concurrent_ctas(config.ranks, 2) and operands.head_dim in TWICE_RESIDENT_HEAD_DIMS:
        return wide
    return config


def tokens_per_step(operands: DecodeOperands, config: DecodeConfig) -> int:
    """Tokens a CTA takes in one step of its loop."""
    return config.warps * (_MmaBody if config.tensor_cores else _LaneBody).tokens_of(operands)


def check_config(operands: DecodeOperands, config: DecodeConfig) -> None:
    """ClusterError naming the limit ``config`` breaks for ``operands``."""
    ranks = config.ranks
    if not 1 <= ranks <= MAX_PORTABLE_CLUSTER_SIZE or ranks & (ranks - 1):
        raise ClusterError(f"decode attention: a cluster of 1 to {MAX_PORTABLE_CLUSTER_SIZE} CTAs, a power of two "
                           f"(not {ranks})")
    if config.warps not in WARPS:
        raise ClusterError(f"decode attention: {' or '.join(map(str, WARPS))} warps a CTA (not {config.warps})")
    if config.files not in FILES:
        raise ClusterError(f"decode attention: {' or '.join(map(str, FILES))} register files (not {config.files})")
    if shared_bytes(operands, config) > STATIC_SHARED_BYTES:
        raise ClusterError(f"decode attention: a cluster of {ranks} CTAs of {config.warps} warps needs "
                           f"{shared_bytes(operands, config)} B of static shared memory per CTA, more than the "
                           f"{STATIC_SHARED_BYTES} B CUDA allows")
    if config.tensor_cores:
        for ok, limit in tensor_core_limits(operands):
            if not ok:
                raise ClusterError(f"decode attention on tensor cores: needs {limit}")
        if config.files > 2 and operands.head_dim > 64:
            raise ClusterError(f"decode attention on tensor cores: {config.files} register files of K and V rows "
                               f"of {operands.head_dim} columns need more than a thread's 255 registers "
                               "(2 files, or head dims up to 64)")


def _load_streamed(words: list, pointer) -> None:
    """Emit the 16-byte load at ``pointer`` into the four 32-bit ``words``, evict-first (``.cs``):
    a call reads each K and V row once, so its rows should leave L2 before what later kernels
    will read there (the next projection's weight, which it prefetches while this kernel runs)."""
    B.evaluate(T.ptx.ld.global_.cs.nc.v4.b32(*words, pointer))


def decode_kernel(operands: DecodeOperands, config: DecodeConfig, name: str, asserts=()) -> tirx.PrimFunc:
    """The kernel of the module docstring over ``operands`` in ``config``, a function named
    ``name`` whose body reads the operands' buffers (the caller gives it their parameters;
    ``asserts``: (condition, message) checked on the host first)."""
    check_config(operands, config)
    body = _MmaBody if config.tensor_cores else _LaneBody
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name(name)
            B.func_attr({"tirx.noalias": True})
            with contextlib.ExitStack() as checked:
                for cond, message in asserts:
                    checked.enter_context(B.Assert(cond, message))
                with B.thread_binding(operands.pairs() * config.ranks, thread="blockIdx.x") as bx:
                    with B.thread_binding(config.warps * _WARP, thread="threadIdx.x") as tx:
                        with B.sblock("decode_attention"):
                            B.reads()
                            B.writes()
                            body(operands, config, bx, tx).emit()
    return ib.get()


class _Body(ABC):
    """The statements of thread ``tx`` of CTA ``bx``, emitted into the open block: the CTA's
    share of the pair's tokens, its warps' online-softmax states merged through shared memory,
    the CTAs' through rank 0's (DSM). Subclasses say how a warp goes through its tokens."""

    #: Tokens a warp takes in one step.
    warp_tokens: int

    def __init__(self, operands: DecodeOperands, config: DecodeConfig, bx, tx):
        self.operands, self.ranks, self.warps, self.files = operands, config.ranks, config.warps, config.files
        g = operands.group
        self.local = lambda shape, dtype="float32": B.sblock_alloc_buffer(shape, dtype, scope="local")  # noqa: E731
        self.span = self.local((2,), "int32")  # the CTA's first token, past its last
        self.merged = self.local((2,))  # a merge's running max and sum
        self.peer = self.local((1,), "uint32")
        self.warp_o = B.sblock_alloc_buffer((self.warps, g, operands.head_dim), "float32", scope="shared")
        self.warp_md = B.sblock_alloc_buffer((self.warps, g, 2), "float32", scope="shared")
        if self.ranks > 1:  # rank 0's: every CTA's state, pushed there through DSM
            self.cta_o = B.sblock_alloc_buffer((self.ranks, g, operands.head_dim), "float32", scope="shared")
            self.cta_md = B.sblock_alloc_buffer((self.ranks, g, 2), "float32", scope="shared")
        self.tx = tx
        self.pair = bx // self.ranks
        self.rank = bx % self.ranks
        self.lane = tx % _WARP
        self.warp = tx // _WARP
        self.scale = _scaled_by_log2e(operands.scale())

    @abstractmethod
    def _start(self) -> None:
        """Emit the warp's state before its first token: the query held, nothing summed."""

    @abstractmethod
    def _step_tokens(self, step) -> list:
        """The tokens whose rows the thread loads in ``step``, at most :data:`ROW_SLOTS`, each
        clamped into the share (past its end a thread reads the share's last token)."""

    @abstractmethod
    def _load(self, file: int, step) -> None:
        """Emit the loads of the warp's tokens of ``step`` into register file ``file`` (in flight
        together), from what :meth:`_look_up` emitted for them."""

    def _look_up(self, file: int, step) -> None:
        """Emit what the loads of ``step`` into register file ``file`` need (their pages)."""
        for u, token in enumerate(self._step_tokens(step)):
            self.operands.before_loads(file * ROW_SLOTS + u, token)

    @abstractmethod
    def _update(self, file: int, step) -> None:
        """Emit the online softmax of the group's heads by ``step``'s tokens (in ``file``)."""

    @abstractmethod
    def _store_warp_state(self) -> None:
        """Emit the store of the warp's merged state into ``warp_o`` / ``warp_md``, for every
        query head of the group."""

    def emit(self) -> None:
        if self.ranks == 1:
            self._emit_cta()
            return
        with B.attr(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, self.ranks):
            # Peers push into rank 0's buffers while it may still be in its token loop, through
            # addresses TVM does not see: touched here, the buffers are live from the start, so
            # TVM's storage reuse cannot give the warps' states any part of them.
            for buffer in (self.cta_o, self.cta_md):
                B.evaluate(buffer.access_ptr("rw"))
            # Every CTA of the cluster has started before any writes into rank 0's shared
            # memory: arrive now, wait just before the first push.
            B.evaluate(T.ptx.barrier.cluster.arrive.relaxed.aligned())
            self._emit_cta()

    def _token(self, token):
        """``token`` clamped into the CTA's share (a thread past its end reads the last one)."""
        return T.min(token, self.span[1] - 1)

    def _emit_cta(self) -> None:
        ops = self.operands
        ops.begin(self.pair)
        length = ops.length()
        share = (length + self.ranks - 1) // self.ranks
        first, stop = self.span[0], self.span[1]
        B.buffer_store(self.span, self.rank * share, [0])
        B.buffer_store(self.span, T.min(length, self.rank * share + share), [1])
        if not ops.tables_ready:
            self._emit_steps(looked_up=False)
            return
        # the first steps' pages looked up and their rows on their way to L2 while the kernel
        # before this one runs (launched programmatically, this one waits for it only then)
        with B.If(first < stop):
            with B.Then():
                for s in range(self.files):
                    self._look_up(s, s)
                ops.prefetch_rows(self.tx, first, T.min(stop, first + self._group_tokens))
        with B.attr(tvm.ir.StringImm("decode_attention"), PROGRAMMATIC_WAIT_KEY, 0):
            self._emit_steps(looked_up=True)

    @property
    def _group_tokens(self) -> int:
        """Tokens the CTA takes in one pass of its loop: a step in each register file."""
        return self.files * self.warps * self.warp_tokens

    def _emit_steps(self, looked_up: bool) -> None:
        """Emit the CTA's steps over its share and the merges after them (``looked_up``: the
        first steps' pages already looked up)."""
        first, stop = self.span[0], self.span[1]
        self._start()
        with B.If(first < stop):  # the same for every thread of the CTA
            with B.Then():
                # step s in register file s % F: its loads are issued F - 1 steps before it
                # computes, what they need (their pages) looked up a step before that
                F, group_tokens = self.files, self._group_tokens
                for s in range(F - 1):
                    if not looked_up:
                        self._look_up(s, s)
                    self._load(s, s)
                if not looked_up:
                    self._look_up(F - 1, F - 1)
                with B.serial(0, (stop - first + group_tokens - 1) // group_tokens) as group:
                    for j in range(F):
                        step = F * group + j
                        self._load((j + F - 1) % F, step + F - 1)
                        self._look_up(j, step + F)
                        self._update(j, step)
        self._store_warp_state()
        B.evaluate(T.tvm_storage_sync("shared"))
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

    def _merge_warps(self, use) -> None:
        """The CTA's warps merged, element by element: ``use(h, column, o, (max, sum))``."""
        self._each_element(lambda h, column: self._combine(
            self.warps, lambda w: self.warp_md[w, h, 0], lambda w: self.warp_md[w, h, 1],
            lambda w: self.warp_o[w, h, column], lambda o, md: use(h, column, o, md)))

    def _push(self, h, column, o, md) -> None:
        """This CTA's state of (``h``, ``column``) stored into rank 0's shared memory (stores do
        not wait for the peer, loads would)."""
        state = self.rank * self.operands.group + h  # this CTA's state of h in rank 0's buffers
        self._store_to_rank0(self.cta_o, state * self.operands.head_dim + column, o)
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
        """The output of the group's head ``h`` at ``column`` from its merged state, and its
        log-sum-exp (0 and :data:`EMPTY_MAX` for no tokens)."""
        total = md[1]
        value = T.if_then_else(total > 0, o / total, tirx.const(0.0, "float32"))
        lse = T.if_then_else(total > 0, md[0] + T.log2(total), tirx.const(EMPTY_MAX, "float32"))
        self.operands.write(h, column, value, lse)

    def _each_element(self, body) -> None:
        """``body(h, column)`` for every (query head, column) of the group, spread over the
        CTA's threads."""
        ops = self.operands
        elements = ops.group * ops.head_dim
        threads = self.warps * _WARP
        with B.serial(0, (elements + threads - 1) // threads) as i:
            index = i * threads + self.tx
            with B.If(index < elements):
                with B.Then():
                    body(index // ops.head_dim, index % ops.head_dim)

    def _combine(self, sources: int, max_of, sum_of, o_of, use) -> None:
        """Online-softmax states ``0..sources-1`` merged: ``use(o, (max, sum))``."""
        merged = self.merged
        B.buffer_store(merged, tirx.const(EMPTY_MAX, "float32"), [0])
        for r in range(sources):
            B.buffer_store(merged, T.max(merged[0], max_of(r)), [0])
        weights = [T.exp2(max_of(r) - merged[0]) for r in range(sources)]
        B.buffer_store(merged, _tree_sum([sum_of(r) * w for r, w in enumerate(weights)]), [1])
        use(_tree_sum([o_of(r) * w for r, w in enumerate(weights)]), (merged[0], merged[1]))


class _LaneBody(_Body):
    """CUDA cores: each warp is token slots of ``D / 8`` lanes (rounded up to a power of two;
    the lanes past the row idle); a lane loads 8 elements (16 bytes) of a token's K and V rows,
    :attr:`DecodeOperands.unroll` tokens a step; the slot's lanes reduce the scores of every
    query head of the group by shuffles, and each slot keeps an online softmax per query head,
    rescaled once a step; the slots of a warp merge by shuffles."""

    @staticmethod
    def tokens_of(operands: DecodeOperands) -> int:
        """Tokens a warp takes in one step: its token slots, ``unroll`` tokens each."""
        return _WARP // operands.lanes * operands.unroll

    def __init__(self, operands: DecodeOperands, config: DecodeConfig, bx, tx):
        super().__init__(operands, config, bx, tx)
        g, vec, local = operands.group, operands.vector, self.local
        self.slots = _WARP // operands.lanes  # token slots of a warp
        self.unroll = U = operands.unroll
        self.warp_tokens = self.tokens_of(operands)
        self.q_reg, self.o = local((g * vec,)), local((g * vec,))
        self.m, self.d = local((g,)), local((g,))
        self.s, self.p = local((g * U,)), local((U,))  # a step's scores, one head's weights
        # K and V pieces as loaded (16-byte words) and as read (the head dim's type), a register
        # file a step in flight
        self.k_words, self.v_words = ([local((U * _WORDS,), "uint32") for _ in range(self.files)] for _ in range(2))
        self.slot = self.warp * self.slots + self.lane // operands.lanes
        self.part = self.lane % operands.lanes
        # past the row (a head dim of 12 pieces on 16 lanes): a query of zeros, loads of the
        # row's last piece, nothing stored
        self.in_row = self.part < operands.pieces
        self.piece_column = T.min(self.part, operands.pieces - 1) * operands.vector

    def _tokens(self, step) -> list:
        stride = self.warps * self.slots
        return [self.span[0] + (step * self.unroll + u) * stride + self.slot for u in range(self.unroll)]

    def _start(self) -> None:
        ops, vec = self.operands, self.operands.vector
        for h in range(ops.group):
            B.buffer_store(self.m, tirx.const(EMPTY_MAX, "float32"), [h])
            B.buffer_store(self.d, tirx.const(0.0, "float32"), [h])
            with B.unroll(0, vec) as e:
                B.buffer_store(self.o, tirx.const(0.0, "float32"), [h * vec + e])
                query = T.Cast("float32", ops.query(h, self.piece_column + e)) * self.scale
                if ops.lanes != ops.pieces:
                    query = T.if_then_else(self.in_row, query, tirx.const(0.0, "float32"))
                B.buffer_store(self.q_reg, query, [h * vec + e])

    def _step_tokens(self, step) -> list:
        return [self._token(token) for token in self._tokens(step)]

    def _load(self, file: int, step) -> None:
        """The K and V pieces of the slot's tokens of ``step`` into register file ``file``, all
        in flight together. Past the share's end a slot reads its last token (the shuffles need
        every lane; :meth:`_update` weighs it 0)."""
        ops = self.operands
        for u, token in enumerate(self._step_tokens(step)):
            for kv, words in ((0, self.k_words[file]), (1, self.v_words[file])):
                _load_streamed([words[u * _WORDS + w] for w in range(_WORDS)],
                               ops.row_pointer(file * ROW_SLOTS + u, kv, token, self.piece_column))

    def _update(self, file: int, step) -> None:
        """The online softmax of every query head of the group by one step's tokens (their K
        and V pieces in register file ``file``): the step's scores, reduced over the slot's
        lanes, then one rescale of the running state for all of them."""
        ops, g, vec, U = self.operands, self.operands.group, self.operands.vector, self.unroll
        k_reg, v_reg = (B.decl_buffer((U * vec,), ops.dtype, data=words[file].data, scope="local")
                        for words in (self.k_words, self.v_words))
        valid = [token < self.span[1] for token in self._tokens(step)]
        for h in range(g):
            for u in range(U):
                terms = [self.q_reg[h * vec + e] * T.Cast("float32", k_reg[u * vec + e]) for e in range(vec)]
                B.buffer_store(self.s, _tree_sum(terms), [h * U + u])
        mask = 1
        while mask < ops.lanes:
            for i in range(g * U):
                B.buffer_store(self.s, self.s[i] + shuffle_xor(self.s[i], mask), [i])
            mask *= 2
        if ops.has_terms:
            for h in range(g):
                for u, token in enumerate(self._tokens(step)):
                    B.buffer_store(self.s, ops.exponent(h, self._token(token), self.s[h * U + u]), [h * U + u])
        zero = tirx.const(0.0, "float32")
        for h in range(g):
            B.buffer_store(self.merged, self.m[h], [0])
            for u in range(U):
                B.buffer_store(self.merged, T.if_then_else(
                    valid[u], T.max(self.merged[0], self.s[h * U + u]), self.merged[0]), [0])
            alpha = T.exp2(self.m[h] - self.merged[0])
            for u in range(U):
                B.buffer_store(self.p, T.if_then_else(valid[u], T.exp2(self.s[h * U + u] - self.merged[0]), zero), [u])
            B.buffer_store(self.d, self.d[h] * alpha + _tree_sum([self.p[u] for u in range(U)]), [h])
            with B.unroll(0, vec) as e:
                B.buffer_store(self.o, self.o[h * vec + e] * alpha + _tree_sum(
                    [self.p[u] * T.Cast("float32", v_reg[u * vec + e]) for u in range(U)]), [h * vec + e])
            B.buffer_store(self.m, self.merged[0], [h])

    def _store_warp_state(self) -> None:
        """The warp's slots merged into its first slot's lanes (xor shuffles across slots), then
        stored."""
        ops, vec = self.operands, self.operands.vector
        mask = ops.lanes
        while mask < _WARP:
            for h in range(ops.group):
                other_m = shuffle_xor(self.m[h], mask)
                B.buffer_store(self.merged, T.max(self.m[h], other_m), [0])
                mine, theirs = T.exp2(self.m[h] - self.merged[0]), T.exp2(other_m - self.merged[0])
                B.buffer_store(self.d, self.d[h] * mine + shuffle_xor(self.d[h], mask) * theirs, [h])
                for e in range(vec):
                    o = self.o[h * vec + e]
                    B.buffer_store(self.o, o * mine + shuffle_xor(o, mask) * theirs, [h * vec + e])
                B.buffer_store(self.m, self.merged[0], [h])
            mask *= 2
        with B.If(tirx.And(self.lane < ops.lanes, self.in_row) if ops.lanes != ops.pieces else self.lane < ops.lanes):
            with B.Then():
                for h in range(ops.group):
                    with B.unroll(0, vec) as e:
                        B.buffer_store(self.warp_o, self.o[h * vec + e], [self.warp, h, self.part * vec + e])
                    with B.If(self.part == 0):
                        with B.Then():
                            B.buffer_store(self.warp_md, self.m[h], [self.warp, h, 0])
                            B.buffer_store(self.warp_md, self.d[h], [self.warp, h, 1])


class _MmaBody(_Body):
    """Tensor cores (``mma.sync`` m16n8k16, fp32 accumulation): a warp takes 16 tokens a step,
    the group's query heads the rows of the A operand (row ``lane // 4``; rows past the group
    and 8..15 zero).

    Scores ``S = Q K^T`` are two n8 tiles of 8 tokens; their accumulators are already the A
    operand of ``O += P V`` (the two tiles' tokens its k16), as in flash attention. The head
    dim is permuted, the same way for Q and K (a dot product does not see the order) and for
    V and O (the output is stored through the permutation), so that each thread's operand
    pieces are contiguous in memory and load 16 bytes at a time straight from global memory
    into registers, with no shared memory: the thread of A/C row ``r = lane // 4`` and place
    ``p = lane % 4`` among the row's four loads ``D / 4`` columns ``p * D / 4 ..`` of K rows
    ``r`` and ``8 + r`` and ``D / 8`` columns ``r * D / 8 ..`` of V rows ``2p, 2p + 1, 2p + 8,
    2p + 9`` (of the step's 16); a warp reads each byte of its rows once. The running max and sum are per row, the max reduced
    over the row's four threads by shuffles, the sum once at the end."""

    @staticmethod
    def tokens_of(operands: DecodeOperands) -> int:
        """Tokens a warp takes in one step."""
        return 16

    def __init__(self, operands: DecodeOperands, config: DecodeConfig, bx, tx):
        super().__init__(operands, config, bx, tx)
        D, local = operands.head_dim, self.local
        self.warp_tokens = self.tokens_of(operands)
        self.k_cols, self.v_cols = D // 4, D // 8  # columns a thread loads of a K row, of a V row
        self.row, self.place = self.lane // 4, self.lane % 4
        # 16-bit pairs in 32-bit words: Q's columns (A's row, two words a k-step), two K rows'
        # and four V rows' columns, a register file a step in flight
        self.q_frag = local((self.k_cols // 2,), "uint32")
        self.k_words = [local((self.k_cols,), "uint32") for _ in range(self.files)]
        self.v_words = [local((2 * self.v_cols,), "uint32") for _ in range(self.files)]
        self.s = local((8,))  # two n8 tiles of scores (rows 8..15 unused)
        self.o = local((2 * self.v_cols,))  # a thread's two columns of each n8 tile of O
        # accumulator rows 8..15 of O, never read: their inputs are left as they are (zeros
        # cost registers, 203 -> 230 at head dim 128)
        self.unused = local((2,))
        self.p_frag, self.v_frag = local((2,), "uint32"), local((2,), "uint32")
        self.m, self.d = local((1,)), local((1,))
        self.zero = local((1,), "uint32")

    def _halves(self, words):
        """``words`` read as q's dtype."""
        return B.decl_buffer((words.shape[0] * 2,), self.operands.dtype, data=words.data, scope="local")

    def _start(self) -> None:
        ops, g = self.operands, self.operands.group
        B.buffer_store(self.m, tirx.const(EMPTY_MAX, "float32"), [0])
        B.buffer_store(self.d, tirx.const(0.0, "float32"), [0])
        B.buffer_store(self.zero, tirx.const(0, "uint32"), [0])
        with B.unroll(0, 2 * self.v_cols) as i:
            B.buffer_store(self.o, tirx.const(0.0, "float32"), [i])
        q_half = self._halves(self.q_frag)
        head = T.min(self.row, g - 1)
        # q_half[i]: Q column place * D / 4 + i; in k-step i // 4, i % 4 of 0, 1 is A's a0
        # (k 2p, 2p + 1), of 2, 3 its a2 (k 2p + 8, 2p + 9)
        with B.unroll(0, self.k_cols) as i:
            value = ops.query(head, self.place * self.k_cols + i)
            B.buffer_store(q_half, T.if_then_else(self.row < g, value, tirx.const(0, ops.dtype)), [i])

    def _rows(self, step):
        """The warp's first token of ``step``, the thread's K rows (``+ r, + 8 + r``) and V rows
        (``+ 2p, + 2p + 1, + 2p + 8, + 2p + 9``)."""
        base = self.span[0] + (step * self.warps + self.warp) * self.warp_tokens
        k_rows = [base + self.row, base + 8 + self.row]
        v_rows = [base + 2 * self.place + r for r in (0, 1, 8, 9)]
        return base, k_rows, v_rows

    def _step_tokens(self, step) -> list:
        _, k_rows, v_rows = self._rows(step)
        return [self._token(t) for t in (*k_rows, *v_rows)]

    def _load(self, file: int, step) -> None:
        ops = self.operands
        for u, token in enumerate(self._step_tokens(step)):
            kv, cols, words = (0, self.k_cols, self.k_words[file]) if u < 2 else (1, self.v_cols, self.v_words[file])
            first = self.place * cols if kv == 0 else self.row * cols
            r = u if kv == 0 else u - 2
            for piece in range(cols // ops.vector):
                at = (r * cols // ops.vector + piece) * _WORDS
                _load_streamed([words[at + w] for w in range(_WORDS)],
                               ops.row_pointer(file * ROW_SLOTS + u, kv, token, first + piece * ops.vector))

    def _mma(self, d: list, a: list, b: list, c: list) -> None:
        """``d = a b + c`` (fragments of registers; ``c`` may be values)."""
        operand = {"float16": "f16", "bfloat16": "bf16"}[self.operands.dtype]
        instruction = T.ptx.mma.sync.aligned.m16n8k16.row.col.f32
        for part in (operand, operand, "f32"):
            instruction = getattr(instruction, part)
        B.evaluate(instruction(*d, *a, *b, *c))

    def _update(self, file: int, step) -> None:
        ops, zero = self.operands, self.zero[0]
        base, _, _ = self._rows(step)
        s, k_words = self.s, self.k_words[file]
        row_words = self.k_cols // 2  # words of one K row a thread holds
        for tile in range(2):
            for i in range(4):
                B.buffer_store(s, tirx.const(0.0, "float32"), [4 * tile + i])
            for k in range(ops.head_dim // 16):
                scores = [s[4 * tile + i] for i in range(4)]
                self._mma(scores, [self.q_frag[2 * k], zero, self.q_frag[2 * k + 1], zero],
                          [k_words[tile * row_words + 2 * k], k_words[tile * row_words + 2 * k + 1]], scores)
        # the thread's scores: tile's tokens base + 8 tile + 2p + e, in s[4 tile + e]
        held = [(tile, e) for tile in range(2) for e in range(2)]
        valid = {(tile, e): base + 8 * tile + 2 * self.place + e < self.span[1] for tile, e in held}
        head = T.min(self.row, ops.group - 1)  # rows past the group hold zeros
        score = {(tile, e): ops.exponent(head, self._token(base + 8 * tile + 2 * self.place + e),
                                         s[4 * tile + e] * self.scale) for tile, e in held}
        B.buffer_store(self.merged, self.m[0], [0])
        for key in held:
            B.buffer_store(self.merged, T.if_then_else(valid[key], T.max(self.merged[0], score[key]), self.merged[0]), [0])
        for mask in (1, 2):
            B.buffer_store(self.merged, T.max(self.merged[0], shuffle_xor(self.merged[0], mask)), [0])
        B.buffer_store(self.merged, T.exp2(self.m[0] - self.merged[0]), [1])
        alpha = self.merged[1]
        B.buffer_store(self.m, self.merged[0], [0])
        zero_f = tirx.const(0.0, "float32")
        for key in held:
            B.buffer_store(s, T.if_then_else(valid[key], T.exp2(score[key] - self.m[0]), zero_f), [4 * key[0] + key[1]])
        B.buffer_store(self.d, self.d[0] * alpha + _tree_sum([s[4 * tile + e] for tile, e in held]), [0])
        with B.unroll(0, 2 * self.v_cols) as i:
            B.buffer_store(self.o, self.o[i] * alpha, [i])
        p_half, v_half, vf_half = self._halves(self.p_frag), self._halves(self.v_words[file]), self._halves(self.v_frag)
        for tile in range(2):
            for e in range(2):
                B.buffer_store(p_half, T.Cast(ops.dtype, s[4 * tile + e]), [2 * tile + e])
        for n in range(self.v_cols):  # n8 tile n: O columns (2p + e) * v_cols + n
            for r in range(4):
                B.buffer_store(vf_half, v_half[r * self.v_cols + n], [r])
            unused = [self.unused[0], self.unused[1]]
            self._mma([self.o[2 * n], self.o[2 * n + 1], *unused], [self.p_frag[0], zero, self.p_frag[1], zero],
                      [self.v_frag[0], self.v_frag[1]], [self.o[2 * n], self.o[2 * n + 1], *unused])

    def _store_warp_state(self) -> None:
        g = self.operands.group
        for mask in (1, 2):
            B.buffer_store(self.d, self.d[0] + shuffle_xor(self.d[0], mask), [0])
        with B.If(self.row < g):
            with B.Then():
                for n in range(self.v_cols):
                    for e in range(2):
                        column = (2 * self.place + e) * self.v_cols + n
                        B.buffer_store(self.warp_o, self.o[2 * n + e], [self.warp, self.row, column])
                with B.If(self.place == 0):
                    with B.Then():
                        B.buffer_store(self.warp_md, self.m[0], [self.warp, self.row, 0])
                        B.buffer_store(self.warp_md, self.d[0], [self.warp, self.row, 1])


def _scaled_by_log2e(scale):
    """A softmax scale as the kernel applies it (its exponentials are base 2)."""
    return scale * LOG2E


def _tree_sum(values: list):
    return tree_reduce(lambda a, b: a + b, values)
