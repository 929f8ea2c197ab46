"""tvm-dsm as a named Relax pipeline: ``tvm.compile(mod, target, relax_pipeline="tvm_dsm")``.

It is TVM's CUDA pipeline (``tvm.relax.backend.cuda.pipeline``: library dispatch, legalize and
fuse, dlight, dataflow lowering, finalization) with two changes in the middle: the Relax graph is
lowered by :func:`tvm_dsm.relax_integration.lower_to_tir` (weight transposes folded into their
matmuls, GEMM chains grouped for the chain family), and :class:`ScheduleTIR` schedules every
PrimFunc a tvm-dsm family matches before dlight schedules the rest. Functions that arrive
scheduled (``nn.llm``'s paged-attention kernels) keep their own schedule, except those named in
``kv_cache_kernels`` (:func:`use_kv_cache_kernels`), by default its decode attention, which
tvm-dsm's cluster kernel replaces (:mod:`tvm_dsm.kernels.paged_decode`; measured faster in the
whole model at batch 1 to 64 and KV lengths 541 and 2048, ``bench/results/llm``), and its
prefill attention over the new tokens, on tensor cores (:mod:`tvm_dsm.kernels.ragged_prefill`;
96x ``nn.llm``'s kernel for 64 prompts of 512 tokens, ``bench/results/ragged_prefill``), and its
append of keys and values to the pages in 16-byte vectors (:mod:`tvm_dsm.kernels.kv_append`);
``()`` keeps ``nn.llm``'s. dlight runs under
:func:`tvm_dsm.stock.stock_target` (it skips tensor cores on "sm_90a"), after
:class:`LowBatchDispatch` has given the matmuls of a symbolic batch no family took the low-batch
GEMV dispatch MLC-LLM adds for decode.

A family that crashes on a function (a tvm-dsm bug, not a refusal) leaves it to dlight, with a
warning and its traceback logged. Which function went where is logged at INFO and, for a caller that passes ``coverage={}``
(``relax.get_pipeline("tvm_dsm", coverage=cov)``), filled into that dict: kernel name to family
name, ``"dlight"`` or ``"prescheduled"``; ``choices={}`` is filled with
:class:`ScheduleTIR`'s choice of each function it saw (:mod:`tvm_dsm.model_report` prints both).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
from tvm import relax, tirx
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.s_tir import meta_schedule as ms

from .stock import stock_rules, stock_target
from .errors import ClusterError
from .families.row_ranges import dispatch
from .ir import binds_threads, find_all, row_variable
from .hardware import Hardware, load_hardware
from .kernels import kv_append, paged_decode, ragged_prefill
from .relax_matmuls import SIXTEEN_BIT, is_op_call
from .relax_weights import MarkReadOnlyParams
from .annotations import LAUNCH_EARLY_KEY
from .relax_patterns import RowMaxValues, rewrite_widened_products
from .relax_top_k import TopKAsRows
from .relax_reshapes import ReshapesAsViews
from .relax_integration import CRASH_ATTR, FAMILY_ATTR, Choice, ScheduleTIR, lower_to_tir

LOG = logging.getLogger("tvm_dsm.relax")

#: Coverage labels of the functions no tvm-dsm family scheduled.
DLIGHT, PRESCHEDULED = "dlight", "prescheduled"
#: Coverage label of a reshape Relax reads in place: no kernel runs for it.
VIEW = "view"


#: Row counts up to which a symbolic-batch matmul takes dlight's low-batch GEMV, each with that
#: batch tile; past the last, dlight's matmul.
LOW_BATCH_BUCKETS = (2, 4, 8)


def low_batch_dispatch(func: tirx.PrimFunc, target: tvm.target.Target) -> tirx.PrimFunc | None:
    """A matmul of a symbolic row count (a decode batch) scheduled the way MLC-LLM specializes
    it: dlight's low-batch GEMV with a batch tile of each of LOW_BATCH_BUCKETS for the row
    counts up to it, dlight's matmul beyond, chosen on the host (:func:`row_ranges.dispatch`);
    None where the function is not such a matmul. Apply under :func:`stock_target`."""
    from tvm.s_tir import dlight as dl

    try:
        if row_variable(func) is None:
            return None
    except ClusterError:
        return None
    branches = []
    for bound, rule in [*((b, dl.gpu.LowBatchGEMV(b)) for b in LOW_BATCH_BUCKETS), (None, dl.gpu.Matmul())]:
        sch = rule.apply(func, target, False)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is None:
            return None
        branches.append((bound, sch.mod["main"]))
    return dispatch(func, branches)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.LowBatchDispatch")
def LowBatchDispatch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """:func:`low_batch_dispatch` on every unscheduled PrimFunc it takes, marked scheduled."""
    target = tvm.target.Target.current(allow_none=False)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled", False):
            dispatched = low_batch_dispatch(func, target)
            if dispatched is not None:
                mod[gv] = dispatched.with_attr("tirx.is_scheduled", True)
    return mod


#: The names :func:`kernel_coverage` gives ``nn.llm``'s kernels tvm-dsm replaces.
PAGED_DECODE, RAGGED_PREFILL, KV_APPEND = "paged_decode", "ragged_prefill", "kv_append"
#: ``nn.llm``'s kernels tvm-dsm replaces, by name: the function's symbol, and what builds the
#: replacement of a function (ClusterError where it does not take it).
KV_CACHE_KERNELS = {
    PAGED_DECODE: (paged_decode.SYMBOL, lambda func, hw: paged_decode.paged_decode_dispatch(
        paged_decode.find_paged_decode(func), hw)),
    RAGGED_PREFILL: (ragged_prefill.SYMBOL, lambda func, hw: ragged_prefill.ragged_prefill_kernel(func)),
    KV_APPEND: (kv_append.SYMBOL, lambda func, hw: kv_append.kv_append_kernel(func)),
}
#: The KV-cache kernels replaced by default.
DEFAULT_KV_CACHE_KERNELS = (PAGED_DECODE, RAGGED_PREFILL, KV_APPEND)
#: The KV cache's constructor, and the position of its RoPE mode among the arguments
#: (``nn.llm.kv_cache``; 2 is ``RopeMode.INLINE``: RoPE inside the attention kernels).
_KV_CACHE_CREATE, _ROPE_MODE_ARG, _INLINE_ROPE = "vm.builtin.paged_attention_kv_cache_create", 8, 2


def _rope_inside_attention(mod: tvm.IRModule) -> bool:
    """Whether a KV cache of ``mod`` applies RoPE inside its attention kernels."""
    found = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0], relax.ExternFunc)
                and str(expr.args[0].global_symbol) == _KV_CACHE_CREATE):
            mode = expr.args[1 + _ROPE_MODE_ARG]
            found.append(not isinstance(mode, tvm.tirx.IntImm) or int(mode.value) == _INLINE_ROPE)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return any(found)


def use_kv_cache_kernels(mod: tvm.IRModule, hw: Hardware | None = None,
                         names: tuple[str, ...] = DEFAULT_KV_CACHE_KERNELS) -> tvm.IRModule:
    """``mod`` with ``nn.llm``'s KV-cache kernels named in ``names`` (keys of
    :data:`KV_CACHE_KERNELS`) replaced by tvm-dsm's, sized for ``hw``; the attention kernels
    kept where the KV cache applies RoPE inside them (tvm-dsm's take K stored rotated)."""
    if names and _rope_inside_attention(mod):
        LOG.info("nn.llm's attention kernels kept: the KV cache applies RoPE inside attention")
        names = tuple(n for n in names if n not in (PAGED_DECODE, RAGGED_PREFILL))
    if not names:
        return mod
    hw = hw or load_hardware()
    mod = mod.clone()
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        for name in names:
            symbol, replace = KV_CACHE_KERNELS[name]
            try:
                kernel = replace(func, hw)
            except ClusterError as err:
                if gv.name_hint.startswith(symbol):
                    LOG.info("%s kept: %s", gv.name_hint, err)
                continue
            mod.update_func(gv, kernel.with_attr(FAMILY_ATTR, name))
            break
    return mod


def _scheduled(mod: tvm.IRModule) -> set[str]:
    return {gv.name_hint for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and (f.attrs.get("tirx.is_scheduled", False) or binds_threads(f))}


def _called(mod: tvm.IRModule) -> set[str]:
    """The PrimFuncs the Relax functions of ``mod`` call, by name."""
    prim_funcs = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    return {v.name_hint for f in mod.functions.values() if isinstance(f, relax.Function)
            for v in find_all(f.body, tvm.ir.GlobalVar) if v.name_hint in prim_funcs}


def views(mod: tvm.IRModule) -> set[str]:
    """The PrimFuncs of ``mod`` that are reshapes Relax reads in place: the build's
    ``RewriteDataflowReshape`` replaces every call of them by a view of the input, so no kernel
    of theirs runs (a torch model's ``view`` and ``split`` lowered to copies, then undone)."""
    return _called(mod) - _called(relax.transform.RewriteDataflowReshape()(mod))


def kernel_coverage(mod: tvm.IRModule, prescheduled: set[str]) -> dict[str, str]:
    """Every PrimFunc of ``mod`` (after :class:`ScheduleTIR`) by name: the tvm-dsm family that
    scheduled it, ``PRESCHEDULED`` if its name is in ``prescheduled``, ``VIEW`` for a reshape
    read in place (:func:`views`), else ``DLIGHT`` (with the error, where a family crashed on it)."""
    coverage = {}
    in_place = views(mod)
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        attrs = func.attrs or {}
        if gv.name_hint in in_place and FAMILY_ATTR not in attrs:
            coverage[gv.name_hint] = VIEW
        elif FAMILY_ATTR in attrs:
            coverage[gv.name_hint] = str(attrs[FAMILY_ATTR])
        elif CRASH_ATTR in attrs:
            coverage[gv.name_hint] = f"{DLIGHT} (tvm-dsm crashed: {attrs[CRASH_ATTR]})"
        else:
            coverage[gv.name_hint] = PRESCHEDULED if gv.name_hint in prescheduled else DLIGHT
    return dict(sorted(coverage.items()))


def lower_for_scheduling(mod: tvm.IRModule, target: tvm.target.Target, hw: Hardware | None = None,
                         kv_cache_kernels: tuple[str, ...] = DEFAULT_KV_CACHE_KERNELS,
                         gated_projections: bool = True) -> tvm.IRModule:
    """``mod`` as the pipeline schedules it: :data:`~tvm_dsm.relax_top_k.TopKAsRows`, library
    dispatch, :func:`lower_to_tir` (``gated_projections``), the reshapes Relax cannot read in
    place as views (:data:`~tvm_dsm.relax_reshapes.ReshapesAsViews`), :func:`use_kv_cache_kernels`
    (``kv_cache_kernels``), :func:`~tvm_dsm.relax_weights.MarkReadOnlyParams` (weights a kernel may
    load before it waits for the previous one). Tuning extracts its tasks from this module, so
    that the records match the functions compiled."""
    with target:
        # before library dispatch, which would give R.topk to TVM's sort
        mod = TopKAsRows(RowMaxValues(mod))
        mod = tvm.transform.Sequential(cuda_pipeline.library_dispatch_passes(target))(mod)
        return MarkReadOnlyParams(use_kv_cache_kernels(ReshapesAsViews(lower_to_tir(mod, gated_projections)), hw,
                                                       kv_cache_kernels))


def widened_products(mod: tvm.IRModule) -> dict[str, int]:
    """The fp32 matrix products (``R.matmul`` of fp32 operands) of each Relax function of
    ``mod`` whose parameters hold 16-bit tensors, by function: a 16-bit model computing in fp32,
    as TVM's torch importer makes it (each product of 16-bit operands returns fp32, never
    rounded back), on CUDA cores where no tensor-core family takes fp32. A product of two
    widened 16-bit tensors is not one: the pipeline computes it from the 16-bit tensors
    (:func:`~tvm_dsm.relax_patterns.rewrite_widened_products`)."""
    found = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        types = [p.ty for p in func.params]
        if not any(getattr(t, "dtype", None) in SIXTEEN_BIT for t in types):
            continue
        products = [call for call in find_all_calls(rewrite_widened_products(func), "relax.matmul")
                    if all(getattr(a.ty, "dtype", None) == "float32" for a in call.args)]
        if products:
            found[gv.name_hint] = len(products)
    return found


def find_all_calls(func: relax.Function, op: str) -> list[relax.Call]:
    """The calls of the Relax operator ``op`` in ``func``."""
    calls = []
    relax.analysis.post_order_visit(func, lambda e: calls.append(e) if is_op_call(e, op) else None)
    return calls


def schedule_kernels(mod: tvm.IRModule, target: tvm.target.Target,
                     database: ms.Database | None = None, hw: Hardware | None = None,
                     choices: dict[str, Choice] | None = None,
                     kv_cache_kernels: tuple[str, ...] = DEFAULT_KV_CACHE_KERNELS,
                     gated_projections: bool = True,
                     progress: Callable[[int, int, str], None] | None = None) -> tuple[tvm.IRModule, dict[str, str]]:
    """The pipeline up to dlight: :func:`lower_for_scheduling`, :class:`ScheduleTIR` (filling
    ``choices``, calling ``progress``); the module and its :func:`kernel_coverage`, logged
    (with a warning where a 16-bit model computes its products in fp32: :func:`widened_products`)."""
    for name, count in widened_products(mod).items():
        LOG.warning("%s: %d matrix products compute in fp32 though the model holds 16-bit tensors (TVM's "
                    "torch importer returns fp32 from 16-bit products): CUDA cores, no tensor-core family. "
                    "tvm_dsm.relax_torch.from_exported_program imports the program in torch's types", name, count)
    mod = lower_for_scheduling(mod, target, hw, kv_cache_kernels, gated_projections)
    prescheduled = _scheduled(mod)
    with target:
        mod = ScheduleTIR(target, database, hw, survive_crashes=True, choices=choices, progress=progress)(mod)
    taken = kernel_coverage(mod, prescheduled)
    for name, where in taken.items():
        LOG.info("%s: %s", name, where)
    LOG.info("tvm-dsm families scheduled %d of %d kernels",
             sum(not w.startswith((DLIGHT, PRESCHEDULED, VIEW)) for w in taken.values()),
             sum(w != VIEW for w in taken.values()))
    return mod, taken


def tvm_dsm_pipeline(database: ms.Database | None = None, hw: Hardware | None = None,
                     coverage: dict[str, str] | None = None,
                     choices: dict[str, Choice] | None = None,
                     kv_cache_kernels: tuple[str, ...] = DEFAULT_KV_CACHE_KERNELS,
                     launch_early: bool = True, gated_projections: bool = True,
                     progress: Callable[[int, int, str], None] | None = None) -> tvm.transform.Pass:
    """The pipeline of the module docstring, for the target ``tvm.compile`` enters
    (``tvm.target.Target.current()``); ``database``: tuning records :class:`ScheduleTIR` prefers
    to the planner's choice; ``coverage``: a dict to fill with :func:`kernel_coverage`;
    ``choices``: a dict to fill with :class:`ScheduleTIR`'s choices; ``kv_cache_kernels``:
    the ``nn.llm`` attention kernels replaced by tvm-dsm's (see the module docstring);
    ``launch_early``: every kernel launched programmatically (``LAUNCH_EARLY_KEY``): it launches
    while the one before it runs and waits for it before touching memory, the decode GEMVs
    loading their weights' first tiles before they wait (1B Llama decode on an H200: 0.871 ->
    0.827 ms a step at batch 1, 1.014 -> 0.966 at 8, 1.217 -> 1.136 at 32; ``False``: only the
    kernels whose schedules ask for it); ``gated_projections``: fused gate/up
    projections as one gated GEMM each (:mod:`tvm_dsm.relax_gated`); ``progress``: called as
    ``progress(done, total, name)`` before each function is scheduled."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_dsm.RelaxPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        mod, taken = schedule_kernels(mod, target, database, hw, choices, kv_cache_kernels, gated_projections,
                                      progress)
        if coverage is not None:
            coverage.update(taken)
        with stock_target(target):
            mod = LowBatchDispatch(mod)
            mod = stock_rules()(mod)
        if launch_early:
            mod = tvm.IRModule({gv: f.with_attr(LAUNCH_EARLY_KEY, True) if isinstance(f, tirx.PrimFunc) else f
                                for gv, f in mod.functions.items()}, attrs=mod.attrs, global_infos=mod.global_infos)
        with target:
            return tvm.transform.Sequential(cuda_pipeline.dataflow_lower_passes(target)
                                            + cuda_pipeline.finalize_passes(target))(mod)

    return _pipeline
