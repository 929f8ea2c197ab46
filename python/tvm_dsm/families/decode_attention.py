"""Decode attention as users write it (one query a head; grouped- and multi-query heads read
each K/V row once for the group) as tvm-dsm's cluster decode kernel
(:mod:`tvm_dsm.kernels.dense_decode`).

The model is a roofline of two terms. HBM: q and the output once, K and V once per group of
query heads a CTA holds (a group larger than the registers hold is read once per part), at the
share of the SMs the grid keeps busy (a CTA per pair of sequence and KV head group, times the
cluster size). Compute: two multiply-adds per key and column for each query row, at the rate the
kernel's body (tensor cores or CUDA cores) was measured to sustain over several query rows a
group (``decode_attention.mma_flops``, ``decode_attention.lane_flops``: a small share of the
peaks, each CTA going through its keys in order). At one query a head the compute is far below
the HBM time; over the query rows of a short prefill (77 tokens, which the kernel takes as a
group of rows sharing K and V) it is not, and the attention kernel's warpgroup MMAs were 1.3-8x
faster there (H200, ``bench/results/archive/short_attention_families_s86.json``).
Clusters differ in the model only by the SMs they fill, which does not order them as measured,
so :func:`~tvm_dsm.kernels.dense_decode.default_config`'s choice is ranked first.
"""

from __future__ import annotations

import math

from ..hardware import Hardware
from ..kernels import dense_decode as rule
from ..kernels.decode_attention import DecodeConfig
from ..transform.buffers import buffer_bytes
from .kernel_plan import KernelPlan, roofline
from .template_family import TemplateFamily


class DecodeAttention(TemplateFamily):
    name = "decode_attention"
    template = rule.TEMPLATE
    symbolic_rows = True  # a key length known when called (the past of a KV cache), read at run time

    def predict(self, found: rule.DenseOperands, config: DecodeConfig, hw: Hardware) -> KernelPlan:
        q, k, v, out = found.shape.operands
        reads = found.shape.group // found.group  # times each K/V row is read
        traffic = {"hbm": buffer_bytes(q) + buffer_bytes(out) + reads * (buffer_bytes(k) + buffer_bytes(v))}
        rows = math.prod(found.shape.head_extents)  # query rows: every sequence, head and query
        body = "mma" if config.tensor_cores else "lane"
        work = {body: 4 * rows * found.shape.kv_len * found.shape.dim}
        return roofline(config, traffic, work, hw, busy=found.pairs() * config.ranks / hw.sm_count,
                        rates={body: hw.fitted(f"decode_attention.{body}_flops")})
