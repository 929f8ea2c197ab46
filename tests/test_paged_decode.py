"""tvm-dsm's decode attention over nn.llm's paged KV cache (tvm_dsm.kernels.paged_decode):
which functions it takes, the kernel it writes, and on the GPU its output and log-sum-exp
against float64 and against nn.llm's own kernel on the same cache."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.nn.llm._decode_kernels import _attention_decode

from conftest import TARGET, cuda_source, host_launch, registers
from tvm_dsm.annotations import LAUNCH_EARLY_KEY
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.kernels.decode_attention import DecodeConfig
from tvm_dsm.kernels.paged_decode import (batch_configs, default_ranks, find_paged_decode, paged_decode_dispatch,
                                          paged_decode_kernel)
from tvm_dsm.relax_pipeline import (KV_APPEND, PAGED_DECODE, PRESCHEDULED, RAGGED_PREFILL, schedule_kernels,
                                    use_kv_cache_kernels)

PAGE = 16


def nn_llm_decode(qo_heads: int, kv_heads: int, head_dim: int, dtype: str = "float16",
                  sliding_window: bool = False):
    return _attention_decode(kv_heads, qo_heads, head_dim, dtype, sliding_window, {},
                             tvm.target.Target(TARGET))


def test_it_takes_nn_llm_decode_and_reads_its_sizes():
    found = find_paged_decode(nn_llm_decode(32, 8, 64))
    assert (found.qo_heads, found.kv_heads, found.head_dim, found.page_size, found.group) == (32, 8, 64, PAGE, 4)
    assert default_ranks(found, load_hardware()) == 8  # 8 KV heads x 8 CTAs: half of 132 SMs, portable


@pytest.mark.parametrize("make, limit", [
    (lambda: nn_llm_decode(32, 8, 64, sliding_window=True), "not nn.llm's paged decode"),
    (lambda: nn_llm_decode(8, 8, 512), "a head dim that is a multiple of 8 up to 256"),
    (lambda: nn_llm_decode(64, 4, 64), "at most 8 query heads per KV head"),
    (lambda: nn_llm_decode(32, 8, 64, "float32"), "16-bit q, K and V"),
])
def test_it_refuses_with_the_limit_named(make, limit):
    with pytest.raises(ClusterError, match=limit):
        find_paged_decode(make())


def test_the_kernel_launches_a_cluster_per_sequence_and_kv_head_and_assembles(assemble):
    found = find_paged_decode(nn_llm_decode(32, 8, 64))
    mod = tvm.IRModule({"main": paged_decode_kernel(found, DecodeConfig(8, True))})
    (launch,) = host_launch(mod, "tvm_dsm")
    assert "B * 64, 128, 8" in launch and '"clusterCtaIdx.x"' in launch
    source = cuda_source(mod, "tvm_dsm")
    assert "mapa.shared::cluster" in source and "barrier.cluster" in source
    assert "mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32" in source  # 4 query heads a KV row
    assemble(source, "paged_decode")
    alone = cuda_source(tvm.IRModule({"main": paged_decode_kernel(found)}), "tvm_dsm")
    assert "barrier.cluster" not in alone  # one CTA a (sequence, KV head): no cluster
    assemble(alone, "paged_decode_alone")
    with pytest.raises(ClusterError, match="a power of two"):
        paged_decode_kernel(found, DecodeConfig(3, True))


@pytest.mark.parametrize("config", [DecodeConfig(8, True), DecodeConfig(1, False)])
def test_the_page_tables_are_read_and_the_first_rows_prefetched_before_the_kernel_waits(config, assemble):
    """Launched programmatically, the kernel looks up its first steps' pages (the host copied the
    tables before the step) and prefetches those pages' K and V rows of its head into L2, then
    waits for the kernel before it (which appends this step's rows) before it reads the query or
    a row; launched plainly, it waits for nothing. Its K and V rows are loaded evict-first."""
    found = find_paged_decode(nn_llm_decode(32, 8, 64))
    kernel = paged_decode_kernel(found, config)
    early = cuda_source(tvm.IRModule({"main": kernel.with_attr(LAUNCH_EARLY_KEY, True)}), "tvm_dsm")
    body = early[early.index("__global__ void"):]
    body = body[body.index("{"):]
    wait = body.index("griddepcontrol_wait()")
    assert body.count("griddepcontrol_wait()") == 1
    assert "page_table_values_ptr[" in body[:wait] and "prefetch_L2_global(" in body[:wait]
    assert "Q_ptr[" not in body[:wait] and "ld_vec_global_cs_nc_v4_b32(" not in body[:wait]
    assert "ld_vec_global_cs_nc_v4_b32(" in body[wait:] and "ld_vec_global_nc_v4_b32(" not in body
    assemble(early, "paged_decode_early")
    plain = cuda_source(tvm.IRModule({"main": kernel}), "tvm_dsm")
    assert "griddepcontrol" not in plain[plain.index("__global__ void"):]


@pytest.mark.parametrize("head_dim, tensor_cores", [(64, True), (128, False)])
def test_three_register_files_issue_each_steps_loads_two_steps_ahead_without_spilling(head_dim, tensor_cores,
                                                                                       ptxas_report):
    """Three register files hold a third step's K/V loads (more registers than two) without
    spilling; three files of 128-wide rows on tensor cores would need more than 255 registers,
    refused naming it."""
    found = find_paged_decode(nn_llm_decode(32, 8, head_dim))
    report = {}
    for files in (2, 3):
        source = cuda_source(tvm.IRModule({"main": paged_decode_kernel(found, DecodeConfig(1, tensor_cores, 4, files))}),
                             "tvm_dsm")
        report[files] = ptxas_report(source, f"paged_decode_files{files}_{head_dim}")
        assert " 0 bytes spill stores" in report[files], report[files]
    used = {f: registers(r) for f, r in report.items()}
    assert used[3] > used[2]  # the third file's loads held
    with pytest.raises(ClusterError, match="255 registers"):
        paged_decode_kernel(find_paged_decode(nn_llm_decode(32, 8, 128)), DecodeConfig(1, True, 4, files=3))
    with pytest.raises(ClusterError, match="2 or 3 register files"):
        paged_decode_kernel(found, DecodeConfig(1, tensor_cores, 4, files=4))


@pytest.mark.parametrize("qo_heads, kv_heads, head_dim, ranks", [(8, 8, 128, 2), (32, 8, 64, 8), (28, 4, 128, 4)])
def test_buffers_peers_push_into_are_never_shared_with_the_ctas_own(qo_heads, kv_heads, head_dim, ranks):
    """Peers push their states into rank 0 while it may still be in its token loop: a buffer
    they push into that TVM's storage reuse also gave to the warps' states was overwritten
    early (GPU: 19% error, now and then, for 8 heads of 128 on 2 ranks)."""
    source = cuda_source(tvm.IRModule({"main": paged_decode_kernel(
        find_paged_decode(nn_llm_decode(qo_heads, kv_heads, head_dim)), DecodeConfig(ranks, qo_heads > kv_heads))}), "tvm_dsm")
    kernel = source[source.index("__global__ void"):]
    pushed = set(re.findall(r"mapa_u32_shared__cluster_u32\(\w+\[0\], tvm_builtin_cuda_cvta_generic_to_shared"
                            r"\(\(&\((\w+)\[", kernel))
    assert len(pushed) == 2, pushed  # the output columns and the (max, sum) statistics
    for name in pushed:
        assert not re.search(rf"\b{name}\[[^\]]*\] = ", kernel), f"{name} is written locally too"


def test_larger_batches_get_smaller_clusters_one_kernel_each(assemble):
    found = find_paged_decode(nn_llm_decode(32, 8, 64))
    ranges = batch_configs(found, load_hardware())
    # tensor cores (4 query heads a row), 8 KV heads a sequence, head dim 64 (two CTAs of 8 warps fit
    # an SM): each batch in the most CTAs a pair that run at once two an SM (clusters of 4 and 8:
    # 240 of them, 264 in clusters of 1-2); three register files where the grid runs at once at
    # one an SM (clusters of 4 and 8: 120), 4 warps past every range
    assert [(bound, c.ranks, c.warps, c.files) for bound, c in ranges] == [
        (1, 8, 8, 3), (3, 8, 8, 2), (7, 4, 8, 2), (8, 2, 8, 3), (16, 2, 8, 2), (33, 1, 8, 2), (None, 1, 4, 2)]
    assert all(c.tensor_cores for _, c in ranges)
    wide = batch_configs(find_paged_decode(nn_llm_decode(32, 8, 128)), load_hardware())
    # head dim 128: two files only, and two CTAs of 8 warps do not fit an SM's registers
    assert [(bound, c.ranks, c.warps, c.files) for bound, c in wide][-2:] == [(16, 1, 8, 2), (None, 1, 4, 2)]
    mod = tvm.IRModule({"main": paged_decode_dispatch(found, load_hardware())})
    launches = host_launch(mod, "tvm_dsm")
    assert len(launches) == len(ranges)
    for (_, config), launch in zip(ranges, launches, strict=True):
        threads = 32 * config.warps
        assert (f', {threads}, {config.ranks}, launch_params=' if config.ranks > 1
                else f', {threads}, launch_params=') in launch
    assemble(cuda_source(mod, "tvm_dsm"), "paged_decode_dispatch")


@pytest.mark.parametrize(("qo_heads", "kv_heads", "head_dim", "dtype"), [
    (8, 1, 64, "float16"), (4, 1, 128, "bfloat16"), (32, 4, 64, "float16"), (28, 4, 128, "bfloat16"),
    (8, 8, 64, "float16")])
def test_every_batch_range_builds_and_keeps_its_deepest_grid_within_what_runs_at_once(qo_heads, kv_heads,
                                                                                     head_dim, dtype):
    """Models of one to eight KV heads and groups of one to eight: the ranges' bounds rise, every
    range's kernel builds (its configuration passes the kernel's checks), and at each range's
    largest batch a grid of three register files runs at once at one CTA an SM, one of 8 warps at
    two (clusters of 4 and 8 strand SMs: Hardware.concurrent_ctas)."""
    hw = load_hardware()
    found = find_paged_decode(nn_llm_decode(qo_heads, kv_heads, head_dim, dtype))
    ranges = batch_configs(found, hw)
    bounds = [bound for bound, _ in ranges[:-1]]
    assert bounds == sorted(set(bounds)) and ranges[-1][0] is None
    paged_decode_dispatch(found, hw)
    for bound, config in ranges[:-1]:
        ctas = bound * kv_heads * config.ranks
        if config.files == 3:
            assert ctas <= hw.concurrent_ctas(config.ranks, 1), (bound, config)
        elif config.warps == 8:
            assert ctas <= hw.concurrent_ctas(config.ranks, 2), (bound, config)


def test_clusters_stay_within_a_ctas_static_shared_memory(assemble):
    wide = find_paged_decode(nn_llm_decode(16, 2, 256))  # 8 query heads of 256 columns a group
    assert default_ranks(wide, load_hardware()) == 1
    with pytest.raises(ClusterError, match="static shared memory"):
        paged_decode_kernel(wide, DecodeConfig(2, True))
    assemble(cuda_source(tvm.IRModule({"main": paged_decode_kernel(wide)}), "tvm_dsm"), "paged_decode_wide")
    assert default_ranks(find_paged_decode(nn_llm_decode(32, 4, 128)), load_hardware()) == 4


@pytest.mark.slow
def test_the_relax_pipeline_replaces_the_attention_kernels_of_an_llm():
    from tvm_dsm.workloads.llama import LLAMA_TINY, export_llama

    mod = export_llama(LLAMA_TINY, TARGET)[0]
    with tvm.target.Target(TARGET):
        replaced = use_kv_cache_kernels(mod)
    names = {gv.name_hint: f for gv, f in replaced.functions.items()}
    assert str(names["batch_decode_paged_kv"].attrs["tvm_dsm.family"]) == PAGED_DECODE
    assert "tvm_dsm.family" not in names["batch_decode_paged_kv_sliding_window"].attrs
    assert "tvm_dsm.family" not in mod["batch_decode_paged_kv"].attrs  # the input is left as it was
    assert str(names["batch_prefill_ragged_kv"].attrs["tvm_dsm.family"]) == RAGGED_PREFILL
    assert "tvm_dsm.family" not in names["batch_prefill_paged_kv"].attrs
    with tvm.target.Target(TARGET):
        decode_only = use_kv_cache_kernels(mod, names=(PAGED_DECODE,))
    assert "tvm_dsm.family" not in decode_only["batch_prefill_ragged_kv"].attrs
    target = tvm.target.Target(TARGET)
    assert schedule_kernels(mod, target)[1]["batch_decode_paged_kv"] == PAGED_DECODE  # the default
    assert schedule_kernels(mod, target, kv_cache_kernels=())[1]["batch_decode_paged_kv"] == PRESCHEDULED


def _paged_cache(rng, lengths, kv_heads, head_dim, dtype):
    """A cache holding ``lengths`` tokens per sequence on shuffled pages: (pages, indptr,
    page ids, last-page lengths, K and V per sequence as float64)."""
    counts = [max(1, math.ceil(n / PAGE)) if n else 0 for n in lengths]
    total = sum(counts) + 3
    pages = rng.standard_normal((total, 2, kv_heads, PAGE, head_dim)).astype(dtype)
    ids = rng.permutation(total)[:sum(counts)].astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([n - (c - 1) * PAGE if c else 0 for n, c in zip(lengths, counts)], np.int32)
    kv = []
    for b, n in enumerate(lengths):
        rows = [pages[ids[indptr[b] + t // PAGE], :, :, t % PAGE] for t in range(n)]
        kv.append(np.stack(rows, 2).astype(np.float64) if n else np.zeros((2, kv_heads, 0, head_dim)))
    return pages, indptr, ids, last, kv


def _reference(q, kv, group, sm_scale):
    """float64 attention per sequence and query head; the log-sum-exp in base 2."""
    batch, heads, dim = q.shape
    out, lse = np.zeros((batch, heads, dim)), np.full((batch, heads), -5e4)
    for b in range(batch):
        k, v = kv[b]
        if k.shape[1] == 0:
            continue
        for h in range(heads):
            s = k[h // group] @ q[b, h].astype(np.float64) * sm_scale
            w = np.exp(s - s.max())
            out[b, h] = w @ v[h // group] / w.sum()
            lse[b, h] = (s.max() + math.log(w.sum())) * math.log2(math.e)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("qo_heads, kv_heads, head_dim, dtype, config", [
    (32, 8, 64, "float16", DecodeConfig(8, True, 8)), (32, 8, 64, "float16", DecodeConfig(8)),
    (32, 8, 64, "float16", DecodeConfig(1, True)), (28, 4, 128, "bfloat16", DecodeConfig(4, True, 8)),
    (28, 4, 128, "bfloat16", DecodeConfig(4)), (8, 8, 128, "float16", DecodeConfig(2)),
    (8, 8, 128, "float16", DecodeConfig(2, True)), (16, 2, 256, "float16", DecodeConfig(1)),
    (32, 8, 64, "float16", None), (32, 32, 96, "float16", DecodeConfig(2)),
    (32, 8, 64, "float16", DecodeConfig(1, True, 4, files=3)), (32, 8, 64, "float16", DecodeConfig(2, True, 8, files=3)),
    (28, 4, 128, "bfloat16", DecodeConfig(2, files=3)), (32, 8, 64, "float16", DecodeConfig(8, True, 8, files=3)),
    (32, 8, 64, "float16", DecodeConfig(1, True, 8)),
])
def test_it_matches_float64_and_nn_llm_on_the_gpu(qo_heads, kv_heads, head_dim, dtype, config):
    """Both bodies (tensor cores by default where a group shares each row), a sequence of one
    token, one of exactly a page, one a token past it, an empty one."""
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    rng = np.random.default_rng()
    np_dtype = np.dtype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    lengths = [1, 16, 17, 531, 100, 0]
    pages, indptr, ids, last, kv = _paged_cache(rng, lengths, kv_heads, head_dim, np_dtype)
    q = rng.standard_normal((len(lengths), qo_heads, head_dim)).astype(np_dtype)
    sm_scale = head_dim ** -0.5
    ref_out, ref_lse = _reference(q, kv, qo_heads // kv_heads, sm_scale)
    dev = tvm.cuda(0)
    original = nn_llm_decode(qo_heads, kv_heads, head_dim, dtype)
    found = find_paged_decode(original)
    # config None: the pipeline's kernels, one per range of batch sizes, launched programmatically
    # as the pipeline launches them
    ours = (paged_decode_dispatch(found, load_hardware()).with_attr(LAUNCH_EARLY_KEY, True) if config is None
            else paged_decode_kernel(found, config))
    results = {}
    for name, func, pipeline in (("ours", ours, "tvm_dsm"), ("nn_llm", original, "default")):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=TARGET, tir_pipeline=pipeline)
        out = tvm.runtime.tensor(np.full(q.shape, np.nan, np_dtype), dev)
        lse = tvm.runtime.tensor(np.full(q.shape[:2], np.nan, np.float32), dev)
        zeros = tvm.runtime.tensor(np.zeros(len(lengths), np.int32), dev)
        args = [tvm.runtime.tensor(a, dev) for a in (q, pages, indptr, ids, last)]
        lib(*args, zeros, zeros, out, lse, 0, 1.0, 1e4, sm_scale)
        results[name] = (out.numpy().astype(np.float64), lse.numpy().astype(np.float64))
    out, lse = results["ours"]
    assert np.linalg.norm(out - ref_out) / np.linalg.norm(ref_out) < 2e-3
    assert np.abs(lse[:-1] - ref_lse[:-1]).max() < 1e-3
    assert not out[-1].any() and (lse[-1] == -5e4).all()  # an empty sequence: zeros, nn.llm's empty lse
    theirs, their_lse = results["nn_llm"]
    assert np.linalg.norm(out[:-1] - theirs[:-1]) / np.linalg.norm(theirs[:-1]) < 2e-3
    assert np.abs(lse[:-1] - their_lse[:-1]).max() < 1e-3


@pytest.mark.gpu
def test_in_kernel_rope_stops_before_launch_with_the_reason():
    dev = tvm.cuda(0)
    ours = paged_decode_kernel(find_paged_decode(nn_llm_decode(8, 2, 64)), DecodeConfig(2, True))
    lib = tvm.compile(tvm.IRModule({"main": ours}), target=TARGET, tir_pipeline="tvm_dsm")
    rng = np.random.default_rng()
    pages, indptr, ids, last, _ = _paged_cache(rng, [5], 2, 64, np.float16)
    q = rng.standard_normal((1, 8, 64)).astype(np.float16)
    args = [tvm.runtime.tensor(a, dev) for a in (q, pages, indptr, ids, last)]
    zeros = tvm.runtime.tensor(np.zeros(1, np.int32), dev)
    out = tvm.runtime.tensor(np.zeros(q.shape, np.float16), dev)
    lse = tvm.runtime.tensor(np.zeros((1, 8), np.float32), dev)
    with pytest.raises(Exception, match="RoPE"):
        lib(*args, zeros, zeros, out, lse, 1, 1.0, 1e4, 0.125)


def test_a_cache_with_rope_inside_attention_keeps_nn_llms_kernel(monkeypatch):
    """The kernel takes K stored rotated: where the KV cache is created with RoPE applied inside
    the attention kernels (RopeMode.INLINE), the pipeline leaves nn.llm's decode and prefill
    kernels, and still replaces the KV append (a copy, the same either way)."""
    from types import SimpleNamespace

    from tvm.relax.frontend.nn.llm.kv_cache import RopeMode

    from tvm_dsm.workloads import llama

    monkeypatch.setattr(llama, "RopeMode", SimpleNamespace(NORMAL=RopeMode.INLINE))
    from tvm_dsm.relax_pipeline import _rope_inside_attention

    mod = llama.export_llama(llama.LLAMA_TINY, TARGET)[0]
    assert _rope_inside_attention(mod)
    with tvm.target.Target(TARGET):
        kept = use_kv_cache_kernels(mod)
    assert "tvm_dsm.family" not in kept["batch_decode_paged_kv"].attrs
    assert "tvm_dsm.family" not in kept["batch_prefill_ragged_kv"].attrs
    assert str(kept["tir_kv_cache_transpose_append"].attrs["tvm_dsm.family"]) == KV_APPEND
