"""Prefill attention over ``nn.llm``'s ragged sequences on tvm-dsm's tensor-core attention kernel
(:mod:`tvm_dsm.kernels.attention`).

``nn.llm``'s TIR prefill kernel (``batch_prefill_ragged_kv``) computes on CUDA cores in 16 CTAs
per KV head and walks every key tile of a causal row, the masked ones too. This kernel keeps that
function's parameters, so the KV cache calls it unchanged, and computes each 64-row query tile of
each head of each sequence in a CTA of its own, both products on warpgroup MMAs, stopping at the
diagonal (:class:`~tvm_dsm.kernels.attention.RaggedSequences`). It writes the output and the
log-sum-exp (base 2) the KV cache merges with the attention over cached pages.

It takes the cache whose RoPE is applied before attention (``rotary_mode == 0``); a call with
in-kernel RoPE stops with an error before launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ..errors import ClusterError
from ..ir import branch_on
from .attention import AttentionConfig, RaggedSequences, attention_kernel, check_config, padded_dim

#: The function ``nn.llm`` builds for prefill attention over the new tokens, and its parameters.
SYMBOL = "batch_prefill_ragged_kv"
PARAMS = ("q", "q_indptr", "k", "v", "kv_indptr", "q_rope_position", "k_rope_pos_offset", "output",
          "lse", "causal", "rotary_mode", "rope_scale", "rope_theta", "sm_scale")


def find_ragged_prefill(func: tirx.PrimFunc) -> RaggedSequences:
    """The sizes of ``nn.llm``'s ragged prefill function ``func``; ClusterError naming what does
    not match or which limit the kernel has."""
    symbol = str((func.attrs or {}).get("global_symbol", ""))
    names = tuple(p.name for p in func.params)
    if symbol != SYMBOL or names != PARAMS:
        raise ClusterError(f"not nn.llm's ragged prefill attention ({SYMBOL} with parameters {PARAMS})")
    q, k, v = (func.params[PARAMS.index(name)].ty for name in ("q", "k", "v"))
    try:
        heads, dim, kv_heads, v_dim = int(q.shape[1]), int(q.shape[2]), int(k.shape[1]), int(v.shape[2])
    except (TypeError, ValueError) as err:
        raise ClusterError(f"ragged prefill: heads and head dim must be constants ({err})") from err
    found = RaggedSequences(heads, kv_heads, dim, str(q.dtype))
    if found.dtype not in ("float16", "bfloat16") or str(k.dtype) != found.dtype or str(v.dtype) != found.dtype:
        raise ClusterError(f"ragged prefill: q, k and v in float16 or bfloat16, not {q.dtype}/{k.dtype}/{v.dtype}")
    if v_dim != dim or heads % kv_heads:
        raise ClusterError("ragged prefill: needs v's head dim equal to q's and query heads a multiple of the KV heads")
    check_config(found.shape(), config(found))
    return found


def config(found: RaggedSequences) -> AttentionConfig:
    """One 64-row block per CTA at head dim 64 (prompts are often short: small tiles waste
    least), two warpgroups sharing each key tile at 128 (as the causal dense kernel)."""
    return AttentionConfig(64, warpgroups=2) if padded_dim(found.dim) == 128 else AttentionConfig(64)


def ragged_prefill_kernel(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (``nn.llm``'s ragged prefill) as tvm-dsm's kernel, with ``func``'s parameters and
    attributes; launched only for a batch with query tokens."""
    found = find_ragged_prefill(func)
    kernel = attention_kernel(None, config(found), found)
    params = dict(zip(PARAMS, kernel.params))
    rope_inside = tirx.AssertStmt(  # (TVM 0.27's constructor order: condition, kind, message)
        params["rotary_mode"] == 0, tvm.ir.StringImm("ValueError"),
        ["tvm-dsm's ragged prefill attention takes q and k rotated before the kernel (RoPE mode NORMAL "
         "or NONE), not RoPE applied in it"])
    body = branch_on(kernel.params[0].ty.shape[0], [(None, kernel)])
    attrs = {**dict(kernel.attrs), **dict(func.attrs)}
    return tirx.PrimFunc(kernel.params, tirx.SeqStmt([rope_inside, body]),
                         attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))
