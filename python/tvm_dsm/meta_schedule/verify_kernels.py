"""MetaSchedule's GPU-code check on the kernels tvm-dsm's pipeline actually lowers a candidate to.

MetaSchedule's ``VerifyGPUCode`` lowers a candidate with TVM's generic pass list and runs TVM's
``verify_gpu_code`` analysis on the result. On a tvm-dsm schedule that list is not the lowering
the kernel gets: without tvm-dsm's TMA pipeline, cluster lowering and storage reuse (the fp32
partial tiles overlay the operand pipeline's buffers), it counts every buffer apart, so it refuses
kernels that build and run (on a 1152 x 896 dense layer at M = 1024, 8 of the planner's first 64
configurations, its first among them). :class:`VerifyLoweredKernels` runs the same analysis
with the same limits on each kernel of tvm-dsm's own lowering (:func:`tvm_dsm.pipeline.dsm_pipeline`,
about 0.05 s a candidate), and refuses the candidates that lowering refuses
(:class:`~tvm_dsm.errors.ClusterError`: a kernel over the GPU's shared memory, ...).
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm_ffi import structural_hash

from ..errors import ClusterError
from ..hardware import Hardware
from ..pipeline import dsm_pipeline

#: ``verify_gpu_code``'s limits that MetaSchedule's VerifyGPUCode sets apart from the target's.
_FIXED_LIMITS = {"max_vthread": 8, "max_vector_bytes": 16}
#: A device kernel's calling convention after SplitHostDevice.
_DEVICE_KERNEL_LAUNCH = 2


def lowered_kernels(mod: tvm.IRModule, target: tvm.target.Target, hw: Hardware) -> list[tvm.tirx.PrimFunc]:
    """The device kernels tvm-dsm's pipeline lowers ``mod`` to for ``target`` (ClusterError
    where it refuses them)."""
    lower, _, _ = dsm_pipeline(hw)
    bound = tvm.tirx.transform.BindTarget(tvm.target.Target(target, host="llvm"))(mod)
    return [func for func in lower(bound).functions.values()
            if func.attrs is not None and int(func.attrs.get("calling_conv", 0)) == _DEVICE_KERNEL_LAUNCH]


def within_limits(mod: tvm.IRModule, target: tvm.target.Target, hw: Hardware) -> bool:
    """Whether every kernel of ``mod`` as tvm-dsm lowers it passes ``verify_gpu_code`` with
    ``target``'s shared-memory and thread limits."""
    limits = {"max_shared_memory_per_block": int(target.attrs["max_shared_memory_per_block"]),
              "max_threads_per_block": int(target.attrs["max_threads_per_block"]), **_FIXED_LIMITS}
    try:
        kernels = lowered_kernels(mod, target, hw)
    except (ClusterError, tvm.error.InternalError):
        return False
    return bool(kernels) and all(s_tir.analysis.verify_gpu_code(kernel, limits) for kernel in kernels)


@derived_object
class VerifyLoweredKernels(ms.postproc.PyPostproc):
    """:func:`within_limits` as a MetaSchedule postprocessor, for the target of the tuning
    context; a verdict is kept per candidate (the search meets the same configuration many
    times)."""

    def __init__(self, hw: Hardware):
        super().__init__()
        self.hw = hw
        self.target: tvm.target.Target | None = None
        self._verdicts: dict[int, bool] = {}

    def _initialize_with_tune_context(self, context) -> None:
        self.target = context.target

    def apply(self, sch: s_tir.Schedule) -> bool:
        key = structural_hash(sch.mod)
        if key not in self._verdicts:
            self._verdicts[key] = within_limits(sch.mod, self.target, self.hw)
        return self._verdicts[key]

    def clone(self) -> "VerifyLoweredKernels":
        return VerifyLoweredKernels(self.hw)
