"""TVM's stock GPU schedules as a TVM user gets them without tvm-dsm: dlight's default rules and
the target they schedule for."""

from __future__ import annotations

import contextlib

import tvm

from .hardware import H100
from .script_parsing import on_a_shallow_stack


def stock_target(target=H100) -> tvm.target.Target:
    """The target dlight schedules for: dlight skips tensor cores when the arch is "sm_90a"
    (it cannot parse the suffix), so "sm_90" there."""
    target = tvm.target.Target(target)
    if str(target.attrs.get("arch", "")) == "sm_90a":
        target = tvm.target.Target({**dict(target.export()), "arch": "sm_90"})
    return target


def stock_rules() -> tvm.transform.Pass:
    """dlight's default GPU rules and its transpose rule, before the fallback (TVM's CUDA
    pipeline leaves it out: the fallback gives a transposed copy's threads reads a row apart,
    the transpose rule tiles through shared memory), as one pass (apply it under
    :func:`stock_target`), run on a shallow stack
    (:func:`~tvm_dsm.script_parsing.on_a_shallow_stack`): the tensor intrinsics its matmul rule
    imports on first use took 100 s from a Relax pass's stack with torch imported, against
    1.4 s for the whole model through TVM's own pipeline."""
    from tvm.s_tir import dlight as dl

    class Transpose(dl.gpu.Transpose):
        """dlight's transpose rule; its test of a block compares index expressions with ``!=``,
        which raises for any but two variables (TVM 0.27): such a block is not a transpose."""

        def is_transpose(self, sch, block_rv) -> bool:
            try:
                return super().is_transpose(sch, block_rv)
            except ValueError:
                return False

    rules = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                    dl.gpu.GeneralReduction(), Transpose(), dl.gpu.Fallback())

    @tvm.transform.module_pass(opt_level=0, name="StockRules")
    def apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current()  # thread-local: entered again in the fresh thread

        def run() -> tvm.IRModule:
            with target if target is not None else contextlib.nullcontext():
                return rules(mod)

        return on_a_shallow_stack(run)

    return apply
