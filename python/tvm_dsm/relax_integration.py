"""tvm-dsm inside Relax model compilation: schedule a model's TIR functions with tvm-dsm's
families, leave the rest to TVM's stock schedules.

A Relax model reaches TIR through ``LegalizeOps`` and ``FuseOps``/``FuseTIR``: each fused
PrimFunc is one operator group (a matmul with its elementwise epilogue, a reduction, ...), or a
whole GEMM chain that :mod:`tvm_dsm.relax_chains` grouped first, for the chain family.
:class:`ScheduleTIR` gives every unscheduled PrimFunc that a tvm-dsm family matches the schedule
:func:`tvm_dsm.driver.schedule` would build (a tuning record from ``database``, else the
planner's best) and marks it scheduled, so dlight's ``ApplyDefaultSchedule`` afterwards leaves
it alone and schedules only what no family covers. :func:`compile_model` is that pipeline.

``relax.transform.FuseTransposeMatmul`` comes first: ``R.matmul(x, R.permute_dims(w))`` (a
``torch.nn.Linear`` written in Relax) legalizes to a separate transpose kernel otherwise, and
the matmul would read ``W`` as ``[k, n]``, which TMA copies cannot stream.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms

from .driver import H100, schedule, schedule_row_ranges, stock_rules, stock_target
from .errors import ClusterError
from .families import match_family
from .families.row_ranges import row_variable
from .hardware import Hardware
from .relax_chains import FuseGemmChains, merge_elementwise
from .relax_matmuls import MatmulsAsMatrices

LOG = logging.getLogger("tvm_dsm.relax")

#: The PrimFunc attribute naming the tvm-dsm family that scheduled the function.
FAMILY_ATTR = "tvm_dsm.family"
#: The PrimFunc attribute holding the error of a family that crashed on the function.
CRASH_ATTR = "tvm_dsm.crash"


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.ScheduleTIR")
class ScheduleTIR:
    """Schedule every PrimFunc of the module that a tvm-dsm family matches (see the module
    docstring), marked with the family's name (``FAMILY_ATTR``); the others stay unscheduled,
    with the reason logged at debug level. An exception other than a family's refusal
    (ClusterError) is a tvm-dsm bug: raised, or with ``survive_crashes`` logged as a warning
    with its traceback and recorded on the function (``CRASH_ATTR``), which stays unscheduled."""

    def __init__(self, target=H100, database: ms.Database | None = None,
                 hw: Hardware | None = None, survive_crashes: bool = False):
        self.target, self.database, self.hw = target, database, hw
        self.survive_crashes = survive_crashes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs.get("tirx.is_scheduled", False):
                continue
            # Relax legalizes with int64 extents; the families' kernels index in int32.
            func = tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
            func = merge_elementwise(func)
            try:  # a matched family may still refuse (no valid configuration)
                if row_variable(func) is not None:
                    family, sch = schedule_row_ranges(func, self.target, self.hw)
                else:
                    family, _ = match_family(func, self.target)
                    sch = schedule(func, self.target, database=self.database, hw=self.hw,
                                   stock_fallback=False)
            except ClusterError as err:
                LOG.debug("%s: no tvm-dsm family: %s", gv.name_hint, err)
                continue
            except Exception as err:  # noqa: BLE001  (a family's bug, re-raised unless told)
                if not self.survive_crashes:
                    raise
                LOG.warning("%s: a tvm-dsm family crashed on it; left to dlight", gv.name_hint,
                            exc_info=True)
                updates[gv] = mod[gv].with_attr(CRASH_ATTR, f"{type(err).__name__}: {err}")
                continue
            updates[gv] = sch.mod["main"].with_attrs({"tirx.is_scheduled": True,
                                                      FAMILY_ATTR: family.name})
        for gv, func in updates.items():
            mod[gv] = func
        return mod


def lower_to_tir(mod: tvm.IRModule) -> tvm.IRModule:
    """16-bit matmuls as fp32-accumulated matrix products (:mod:`tvm_dsm.relax_matmuls`),
    transposes folded into matmuls, operators legalized to TIR, GEMM chains grouped
    (:mod:`tvm_dsm.relax_chains`), the rest fused by Relax's passes."""
    return tvm.transform.Sequential([
        MatmulsAsMatrices,
        relax.transform.FuseTransposeMatmul(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        FuseGemmChains,
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])(mod)


def compile_model(mod: tvm.IRModule, target=H100, database: ms.Database | None = None,
                  hw: Hardware | None = None) -> relax.VMExecutable:
    """Compile a Relax model: transposes folded into matmuls, legalized and fused, tvm-dsm's
    schedules where a family applies, dlight's elsewhere."""
    target = tvm.target.Target(target)
    mod = ScheduleTIR(target, database, hw)(lower_to_tir(mod))
    with stock_target(target):
        mod = stock_rules()(mod)
    return tvm.compile(mod, target=target)
