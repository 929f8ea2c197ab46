"""Decode attention as users write it (one query a head; grouped- and multi-query heads read
each K/V row once for the group) as tvm-dsm's cluster decode kernel
(:mod:`tvm_dsm.kernels.dense_decode`).

The model is the HBM floor: q and the output once, K and V once per group of query heads a CTA
holds (a group larger than the registers hold is read once per part), at the share of the SMs
the grid keeps busy (a CTA per pair of sequence and KV head group, times the cluster size). Its
products are two multiply-adds an element of K and V per query head, far below the HBM time.
Clusters differ in the model only by the SMs they fill, which does not order them as measured,
so :func:`~tvm_dsm.kernels.dense_decode.default_config`'s choice is ranked first.
"""

from __future__ import annotations

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
        return roofline(config, traffic, {}, hw, busy=found.pairs() * config.ranks / hw.sm_count)
