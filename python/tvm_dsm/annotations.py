"""Every annotation key tvm-dsm's schedules write and its passes read, in one place.

A schedule marks a block or loop; a lowering pass finds the mark and rewrites what it covers.
The last keys are TVM's own, which tvm-dsm sets."""

from __future__ import annotations

#: Loop annotation on the cluster-index loop: the number of CTAs per cluster.
CLUSTER_SIZE_KEY = "tvm_dsm.cluster_size"
#: Loop annotation on a GEMM's cluster loop over a symbolic count of rows of tiles: [group,
#: columns of tiles]; tvm_dsm.transform.raster_clusters walks ``group`` rows per column.
RASTER_GROUP_KEY = "tvm_dsm.raster_group"
#: Loop annotation on the ``blockIdx.x`` loop of a split reduction's second kernel: [rows of
#: tiles, arrivals, gathered]. tvm_dsm.transform.tile_reduce folds the kernel into the cluster
#: kernel before it, each tile's iteration run by the last of its ``arrivals`` CTAs to finish
#: it, or (gathered) shared by them once all have arrived.
TILE_REDUCE_KEY = "tvm_dsm.tile_reduce"
#: Loop annotation: the loop's iterations commute; start CTA r's walk at peer r (rotation).
ROTATE_PEERS_KEY = "tvm_dsm.rotate_peers"
#: Loop annotation: this copy loop between DSM slices moves by cp.async.bulk pushes.
BULK_COPY_KEY = "tvm_dsm.bulk_copy"
#: Block annotation (a pragma, so it survives LowerOpaqueBlock as an attribute) on once-per-cluster
#: stages; tvm_dsm.transform.lower_cluster runs them on rank 0 only.
ROOT_ONLY_KEY = "pragma_tvm_dsm_root_only"
#: Attribute left around a cluster kernel's body; tvm_dsm.transform.cluster_launch turns it into
#: the ``clusterCtaIdx.x`` launch dimension after LowerThreadAllreduce.
CLUSTER_LAUNCH_KEY = "tvm_dsm.cluster_launch"
#: Marks the first touch of a DSM slice no peer writes (see release_slice_starts).
RELEASABLE_START_KEY = "tvm_dsm.releasable_slice_start"
#: Markers around a lowered bulk copy (node: the destination / source slice), read by barrier
#: placement in tvm_dsm.transform.lower_cluster and removed before that pass returns.
BULK_DST = "tvm_dsm.bulk_dst"
BULK_SRC = "tvm_dsm.bulk_src"
#: Loop annotation (set by the schedule): stream the marked copies of this loop's body with TMA
#: through this many shared-memory slots.
TMA_STAGES_KEY = "tvm_dsm.tma_stages"
#: Block annotation (set by the schedule): a shared-memory tile copy to issue as a TMA copy.
TMA_COPY_KEY = "tvm_dsm.tma_copy"
#: Block annotation (set by tvm_dsm.rules.aligned_rows): a product reading zero-filled copies of
#: its operands that the same function makes.
COPIED_OPERANDS_KEY = "tvm_dsm.copied_operands"
#: Name prefix of the CUDA helpers issuing warpgroup MMAs on a copied tile
#: (tvm_dsm.intrin.wgmma): the pass points their tile pointer at the slot.
WGMMA_HELPER_PREFIX = "tvm_dsm_wgmma_"
#: Root-block annotation asking for it; s_tir lowering keeps ``pragma_`` annotations as
#: attributes around the function body.
PROGRAMMATIC_LAUNCH_KEY = "pragma_tvm_dsm_programmatic_launch"
#: Root-block annotation (a pragma) of a schedule whose CTAs each stream whole rows of a weight,
#: its value the rows a CTA reads: launched programmatically, each CTA prefetches them into L2
#: before it waits for the previous grid (tvm_dsm.transform.weight_prefetch).
PREFETCH_ROWS_KEY = "pragma_tvm_dsm_prefetch_rows"
#: PrimFunc attribute: launch every kernel of the function programmatically, whatever schedule
#: wrote it (tvm_dsm.transform.programmatic_launch): it launches while the previous kernel runs
#: and waits for it before touching memory.
LAUNCH_EARLY_KEY = "tvm_dsm.launch_early"
#: PrimFunc attribute: the names of parameters no kernel of the program writes (a model's
#: weights, from tvm_dsm.relax_pipeline). Even a function's first kernel, launched
#: programmatically, may read them before it waits for the previous grid.
READ_ONLY_PARAMS_KEY = "tvm_dsm.read_only_params"
#: Statement attribute: where a kernel launched programmatically waits for the previous grid,
#: put there by a kernel whose statements before it read only what no earlier kernel writes (a
#: paged KV cache's page tables, which the host copies before the step); without it the wait
#: leads the kernel (tvm_dsm.transform.programmatic_launch).
PROGRAMMATIC_WAIT_KEY = "tvm_dsm.programmatic_wait"
#: Statement attribute (node: a parameter) around one thread's TMA copies of the first pipeline
#: steps' tiles from that parameter into shared memory (tvm_dsm.transform.tma_pipeline):
#: issued before the kernel waits for the previous grid when that is safe, else after it.
EARLY_COPY_KEY = "tvm_dsm.early_copy"
#: Annotations of the ``*_final`` block: the CTAs a row's parts span (part p on rank p % ranks),
#: and the rows whose threads share a CTA.
RANKS_ATTR = "tvm_dsm.ranks"
ROWS_PER_CTA_ATTR = "tvm_dsm.rows_per_cta"
#: Block attribute of a top-k level written by tvm_dsm.fusion.top_k.top_k: its k.
TOP_K_KEY = "tvm_dsm.top_k"
#: Root-block annotation carrying the planner's predicted time (microseconds).
PREDICTED_US_KEY = "tvm_dsm.predicted_us"
#: Root-block annotation carrying the index of a MetaSchedule candidate's configuration among the
#: planner's pruned ones (a traced ``sample_categorical`` decision).
PLAN_INDEX_KEY = "tvm_dsm.plan_index"
#: Root-block annotation carrying the fields of the family configuration a schedule applies (JSON).
CONFIG_KEY = "tvm_dsm.config"
#: Loop annotation of s_tir's software pipeline listing its asynchronous stages.
ASYNC_STAGES_KEY = "software_pipeline_async_stages"
#: TVM's launch-parameter tag for programmatic stream serialization (spelled as in TVM 0.27).
PDL_LAUNCH_TAG = "tirx.use_programtic_dependent_launch"
#: Root-block annotation: the schedule family that writes this function's kernel from the
#: configuration ``CONFIG_KEY`` records (a family that generates its kernel rather than tracing a
#: schedule of the function); tvm_dsm.transform.generate_kernels writes it when lowering.
GENERATED_BY_KEY = "tvm_dsm.generated_by"
