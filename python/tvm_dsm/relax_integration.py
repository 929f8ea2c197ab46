"""tvm-dsm inside Relax model compilation: schedule a model's TIR functions with tvm-dsm's
families, leave the rest to TVM's stock schedules.

A Relax model reaches TIR through ``LegalizeOps`` and ``FuseOps``/``FuseTIR``: each fused
PrimFunc is one operator group (a matmul with its elementwise epilogue, a reduction, ...), or a
whole GEMM chain that :mod:`tvm_dsm.relax_chains` grouped first, for the chain family.
:class:`ScheduleTIR` gives every unscheduled PrimFunc that a tvm-dsm family matches the schedule
:func:`tvm_dsm.driver.schedule` would build (a tuning record from ``database``, else the
planner's best) and marks it scheduled, so dlight's ``ApplyDefaultSchedule`` afterwards leaves
it alone and schedules only what no family covers, except a function ``database`` holds a record
of (tuned in TVM's default design space), which gets that record's schedule
(``FAMILY_ATTR`` ``"meta_schedule"``). :func:`compile_model` is that pipeline.

``relax.transform.FuseTransposeMatmul`` comes first: ``R.matmul(x, R.permute_dims(w))`` (a
``torch.nn.Linear`` written in Relax) legalizes to a separate transpose kernel otherwise, and
the matmul would read ``W`` as ``[k, n]``: a transpose kernel more, and tiles only warpgroup
MMAs read from TMA (fp8 ones not at all).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms

from .driver import (FAMILY_FAILURES, H100, operator_families, plan, replay, schedule_operators, schedule_row_ranges,
                     tuning_record)
from .stock import stock_rules, stock_target
from .errors import ClusterError, last_line
from .families.row_ranges import range_variable
from .ir import binds_threads, narrow_indices
from .hardware import Hardware
from .pipeline import lower
from .relax_attention import FuseAttention
from .relax_attention_padding import PadAttentionHeadDims
from .relax_packed_attention import PackedAttentionOperands
from .relax_chains import FuseGemmChains, merge_elementwise
from .relax_gated import FuseGatedProjections
from .relax_matmuls import MatmulsAsMatrices, TransposePerMatmul
from .relax_siblings import FuseSiblingProjections
from .relax_patches import PatchesAsMatrices
from .relax_attention_masks import AttentionMasksFromConstants
from .relax_constants import FoldConstantTensors
from .relax_fills import NonFiniteFills
from .relax_patterns import RewriteToRelaxOps
from .relax_precision import AttentionScaleOnQuery, NormsInFp32

LOG = logging.getLogger("tvm_dsm.relax")

#: The PrimFunc attribute naming the tvm-dsm family that scheduled the function.
FAMILY_ATTR = "tvm_dsm.family"
#: ``FAMILY_ATTR`` of a function no family takes, scheduled from a tuning record of TVM's
#: default design space.
TUNED_IN_TVM_SPACE = "meta_schedule"
#: ``FAMILY_ATTR`` of a function of two or more matmuls no family takes whole, scheduled one
#: operator at a time (:func:`tvm_dsm.driver.schedule_operators`).
PER_OPERATOR = "per_operator"
#: The PrimFunc attribute holding the error of a family that crashed on the function.
CRASH_ATTR = "tvm_dsm.crash"


@dataclass(frozen=True)
class RangeChoice:
    """The family that schedules a function's rows up to ``bound`` (None: every row count past
    the ranges before; for a function of constant extents, the one range) and its plan's
    predicted time (for a symbolic row count, at the range's largest row count)."""

    bound: int | None
    family: str
    predicted_us: float


@dataclass(frozen=True)
class Choice:
    """What :class:`ScheduleTIR` did with one PrimFunc: the family of each range of its rows
    (``row_variable`` names the variable its ranges are of, None for constant extents), or, with no
    ranges, why no family took it (a family's refusal, or its crash); ``tuned``: the schedule
    is a tuning record's, not the planner's pick."""

    ranges: tuple[RangeChoice, ...] = ()
    row_variable: str | None = None
    reason: str = ""
    tuned: bool = False

    @property
    def families(self) -> str:
        """The families of its ranges in order, each once, joined by "/"."""
        return "/".join(dict.fromkeys(r.family for r in self.ranges))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.ScheduleTIR")
class ScheduleTIR:
    """Schedule every PrimFunc of the module that a tvm-dsm family matches (see the module
    docstring), marked with the family's name (``FAMILY_ATTR``); the others stay unscheduled,
    with the reason logged at debug level. An exception other than a family's refusal
    (ClusterError) is a tvm-dsm bug: raised, or with ``survive_crashes`` logged as a warning
    with its traceback and recorded on the function (``CRASH_ATTR``), which stays unscheduled.
    ``choices``: a dict to fill with each visited function's :class:`Choice`, by name;
    ``progress``: called as ``progress(done, total, name)`` before each function is visited."""

    def __init__(self, target=H100, database: ms.Database | None = None,
                 hw: Hardware | None = None, survive_crashes: bool = False,
                 choices: dict[str, Choice] | None = None,
                 progress: Callable[[int, int, str], None] | None = None):
        self.target, self.database, self.hw = target, database, hw
        self.survive_crashes = survive_crashes
        self.choices = {} if choices is None else choices
        self.progress = progress

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        visited = [(gv, func) for gv, func in mod.functions.items()
                   if isinstance(func, tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled", False)
                   and not binds_threads(func)]
        for done, (gv, func) in enumerate(visited):
            if self.progress is not None:
                self.progress(done, len(visited), gv.name_hint)
            form = None
            try:  # a matched family may still refuse (no valid configuration)
                form = scheduling_form(func)
                choice, sch = self._schedule(form)
            except ClusterError as err:
                LOG.debug("%s: no tvm-dsm family: %s", gv.name_hint, err)
                self.choices[gv.name_hint] = Choice(reason=str(err))
                record = tuning_record(self.database, func, self.target)
                if record is not None:
                    updates[gv] = replay(record.trace, func).mod["main"].with_attrs(
                        {"tirx.is_scheduled": True, FAMILY_ATTR: TUNED_IN_TVM_SPACE})
                    continue
                if form is not None:  # two matmuls no family takes together (a grouped chain or attention)
                    self._per_operator(gv, form, updates)
                continue  # else dlight's
            except Exception as err:  # noqa: BLE001  (a family's bug, re-raised unless told)
                if not self.survive_crashes:
                    raise
                LOG.warning("%s: a tvm-dsm family crashed on it", gv.name_hint, exc_info=True)
                crash = f"{type(err).__name__}: {err}"
                self.choices[gv.name_hint] = Choice(reason=f"tvm-dsm crashed: {crash}")
                if form is None or not self._per_operator(gv, form, updates):
                    updates[gv] = mod[gv].with_attr(CRASH_ATTR, crash)  # dlight's
                continue
            if self._lowers(gv, sch, f"the {choice.families} schedule"):
                self.choices[gv.name_hint] = choice
                updates[gv] = sch.mod["main"].with_attrs({"tirx.is_scheduled": True, FAMILY_ATTR: choice.families})
            else:
                self._per_operator(gv, form, updates)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    def _per_operator(self, gv: tvm.ir.GlobalVar, form: tirx.PrimFunc, updates: dict) -> bool:
        """Whether ``form``, holding two or more matmuls whose family refused, crashed on or did
        not lower the function whole, is scheduled an operator at a time (into ``updates``): dlight
        has no rule for two matmuls in one kernel (a chain as one dlight function: a few CTAs)."""
        try:
            sch = schedule_operators(form, self.target, self.hw)
        except (ClusterError, *FAMILY_FAILURES):
            return False  # dlight's
        if not self._lowers(gv, sch, "its operators' schedules"):
            return False
        families = ", ".join(operator_families(form, self.target, self.hw))
        self.choices[gv.name_hint] = Choice(reason=f"its operators: {families}")
        updates[gv] = sch.mod["main"].with_attrs({"tirx.is_scheduled": True, FAMILY_ATTR: PER_OPERATOR})
        return True

    def _lowers(self, gv: tvm.ir.GlobalVar, sch, what: str) -> bool:
        """Whether ``sch`` goes through the TIR pipeline; where it does not (a family that should
        have refused the function), the function is left to dlight, as ``build`` leaves it, with
        a warning and the reason recorded: a model then compiles wherever TVM compiles it."""
        try:
            lower(sch.mod, self.target, self.hw)
            return True
        except (ClusterError, *FAMILY_FAILURES) as err:
            reason = last_line(err)
            LOG.warning("%s: %s does not lower (%s); left to dlight", gv.name_hint, what, reason)
            self.choices[gv.name_hint] = Choice(reason=f"{what} does not lower: {reason}")
            return False

    def _schedule(self, func: tirx.PrimFunc):
        """``func``'s :class:`Choice` and schedule: one kernel per range of rows for a symbolic
        row count, else a tuning record's schedule or the planner's best (the prediction is
        the planner's best either way); ClusterError where no family takes it."""
        variable = range_variable(func)
        if variable is not None:
            kernels, sch = schedule_row_ranges(func, self.target, self.hw, self.database)
            ranges = (RangeChoice(k.bound, k.family.name, k.predicted_us) for k in kernels)
            return Choice(tuple(ranges), variable.name, tuned=any(k.tuned for k in kernels)), sch
        ranking = plan(func, self.hw, self.target)
        record = tuning_record(self.database, ranking.func, self.target)  # kept for the form planned
        sch = ranking.schedule() if record is None else replay(record.trace, ranking.func)
        return Choice((RangeChoice(None, ranking.family.name, ranking.best.predicted_us),),
                      tuned=record is not None), sch


def scheduling_form(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` as the families see it: int32 indices, elementwise blocks merged
    (:func:`~tvm_dsm.relax_chains.merge_elementwise`). A tuning task of a function a family
    takes is this form, since :class:`ScheduleTIR` looks up its tuning records by it."""
    return merge_elementwise(narrow_indices(func))


def lower_to_tir(mod: tvm.IRModule, gated_projections: bool = True) -> tvm.IRModule:
    """Common subexpressions computed once (a torch model's ``x.float()`` written twice in its
    RMSNorm is one cast), fills of infinity or NaN as broadcasts (:mod:`tvm_dsm.relax_fills`: TVM
    cannot legalize them), tensors computed from constants alone evaluated
    (:mod:`tvm_dsm.relax_constants`), decomposed operators put back as Relax's (:mod:`tvm_dsm.relax_patterns`),
    attention masks computed from constants read as causal or windowed (:mod:`tvm_dsm.relax_attention_masks`), bf16 layer
    norms in fp32 and 16-bit attention's explicit scale on its query (:mod:`tvm_dsm.relax_precision`:
    TVM cannot legalize them), attention at head dims off 32-byte rows on padded copies
    (:mod:`tvm_dsm.relax_attention_padding`), attention reading q, k and v in place from a packed projection
    (:mod:`tvm_dsm.relax_packed_attention`), patch embeddings
    as GEMMs (:mod:`tvm_dsm.relax_patches`), 16-bit matmuls as fp32-accumulated matrix products
    (:mod:`tvm_dsm.relax_matmuls`), fused gate/up
    projections as gated GEMMs (:mod:`tvm_dsm.relax_gated`), transposes folded into matmuls (one
    each: :func:`tvm_dsm.relax_matmuls.TransposePerMatmul`),
    operators legalized to TIR, GEMM chains and spelled-out attention grouped
    (:mod:`tvm_dsm.relax_chains`, :mod:`tvm_dsm.relax_attention`), the rest fused by Relax's
    passes. ``gated_projections=False`` leaves gate/up projections a GEMM and
    a fused split/SiLU/multiply (the A/B of the rewrite)."""
    gated = [FuseGatedProjections, relax.transform.DeadCodeElimination()] if gated_projections else []
    return tvm.transform.Sequential([
        relax.transform.EliminateCommonSubexpr(),  # one node for the same value, which the rewrites match as one
        NonFiniteFills,  # before anything legalizes them
        FoldConstantTensors,
        RewriteToRelaxOps,
        AttentionMasksFromConstants,
        NormsInFp32,
        PadAttentionHeadDims,  # with an explicit scale, which the next pass moves onto the query
        AttentionScaleOnQuery,
        PackedAttentionOperands,
        PatchesAsMatrices,
        MatmulsAsMatrices,
        *gated,  # the projections' split halves dead before FuseOps
        TransposePerMatmul,
        relax.transform.FuseTransposeMatmul(),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        FuseGemmChains,
        FuseAttention,
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        FuseSiblingProjections,
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
