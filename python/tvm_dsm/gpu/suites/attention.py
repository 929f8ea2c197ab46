"""Attention as one tensor-core kernel."""

from __future__ import annotations

import itertools
from ...rules.attention import CONFIGS as ATTENTION_CONFIGS
from ...rules.attention import default_config, find_attention, fuse_attention
from ...workloads import cascades as cascade_workloads
from .base import Variant, args_of, nbytes_of


#: Attention shapes (heads x batch, query length, key length, head dim); the first is the
#: issue's [128, 16, 512, 64].
ATTENTION_SHAPES = [(2048, 512, 512, 64), (256, 1024, 1024, 64), (64, 4096, 4096, 64), (256, 1024, 1024, 128)]


def attention() -> list[Variant]:
    """Attention as one kernel (tvm_dsm.rules.attention), plain and causal, in each
    configuration that fits; default_config's is the pick."""
    variants = []
    for (heads, q_len, kv_len, dim), causal in itertools.product(ATTENTION_SHAPES, (False, True)):
        func = cascade_workloads.attention(heads, q_len, kv_len, dim, causal)
        args = args_of(func)
        for config in ATTENTION_CONFIGS:
            variants.append(Variant(
                name=f"attention_{heads}x{q_len}x{kv_len}x{dim}{'_causal' if causal else ''}"
                f"_m{config.block_m}n{config.block_n}" + (f"_w{config.warpgroups}" if config.warpgroups > 1 else ""),
                workload="attention",
                mod=fuse_attention(func, config),
                args=args,
                bytes=nbytes_of(args),
                flops=4 * heads * q_len * kv_len * dim // (2 if causal else 1),  # the keys seen
                plan={**vars(config), "planner": config == default_config(find_attention(func)[0])},
                peers=("torch_eager", "torch_compile", "torch_sdpa"),
                reference_kwargs={"causal": True} if causal else {},
                extra={"causal": causal},
            ))
    return variants
