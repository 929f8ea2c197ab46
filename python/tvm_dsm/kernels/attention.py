"""Attention as one FlashAttention-style kernel: RedFuser's incremental form over key tiles,
both products on warpgroup MMAs.

The user writes attention unfused (:func:`tvm_dsm.workloads.cascades.attention`: scores, row
max, exp-sum, exp-weighted sum of V, divide). :func:`find_attention` proves the cascade with
:mod:`tvm_dsm.fusion.cascade` (max -> sum and sum of V rescaled by ``fix(m_old, m_new) =
exp(m_old - m_new)``) and reads the shape; :func:`attention_kernel` writes the fused loop over
key tiles with that correction, each warp owning 16 query rows of a 64-row warpgroup block:

    S_t = Q K_t^T                       wgmma, Q and K_t from shared memory, S_t in registers
    m' = max(m, scale * rowmax(S_t))    per row: the thread's columns, then its 4-lane quad
    O = O * fix(m, m');  l = l * fix(m, m') + rowsum(P_t)
    P_t = exp(scale S_t - m')           ex2 in registers, rounded to fp16 pairs in the A-fragment layout
    O += P_t V_t                        wgmma, P_t from registers, V_t (MN-major) from shared
    out = O / l                         after the last tile (l summed over the quad)

Why this shape: the scores never leave registers. The wgmma accumulator of a warp's 16 rows
is laid out like mma.sync's 16x16 fragments, so the fp16 probabilities are already the A operand
of the second product (FlashAttention-2's trick), and a row's reductions are two quad shuffles.
Staging S_t and P_t through shared memory with one thread per row is an order of magnitude
slower (docs/attention.md).

Every fp32 -> fp16 rounding (P, and the output) takes two values per ``cvt.rn.f16x2.f32``. The
output leaves through shared memory: O / l, in fp16 pairs, into Q's slot in the layout TMA lands
Q in, then one TMA tensor store per 64-column panel. Scalar casts (32 2-byte output stores a
thread) and 4-byte stores straight from registers both measured slower (docs/attention.md).

Q, then key and value tiles, arrive by TMA tensor copies (one thread issues them; they complete
on an mbarrier per slot, K's and V's apart) through two shared-memory slots: tile t + 1 loads
while tile t computes, and the CTA barrier at the top of each step frees the slot the step
refills. With one warpgroup of one row block a CTA (:func:`overlaps_softmax`) tile t's
``S = Q K^T`` and tile t - 1's ``O += P V`` are in flight together, the softmax of tile t
computed while the second runs (``wgmma.wait_group 1``); V of tile t then loads at step t. TMA lands
every tile 128-byte swizzled in 64-column panels (16-byte chunk c of row r at chunk
``c ^ (r % 8)``), the layout the wgmma descriptors name (:mod:`tvm_dsm.intrin.wgmma`); that
swizzle is applied to absolute addresses, so the kernel aligns its dynamic shared buffer to
1024 bytes itself. Key/value tiles are not multicast to clusters: the per-tile cluster
barrier that frees a slot in both CTAs costs more than the halved L2 reads save
(docs/attention.md).
Causal attention (key t visible to query i iff t <= i) skips the tiles past the diagonal, masks
the diagonal ones, and runs the CTAs with the most tiles first. A CTA holds one or two
warpgroups (``AttentionConfig.warpgroups``), each with its own row blocks, all reading the same
key/value tiles; :func:`default_config` says which shapes take which.

The same kernel takes sequences packed end to end, as ``nn.llm``'s ragged prefill holds them
(:class:`RaggedSequences`, :mod:`tvm_dsm.kernels.ragged_prefill`): a CTA per (query tile, head)
of each sequence, its sequence found by walking the index pointers, lengths, scale and
causality read at run time, and its rows stored from registers within their own sequence (a
TMA store of a whole tile would write the next sequence's rows), with their log-sum-exp.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass
from types import SimpleNamespace

import sympy
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from ..errors import ClusterError, passes
from ..fusion.symbolic import ToTIR
from ..hardware import Hardware, load_hardware
from ..ir import extent_variables, shuffle_reduce, specialized, substitute, tree_reduce
from ..transform.tma_pipeline import encode_tensor_map
from ..intrin.wgmma import WARPGROUP_ROWS, call_source, mma_async_source, wait_source
from .attention_pattern import AttentionShape, HeadAxis, OperandLayout, find_attention
from .template import KernelTemplate

#: The running sums' correction when the row max moves from y0_old to y0_new.
_CORRECTION = sympy.exp(sympy.Symbol("y0_old", real=True) - sympy.Symbol("y0_new", real=True))
_NEG = -3.0e38  # the max's identity: finite, so fix(identity, m) is 0 or 1, never inf - inf
_PANEL = 64  # fp16 columns of one 128-byte swizzle panel
_ROW_BYTES = 128
_ATOM_BYTES = 8 * _ROW_BYTES  # one 8-row swizzle atom
#: The kernel's mbarriers: K's two slots (0, 1), Q's, then V's two slots.
_Q_BARRIER, _V_BARRIER, _BARRIERS = 2, 3, 5
_WARPGROUP_THREADS = 128
#: Two fp32 values rounded into one 16-bit pair with one ``cvt.rn.{f16,bf16}x2.f32``, stored at
#: ``dst`` (why pairs: the module docstring): {dtype: (C element, C pair, conversion)}. Callers
#: name ``dst`` with ``access_ptr(extent=2)``: TVM sizes a local buffer by the elements it sees
#: accessed, and ``address_of`` names only one.
_PAIRS = {"float16": ("half", "__half2", "__floats2half2_rn"),
          "bfloat16": ("nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn")}


def _pack(dtype: str) -> tuple[str, str]:
    """The pair-rounding helper for ``dtype``: (name, CUDA)."""
    element, pair, convert = _PAIRS[dtype]
    name = f"tvm_dsm_pack_{element.replace('nv_', '')}2"
    return name, f"""
__forceinline__ __device__ void {name}({element}* dst, float lo, float hi) {{
  *reinterpret_cast<{pair}*>(dst) = {convert}(lo, hi);
}}
"""


@dataclass(frozen=True)
class AttentionConfig:
    """``block_n`` keys per tile; ``row_blocks`` 64-row blocks of queries per warpgroup, one
    after another; ``warpgroups`` per CTA, each with its own row blocks and all sharing the key
    and value tiles (:func:`default_config` picks them); ``prefetch_terms``: score terms' tensor
    elements loaded while the scores' MMA runs, where registers allow (:func:`prefetches_terms`)."""

    block_n: int = 64
    row_blocks: int = 1
    warpgroups: int = 1
    prefetch_terms: bool = True
    overlap_softmax: bool | None = None  # None: where it fits (overlaps_softmax)

    @property
    def block_m(self) -> int:
        return WARPGROUP_ROWS * self.row_blocks * self.warpgroups

    def explain(self) -> str:
        return (f"attention: {self.block_m} query rows x {self.block_n}-key tiles per CTA, "
                f"{self.warpgroups} warpgroup(s) of {self.row_blocks} 64-row block(s), both products on "
                "warpgroup MMAs, key/value tiles by TMA")


#: Configurations whose registers fit without spills (ptxas, checked in tests/test_attention.py).
CONFIGS = (AttentionConfig(64, 1), AttentionConfig(128, 1), AttentionConfig(64, 2),
           AttentionConfig(64, 1, 2), AttentionConfig(128, 1, 2))
