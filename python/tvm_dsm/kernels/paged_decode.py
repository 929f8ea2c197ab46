"""Decode attention over ``nn.llm``'s paged KV cache on tvm-dsm's cluster decode kernel
(:mod:`tvm_dsm.kernels.decode_attention`).

``nn.llm``'s TIR decode kernel (``batch_decode_paged_kv``) runs one CTA per sequence and KV head:
at batch 1 with 8 KV heads that is 8 CTAs on 132 SMs, 24 us a layer at a context of 531 tokens
(H200) where its K and V take under a microsecond at HBM rate. This kernel keeps that function's
parameters, so the KV cache calls it unchanged, and changes how the work is spread: a cluster of
CTAs per (sequence, KV head), smaller clusters for larger batches (one kernel per range of batch
sizes, :func:`paged_decode_dispatch`). Its rows are looked up per token in the page table; it
writes the output and the log-sum-exp (base 2, as ``nn.llm``'s merge kernels read it).

It takes the cache whose RoPE is applied before K is appended (``rotary_mode == 0``); a call
with in-kernel RoPE stops with an error before launch. Sliding-window caches keep ``nn.llm``'s
kernel (:func:`find_paged_decode` does not match them).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.tirx.script.builder import ir as B

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import branch_on
from .decode_attention import (FILES, ROW_SLOTS, DecodeConfig, DecodeOperands, decode_kernel, most_ranks,
                               prefers_tensor_cores, wave_ctas, with_depth)

#: The function ``nn.llm`` builds for decode attention over its paged KV cache, and its
#: parameters in order.
SYMBOL = "batch_decode_paged_kv"
PARAMS = ("Q", "pages", "page_table_indptr", "page_table_values", "length_info",
          "k_rope_pos_offset", "q_rope_position", "output", "lse", "rotary_mode", "rope_scale",
          "rope_theta", "sm_scale")


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
    found = PagedDecode(func, qo_heads, kv_heads, head_dim, page_size, str(q.dtype))
    limits = [
        (two == 2 and pages_dim == head_dim and str(pages.dtype) == found.dtype, "pages [P, 2, Hkv, page, D] of Q's dtype"),
        (qo_heads % kv_heads == 0, "query heads a multiple of the KV heads"),
        *_PagedOperands(found).limits(),
    ]
    for ok, limit in limits:
        if not ok:
            raise ClusterError(f"paged decode: needs {limit}")
    return found


def default_ranks(found: PagedDecode, hw: Hardware) -> int:
    """CTAs per (sequence, KV head): enough for one sequence's KV heads to fill the SMs, within a
    portable cluster and the static shared memory of a CTA."""
    return most_ranks(_PagedOperands(found), found.kv_heads, hw)


def batch_configs(found: PagedDecode, hw: Hardware) -> list[tuple[int | None, DecodeConfig]]:
    """Kernel configurations by batch size, ``[(largest batch, config), ..., (None, config)]``:
    each batch in the most CTAs per (sequence, KV head) that keep its grid within
    :func:`~tvm_dsm.kernels.decode_attention.wave_ctas`, from :func:`default_ranks` down to 1;
    with the warps and register files
    :func:`~tvm_dsm.kernels.decode_attention.with_depth` gives the batch's grid (the key count is
    known only at run time). Neighbouring batches of one configuration are one range."""
    operands = _PagedOperands(found)
    tensor_cores = prefers_tensor_cores(operands)
    beyond = DecodeConfig(1, tensor_cores)  # the batches past every range
    bounds = [(wave_ctas(operands, hw, ranks, tensor_cores) // (found.kv_heads * ranks), ranks)
              for ranks in _halvings(default_ranks(found, hw))]
    ranges = []
    for batch in range(1, max(bound for bound, _ in bounds) + 1):
        ranks = next(ranks for bound, ranks in bounds if batch <= bound)
        config = with_depth(operands, DecodeConfig(ranks, tensor_cores), batch * found.kv_heads, hw)
        if ranges and ranges[-1][1] == config:
            ranges.pop()
        ranges.append((batch, config))
    while ranges and ranges[-1][1] == beyond:
        ranges.pop()
    return ranges + [(None, beyond)]


def _halvings(ranks: int) -> list[int]:
    """``ranks``, its half, ... down to 1."""
    return [ranks >> i for i in range(ranks.bit_length())]


def paged_decode_dispatch(found: PagedDecode, hw: Hardware) -> tirx.PrimFunc:
    """``found``'s function as one kernel per range of batch sizes (:func:`batch_configs`), the
    batch size tested on the host before each launch."""
    kernels = [(bound, paged_decode_kernel(found, config)) for bound, config in batch_configs(found, hw)]
    return kernels[-1][1].with_body(branch_on(found.func.params[0].ty.shape[0], kernels))


def paged_decode_kernel(found: PagedDecode, config: DecodeConfig | None = None) -> tirx.PrimFunc:
    """The decode kernel over ``found``'s paged cache in ``config`` (by default one CTA a
    (sequence, KV head), on tensor cores where
    :func:`~tvm_dsm.kernels.decode_attention.prefers_tensor_cores`), with ``found``'s parameters."""
    operands = _PagedOperands(found)
    config = config or DecodeConfig(1, prefers_tensor_cores(operands))
    params = list(found.func.params)
    pages_offset = params[PARAMS.index("pages")].ty.elem_offset
    body = decode_kernel(operands, config, SYMBOL, asserts=[
        (params[PARAMS.index("rotary_mode")] == 0,
         "tvm-dsm's paged decode attention takes K stored rotated (RoPE mode NORMAL or NONE), not RoPE "
         "applied in the kernel"),
        (tirx.floormod(pages_offset, operands.vector) == 0,
         "tvm-dsm's paged decode attention loads 16-byte pieces of the pages: their offset must be a "
         "multiple of 16 bytes"),
    ]).body
    attrs = {**dict(found.func.attrs), "tirx.noalias": True}
    return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))


