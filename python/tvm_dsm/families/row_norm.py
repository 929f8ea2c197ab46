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

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..kernels import row_norm as rule
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import CUDA_CORE_FLOPS, ELEMENT_OPS, KernelPlan, default_first, roofline


class RowNorm(ScheduleFamily):
    name = "row_norm"
    traced = False  # the kernel is written from a template, not a trace of the function

    def recognize(self, func: tirx.PrimFunc) -> rule.RowNorm:
        """The normalization as the kernel takes it, where a row fits a cluster's registers."""
        found = rule.find_row_norm(func)
        rule.default_config(found)  # ClusterError naming the limit where a row does not fit
        return found

    def predict(self, found: rule.RowNorm, config: rule.RowNormConfig, hw: Hardware) -> KernelPlan:
        ctas = found.rows // config.rows_per_cta * config.ranks
        element_ops = ELEMENT_OPS * found.rows * found.width * (len(found.levels) + len(found.stages))
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)},
                        {"fp32": element_ops}, {"hbm": hw.hbm_bw, "fp32": CUDA_CORE_FLOPS},
                        busy=ctas / hw.sm_count)

    def rank(self, found: rule.RowNorm, hw: Hardware) -> list[KernelPlan]:
        plans = [self.predict(found, c, hw) for c in rule.candidate_configs(found)]
        default = rule.default_config(found, hw.sm_count)
        if default not in [p.config for p in plans]:
            plans.append(self.predict(found, default, hw))
        return default_first(plans, default)

    def apply(self, func: tirx.PrimFunc, config: rule.RowNormConfig) -> s_tir.Schedule:
        return s_tir.Schedule(rule.fuse_row_norm(func, config))
