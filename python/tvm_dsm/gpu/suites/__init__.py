"""Kernel suites the GPU workflow builds here and runs on the device machine: one module per
domain, and ``experiments`` for the one-off sweeps and ablations behind design choices.

``SUITES`` maps a suite's name to the function listing its kernels (:class:`~.base.Variant`);
``EXPERIMENTS`` names the ones that are ablations rather than measurements of the picks.
"""

from __future__ import annotations

from . import experiments
from .attention import attention, attention_forms, attention_terms, decode_forms
from .base import CHAINS, SWIGLUS, Variant
from .cascades import cascades, softmax, softmax_gemm, top_k_rows
from .chains import chains, chains_m, conv_chains
from .decode import decode, decode_picks
from .elementwise import elementwise, elementwise_configs
from .generality import generality, symbolic_rows
from .norms import norms
from .real_shapes import real_shapes
from .gemm import GEMM_SHAPES, batched_gemm, fp8, gated, gemm, gemm_large_m, gemm_m, layer_shapes, lm_head
from .reductions import collectives, split_k

EXPERIMENTS = {
    "cascades_rows": experiments.cascades_rows, "chains_pdl": experiments.chains_pdl,
    "chains_one_launch": experiments.chains_one_launch, "chains_picks": experiments.chains_picks,
    "dense_candidates": experiments.dense_candidates,
    "swiglu_candidates": experiments.swiglu_candidates,
    "chains_tma": experiments.chains_tma, "decode_pdl": experiments.decode_pdl,
    "decode_staged": experiments.decode_staged, "decode_form_clusters": experiments.decode_form_clusters,
    "elementwise_configs": elementwise_configs, "wide_head_attention": experiments.wide_head_attention,
    "symbolic_attention": experiments.symbolic_attention, "attention_configs": experiments.attention_configs,
    "attention_overlap": experiments.attention_overlap,
    "attention_terms_prefetch": experiments.attention_terms_prefetch, "kn_tile_heights": experiments.kn_tile_heights,
    "past_tile_rows": experiments.past_tile_rows,
    "fp8_depths": experiments.fp8_depths, "decode_gemm_configs": experiments.decode_gemm_configs,
    "prefill_gemm_configs": experiments.prefill_gemm_configs, "tile_heights": experiments.tile_heights,
    "width_768_gemm_configs": experiments.width_768_gemm_configs,
    "vit_gemm_configs": experiments.vit_gemm_configs, "tile_widths": experiments.tile_widths,
    "model_gemm_widths": experiments.model_gemm_widths,
    "launch_early_gemms": experiments.launch_early_gemms,
    "decode_gemm_pool_rotated": experiments.decode_gemm_pool_rotated,
    "gemm_k_scaling": experiments.gemm_k_scaling, "short_tile_depths": experiments.short_tile_depths,
    "trailing_dense_configs": experiments.trailing_dense_configs,
    "llama_decode_clusters": experiments.llama_decode_clusters,
    "llama_decode_small_batches": experiments.llama_decode_small_batches,
    "row_gemv_configs": experiments.row_gemv_configs, "column_gemv_configs": experiments.column_gemv_configs,
    "column_gemv_clusters": experiments.column_gemv_clusters,
    "column_gemv_defaults": experiments.column_gemv_defaults,
    "simt_gemm_configs": experiments.simt_gemm_configs, "fp32_row_gemv": experiments.fp32_row_gemv,
    "wide_decode_gemm_configs": experiments.wide_decode_gemm_configs,
    "row_norm_configs": experiments.row_norm_configs,
    "fp8_sweep": experiments.fp8_sweep, "gemm_depths": experiments.gemm_depths,
    "gemm_stages": experiments.gemm_stages, "gemm_tma": experiments.gemm_tma,
    "gemm_wgmma": experiments.gemm_wgmma, "programmatic_launch": experiments.programmatic_launch,
}

SUITES = {
    "split_k": split_k, "collectives": collectives, "cascades": cascades, "softmax": softmax,
    "softmax_gemm": softmax_gemm, "top_k_rows": top_k_rows, "decode": decode, "decode_picks": decode_picks,
    "gemm": gemm, "gemm_m": gemm_m, "batched_gemm": batched_gemm, "gated": gated, "gemm_large_m": gemm_large_m, "fp8": fp8,
    "lm_head": lm_head, "chains": chains, "chains_m": chains_m, "conv_chains": conv_chains,
    "attention": attention, "attention_forms": attention_forms, "attention_terms": attention_terms,
    "decode_forms": decode_forms,
    "generality": generality, "norms": norms, "elementwise": elementwise, "real_shapes": real_shapes,
    "symbolic_rows": symbolic_rows,
    **EXPERIMENTS,
}

__all__ = ["CHAINS", "EXPERIMENTS", "GEMM_SHAPES", "SUITES", "SWIGLUS", "Variant", "layer_shapes"]
