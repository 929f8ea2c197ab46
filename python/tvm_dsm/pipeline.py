"""The tvm-dsm TIR pipeline: TVM 0.27's s_tir pipeline with the cluster/DSM phases inserted.

TVM 0.27 has no hook to insert passes into its default pipeline, so tvm-dsm registers this one
under ``"tvm_dsm"`` and as the ``"s_tir"`` pipeline that ``tvm.compile(..., tir_pipeline=
"default")`` and MetaSchedule's builder use (the stock one stays available as ``"s_tir_stock"``).
Without cluster bindings or DSM buffers the inserted passes change nothing; with them, the stock
pipeline would silently launch too few CTAs or place DSM buffers in per-thread arrays.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import pipeline as stock
from tvm.tirx import compilation_pipeline

from .hardware import Hardware, load_hardware
from .intrin.mma import ACCUMULATOR_TYPES
from .ir import find_all
from .transform.argument_checks import CheckArguments
from .transform.bool_vectors import BoolVectors
from .transform.generate_kernels import GenerateKernels
from .transform.hoist_warp_buffers import HoistWarpBuffers
from .transform.integer_powers import IntegerPowers
from .transform.zero_filled_copies import ZeroFilledCopies
from .transform.tile_reduce import FoldTileReductions
from .transform import AttachClusterLaunch, CheckClusterSchedule, LowerCluster
from .transform.release_slice_starts import ReleaseSliceStarts
from .transform.merge_pipeline_barriers import MergePipelineBarriers
from .transform.programmatic_launch import ProgrammaticLaunch
from .transform.weight_prefetch import PrefetchWeightRows
from .transform.raster_clusters import RasterClusters
from .transform.storage_rewrite import StorageRewrite
from .transform.tma_pipeline import LowerTmaPipeline
from .annotations import ASYNC_STAGES_KEY



def _requests_async_copy(mod: tvm.IRModule) -> bool:
    """Whether a schedule pipelined a loop with asynchronous stages (cp.async): stock TVM only
    emits them under the ``tirx.use_async_copy`` option, which a schedule cannot set."""
    return any(
        find_all(f.body, tirx.For, lambda loop: ASYNC_STAGES_KEY in loop.annotations)
        for f in mod.functions.values()
        if isinstance(f, tirx.PrimFunc)
    )


def _passes(config, async_copy: bool, hw: Hardware) -> list:
    """The stock s_tir pass list (TVM 0.27.0) with tvm-dsm's passes marked ``# tvm-dsm``, those
    that depend on the GPU lowering for ``hw``."""
    passes = [
        IntegerPowers,  # tvm-dsm
        GenerateKernels(hw),  # tvm-dsm
        CheckClusterSchedule,  # tvm-dsm
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        FoldTileReductions,  # tvm-dsm: before the thread bindings are lifted and unified
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectPermutedLayout(),
        s_tir.transform.AnnotateIrregularLoop(),
        LowerTmaPipeline(hw),  # tvm-dsm
        RasterClusters,  # tvm-dsm: after the TMA pipeline, which reads copy indices as the schedule wrote them
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.TransformMmaBufferLayout(),
        s_tir.transform.LowerOpaqueBlock(),
        PrefetchWeightRows,  # tvm-dsm
        LowerCluster,  # tvm-dsm
        tirx.transform.FlattenBuffer(),
        tirx.transform.BF16ComputeLegalize(),
        tirx.transform.NarrowDataType(32),
        s_tir.transform.LoopPartition(),
        BoolVectors,  # tvm-dsm: TVM's CUDA code writes a bool vector two bytes a lane
        tirx.transform.VectorizeLoop(not bool(config.get("tirx.disable_vectorize", False))),
        s_tir.transform.InjectVirtualThread(),
        s_tir.transform.InjectDoubleBuffer(),
    ]
    if not bool(config.get("tirx.disable_storage_rewrite", False)):
        passes.append(StorageRewrite)  # tvm-dsm: TVM's, unless a view or tensor map reaches an allocation
    if async_copy:
        passes.append(s_tir.transform.LowerAsyncDMA())
    passes += [
        s_tir.transform.HoistIfThenElse(),
        tirx.transform.UnrollLoop(),
        s_tir.transform.RenormalizeSplitPattern(),
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
        s_tir.transform.RewriteUnsafeSelect(),
    ]
    if bool(config.get("tirx.instrument_bound_checkers", False)):
        passes.append(s_tir.transform.InstrumentBoundCheckers())
    if bool(config.get("tirx.s_tir.ldg32", False)):
        passes.append(s_tir.transform.InjectPTXLDG32(True))
    passes += [HoistWarpBuffers, LowerWarpAccumulators]  # tvm-dsm
    if not bool(config.get("tirx.disable_cse_tir", False)):
        passes.append(tirx.transform.CommonSubexprElim())
    if bool(config.get("tirx.instrument_lwp", False)):
        passes.append(s_tir.transform.InstrumentProfileIntrinsics())
    passes += [
        tirx.transform.FP8ComputeLegalize(),
        s_tir.transform.VerifyVTCMLimit(),
        s_tir.transform.LowerVtcmAlloc(),
        tirx.transform.VerifyMemory(),
        tirx.transform.AnnotateEntryFunc(),
        s_tir.transform.ThreadSync("shared"),
        s_tir.transform.ThreadSync("shared.dyn"),
        s_tir.transform.ThreadSync("warp"),
        MergePipelineBarriers,  # tvm-dsm
        s_tir.transform.InferFragment(),
        s_tir.transform.LowerThreadAllreduce(),
    ]
    passes.append(ZeroFilledCopies)  # tvm-dsm
    if async_copy:
        passes.append(s_tir.transform.InjectPTXAsyncCopy())
    if bool(config.get("tirx.s_tir.ldg32", False)):
        passes.append(s_tir.transform.InjectPTXLDG32())
    passes += [
        ReleaseSliceStarts,  # tvm-dsm
        s_tir.transform.MergeSharedMemoryAllocations(),
        AttachClusterLaunch(hw),  # tvm-dsm: after the merge, which may overlay DSM slices
        ProgrammaticLaunch,  # tvm-dsm
        tirx.transform.SplitHostDevice(),
        tirx.transform.MakePackedAPI(),
        CheckArguments,  # tvm-dsm: the shape before the strides, and the data's alignment
        tirx.transform.FP8StorageLegalize(),
        tirx.transform.BF16StorageLegalize(),
    ]
    return passes


def dsm_pipeline(hw: Hardware | None = None):
    """Pipeline factory in TVM's protocol: (lowering pass, host finalizer, device finalizer),
    lowering for the GPU ``hw`` describes (by default the committed H100 description)."""
    hw = hw or load_hardware()

    @tvm.transform.module_pass(opt_level=0, name="tvm_dsm.Pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        config = tvm.transform.PassContext.current().config
        async_copy = bool(config.get("tirx.use_async_copy", False)) or _requests_async_copy(mod)
        return tvm.ir.transform.Sequential(_passes(config, async_copy, hw))(mod)

    return _pipeline, stock.finalize_host_passes, finalize_device_passes


def lower(mod: tvm.IRModule, target, hw: Hardware | None = None) -> tvm.IRModule:
    """``mod`` (scheduled functions) through the tvm-dsm TIR pipeline for ``target``, without
    code generation: what raises here (a refusal in the cluster lowering, a TVM check) would
    stop ``tvm.compile`` of a model holding it. Milliseconds for a kernel, about a second for a
    function of many row ranges."""
    passes, _, _ = dsm_pipeline(hw)
    with tvm.transform.PassContext(opt_level=3):
        return passes(tirx.transform.BindTarget(tvm.target.Target(target))(mod))


#: Warp-scope buffers (mma fragments) one kernel may hold.
_MAX_WARP_BUFFERS = 32


def _warp_accumulators(mod: tvm.IRModule) -> int:
    return sum(
        len(find_all(f.body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == "warp"
                     and str(a.buffer.ty.dtype) in ACCUMULATOR_TYPES.values()))
        for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)
    )


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.LowerWarpAccumulators")
def LowerWarpAccumulators(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """TVM's LowerWarpMemory until no fp32 or int32 (accumulator) warp buffer is left. One run lowers
    only the first warp-scope allocation of a scope (TVM 0.27); an accumulator left behind
    keeps its mma.sync and store at 32 lanes' worth of per-thread memory while its fill is
    lowered, and reads uninitialized registers (a fused kernel's second accumulator). fp16
    operand fragments left behind are consistent, and lowering them was measured slower on
    the H100 (0.82x geomean over the GEMM suite), so they stay. Runs before
    CommonSubexprElim, whose temporaries hide the lane index the pass matches; the device
    finalizer then skips it (:func:`finalize_device_passes`)."""
    for _ in range(_MAX_WARP_BUFFERS):
        if not _warp_accumulators(mod):
            break
        mod = tirx.transform.LowerWarpMemory()(mod)
    return mod


def finalize_device_passes() -> tvm.transform.Pass:
    """TVM's device finalization without its LowerWarpMemory: :func:`LowerWarpAccumulators`
    has lowered what must be, and a second attempt on the fp16 fragments fails on the lane
    index that CommonSubexprElim has hidden."""
    return tvm.ir.transform.Sequential([tirx.transform.StmtSimplify(), tirx.transform.LowerIntrin()])


def register_pipeline() -> None:
    """Make the tvm-dsm pipeline TVM's default s_tir pipeline (idempotent)."""
    table = compilation_pipeline.PIPELINE_MAP
    if table.get("s_tir") is not dsm_pipeline:
        table.setdefault("s_tir_stock", table["s_tir"])
    table["s_tir"] = dsm_pipeline
    table["tvm_dsm"] = dsm_pipeline