#: Head dims the kernel computes in: one to four 64-column swizzle panels. A head dim between
#: is computed in the next one, TMA filling the columns past it with zeros on loads (they add
#: nothing to q . k, and P V's extra columns are clipped by the TMA store).
PADDED_DIMS = (64, 128, 192, 256)
#: A TMA tensor map's strides are multiples of 16 bytes: the head dim's rows of 2-byte elements.
_DIM_MULTIPLE = 8
#: fp32 accumulator registers a thread may hold (S and O of its row blocks): the most that
#: ptxas fits without spills next to the rest (head dim 128, two row blocks of 64-key tiles).
_MAX_ACCUMULATORS = 192
#: fp32 registers of S and O and fp16 pairs of P a thread may hold at once with the softmax
#: overlapped (:func:`overlaps_softmax`): 128-key tiles at head dim 128.
_OVERLAPPED_ACCUMULATORS = 160
#: Dynamic shared memory a CTA may opt into on Hopper.
_MAX_SHARED_BYTES = 227 * 1024
#: The extents a function of symbolic ones is matched at (:meth:`AttentionTemplate.find`), the
#: first variable's, then the second's, the third's (lengths or a batch): above every head dim,
#: whose extent an equal length would make ambiguous to the matcher.
_MATCHED_LENGTHS = (264, 328, 392)
#: Other extents the score terms of a function of symbolic ones are read at, to check that they
#: do not depend on them.
_OTHER_LENGTHS = (280, 344, 408)
#: How much fuller the waves of CTAs one an SM must be to take them at head dims 80-128
#: (:func:`_fills_fewer_waves`).
_WAVE_FILL_MARGIN = 0.05
#: Keys from which causal attention at head dims 80-128 shares 128-key tiles between two
#: warpgroups (:func:`default_config`).
_LONG_CAUSAL_KEYS = 2048


#: The kernel's buffers and values a key step reads (``key_step`` in :func:`attention_kernel`).
_STEP_SCOPE = ("smem", "bars", "s", "p", "o", "m", "l", "new_max", "fixed", "pre", "base", "tx", "heads", "seq", "P",
               "qt", "kv_row0", "scale", "scale_log2e", "block0", "warp", "lane", "tiles", "own_tiles")


def _step_scope(scope: SimpleNamespace) -> tuple:
    """``scope``'s values of :data:`_STEP_SCOPE`, in order."""
    return tuple(getattr(scope, name) for name in _STEP_SCOPE)