class _PagedOperands(DecodeOperands):
    """The rows of ``nn.llm``'s cache: a pair is (sequence, KV head); a token's page is looked
    up in the sequence's page table."""

    #: The page tables are the cache's per-step arrays, which the host copies before the step.
    tables_ready = True

    def __init__(self, found: PagedDecode):
        self.found = found
        self.group, self.head_dim, self.dtype = found.group, found.head_dim, found.dtype
        (self.q, self.pages, self.indptr, self.values, self.length_info, _, _, self.output,
         self.lse, _, _, _, self.sm_scale) = found.func.params

    def pairs(self):
        return self.q.ty.shape[0] * self.found.kv_heads

    def begin(self, pair) -> None:
        self.seq, self.head = pair // self.found.kv_heads, pair % self.found.kv_heads
        # the page table's start, once; the pages of each register file's step
        self.first_page = B.sblock_alloc_buffer((1,), "int32", scope="local")
        self.page = B.sblock_alloc_buffer((max(FILES) * ROW_SLOTS,), "int32", scope="local")
        B.buffer_store(self.first_page, self.indptr[self.seq], [0])

    def length(self):
        begin, end = self.indptr[self.seq], self.indptr[self.seq + 1]
        return T.if_then_else(begin != end, (end - begin - 1) * self.found.page_size + self.length_info[self.seq], 0)

    def query(self, h, column):
        return self.q[self.seq, self.head * self.group + h, column]

    def scale(self):
        return self.sm_scale

    def before_loads(self, slot: int, token) -> None:
        B.buffer_store(self.page, self.values[self.first_page[0] + token // self.found.page_size], [slot])

    def prefetch_rows(self, tx, begin, end) -> None:
        """Thread ``tx`` prefetches page ``tx // 2`` of those holding tokens ``begin`` to
        ``end``: its K rows of the pair's head (``tx`` even) or its V rows, contiguous."""
        f = self.found
        first = begin // f.page_size
        with B.If(tx < ((end - 1) // f.page_size + 1 - first) * 2):
            with B.Then():
                page = self.values[self.first_page[0] + first + tx // 2]
                rows = f.page_size * f.head_dim
                start = ((page * 2 + tx % 2) * f.kv_heads + self.head) * rows
                nbytes = rows * tvm.DataType(f.dtype).bits // 8
                B.evaluate(T.ptx["cp.async.bulk.prefetch.L2.global"](
                    self.pages.access_ptr("r", offset=start), tirx.const(nbytes, "uint32")))

    def row_pointer(self, slot: int, kv: int, token, column):
        f = self.found
        flat = (((self.page[slot] * 2 + kv) * f.kv_heads + self.head) * f.page_size + token % f.page_size) \
            * f.head_dim + column
        return self.pages.access_ptr("r", offset=flat)

    def write(self, h: int, column, value, lse) -> None:
        head = self.head * self.group + h
        B.buffer_store(self.output, T.Cast(self.dtype, value), [self.seq, head, column])
        with B.If(column == 0):
            with B.Then():
                B.buffer_store(self.lse, lse, [self.seq, head])
