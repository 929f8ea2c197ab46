"""Row-wise normalizations (softmax, log-softmax, RMSNorm, LayerNorm: row statistics, then an
element-wise stage reading the row again) as one kernel that holds each row in registers and
reads it from HBM once (:mod:`tvm_dsm.kernels.row_norm`).

The model is a roofline: the function's operands read once and its outputs written once at
HBM bandwidth (a weight or bias, shared by the rows, counted once), and the CUDA cores' element
work (:data:`~.kernel_plan.ELEMENT_OPS` per element for each level and each stage), at the
share of the SMs the grid's CTAs occupy. The configuration :func:`~tvm_dsm.kernels.row_norm.default_config`
picks (the fewest CTAs a row within the register limit, a cluster where the rows alone leave SMs
idle) ranks first: the roofline gives every split of a filled machine the same time.
"""

from __future__ import annotations

import dataclasses

from ..hardware import Hardware
from ..kernels import row_norm as rule
from ..transform.buffers import buffer_bytes
from .kernel_plan import ELEMENT_OPS, KernelPlan, roofline
from .template_family import TemplateFamily


class RowNorm(TemplateFamily):
    name = "row_norm"
    template = rule.TEMPLATE
    symbolic_rows = True  # a row count known when called: one CTA (or cluster) a row

    def for_symbolic_rows(self, config: rule.RowNormConfig) -> rule.RowNormConfig:
        """One row a CTA: a symbolic row count need not divide into CTAs of several rows."""
        return dataclasses.replace(config, rows_per_cta=1)

    def predict(self, found: rule.RowNorm, config: rule.RowNormConfig, hw: Hardware) -> KernelPlan:
        ctas = found.rows // config.rows_per_cta * config.ranks
        element_ops = ELEMENT_OPS * found.rows * found.width * (len(found.levels) + len(found.stages))
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)},
                        {"fp32": element_ops}, hw, busy=ctas / hw.sm_count)