def padded_dim(dim: int) -> int:
    """The head dim the kernel computes ``dim`` in (see :data:`PADDED_DIMS`)."""
    return -(-dim // _PANEL) * _PANEL


def _shared_elements(D: int, DV: int, c: AttentionConfig) -> int:
    """The CTA's shared buffer in elements at (padded) head dims ``D`` of q and k and ``DV`` of
    v: Q's tile, two slots each of K and V tiles, and room to align the tiles to 1024 bytes (the
    output leaves through Q's slot and, where it is wider, the K slots after it)."""
    return c.block_m * D + 2 * c.block_n * (D + DV) + _ATOM_BYTES // 2


def takes_head_dim(dim: int) -> bool:
    """Whether the kernel computes head dim ``dim``: a multiple of 8 (TMA strides are 16-byte
    multiples) whose padded width is one of :data:`PADDED_DIMS`."""
    return dim % _DIM_MULTIPLE == 0 and padded_dim(dim) in PADDED_DIMS


def check_config(shape: AttentionShape, c: AttentionConfig) -> None:
    for dim in {shape.dim, shape.v_dim}:
        if not takes_head_dim(dim):
            raise ClusterError(f"head dim {dim}: the kernel takes multiples of {_DIM_MULTIPLE} (TMA strides are "
                               f"16-byte multiples) up to {max(PADDED_DIMS)} (wgmma's widest N)")
    if dataclasses.replace(c, prefetch_terms=True, overlap_softmax=None) not in CONFIGS:
        raise ClusterError(f"{c}: registers are checked to fit without spills only for {CONFIGS}")
    D, DV = padded_dim(shape.dim), padded_dim(shape.v_dim)
    accumulators = c.row_blocks * (DV + c.block_n) // 2  # S and O of a thread's rows
    if accumulators > _MAX_ACCUMULATORS:
        raise ClusterError(f"{c} at head dim {DV}: {accumulators} fp32 accumulators a thread, "
                           f"more than the {_MAX_ACCUMULATORS} that fit without spills")
    if _shared_elements(D, DV, c) * 2 > _MAX_SHARED_BYTES:
        raise ClusterError(f"{c} at head dim {D}: {_shared_elements(D, DV, c) * 2} B of shared memory a CTA, more "
                           f"than the {_MAX_SHARED_BYTES} B of a Hopper CTA")


def _ctas(shape: AttentionShape, rows: int) -> int | None:
    """The kernel's CTAs at ``rows`` query rows each, one per head and row block (None where the
    heads or the query length are variables)."""
    if isinstance(shape.q_len, int) and isinstance(shape.heads, int):
        return shape.heads * -(-shape.q_len // rows)
    return None


def _one_wave(shape: AttentionShape, rows: int, hw: Hardware | None) -> bool:
    """Whether CTAs of ``rows`` query rows each fit one wave on ``hw``'s SMs."""
    ctas = _ctas(shape, rows)
    return ctas is not None and ctas <= (hw or load_hardware()).sm_count


def _last_wave_fill(ctas: int, slots: int) -> float:
    """How full the waves of ``ctas`` CTAs over ``slots`` resident at once are, on average."""
    return ctas / slots / -(-ctas // slots)


def _fills_fewer_waves(shape: AttentionShape, hw: Hardware | None) -> bool:
    """Whether CTAs of 128 query rows one an SM (two warpgroups) fill their waves better, by
    :data:`_WAVE_FILL_MARGIN`, than two an SM (one warpgroup of two row blocks): 28 heads of 4096
    queries are 896 CTAs, 3.4 waves of two an SM against 6.8 of one (H100: 462 against 501 us,
    bench/results/archive/attention_overlap_h100_s102.json)."""
    ctas, sms = _ctas(shape, 128), (hw or load_hardware()).sm_count
    return bool(ctas) and _last_wave_fill(ctas, sms) > _last_wave_fill(ctas, 2 * sms) + _WAVE_FILL_MARGIN


def default_config(shape: AttentionShape, hw: Hardware | None = None) -> AttentionConfig:
    """At head dim 64, one warpgroup of 64 query rows per CTA, with 128-key tiles from 1024
    keys (half the steps) and 64-key tiles below (and for a symbolic length). At head dims 80-128
    (a key/value tile is twice the bytes) two 64-row blocks share each 64-key tile: in one
    warpgroup without the mask, in two with it (the first stops at its own diagonal); but two
    warpgroups share 128-key tiles where the CTAs of 128 query rows are one wave on ``hw``'s SMs
    (a CTA an SM: two warpgroups give it 8 warps where one warpgroup of two row blocks gives it
    4) and, with the mask, from 2048 keys (half the steps of the long rows); without it, also
    where those CTAs fill their waves better (:func:`_fills_fewer_waves`). Wider heads: two
    warpgroups of one row block each share the 64-key tiles (two row blocks a warpgroup would
    spill), but one warpgroup a CTA where the CTAs of 64 query rows are one wave (head dim 256
    on the H200, with and without score terms: 1.08-1.43x faster at 64-128 CTAs, 1.0-1.43x
    slower at 512; bench/results/archive/attention_d256_warpgroups_s81.json). Measured through
    the compile path a user's ``tvm.compile`` takes (docs/attention.md);
    the head-dim 80-128 choice on the H200, every candidate beside SDPA at the 32 real-model
    shapes of those head dims (bench/results/archive/attention_configs_real_shapes_s58.json).
    Score terms reading a tensor at each key (a bias) keep 64-key tiles at head dim 64: their
    elements, loaded while the scores' MMA runs, then take half the registers (H32 S1024 D64
    with a bias [S, S] 51.4 us against 79.1 on 128-key tiles, H200,
    bench/results/archive/attention_terms_prefetch_s68.json). Where v's head dim differs from
    q's, the wider one decides; but where v is the narrower (DeepSeek's latent attention: 192 and
    128) two warpgroups share 128-key tiles, which fit there: on the H200 at four MLA prefill
    shapes (16 and 128 heads, 1024-4096 keys, causal or not) 1.10-1.19x faster than any other
    configuration (bench/results/archive/attention_mla_configs_s84.json)."""
    width = padded_dim(max(shape.dim, shape.v_dim))
    if shape.v_dim < shape.dim and passes(check_config, shape, AttentionConfig(128, warpgroups=2)):
        return AttentionConfig(128, warpgroups=2)
    if width > 128:
        return AttentionConfig(64) if _one_wave(shape, 64, hw) else AttentionConfig(64, warpgroups=2)
    if width == 128:
        one_wave = _one_wave(shape, 128, hw)
        long_causal = shape.causal and isinstance(shape.kv_len, int) and shape.kv_len >= _LONG_CAUSAL_KEYS
        if one_wave or long_causal or (not shape.causal and _fills_fewer_waves(shape, hw)):
            return AttentionConfig(128, warpgroups=2)
        return AttentionConfig(64, warpgroups=2) if shape.causal else AttentionConfig(64, row_blocks=2)
    reads_tensors = shape.terms is not None and bool(shape.terms.tensor_loads())
    long = isinstance(shape.kv_len, int) and shape.kv_len >= 1024
    return AttentionConfig(128 if long and not reads_tensors else 64)


def _check_terms_free_of_lengths(func: tirx.PrimFunc, variables: list, matched: tirx.PrimFunc,
                                 shape: AttentionShape) -> None:
    """ClusterError unless ``shape``'s score terms, row outputs and sink (read from ``matched``, the
    function at :data:`_MATCHED_LENGTHS`) are the same at other lengths: a mask written with the
    lengths (``t <= i + (Sk - Sq)``) would be read as its value at the matched ones."""
    other = func
    for var, value in zip(variables, _OTHER_LENGTHS):
        other = specialized(other, var, value)
    again = find_attention(other)

    def read(found: AttentionShape, source: tirx.PrimFunc) -> list:
        own = list(zip(source.params, func.params))
        terms = found.terms
        parts = [] if terms is None else [terms.value, terms.mask, terms.fill]
        parts += [x for r in found.row_outputs for x in (r.indices, r.value)]
        parts += [] if found.sink is None else [found.sink.value]
        return [substitute(x, own) if x is not None and not isinstance(x, float) else x for x in parts]

    first, second = read(shape, matched), read(again, other)
    if len(first) != len(second) or not all(
            a == b if isinstance(a, float) or a is None else tvm_ffi.structural_equal(a, b, map_free_vars=True)
            for a, b in zip(first, second)):
        raise ClusterError(f"attention over symbolic extents: its score terms or mask depend on the lengths "
                           f"{[v.name for v in variables]} (read at one length, they would hold at that one only)")


class AttentionTemplate(KernelTemplate):
    """The attention kernel of an unfused attention (:func:`find_attention`), for sm_90a."""

    def find(self, func: tirx.PrimFunc) -> AttentionShape:
        """:func:`find_attention`'s shape; where extents are variables (one for the query and
        key positions, as a model of any prompt length has it, or one for each; a batch), the
        shape of the function at :data:`_MATCHED_LENGTHS` (its layouts, scale and mask do not
        depend on them) with the variables as its lengths and head extents."""
        variables = extent_variables(func)
        if not variables:
            return find_attention(func)
        if len(variables) > len(_MATCHED_LENGTHS):
            raise ClusterError(f"attention takes a query length, a key length and a batch; got symbolic "
                               f"{[v.name for v in variables]}")
        matched, matched_at = func, {}
        for var, value in zip(variables, _MATCHED_LENGTHS):
            matched = specialized(matched, var, value)
            matched_at[var.name] = value
        shape = find_attention(matched)
        if shape.terms is not None or shape.row_outputs or shape.sink is not None:
            _check_terms_free_of_lengths(func, variables, matched, shape)
        seq = {"q_len": [], "kv_len": []}
        heads: dict[int, tirx.PrimExpr] = {}  # a head variable's extent, where it is symbolic
        lengths_of = ("q_len", "kv_len", "kv_len", "q_len")  # q, k, v, out
        operands = [func.params[n] for n in shape.positions]
        for param, layout, length in zip(operands, shape.layouts, lengths_of, strict=True):
            # an outer head axis (no modulus): its variable counts extent x divisor values (a
            # batch, or batch and heads flattened into one variable, read as var // heads)
            outer = {axis.axis: axis for axis in layout.heads if axis.var is not None and not axis.modulus}
            for n, extent in enumerate(param.ty.shape):
                if not isinstance(extent, tirx.Var) or n == layout.seq:
                    continue
                axis = outer.get(n)
                values = extent * axis.divisor if axis is not None else None
                if (axis is None or not tvm_ffi.structural_equal(heads.setdefault(axis.var, values), values)
                        # the rows run over every value the tensor holds there (not a constant few)
                        or shape.head_extents[axis.var] != matched_at[extent.name] * axis.divisor):
                    raise ClusterError(f"attention over symbolic extents: they must be the sequence lengths of q, "
                                       f"k, v and the output, or an outer head axis (a batch) all four index "
                                       f"alike; {param.name} has {extent.name} at axis {n}")
            seq[length].append(param.ty.shape[layout.seq])
        for length, extents in seq.items():
            if not all(tvm_ffi.structural_equal(extent, extents[0]) for extent in extents):
                raise ClusterError(f"attention's {length} differs between its operands: {extents}")
        q_len, kv_len = (e if isinstance(e, tirx.Var) else int(e) for e in (seq["q_len"][0], seq["kv_len"][0]))
        head_extents = tuple(heads.get(n, extent) for n, extent in enumerate(shape.head_extents))
        # the other inputs and outputs the terms and row outputs read: the function's own
        own = list(zip(matched.params, func.params))
        terms = shape.terms and dataclasses.replace(
            shape.terms, value=substitute(shape.terms.value, own),
            mask=None if shape.terms.mask is None else substitute(shape.terms.mask, own),
            fill=shape.terms.fill if isinstance(shape.terms.fill, float) else substitute(shape.terms.fill, own))
        row_outputs = tuple(dataclasses.replace(r, buffer=substitute(r.buffer, own)) for r in shape.row_outputs)
        sink = shape.sink and dataclasses.replace(shape.sink, value=substitute(shape.sink.value, own))
        return dataclasses.replace(shape, heads=math.prod(head_extents) if heads else shape.heads, q_len=q_len,
                                   kv_len=kv_len, head_extents=head_extents, params=tuple(func.params), terms=terms,
                                   row_outputs=row_outputs, sink=sink)

    def configs(self, shape: AttentionShape) -> list[AttentionConfig]:
        """:data:`CONFIGS` that fit the head dim."""
        fits = []
        for config in CONFIGS:
            try:
                check_config(shape, config)
            except ClusterError as err:
                refusal = err
                continue
            fits.append(config)
        if not fits:
            raise refusal
        return fits

    def default_config(self, shape: AttentionShape, hw: Hardware | None = None) -> AttentionConfig:
        return default_config(shape, hw)

    def check(self, shape: AttentionShape, config: AttentionConfig) -> None:
        check_config(shape, config)

    def kernel(self, shape: AttentionShape, config: AttentionConfig) -> tirx.PrimFunc:
        return attention_kernel(shape, config)


TEMPLATE = AttentionTemplate()
#: The fused kernel of a function (an unfused attention), in a configuration or the default's.
fuse_attention = TEMPLATE.fuse


def prefetches_terms(shape: AttentionShape, c: AttentionConfig) -> bool:
    """Whether the kernel loads its score terms' tensor elements (a bias, a mask) into registers
    while the scores' MMA runs, rather than after it: where it reads any, and a register each
    fits beside the S and O accumulators within :data:`_MAX_ACCUMULATORS`."""
    if not c.prefetch_terms or shape.terms is None or not shape.terms.tensor_loads():
        return False
    scores = c.row_blocks * c.block_n // 16 * 8
    values = c.row_blocks * padded_dim(shape.v_dim) // 16 * 8
    return scores * (1 + len(shape.terms.tensor_loads())) + values <= _MAX_ACCUMULATORS


def overlaps_softmax(shape: AttentionShape, c: AttentionConfig) -> bool:
    """Whether a key tile's softmax runs while the previous tile's P V does (both MMAs in flight
    at once, so a thread holds S, P and O together): ``c.overlap_softmax``, or by default with one
    warpgroup of one row block a CTA where those registers stay within
    :data:`_OVERLAPPED_ACCUMULATORS` (H100, 20 real-model forms: one row block of 128-key tiles
    3-11% faster overlapped; two row blocks 2-7% slower, each block's MMAs a group of their own,
    so the wait for the second block's scores also waits for the first block's P V;
    bench/results/archive/attention_overlap_h100_s102.json). Two warpgroups keep to 128
    registers a thread so that two CTAs share an SM."""
    if c.overlap_softmax is not None:
        return c.overlap_softmax
    scores, outputs = c.block_n // 2, padded_dim(shape.v_dim) // 2
    return (c.warpgroups == 1 and c.row_blocks == 1
            and scores + scores // 2 + outputs <= _OVERLAPPED_ACCUMULATORS)


def _reg(block: int, frags: int, fragment, half, e):
    """A thread's register of accumulator fragment ``fragment`` (16 columns) of 64-row block
    ``block``: row half ``half`` (rows lane/4 and lane/4 + 8 of the warp's 16), element ``e`` of
    its 4 columns (2 * (lane % 4) + {0, 1, 8, 9})."""
    return (block * frags + fragment) * 8 + e // 2 * 4 + half * 2 + e % 2


def _column(fragment, e, lane):
    return fragment * 16 + e // 2 * 8 + lane % 4 * 2 + e % 2


def _helpers(shape: AttentionShape, c: AttentionConfig) -> dict[str, tuple[str, str]]:
    """The warpgroup-MMA helpers the kernel calls, {role: (name, CUDA)}: ``scores`` issues
    S = Q K^T (A and B K-major, 16 columns a step, the first step overwriting S), ``values``
    issues O += P V (P from registers, V MN-major, 16 keys a step), ``wait_scores`` and
    ``wait_output`` wait for them (``wait_scores_behind``: for the scores, while the P V issued
    after them runs on)."""
    D, DV, BN, BM, dtype = padded_dim(shape.dim), padded_dim(shape.v_dim), c.block_n, c.block_m, shape.dtype
    steps = _PANEL // 16
    kind = "" if dtype == "float16" else "_bf16"
    scores, values = f"tvm_dsm_attention_scores_m{BM}n{BN}d{D}{kind}", f"tvm_dsm_attention_values_n{BN}d{DV}{kind}"
    # Descriptors are formed once per call; a K step adds its byte offset / 16 to the start
    # address field (shared addresses stay below 2^18 bytes, so the field cannot carry over).
    k_step = f"((k / {steps}) * {{panel}} + (k % {steps}) * 32) / 16"
    scores_step = mma_async_source(BN, dtype, accumulate="k",
                                   a=f"a_desc + {k_step.format(panel=BM * _ROW_BYTES)}",
                                   b=f"b_desc + {k_step.format(panel=BN * _ROW_BYTES)}")
    values_step = mma_async_source(DV, dtype, b_transposed=True,
                                   b=f"b_desc + k * {16 * _ROW_BYTES // 16}")

    def issue(name, step, steps, a_setup, b_lead):
        b_setup = (f"  uint64_t b_desc = {name}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(b)), "
                   f"{b_lead}, {_ATOM_BYTES});")
        return call_source(name, _PAIRS[dtype][0], f"  {a_setup}\n{b_setup}", steps, step)

    waits = {role: (f"tvm_dsm_attention_wait{regs}_{pending}",
                    wait_source(f"tvm_dsm_attention_wait{regs}_{pending}", regs, pending))
             for role, regs, pending in (("wait_scores", BN // 2, 0), ("wait_scores_behind", BN // 2, 1),
                                         ("wait_output", DV // 2, 0))}
    return {
        "pack": _pack(dtype),
        "scores": (scores, issue(scores, scores_step, D // 16, f"uint64_t a_desc = {scores}_desc("
                                 f"static_cast<uint32_t>(__cvta_generic_to_shared(a)), 16, {_ATOM_BYTES});", 16)),
        "values": (values, issue(values, values_step, BN // 16,
                                 "const uint32_t* a32 = reinterpret_cast<const uint32_t*>(a);", BN * _ROW_BYTES)),
        **waits,
    }


def operand_shape(shape: AttentionShape, layout: OperandLayout, length: int, dim: int) -> list[int]:
    """The buffer shape of an operand with ``layout``, ``length`` positions and head dim ``dim``."""
    dims = [0] * (len(layout.heads) + 2)
    dims[layout.dim], dims[layout.seq] = dim, length
    for axis in layout.heads:
        dims[axis.axis] = axis.extent or axis.reached(shape.head_extents)
    return dims


def _head_values(head, extents: tuple[int, ...]) -> list:
    """The head variables' values of flat query head ``head`` (row-major over ``extents``)."""
    if len(extents) == 1:
        return [head]
    return [head // math.prod(extents[n + 1:]) if n == 0 else head // math.prod(extents[n + 1:]) % extent
            for n, extent in enumerate(extents)]


def _head_coordinates(layout: OperandLayout, values: list) -> list:
    """A copy's coordinates along ``layout``'s head axes, in the tensor map's order."""
    coordinates = []
    for axis in layout.heads:
        if axis.var is None:
            coordinates.append(axis.offset)
            continue
        x = values[axis.var]
        x = x // axis.divisor if axis.divisor > 1 else x
        x = x % axis.modulus if axis.modulus else x
        coordinates.append(x + axis.offset if axis.offset else x)
    return coordinates


@dataclass(frozen=True)
class RaggedSequences:
    """Attention over a batch of sequences packed end to end, as ``nn.llm``'s ragged prefill
    holds them: q and out ``[tokens, heads, dim]``, k and v ``[keys, kv_heads, dim]``, sequence
    ``b`` at rows ``q_indptr[b]:q_indptr[b + 1]`` and ``kv_indptr[b]:kv_indptr[b + 1]``; the
    scale and causality are arguments, causal aligning each sequence's last query with its last
    key. The kernel also writes each row's log-sum-exp (base 2, as ``nn.llm``'s merge reads it)."""

    heads: int
    kv_heads: int
    dim: int
    dtype: str

    def shape(self) -> AttentionShape:
        """The layouts of the packed operands (one head axis, grouped on k and v)."""
        group = self.heads // self.kv_heads
        rows = OperandLayout(dim=2, seq=0, heads=(HeadAxis(axis=1, var=0),))
        keys = OperandLayout(dim=2, seq=0, heads=(HeadAxis(axis=1, var=0, divisor=group),))
        return AttentionShape(self.heads, 0, 0, self.dim, 1.0, True, self.dtype, (self.heads,),
                              (rows, keys, keys, rows))


def attention_kernel(shape: AttentionShape, c: AttentionConfig, ragged: RaggedSequences | None = None) -> tirx.PrimFunc:
    """The fused loop over key tiles (see the module docstring) as one CUDA kernel's TIR; with
    ``ragged``, over packed sequences with ``nn.llm``'s ragged-prefill parameters (see
    :class:`RaggedSequences`): a CTA finds its sequence and query tile by walking ``q_indptr``,
    and stores its rows and their log-sum-exp directly, only those of its own sequence."""
    if ragged is not None:
        shape = ragged.shape()
    D, DV, dtype = padded_dim(shape.dim), padded_dim(shape.v_dim), shape.dtype
    symbolic = not isinstance(shape.q_len, int)  # the query length a variable (AttentionTemplate.find)
    # a batch, query and key length that are variables (AttentionTemplate.find), indexed in int32
    H, N, KV = (n if isinstance(n, int) else T.Cast("int32", n) for n in (shape.heads, shape.q_len, shape.kv_len))
    BM, BN, RB, WG = c.block_m, c.block_n, c.row_blocks, c.warpgroups
    QT, NT = -(-N // BM), -(-KV // BN)  # a tail tile's rows past the end: TMA zero-fills and clips them
    NF, DF = BN // 16, DV // 16  # 16-column fragments of a row block's S and O
    SN, ON = RB * NF * 8, RB * DF * 8  # per-thread fp32 registers of S and O
    K_AT, V_AT = BM * D, BM * D + 2 * BN * D  # element offsets of the K and V slots
    SMEM = _shared_elements(D, DV, c)
    log2e = 1.0 / math.log(2.0)
    # key_tail: the last key tile may run past the keys
    is_ragged, is_causal = ragged is not None, shape.causal
    key_tail = not isinstance(KV, int) or KV % BN != 0
    overlapped = overlaps_softmax(shape, c)  # tile t's softmax runs while tile t - 1's P V does
    h = _helpers(shape, c)

    def fix(old, new):
        return ToTIR({"y0_old": old, "y0_new": new}, "float32")(_CORRECTION)

    def call(role, *args):
        name, source = h[role]
        return T.cuda.func_call(name, *args, source_code=source)

    def row_values(buf, r, half):  # a row's scores held by this thread
        return [buf[_reg(r, NF, f, half, e)] for f in range(NF) for e in range(4)]

    def quad(op, value):  # combine the 4 lanes holding one row
        return shuffle_reduce(op, value, 4)

    def tiles_before(row_end):  # key tiles that rows below ``row_end`` see
        return T.min((row_end + BN - 1) // BN, NT) if is_causal else NT

    def ragged_tiles_before(row_end, seq, causal):  # the same in a packed sequence
        keys = seq[_KV_LEN]
        seen = T.min(T.max(row_end + keys - seq[_Q_LEN], 0), keys)
        return (T.if_then_else(causal != 0, seen, keys) + BN - 1) // BN

    def barrier(bars, i):
        return T.cuda.cvta_generic_to_shared(bars.access_ptr("r")) + T.uint32(8) * T.Cast("uint32", i)

    def copied_bytes(names):
        return sum(tile_bytes[name] for name in names)  # "kv": both tiles

    def tile_barrier(bars, name, tile):  # barriers: K's two slots, Q, V's two slots
        return barrier(bars, tile % 2 + (0 if name == "k" else _V_BARRIER))

    def wait_tile(bars, name, tile):  # the copy into a slot completes phase 0, the next one phase 1, ...
        return T.evaluate(T.cuda.mbarrier_wait(tile_barrier(bars, name, tile), tile // 2 % 2))

    def smem_at(smem, elem):  # shared address of element ``elem``
        return T.cuda.cvta_generic_to_shared(smem.access_ptr("r")) + T.Cast("uint32", elem * 2)

    names = ("q", "k", "v", "out")
    layouts = dict(zip(names, shape.layouts))
    lengths = {"q": shape.q_len, "k": shape.kv_len, "v": shape.kv_len, "out": shape.q_len}
    dims = {"q": shape.dim, "k": shape.dim, "v": shape.v_dim, "out": shape.v_dim}
    shapes = {name: operand_shape(shape, layouts[name], lengths[name], dims[name]) for name in names}
    maps = {name: tirx.Var(f"{name}_tensormap", T.handle("tensormap").ty) for name in names}
    tile_bytes = {"q": BM * D * 2, "k": BN * D * 2, "v": BN * DV * 2}  # whole boxes: TMA counts zero-filled bytes too

    def coordinates(name, panel, row, heads):
        """A TMA copy's coordinates in the tensor map's order: column, position, head axes."""
        return [T.Cast("int32", panel * _PANEL), T.Cast("int32", row),
                *(T.Cast("int32", x) for x in _head_coordinates(layouts[name], heads))]

    def copy(name, panel, dst, row, heads, barrier):
        """The TMA copy of 64-column panel ``panel`` of a tile to shared address ``dst``."""
        rows = BM if name == "q" else BN
        return T.ptx[f"cp.async.bulk.tensor.{len(shapes[name])}d.shared::cluster.global.mbarrier::complete_tx::bytes"](
            dst + T.Cast("uint32", panel * rows * _PANEL * 2), T.address_of(maps[name]),
            *coordinates(name, panel, row, heads), barrier)

    terms = shape.terms
    row_tail = not isinstance(N, int) or N % BM != 0
    # The terms' tensor elements (a bias, a mask) are loaded while the scores' MMA runs, where
    # their registers fit beside the accumulators (:func:`prefetches_terms`).
    prefetched = terms.tensor_loads() if terms is not None and prefetches_terms(shape, c) else []
    prefetching = bool(prefetched)

    def in_bounds(row, key):
        """The condition of a key inside the queries and keys (None where no tile has a tail):
        past them the terms must not read the other inputs' rows."""
        bounds = [cond for cond, tail in ((row < N, row_tail), (key < KV, key_tail)) if tail]
        return functools.reduce(tirx.And, bounds) if bounds else None

    def exponent(score, row, key, heads, pre=None, reg=None):
        """A key's exponent (:class:`ScoreTerms`), its tensor elements read from ``pre`` at
        ``reg`` where they were prefetched; -inf past the queries and keys."""
        loaded = ([T.Cast(str(ld.ty.dtype), pre[n * SN + reg]) for n, ld in enumerate(prefetched)]
                  if prefetched else None)
        value = terms.at(score, row, key, heads, loaded)
        inside = in_bounds(row, key)
        return value if inside is None else T.if_then_else(inside, value, T.float32(float("-inf")))

    def prefetch(pre, r, half, nf, e, lane, t, row, heads):
        """Each prefetched element at the key of row block ``r``, half ``half``, fragment ``nf``,
        element ``e`` of row ``row`` into its register of ``pre`` (0 past the queries and keys)."""
        key = t * BN + _column(nf, e, lane)
        inside = in_bounds(row, key)
        for n, load in enumerate(prefetched):
            value = T.Cast("float32", terms.load_at(load, row, key, heads))
            T.buffer_store(pre, value if inside is None else T.if_then_else(inside, value, T.float32(0)),
                           [n * SN + _reg(r, NF, nf, half, e)])

    # The running max's start: below every exponent a key may have, the terms' fill included (a
    # row that fill empties then weighs its keys alike, as the function does).
    finite_fill = terms is not None and isinstance(terms.fill, float) and math.isfinite(terms.fill)
    start = min(_NEG, terms.fill) if finite_fill else _NEG

    row_output = shape.row_outputs[0] if shape.row_outputs else None
    sink = shape.sink

    def power(score, row_max, scale_log2e):
        """The base-2 exponent of a key's weight: one multiply-add of the scaled score; with
        score terms, the difference taken first (a fill of fp32's lowest value against a row
        max still at its start would overflow as ``score * log2 e``)."""
        if terms is None:
            return score * scale_log2e - row_max * T.float32(log2e)
        return (score - row_max) * T.float32(log2e)

    @T.macro
    def score_terms(s, pre, r, half, lane, t, row, heads):
        """Row block ``r``'s half ``half`` of the scores replaced by their exponents."""
        for nf in T.unroll(NF):
            for e in T.unroll(4):
                s[_reg(r, NF, nf, half, e)] = exponent(s[_reg(r, NF, nf, half, e)], row, t * BN + _column(nf, e, lane),
                                                       heads, pre, _reg(r, NF, nf, half, e))

    @T.macro
    def prefetch_terms(pre, lane, t, qt, block0, warp, heads):
        """The terms' tensor elements of the tile's keys, for every row this thread holds."""
        for r in T.unroll(RB):
            for half in T.unroll(2):
                for nf in T.unroll(NF):
                    for e in T.unroll(4):
                        prefetch(pre, r, half, nf, e, lane, t,
                                 qt * BM + (block0 + r) * WARPGROUP_ROWS + warp * 16 + lane // 4 + half * 8, heads)

    @T.macro
    def copy_panels(smem, base, kv_row0, heads, tile, name, bar):
        at = T.meta_var(K_AT if name == "k" else V_AT)
        dim = T.meta_var(D if name == "k" else DV)
        for panel in T.unroll(dim // _PANEL):
            T.evaluate(copy(name, panel, smem_at(smem, base + at + tile % 2 * BN * dim), kv_row0 + tile * BN,
                            heads, bar))

    @T.macro
    def load_tile(smem, bars, base, kv_row0, heads, tile, names):
        """Key tile ``tile``'s panels of ``names`` ("k", "v" or "kv") into their slots (``tile % 2``):
        one thread issues the copies; they complete on the first one's slot barrier
        (:func:`tile_barrier`)."""
        T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(tile_barrier(bars, names[0], tile),
                                                         T.uint32(copied_bytes(names)))
        if "k" in names:
            copy_panels(smem, base, kv_row0, heads, tile, "k", tile_barrier(bars, names[0], tile))
        if "v" in names:
            copy_panels(smem, base, kv_row0, heads, tile, "v", tile_barrier(bars, names[0], tile))

    @T.macro
    def values(smem, bars, base, o, p, t):
        """O += P V of key tile ``t``, issued once its V tile has arrived (with its K tile, unless
        overlapped)."""
        if overlapped:
            wait_tile(bars, "v", t)
        for r in T.unroll(RB):
            T.evaluate(call("values", T.address_of(o[r * DF * 8]), T.address_of(p[r * NF * 8]),
                            T.address_of(smem[base + V_AT + t % 2 * BN * DV])))

    @T.macro
    def rescale(o, fixed, r, half):
        """Row block ``r``'s half ``half`` of O rescaled to the new row maxima."""
        for df in T.unroll(DF):
            for e in T.unroll(4):
                o[_reg(r, DF, df, half, e)] = o[_reg(r, DF, df, half, e)] * fixed[r * 2 + half]

    @T.macro
    def pack(s, p, r, half, nf):
        """Fragment ``nf`` of row block ``r``'s half ``half`` of P, rounded in pairs from S."""
        for e in T.unroll(0, 4, step=2):  # registers e and e + 1 are adjacent
            T.evaluate(call("pack", p.access_ptr("w", offset=_reg(r, NF, nf, half, e), extent=2),
                            s[_reg(r, NF, nf, half, e)], s[_reg(r, NF, nf, half, e + 1)]))

    @T.macro
    def key_mask(s, r, half, lane, t, keep):
        """Scores of keys ``keep`` rejects set to -inf, in row block ``r``'s half ``half``."""
        for nf in T.unroll(NF):
            for e in T.unroll(4):
                s[_reg(r, NF, nf, half, e)] = T.if_then_else(
                    keep(t * BN + _column(nf, e, lane)), s[_reg(r, NF, nf, half, e)], T.float32(float("-inf")))

    @T.macro
    def find_sequence(seq, bx, P):
        """``seq`` (positions :data:`_INDEX` to :data:`_KV_LEN`) of the sequence whose query tiles
        include tile ``bx`` of the batch's (counted sequence by sequence); its index is
        ``batch_size`` where none does (``P``: the ragged function's parameters)."""
        seq[_INDEX] = P.batch_size
        seq[_TILES_BEFORE] = 0
        for b in range(P.batch_size):
            if seq[_INDEX] == P.batch_size:
                seq[_TILES] = (P.q_indptr[b + 1] - P.q_indptr[b] + BM - 1) // BM
                if bx < seq[_TILES_BEFORE] + seq[_TILES]:
                    seq[_INDEX] = b
                    seq[_Q_TILE] = seq[_TILES] - 1 - (bx - seq[_TILES_BEFORE])  # the most keys first
                else:
                    seq[_TILES_BEFORE] = seq[_TILES_BEFORE] + seq[_TILES]
        if seq[_INDEX] < P.batch_size:
            seq[_Q_START] = P.q_indptr[seq[_INDEX]]
            seq[_Q_LEN] = P.q_indptr[seq[_INDEX] + 1] - P.q_indptr[seq[_INDEX]]
            seq[_KV_START] = P.kv_indptr[seq[_INDEX]]
            seq[_KV_LEN] = P.kv_indptr[seq[_INDEX] + 1] - P.kv_indptr[seq[_INDEX]]

    @T.macro
    def store_rows(o, l, m, fixed, block0, warp, lane, seq, qt, heads, P):
        """Packed sequences: O / l of this thread's rows of its sequence into ``output``, and
        their log-sum-exp (base 2) into ``lse``; a row that sees no key gets zeros and -inf."""
        for r in T.unroll(RB):
            for half in T.unroll(2):
                row = T.meta_var(qt * BM + (block0 + r) * WARPGROUP_ROWS + warp * 16 + lane // 4 + half * 8)
                fixed[0] = quad(operator.add, l[r * 2 + half])
                if row < seq[_Q_LEN]:
                    if lane % 4 == 0:
                        P.lse[seq[_Q_START] + row, heads[0]] = T.if_then_else(
                            fixed[0] > T.float32(0), m[r * 2 + half] * T.float32(log2e) + T.log2(fixed[0]),
                            T.float32(float("-inf")))
                    fixed[0] = T.if_then_else(fixed[0] > T.float32(0), T.float32(1) / fixed[0], T.float32(0))
                    for df in T.unroll(DF):
                        for e in T.unroll(0, 4, step=2):  # columns e and e + 1 are adjacent
                            if _column(df, e, lane) < shape.v_dim:
                                T.evaluate(call("pack", P.output.access_ptr(
                                    "w", offset=((seq[_Q_START] + row) * H + heads[0]) * shape.v_dim
                                    + _column(df, e, lane), extent=2),
                                    o[_reg(r, DF, df, half, e)] * fixed[0], o[_reg(r, DF, df, half, e + 1)] * fixed[0]))

    @T.macro
    def key_step(scope, t, first):
        """Key tile ``t`` of the CTA's (``first``: tile 0, with no P V before it); ``scope``: the
        buffers and values of :meth:`kernel` it reads, by name."""
        (smem, bars, s, p, o, m, l, new_max, fixed, pre, base, tx, heads, seq, P, qt, kv_row0, scale, scale_log2e,
         block0, warp, lane, tiles, own_tiles) = T.meta_var(_step_scope(scope))
        T.tvm_storage_sync("shared")  # every warp is done with K of tile t - 1 and V of t - 2
        if tx == 0:
            if overlapped:  # V of tile t, K of the next
                load_tile(smem, bars, base, kv_row0, heads, t, "v")
                if t + 1 < tiles:
                    load_tile(smem, bars, base, kv_row0, heads, t + 1, "k")
            elif t + 1 < tiles:
                load_tile(smem, bars, base, kv_row0, heads, t + 1, "kv")
        if t < own_tiles:  # causal: this warpgroup's rows see no key of a later tile
            wait_tile(bars, "k", t)  # (and V's, unless overlapped)
            for r in T.unroll(RB):
                T.evaluate(call("scores", T.address_of(s[r * NF * 8]),
                                T.address_of(smem[base + (block0 + r) * WARPGROUP_ROWS * _PANEL]),
                                T.address_of(smem[base + K_AT + t % 2 * BN * D])))
            if prefetching:
                prefetch_terms(pre, lane, t, qt, block0, warp, heads)
            if overlapped and not first:  # the previous tile's P V runs beside this tile's softmax
                values(smem, bars, base, o, p, t - 1)
                T.evaluate(call("wait_scores_behind", T.address_of(s[0])))
            else:
                T.evaluate(call("wait_scores", T.address_of(s[0])))
            for r in T.unroll(RB):
                for half in T.unroll(2):
                    row = T.meta_var(qt * BM + (block0 + r) * WARPGROUP_ROWS + warp * 16 + lane // 4 + half * 8)
                    if is_ragged:
                        # the sequence's keys, up to the row's own position when causal
                        last = T.meta_var(T.if_then_else(
                            P.causal != 0, row + seq[_KV_LEN] - seq[_Q_LEN],
                            seq[_KV_LEN] - 1))
                        keys = T.meta_var(seq[_KV_LEN])
                        if (t + 1) * BN > T.if_then_else(  # a diagonal tile, or one past the keys
                                P.causal != 0, T.min(qt * BM + keys - seq[_Q_LEN], keys), keys):
                            key_mask(s, r, half, lane, t, lambda key: tirx.And(key <= last, key < keys))
                    else:
                        if terms is not None:  # the mask, if any, is the terms' (causal: implied)
                            score_terms(s, pre, r, half, lane, t, row, heads)
                        elif is_causal:
                            if (t + 1) * BN > qt * BM:  # a diagonal tile
                                key_mask(s, r, half, lane, t, lambda key: key <= row)
                        if key_tail:
                            if t == NT - 1:  # the keys past the end, zero-filled
                                key_mask(s, r, half, lane, t, lambda key: key < KV)
                    new_max[0] = T.max(m[r * 2 + half], scale * quad(
                        tirx.max, tree_reduce(tirx.max, row_values(s, r, half))))
                    fixed[r * 2 + half] = fix(m[r * 2 + half], new_max[0])
                    m[r * 2 + half] = new_max[0]
                    if not overlapped:
                        rescale(o, fixed, r, half)
                    for nf in T.unroll(NF):
                        for e in T.unroll(4):
                            T.ptx["ex2.approx.ftz.f32"](
                                s[_reg(r, NF, nf, half, e)],
                                power(s[_reg(r, NF, nf, half, e)], new_max[0], scale_log2e))
                        if not overlapped:
                            pack(s, p, r, half, nf)
                    l[r * 2 + half] = (l[r * 2 + half] * fixed[r * 2 + half]
                                       + tree_reduce(operator.add, row_values(s, r, half)))
            if overlapped:  # O and P wait for the previous tile's P V
                if not first:
                    T.evaluate(call("wait_output", T.address_of(o[0])))
                for r in T.unroll(RB):
                    for half in T.unroll(2):
                        rescale(o, fixed, r, half)
                        for nf in T.unroll(NF):
                            pack(s, p, r, half, nf)
            if not overlapped:
                values(smem, bars, base, o, p, t)
                T.evaluate(call("wait_output", T.address_of(o[0])))
        elif overlapped and not first and t == own_tiles:  # causal: the warpgroup's last P V, on its last tile
            values(smem, bars, base, o, p, t - 1)
            T.evaluate(call("wait_output", T.address_of(o[0])))

    @T.macro
    def kernel(bx, tx, heads, seq, P):
        """One CTA's attention (``seq`` and ``P``: its packed sequence and the ragged function's
        parameters, or None)."""
        with T.sblock("attention"):
            T.reads()
            T.writes()
            smem = T.sblock_alloc_buffer((SMEM,), dtype, scope="shared.dyn")
            bars = T.sblock_alloc_buffer((_BARRIERS,), "uint64", scope="shared.dyn")
            s = T.sblock_alloc_buffer((SN,), "float32", scope="local")
            p = T.sblock_alloc_buffer((SN,), dtype, scope="local")
            o = T.sblock_alloc_buffer((ON,), "float32", scope="local")
            m = T.sblock_alloc_buffer((RB * 2,), "float32", scope="local")
            l = T.sblock_alloc_buffer((RB * 2,), "float32", scope="local")
            new_max = T.sblock_alloc_buffer((1,), "float32", scope="local")
            fixed = T.sblock_alloc_buffer((RB * 2,), "float32", scope="local")
            pre = T.sblock_alloc_buffer((max(1, SN * len(prefetched)),), "float32", scope="local")
            if is_ragged:
                qt = T.meta_var(seq[_Q_TILE])
                q_row0 = T.meta_var(seq[_Q_START])
                kv_row0 = T.meta_var(seq[_KV_START])
                scale = T.meta_var(P.sm_scale)
                scale_log2e = T.meta_var(P.sm_scale * T.float32(log2e))
            else:
                qt = T.meta_var(QT - 1 - bx % QT)  # causal: the CTAs with most tiles first
                q_row0 = T.meta_var(0)
                kv_row0 = T.meta_var(0)
                scale = T.meta_var(T.float32(shape.scale))
                scale_log2e = T.meta_var(T.float32(shape.scale * log2e))
            block0 = T.meta_var(tx // _WARPGROUP_THREADS * RB)  # the warpgroup's first row block
            warp = T.meta_var(tx % _WARPGROUP_THREADS // 32)
            lane = T.meta_var(tx % 32)
            base = T.int32((_ATOM_BYTES - T.Cast("int32", T.cuda.cvta_generic_to_shared(
                smem.access_ptr("r"))) % _ATOM_BYTES) % _ATOM_BYTES // 2)
            if is_ragged:
                tiles = T.meta_var(ragged_tiles_before(qt * BM + BM, seq, P.causal))  # the CTA's
                own_tiles = T.meta_var(ragged_tiles_before(qt * BM + (block0 + RB) * WARPGROUP_ROWS, seq, P.causal))
            else:
                tiles = T.meta_var(tiles_before(qt * BM + BM))  # the CTA's
                own_tiles = T.meta_var(tiles_before(qt * BM + (block0 + RB) * WARPGROUP_ROWS))
            if tx == 0:
                for i in T.unroll(_BARRIERS):
                    T.ptx.mbarrier.init.shared__cta.b64(barrier(bars, i), 1)
                T.ptx.fence.mbarrier_init.release.cluster()
            T.tvm_storage_sync("shared")
            if tx == 0:
                T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(barrier(bars, _Q_BARRIER), T.uint32(tile_bytes["q"]))
                for panel in T.unroll(D // _PANEL):
                    T.evaluate(copy("q", panel, smem_at(smem, base), q_row0 + qt * BM, heads,
                                    barrier(bars, _Q_BARRIER)))
                if 0 < tiles:  # (a packed sequence may have no keys: no copy left in flight at exit)
                    load_tile(smem, bars, base, kv_row0, heads, 0, "k" if overlapped else "kv")
            for i in T.unroll(ON):
                o[i] = T.float32(0)
            for i in T.unroll(RB * 2):
                if sink is None:
                    m[i] = T.float32(start)
                    l[i] = T.float32(0)
                else:  # the sink joins each row as a key of weight exp(logit - max): one quad lane holds it
                    m[i] = T.max(sink.at(heads), T.float32(start))  # a sink of -inf: the plain start
                    l[i] = T.if_then_else(lane % 4 == 0, T.exp(sink.at(heads) - m[i]), T.float32(0))
            T.evaluate(T.cuda.mbarrier_wait(barrier(bars, _Q_BARRIER), 0))
            scope = T.meta_var(SimpleNamespace(smem=smem, bars=bars, s=s, p=p, o=o, m=m, l=l, new_max=new_max,
                                               fixed=fixed, pre=pre, base=base, tx=tx, heads=heads, seq=seq, P=P,
                                               qt=qt, kv_row0=kv_row0, scale=scale, scale_log2e=scale_log2e,
                                               block0=block0, warp=warp, lane=lane, tiles=tiles, own_tiles=own_tiles))
            if overlapped:  # tile 0 apart: the steps after it always have a P V in flight
                if 0 < tiles:
                    key_step(scope, 0, True)
                for t in range(1, tiles):
                    key_step(scope, t, False)
            else:
                for t in range(tiles):
                    key_step(scope, t, False)
            if overlapped and 0 < own_tiles and own_tiles == tiles:
                values(smem, bars, base, o, p, tiles - 1)
                T.evaluate(call("wait_output", T.address_of(o[0])))
            if is_ragged:
                store_rows(o, l, m, fixed, block0, warp, lane, seq, qt, heads, P)
            else:
                if row_output is not None:
                    for r in T.unroll(RB):
                        for half in T.unroll(2):
                            row = T.meta_var(qt * BM + (block0 + r) * WARPGROUP_ROWS + warp * 16 + lane // 4 + half * 8)
                            fixed[0] = quad(operator.add, l[r * 2 + half])
                            if lane % 4 == 0 and row < N:
                                T.buffer_store(row_output.buffer,
                                               row_output.value_of(T.log(fixed[0]) + m[r * 2 + half]),
                                               row_output.indices_at(row, heads))
                # O / l into Q's slot, laid out as TMA lands Q (64-column panels, 16-byte
                # chunk c of row r at c ^ (r % 8)), then one TMA store per panel.
                T.tvm_storage_sync("shared")  # every warp is done reading Q, K and V
                for r in T.unroll(RB):
                    for half in T.unroll(2):
                        fixed[0] = T.float32(1) / quad(operator.add, l[r * 2 + half])
                        row = T.meta_var((block0 + r) * WARPGROUP_ROWS + warp * 16 + lane // 4 + half * 8)
                        for df in T.unroll(DF):
                            for e in T.unroll(0, 4, step=2):  # columns e and e + 1 are adjacent
                                col = T.meta_var(_column(df, e, lane))
                                chunk = T.meta_var(col % _PANEL // 8)  # 16-byte chunk of the panel row
                                T.evaluate(call("pack", smem.access_ptr("w", offset=base + col // _PANEL * BM * _PANEL
                                                + row * _PANEL + T.bitwise_xor(chunk, row % 8) * 8
                                                + col % 8, extent=2),
                                                o[_reg(r, DF, df, half, e)] * fixed[0],
                                                o[_reg(r, DF, df, half, e + 1)] * fixed[0]))
                T.ptx.fence.proxy.async_.shared__cta()  # the stores above, before the copy engine reads
                T.tvm_storage_sync("shared")
                if tx == 0:
                    for panel in T.unroll(DV // _PANEL):
                        T.ptx[f"cp.async.bulk.tensor.{len(shapes['out'])}d.global.shared::cta.bulk_group"](
                            T.address_of(maps["out"]), *coordinates("out", panel, qt * BM, heads),
                            smem_at(smem, base + panel * BM * _PANEL))
                    T.ptx["cp.async.bulk.commit_group"]()
                    T.ptx["cp.async.bulk.wait_group.read"](0)  # the slot stays until the copy has read it

    # (A quoted name in a T.Buffer annotation would declare a variable: the shapes by name.)
    q_shape, k_shape, v_shape, out_shape = (shapes[name] for name in names)

    if is_ragged:
        KVH, DIM = ragged.kv_heads, shape.dim

        @T.prim_func(s_tir=True, check_well_formed=False)
        def fused(var_q: T.handle, var_q_indptr: T.handle, var_k: T.handle, var_v: T.handle,
                  var_kv_indptr: T.handle, var_q_rope_position: T.handle, var_k_rope_pos_offset: T.handle,
                  var_output: T.handle, var_lse: T.handle, causal: T.int32, rotary_mode: T.int32,
                  rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32):
            T.func_attr({"tirx.noalias": True})
            batch_size, qo_len, kv_len = T.int32(), T.int32(), T.int32()
            q_indptr_elem_offset, kv_indptr_elem_offset = T.int32(), T.int32()
            q_rope_position_elem_offset, k_rope_pos_offset_elem_offset = T.int32(), T.int32()
            q = T.match_buffer(var_q, (qo_len, H, DIM), dtype)
            q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
            k = T.match_buffer(var_k, (kv_len, KVH, DIM), dtype)
            v = T.match_buffer(var_v, (kv_len, KVH, DIM), dtype)
            kv_indptr = T.match_buffer(var_kv_indptr, (batch_size + 1,), "int32", elem_offset=kv_indptr_elem_offset)
            q_rope_position = T.match_buffer(var_q_rope_position, (qo_len,), "int32",
                                             elem_offset=q_rope_position_elem_offset)
            k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32",
                                               elem_offset=k_rope_pos_offset_elem_offset)
            output = T.match_buffer(var_output, (qo_len, H, DIM), dtype)
            lse = T.match_buffer(var_lse, (qo_len, H), "float32")
            for bx in T.thread_binding((qo_len + BM - 1) // BM + batch_size, thread="blockIdx.x"):
                for by in T.thread_binding(H, thread="blockIdx.y"):
                    for tx in T.thread_binding(_WARPGROUP_THREADS * WG, thread="threadIdx.x"):
                        with T.sblock("sequence"):
                            T.reads()
                            T.writes()
                            seq = T.sblock_alloc_buffer((_KV_LEN + 1,), "int32", scope="local")
                            find_sequence(seq, bx, _RaggedParams(q_indptr, kv_indptr, batch_size, causal, sm_scale, output, lse))
                            if seq[_INDEX] < batch_size:
                                kernel(bx, tx, [by], seq, _RaggedParams(q_indptr, kv_indptr, batch_size, causal, sm_scale, output, lse))

        sources = dict(zip(names, (fused.params[0], fused.params[2], fused.params[3], fused.params[7])))
    else:
        @T.prim_func(s_tir=True, check_well_formed=False)
        def fused(q: T.Buffer(q_shape, dtype), k: T.Buffer(k_shape, dtype),
                  v: T.Buffer(v_shape, dtype), out: T.Buffer(out_shape, dtype)):
            T.func_attr({"tirx.noalias": True})
            for bx in T.thread_binding(H * QT, thread="blockIdx.x"):
                for tx in T.thread_binding(_WARPGROUP_THREADS * WG, thread="threadIdx.x"):
                    kernel(bx, tx, _head_values(bx // QT, shape.head_extents), None, None)

        sources = dict(zip(names, fused.params))
    body = fused.body
    empty = [extent > 0 for extent in (N, H) if not isinstance(extent, int)]
    if empty:  # no launch of an empty grid (CUDA refuses one)
        body = tirx.IfThenElse(functools.reduce(tirx.And, empty), body, None)
    host = []
    for name in names:
        layout = layouts[name]
        host += [tirx.Bind(maps[name], T.tvm_stack_alloca("tensormap", 1)),
                 encode_tensor_map(maps[name], sources[name], BN if name in ("k", "v") else BM, _PANEL, layout.seq,
                                   [layout.dim, layout.seq, *(axis.axis for axis in layout.heads)])]
    body = tirx.SeqStmt([*host, body])
    if shape.params:  # the function's own parameters (see AttentionShape.params)
        operands = [shape.params[n] for n in shape.positions]
        return tirx.PrimFunc(list(shape.params), substitute(body, list(zip(fused.params, operands))),
                             attrs=fused.attrs)
    return fused.with_body(body)


@dataclass(frozen=True)
class _RaggedParams:
    """The ragged-prefill function's parameters the kernel reads (:class:`RaggedSequences`)."""

    q_indptr: tirx.Var
    kv_indptr: tirx.Var
    batch_size: tirx.Var
    causal: tirx.Var
    sm_scale: tirx.Var
    output: tirx.Var
    lse: tirx.Var


#: A packed sequence's values in a CTA's local buffer (:class:`RaggedSequences`), by position: its
#: index, the query tiles of the sequences before it and its own, the CTA's query tile (the most
#: keys first), where its queries and keys start, their counts.
_INDEX, _TILES_BEFORE, _TILES, _Q_TILE, _Q_START, _Q_LEN, _KV_START, _KV_LEN = range(8)
