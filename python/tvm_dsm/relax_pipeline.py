"""tvm-dsm as a named Relax pipeline: ``tvm.compile(mod, target, relax_pipeline="tvm_dsm")``.

It is TVM's CUDA pipeline (``tvm.relax.backend.cuda.pipeline``: library dispatch, legalize and
fuse, dlight, dataflow lowering, finalization) with two changes in the middle: the Relax graph is
lowered by :func:`tvm_dsm.relax_integration.lower_to_tir` (weight transposes folded into their
matmuls, GEMM chains grouped for the chain family), and :class:`ScheduleTIR` schedules every
PrimFunc a tvm-dsm family matches before dlight schedules the rest. Functions that arrive
scheduled (``nn.llm``'s paged-attention kernels) keep their own schedule. dlight runs under
:func:`tvm_dsm.driver.stock_target` (it skips tensor cores on "sm_90a"), with the low-batch GEMV
rule MLC-LLM adds for decode at small batch.

A family that crashes on a function (a tvm-dsm bug, not a refusal) leaves it to dlight, with a
warning and its traceback logged. Which function went where is logged at INFO and, for a caller that passes ``coverage={}``
(``relax.get_pipeline("tvm_dsm", coverage=cov)``), filled into that dict: kernel name to family
name, ``"dlight"`` or ``"prescheduled"``.
"""

from __future__ import annotations

import logging

import tvm
from tvm import tirx
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.s_tir import meta_schedule as ms

from .driver import stock_target
from .hardware import Hardware
from .relax_integration import CRASH_ATTR, FAMILY_ATTR, ScheduleTIR, lower_to_tir

LOG = logging.getLogger("tvm_dsm.relax")

#: Coverage labels of the functions no tvm-dsm family scheduled.
DLIGHT, PRESCHEDULED = "dlight", "prescheduled"


def dlight_rules(low_batch_gemv: bool = True) -> tvm.transform.Pass:
    """dlight's GPU rules as TVM's CUDA pipeline applies them, plus (``low_batch_gemv``) the
    low-batch GEMV rule MLC-LLM puts after GEMV (a matmul with a small symbolic batch: decode).
    Apply under :func:`stock_target`."""
    from tvm.s_tir import dlight as dl

    rules = [dl.gpu.Matmul(), dl.gpu.GEMV()]
    if low_batch_gemv:
        rules.append(dl.gpu.LowBatchGEMV())
    rules += [dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    return dl.ApplyDefaultSchedule(*rules)


def _scheduled(mod: tvm.IRModule) -> set[str]:
    return {gv.name_hint for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and f.attrs.get("tirx.is_scheduled", False)}


def kernel_coverage(mod: tvm.IRModule, prescheduled: set[str]) -> dict[str, str]:
    """Every PrimFunc of ``mod`` (after :class:`ScheduleTIR`) by name: the tvm-dsm family that
    scheduled it, ``PRESCHEDULED`` if its name is in ``prescheduled``, else ``DLIGHT`` (with
    the error, where a family crashed on it)."""
    coverage = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        attrs = func.attrs or {}
        if FAMILY_ATTR in attrs:
            coverage[gv.name_hint] = str(attrs[FAMILY_ATTR])
        elif CRASH_ATTR in attrs:
            coverage[gv.name_hint] = f"{DLIGHT} (tvm-dsm crashed: {attrs[CRASH_ATTR]})"
        else:
            coverage[gv.name_hint] = PRESCHEDULED if gv.name_hint in prescheduled else DLIGHT
    return dict(sorted(coverage.items()))


def tvm_dsm_pipeline(database: ms.Database | None = None, hw: Hardware | None = None,
                     coverage: dict[str, str] | None = None) -> tvm.transform.Pass:
    """The pipeline of the module docstring, for the target ``tvm.compile`` enters
    (``tvm.target.Target.current()``); ``database``: tuning records :class:`ScheduleTIR` prefers
    to the planner's choice; ``coverage``: a dict to fill with :func:`kernel_coverage`."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_dsm.RelaxPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        with target:
            mod = tvm.transform.Sequential(cuda_pipeline.library_dispatch_passes(target))(mod)
            mod = lower_to_tir(mod)
            prescheduled = _scheduled(mod)
            mod = ScheduleTIR(target, database, hw, survive_crashes=True)(mod)
        taken = kernel_coverage(mod, prescheduled)
        for name, where in taken.items():
            LOG.info("%s: %s", name, where)
        LOG.info("tvm-dsm families scheduled %d of %d kernels",
                 sum(not w.startswith((DLIGHT, PRESCHEDULED)) for w in taken.values()), len(taken))
        if coverage is not None:
            coverage.update(taken)
        with stock_target(target):
            mod = dlight_rules()(mod)
        with target:
            return tvm.transform.Sequential(cuda_pipeline.dataflow_lower_passes(target)
                                            + cuda_pipeline.finalize_passes(target))(mod)

    return _pipeline
