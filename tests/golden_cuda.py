"""The workloads whose generated CUDA must not change when the code is reorganized.

For each, the planner's best three configurations of the family that takes it are scheduled and
compiled for sm_90a; ``tests/data/golden_cuda.json`` holds a SHA-256 of each kernel source.
``python tests/golden_cuda.py`` rewrites that file (only after a change meant to alter kernels).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tvm

GOLDEN = Path(__file__).parent / "data" / "golden_cuda.json"
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
RANKS = 3


def workloads() -> dict:
    """Name -> PrimFunc: one or two per schedule family, written by the workload builders."""
    from tvm_dsm.workloads import cascades, chains, dense, lm_head, reductions

    return {
        "dense_128x4096x4096": dense.dense(128, 4096, 4096),
        "dense_relu_bias_64x3072x768": dense.dense(64, 3072, 768, bias=True, activation="relu"),
        "ffn_128x512x2048x512": chains.gemm_chain(128, 2048, 512, 512),
        "ffn_128x256x512x64": chains.gemm_chain(128, 512, 256, 64),
        "swiglu_128x2048x5632x2048": chains.swiglu_ffn(128, 5632, 2048, 2048),
        "conv_chain": chains.conv_chain(64, 56, 64, 64, 3, 1),
        "lm_head_max": lm_head.lm_head_max(1, 128, 4096, 32000),
        "softmax_stats": cascades.softmax_stats(4096, 4096),
        "decode_attention": cascades.decode_attention(32, 4096, 128),
        "attention": cascades.attention(16, 512, 512, 64),
        "attention_causal": cascades.attention(16, 1024, 1024, 128, causal=True),
        "moe_routing": cascades.moe_routing(4096, 128, 8),
        "row_sum": reductions.row_sum(4096, 8192),
    }


def picks_cuda(ranking) -> list[str]:
    """The CUDA source of the best RANKS configurations of ``ranking`` (``tvm_dsm.plan``'s)."""
    sources = []
    for rank in range(min(RANKS, len(ranking.plans))):
        mod = ranking.schedule(rank).mod
        sources.append(tvm.compile(mod, target=TARGET).mod.imports[0].inspect_source())
    return sources


def digests(ranking) -> list[str]:
    return [hashlib.sha256(src.encode()).hexdigest() for src in picks_cuda(ranking)]


if __name__ == "__main__":
    import tvm_dsm

    table = {name: digests(tvm_dsm.plan(func)) for name, func in workloads().items()}
    GOLDEN.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {sum(map(len, table.values()))} kernels")
