"""softmax(X)·V (a row max, a rescaled row sum and a rescaled sum of products with a [K, J]
matrix) as one tiled kernel on CUDA cores, the keys split over a cluster
(:mod:`tvm_dsm.kernels.softmax_gemm`).

The model is a roofline. HBM: the function's operands once. L2: X once per column tile and V
once per row block, as the CTAs stream their tiles. DSM: with ``ranks`` > 1, every rank but the
merging one hands its rows' state (max, sum, outputs) over. CUDA cores (the kernel computes in
fp32, see the rule): the product's FMA per (row, key, column) and F(x, m) once per (row, key)
and column tile. All at the share of SMs the grid occupies. The configurations ranked are those
:func:`~tvm_dsm.kernels.softmax_gemm.default_config` chooses among (32 x 32 tiles of 4 x 4
outputs a thread, 64 or 32 columns, 1-16 ranks), its choice first: it ran within 0.87-1.0x of
each shape's fastest (bench/results/softmax_gemm/latest.json), an order the roofline does not
resolve.
"""

from __future__ import annotations

import tvm

from ..hardware import Hardware
from ..kernels import softmax_gemm as rule
from ..transform.buffers import buffer_bytes
from .kernel_plan import ELEMENT_OPS, KernelPlan, roofline
from .template_family import TemplateFamily

_STATE_BYTES = 4  # fp32 max, sum and outputs


class SoftmaxGemm(TemplateFamily):
    name = "softmax_gemm"
    template = rule.TEMPLATE

    def predict(self, found: rule.SoftmaxGemm, config: rule.SoftmaxGemmConfig, hw: Hardware) -> KernelPlan:
        s, c = found.shape, config
        x = s.rows * s.keys * tvm.DataType(s.x_dtype).bits // 8
        v = s.keys * s.columns * tvm.DataType(s.v_dtype).bits // 8
        column_tiles, row_blocks = s.columns // c.block_j, s.rows // c.block_m
        ctas = row_blocks * column_tiles * c.ranks
        traffic = {
            "hbm": sum(buffer_bytes(p) for p in found.params),
            "l2": x * column_tiles + v * row_blocks,
        }
        rates = {}
        if c.ranks > 1:
            traffic["dsm"] = ctas * (c.ranks - 1) // c.ranks * c.block_m * (c.block_j + 2) * _STATE_BYTES
            rates["dsm"] = hw.dsm_bw(c.ranks)
        work = {"fp32": 2 * s.rows * s.keys * s.columns + ELEMENT_OPS * s.rows * s.keys * column_tiles}
        return roofline(c, traffic, work, hw, busy=ctas / hw.sm_count, rates=rates)
