"""Attention (scores, row max, exp-sum, exp-weighted sum of V, divide) as one FlashAttention-style
kernel, both products on warpgroup MMAs (:mod:`tvm_dsm.kernels.attention`).

The model is a roofline. HBM: q, k, v and the output once each. L2: q once, and k and v once
per query tile, each CTA (``block_m`` query rows of one head) streaming every key tile it needs
into shared memory (with the causal mask, the tiles up to its last row's diagonal), at the
operand-tile L2 rate of the GEMMs. Tensor cores: ``4 * heads * q_len * kv_len * dim`` FLOPs
(two products), half with the causal mask, at the warpgroup-MMA peak. The slowest of them,
plus a launch, is a floor rather than a time: the 40 kernels of
bench/results/attention/latest.json ran 1.4-3.0x their prediction (19-49 % of the tensor-core
peak; the exponentials and the softmax's shuffles are not counted). The configurations differ
in the model only by their K/V re-reads and grid, which does not order them as measured, so
:func:`~tvm_dsm.kernels.attention.default_config`'s choice, the fastest measured on the H100
(docs/attention.md), is ranked first and the others follow by prediction.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..kernels import attention as rule
from .kernel_plan import KernelPlan, roofline
from .template_family import TemplateFamily

#: Bytes of an element of q, k, v and the output (the kernel takes fp16).
_ELEMENT_BYTES = 2


def _keys_read(shape, block_m: int, block_n: int) -> int:
    """Keys the CTAs of one head read in all: every key per query tile, or with the causal mask
    (key t visible to query i iff t <= i) the whole key tiles up to each tile's last row."""
    tiles = -(-shape.q_len // block_m)
    if not shape.causal:
        return tiles * shape.kv_len
    last_rows = (min(shape.q_len, (j + 1) * block_m) for j in range(tiles))
    return sum(min(shape.kv_len, -(-rows // block_n) * block_n) for rows in last_rows)


class Attention(TemplateFamily):
    name = "attention"
    template = rule.TEMPLATE
    symbolic_rows = True  # a sequence length known when called: the grid and the last key tile's mask follow it
    symbolic_extents = True  # the query and key lengths two variables

    def predict(self, shape, config: rule.AttentionConfig, hw: Hardware) -> KernelPlan:
        # bytes of one position's row of q or k and of v or the output, all heads
        row, value_row = (shape.heads * dim * _ELEMENT_BYTES for dim in (shape.dim, shape.v_dim))
        traffic = {
            "hbm": (shape.q_len + shape.kv_len) * (row + value_row),
            "l2": shape.q_len * row + _keys_read(shape, config.block_m, config.block_n) * (row + value_row),
        }
        flops = (2 * shape.heads * shape.q_len * shape.kv_len * (shape.dim + shape.v_dim)
                 // (2 if shape.causal else 1))
        ctas = shape.heads * -(-shape.q_len // config.block_m)
        return roofline(config, traffic, {"mma": flops}, hw, busy=ctas / hw.sm_count)
