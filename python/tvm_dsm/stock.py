"""TVM's stock GPU schedules as a TVM user gets them without tvm-dsm: dlight's default rules and
the target they schedule for."""

from __future__ import annotations

import tvm

from .hardware import H100


def stock_target(target=H100) -> tvm.target.Target:
    """The target dlight schedules for: dlight skips tensor cores when the arch is "sm_90a"
    (it cannot parse the suffix), so "sm_90" there."""
    target = tvm.target.Target(target)
    if str(target.attrs.get("arch", "")) == "sm_90a":
        target = tvm.target.Target({**dict(target.export()), "arch": "sm_90"})
    return target


def stock_rules() -> tvm.transform.Pass:
    """dlight's default GPU rules, as one pass (apply it under :func:`stock_target`)."""
    from tvm.s_tir import dlight as dl

    return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                   dl.gpu.GeneralReduction(), dl.gpu.Fallback())
