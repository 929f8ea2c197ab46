"""The KV cache's append of a call's keys and values into its pages (``nn.llm``'s
``tir_kv_cache_transpose_append``), scheduled to move 16-byte vectors.

``nn.llm`` writes the function one element a loop iteration and dlight keeps that: a thread
copies one 2-byte element, and the kernel took 102 us a layer for the 32768 tokens of a 64 x 512
prefill of the 1B Llama, where its 134 MB take 34 us at HBM rate (H200). This schedules the same
function, so the KV cache calls it unchanged, with a CTA a token and each thread copying 16
contiguous bytes of a head's row: the head dim is contiguous in both the token-major input and
the page: 33 us a layer there, 4.3 against 11.8 us at 4096 tokens, 1.37 against 1.51 us a decode
step (``bench/results/archive/llama_1b_grid_ours_s53.json``). Tokens whose position is -1 (not
kept by the cache) are skipped.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import MAX_CTA_THREADS
from ..ir import branch_on
from ..rules.elementwise import VECTOR_BYTES

#: The function ``nn.llm`` builds to append keys and values to the pages, and its parameters.
SYMBOL = "tir_kv_cache_transpose_append"
PARAMS = ("pages", "k_data", "v_data", "position_map")
#: Its blocks, one a store of keys and one of values, in one loop nest (token, head, head dim).
BLOCKS = ("k_transpose_append", "v_transpose_append")


def kv_append_kernel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (``nn.llm``'s KV append) scheduled with a 16-byte vector a thread, after a
    host-side check that the pages' element offset keeps those vectors aligned, launched only
    for a call with tokens; ClusterError where ``func`` is not that function or its head dim
    is not a whole number of vectors."""
    symbol = str((func.attrs or {}).get("global_symbol", ""))
    if symbol != SYMBOL or tuple(p.name for p in func.params) != PARAMS:
        raise ClusterError(f"not nn.llm's KV append ({SYMBOL} with parameters {PARAMS})")
    pages, k_data = (func.params[PARAMS.index(name)].ty for name in ("pages", "k_data"))
    lanes = VECTOR_BYTES * 8 // tvm.runtime.DataType(str(k_data.dtype)).bits
    heads, dim = k_data.shape[-2:]
    if not isinstance(heads, tirx.IntImm) or not isinstance(dim, tirx.IntImm) or int(dim) % lanes:
        raise ClusterError(f"KV append: the heads ({heads}) must be a constant and the head dim ({dim}) a "
                           f"constant multiple of {lanes}")
    sch = s_tir.Schedule(func)
    try:
        token, head, column = sch.get_loops(sch.get_sblock(BLOCKS[0]))
    except (ValueError, tvm.error.InternalError) as err:
        raise ClusterError(f"KV append: expected the blocks {BLOCKS} in one loop nest ({err})") from None
    vectors, lane = sch.split(column, [None, lanes])
    threads = int(heads) * int(dim) // lanes
    if threads > MAX_CTA_THREADS:
        raise ClusterError(f"KV append: a token's heads take {threads} vectors, more than a CTA's "
                           f"{MAX_CTA_THREADS} threads")
    sch.bind(token, "blockIdx.x")  # a CTA a token: no CTA past the last, whose position it would read
    sch.bind(sch.fuse(head, vectors), "threadIdx.x")
    sch.vectorize(lane)
    scheduled = sch.mod["main"]
    checks = []
    if isinstance(pages.elem_offset, tirx.IntImm):
        if int(pages.elem_offset) % lanes:
            raise ClusterError(f"KV append: the pages' element offset {pages.elem_offset} is not a multiple of "
                               f"{lanes}: its {VECTOR_BYTES}-byte stores would be misaligned")
    else:
        checks.append(tirx.AssertStmt(  # (TVM 0.27's constructor order: condition, kind, message)
            tirx.floormod(pages.elem_offset, lanes) == 0, tvm.ir.StringImm("ValueError"),
            [f"tvm-dsm's KV append stores {VECTOR_BYTES}-byte vectors: the pages' element offset must be "
             f"a multiple of {lanes}"]))
    body = branch_on(k_data.shape[0], [(None, scheduled)])  # no launch for no tokens
    return scheduled.with_body(tirx.SeqStmt([*checks, body])).with_attr("tirx.is_scheduled", True)
