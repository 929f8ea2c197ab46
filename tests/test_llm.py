"""A Llama decoder written in ``relax.frontend.nn`` with ``nn.llm``'s paged KV cache: it exports
with symbolic batch and length, TVM's default pipeline compiles it for the H100, the "tvm_dsm"
Relax pipeline schedules every kernel and reports which tvm-dsm took, and on the CPU its prefill
and decode logits match a float64 evaluation of the same weights."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import LLVM, TARGET, kernels, relax_cuda_source
from tvm_dsm.stock import stock_target
from tvm_dsm.relax_pipeline import DLIGHT, KV_APPEND, PAGED_DECODE, PRESCHEDULED, RAGGED_PREFILL
from tvm_dsm.relax_gated import FuseGatedProjections
from tvm_dsm.relax_matmuls import MatmulsAsMatrices
from tvm_dsm.workloads.llama import (LLAMA_TINY, LlamaSession, export_llama, random_weights,
                                     reference_logits)

#: nn.llm's paged-attention kernels, scheduled by nn.llm itself.
#: nn.llm's prefill attention kernels, which keep their own schedule (decode's is replaced)
PREFILL_ATTENTION_KERNELS = {"batch_prefill_paged_kv"}


@pytest.fixture(scope="module")
def tiny_cuda():
    return export_llama(LLAMA_TINY, TARGET)


@pytest.fixture(scope="module")
def tvm_dsm_scheduled(tiny_cuda):
    """The tiny model through the "tvm_dsm" Relax pipeline (up to the VM code, before TIR
    lowering), its coverage and the pipeline's log."""
    mod, _ = tiny_cuda
    coverage: dict[str, str] = {}
    handler = _Records()
    logger = logging.getLogger("tvm_dsm.relax")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not an assignment: setLevel clears the enabled-for cache
    try:
        with TARGET:
            scheduled = relax.get_pipeline("tvm_dsm", coverage=coverage)(mod)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return scheduled, coverage, handler.messages


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _dims(param) -> list:
    return [d.name if isinstance(d, tvm.tirx.Var) else int(d) for d in param.ty.shape]


def test_prefill_and_decode_take_symbolic_batch_and_length(tiny_cuda):
    mod, names = tiny_cuda
    prefill_ids, positions = mod["prefill"].params[:2]
    decode_ids = mod["decode"].params[0]
    assert _dims(prefill_ids) == [1, "seq_len"]
    assert _dims(positions) == ["batch_size"]
    assert _dims(decode_ids) == ["batch_size", 1]
    assert "create_tir_paged_kv_cache" in [gv.name_hint for gv in mod.functions]
    assert len(names) == 1 + 6 * LLAMA_TINY.num_layers + 2  # embedding, layers, norm, head


def test_tvm_dsm_pipeline_schedules_every_kernel_and_reports_each(tvm_dsm_scheduled):
    scheduled, coverage, messages = tvm_dsm_scheduled
    kernels_left = {gv.name_hint for gv, f in scheduled.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc)
                    and not f.attrs.get("tirx.is_scheduled", False)}
    # The VM's own host functions (shape computations) are added after scheduling.
    assert all(name.startswith(("shape_func", "compute_symbolic_expr")) for name in kernels_left)
    assert PREFILL_ATTENTION_KERNELS <= {k for k, v in coverage.items() if v == PRESCHEDULED}
    assert coverage["batch_decode_paged_kv"] == PAGED_DECODE
    assert coverage["batch_prefill_ragged_kv"] == RAGGED_PREFILL
    assert coverage["tir_kv_cache_transpose_append"] == KV_APPEND
    assert any(v.startswith(DLIGHT) for v in coverage.values())
    for name, where in coverage.items():
        assert f"{name}: {where}" in messages
    assert any(m.startswith("tvm-dsm families scheduled") for m in messages)


def test_each_one_row_gemv_prefetches_its_weight_before_waiting_for_the_kernel_before(tvm_dsm_scheduled):
    """In every linear layer the model's decode batches of one and two take on the row GEMV,
    those kernels (its function's one- and two-row branches) prefetch rows of the layer's weight,
    which the pipeline names read-only, into L2 before ``griddepcontrol.wait``; the other
    branches' kernels do not."""
    import re

    from conftest import cuda_source
    from tvm_dsm.annotations import READ_ONLY_PARAMS_KEY

    scheduled, coverage, _ = tvm_dsm_scheduled
    layers = [name for name, where in coverage.items() if where.startswith("row_gemv")]
    assert len(layers) >= 5  # QKV, o_proj (two forms), gated, down, LM head
    for name in layers:
        func = scheduled[name]
        weights = {str(w) for w in func.attrs[READ_ONLY_PARAMS_KEY]}
        bodies = kernels(cuda_source(tvm.IRModule({"main": func}))).values()
        early = [re.findall(r"prefetch_L2_global\(\(&\((\w+)_ptr\[", b.split("griddepcontrol_wait")[0])
                 for b in bodies]
        assert [set(e) for e in early if e] == [weights] * 2, name


def test_the_pipeline_launches_every_kernel_of_the_model_programmatically(tvm_dsm_scheduled):
    """By default every device function, whichever schedule wrote it, asks for programmatic
    launch (the host's shape functions launch nothing)."""
    from tvm_dsm.annotations import LAUNCH_EARLY_KEY

    scheduled, coverage, _ = tvm_dsm_scheduled
    functions = [f for f in scheduled.functions.values()
                 if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("tirx.is_host_func", False)]
    assert len(functions) >= len(coverage) and all(f.attrs.get(LAUNCH_EARLY_KEY, False) for f in functions)


def test_no_tvm_dsm_family_crashes_on_the_model(tvm_dsm_scheduled):
    """The model's functions have symbolic batch and sequence lengths: a family takes them or
    refuses them by name (no crash), and dlight schedules the rest."""
    _, coverage, _ = tvm_dsm_scheduled
    assert not [name for name, where in coverage.items() if "crashed" in where]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_linear_layer_and_rms_norm_gets_a_tvm_dsm_kernel(dtype, request):
    """Every matmul is a split-K GEMM (the residual adds in their epilogues) and both RMSNorms
    row norms, for either 16-bit weight type (for the tiny model's own, the pipeline run the
    tests above share)."""
    import dataclasses

    if dtype == LLAMA_TINY.dtype:
        _, coverage, _ = request.getfixturevalue("tvm_dsm_scheduled")
    else:
        mod, _ = export_llama(dataclasses.replace(LLAMA_TINY, dtype=dtype), TARGET)
        coverage: dict[str, str] = {}
        with TARGET:
            relax.get_pipeline("tvm_dsm", coverage=coverage)(mod)
    matmuls = {name: where for name, where in coverage.items() if "matmul" in name}
    norms = {name: where for name, where in coverage.items() if name.startswith("rms_norm")}
    # a row GEMV for a batch of one, split-K GEMMs for more rows
    assert len(matmuls) >= 4 and set(matmuls.values()) == {"row_gemv/split_k_gemm"}
    assert len(norms) == 2 and set(norms.values()) == {"row_norm"}  # decode and prefill
    # the residual adds run in the output and down projections' epilogues
    assert sum(name.endswith(("_add", "_add1")) for name in matmuls) >= 2


def test_tvm_default_pipeline_compiles_the_model_for_the_h100(tiny_cuda):
    mod, _ = tiny_cuda
    executable = tvm.compile(mod, stock_target(TARGET), relax_pipeline="default",
                             tir_pipeline="s_tir_stock")
    names = set(kernels(relax_cuda_source(executable.mod)))
    assert any(name.startswith("batch_decode_paged_kv") for name in names)
    assert any("matmul" in name for name in names)


@pytest.fixture(scope="module")
def tiny_llvm():
    return export_llama(LLAMA_TINY, {"kind": "llvm"})


@pytest.fixture(scope="module")
def tiny_llvm_executable(tiny_llvm):
    """The tiny model as exported, compiled for the CPU by TVM's stock pipelines."""
    return tvm.compile(tiny_llvm[0], LLVM, tir_pipeline="s_tir_stock")


@pytest.mark.parametrize("as_matrices", [False, True])
def test_tiny_prefill_and_decode_logits_match_float64_on_cpu(as_matrices, tiny_llvm, tiny_llvm_executable):
    """Two sequences of 9 tokens prefilled together, then one decode step each; also with the
    model's matmuls rewritten as fp32-accumulated matrices (tvm_dsm.relax_matmuls), residual
    adds and reshapes folded, and its gate/up projections as gated GEMMs (tvm_dsm.relax_gated)."""
    config = LLAMA_TINY
    mod, names = tiny_llvm
    if as_matrices:
        mod = FuseGatedProjections(MatmulsAsMatrices(mod))
        assert any(gv.name_hint.startswith("gated_projection") for gv in mod.functions)
    executable = (tvm.compile(mod, LLVM, tir_pipeline="s_tir_stock") if as_matrices
                  else tiny_llvm_executable)
    weights = random_weights(config)
    session = LlamaSession(executable, tvm.cpu(), weights, names, config, max_batch_size=2,
                           max_total_seq_len=64, prefill_chunk_size=32)
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, config.vocab_size, (2, 9))
    following = rng.integers(0, config.vocab_size, (2, 1))
    prefilled = session.prefill(prompts).numpy()[0]
    decoded = session.decode(tvm.runtime.tensor(following.astype(np.int32), tvm.cpu())).numpy()[:, 0]
    float64 = {name: w.astype(np.float64) for name, w in weights.items()}
    reference = reference_logits(config, float64, np.concatenate([prompts, following], axis=1),
                                 np.array([8, 9]), np, lambda a: a)
    for got, want in ((prefilled, reference[:, 0]), (decoded, reference[:, 1])):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2  # fp16 model: ~5e-3
    if not as_matrices:  # an emptied cache prefills the same prompts to the same logits
        session.reset()
        assert session.batch == 0
        np.testing.assert_array_equal(session.prefill(prompts).numpy()[0], prefilled)
        sharing = LlamaSession(executable, tvm.cpu(), session.params, names, config, max_batch_size=2,
                               max_total_seq_len=64, prefill_chunk_size=32)  # the same weights, not a copy
        assert all(a.same_as(b) for a, b in zip(sharing.params, session.params, strict=True))
        np.testing.assert_array_equal(sharing.prefill(prompts).numpy()[0], prefilled)
        with pytest.raises(ValueError, match="parameters in order"):
            LlamaSession(executable, tvm.cpu(), session.params[1:], names, config, max_batch_size=2,
                         max_total_seq_len=64, prefill_chunk_size=32)
        # a chunk of 9 tokens: one sequence a call, the same logits, and decode goes on from both
        chunked = LlamaSession(executable, tvm.cpu(), weights, names, config, max_batch_size=2,
                               max_total_seq_len=64, prefill_chunk_size=9)
        np.testing.assert_allclose(chunked.prefill(prompts).numpy()[0], prefilled, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(
            chunked.decode(tvm.runtime.tensor(following.astype(np.int32), tvm.cpu())).numpy()[:, 0],
            decoded, rtol=1e-3, atol=1e-3)
        short = LlamaSession(executable, tvm.cpu(), weights, names, config, max_batch_size=2,
                             max_total_seq_len=64, prefill_chunk_size=8)
        with pytest.raises(ValueError, match="longer than the prefill chunk"):
            short.prefill(prompts)
        with pytest.raises(ValueError, match="at least one prompt"):
            short.prefill(prompts[:0])


def test_decode_steps_prepared_ahead_give_the_same_logits_and_are_taken_back(tiny_llvm, tiny_llvm_executable):
    """A session that prepares each next decode step while the device computes gives the
    logits of one that does not: over decode steps up to a full page (the prepared step takes a
    new page), a prefill of a new sequence between them (the prepared step taken back, its page
    freed), decoding all three together and a reset; and in a cache with no page to spare at the
    last step, where it prepares nothing rather than run out of pages."""
    config = LLAMA_TINY
    names, executable = tiny_llvm[1], tiny_llvm_executable
    weights = random_weights(config)
    rng = np.random.default_rng(2)
    prompts, late = rng.integers(0, config.vocab_size, (2, 14)), rng.integers(0, config.vocab_size, (1, 5))
    steps = rng.integers(0, config.vocab_size, (4, 3, 1)).astype(np.int32)
    pages = tvm.get_global_func("vm.builtin.attention_kv_cache_get_num_available_pages")

    def session(prepare_ahead: bool, max_total_seq_len: int) -> LlamaSession:
        return LlamaSession(executable, tvm.cpu(), weights, names, config, max_batch_size=3,
                            max_total_seq_len=max_total_seq_len, prefill_chunk_size=32, prepare_ahead=prepare_ahead)

    def decode(s: LlamaSession, tokens: np.ndarray) -> np.ndarray:
        return s.decode(tvm.runtime.tensor(tokens, tvm.cpu())).numpy()

    def run(prepare_ahead: bool) -> tuple[list[np.ndarray], list[int]]:
        s = session(prepare_ahead, 96)
        out = [s.prefill(prompts).numpy()] + [decode(s, steps[i, :2]) for i in range(2)]  # 16 tokens each
        free = [int(pages(s.cache))]
        out.append(s.prefill(late).numpy())
        free.append(int(pages(s.cache)))
        out.append(decode(s, steps[2]))
        s.reset()
        out += [s.prefill(prompts).numpy(), decode(s, steps[3, :2])]
        return out, free

    (ahead, ahead_free), (plain, plain_free) = run(True), run(False)
    for got, want in zip(ahead, plain):
        np.testing.assert_array_equal(got, want)
    assert ahead_free[0] == plain_free[0] - 2  # the prepared 17th tokens took a page each
    assert ahead_free[1] == plain_free[1]  # and gave them back before the prefill
    exact = [session(prepare_ahead, 32) for prepare_ahead in (True, False)]  # 2 pages a sequence
    for s in exact:
        s.prefill(prompts)
    for i in range(2):
        np.testing.assert_array_equal(*(decode(s, steps[i, :2]) for s in exact))
    with pytest.raises(ValueError, match="prepare_ahead needs step_graphs"):
        LlamaSession(executable, tvm.cuda(0), weights, names, config, max_batch_size=1, max_total_seq_len=16,
                     prefill_chunk_size=16, prepare_ahead=True)


def _run(date: str, configs: dict) -> dict:
    return {"suite": "llm", "device": "GPU", "date": date, "versions": {}, "prompt_len": 512, "configs": configs}


def test_merged_runs_give_a_row_per_point_with_the_other_contenders_as_peers(tmp_path):
    from tvm_dsm.gpu.llm_results import merge

    profile = {"rows": [{"function": f"k{n}", "us_per_step": float(n), "launches_per_step": 2.0} for n in range(6)]}
    checked = {"decode_ms_per_step": 1.0, "prefill_ms": 3.0, "floor_ms": 0.5, "logits_vs_fp32": {"rel_l2_max": 2e-3},
               "decode_kernels": profile}
    ours = _run("day 1", {"tvm_dsm_step_graphs": {
        "batches": {"1": checked, "8": checked | {"logits_vs_fp32": {"rel_l2_max": 9e-3}}},
        "contexts": {"2048": {"1": {"decode_ms_per_step": 2.0, "prefill_ms": 9.0, "floor_ms": 0.6}}}}})
    early = _run("day 1", {"torch_compile": {"batches": {"1": {"decode_ms_per_step": 9.9, "prefill_ms": 9.9}},
                                             "contexts": {"2048": {"1": {"decode_ms_per_step": 3.0}}}}})
    late = _run("day 2", {"torch_compile": {"batches": {"1": {"decode_ms_per_step": 1.5, "prefill_ms": 4.0}}}})
    paths = []
    for n, run in enumerate((ours, early, late)):
        paths.append(tmp_path / f"{n}.json")
        paths[-1].write_text(json.dumps(run))
    merged = merge(paths, tmp_path / "merged.json")
    rows = {r["name"]: r for r in merged["rows"]}
    assert sorted(rows) == [f"tvm_dsm_step_graphs_{p}" for p in (
        "decode_len2048_batch1", "decode_len512_batch1", "decode_len512_batch8",
        "prefill_len2048_batch1", "prefill_len512_batch1", "prefill_len512_batch8")]
    one = rows["tvm_dsm_step_graphs_decode_len512_batch1"]
    assert one["peers"] == {"torch_compile": 1500.0}  # the later run's point replaced the earlier's
    assert (one["ours_us"], one["floor_us"], one["ok"]) == (1000.0, 500.0, True)
    assert rows["tvm_dsm_step_graphs_decode_len2048_batch1"]["peers"] == {"torch_compile": 3000.0}  # kept
    assert rows["tvm_dsm_step_graphs_prefill_len512_batch1"]["floor_us"] is None
    assert [k["function"] for k in one["kernels"]] == ["k5", "k4", "k3", "k2"]  # what holds it back
    assert rows["tvm_dsm_step_graphs_prefill_len512_batch1"]["kernels"] is None  # not profiled
    assert not rows["tvm_dsm_step_graphs_decode_len512_batch8"]["ok"]  # 9e-3 past the 5e-3 bound
    assert rows["tvm_dsm_step_graphs_decode_len512_batch8"]["peers"] == {}
    assert merged["date"] == "day 2" and [r["date"] for r in merged["runs"]] == ["day 1", "day 1", "day 2"]
    (tmp_path / "other.json").write_text(json.dumps(late | {"prompt_len": 128}))
    with pytest.raises(ValueError, match="differ in prompt_len"):
        merge([paths[0], tmp_path / "other.json"], tmp_path / "bad.json")


def test_decode_rows_carry_the_mean_step_where_runs_recorded_it(tmp_path):
    """The median is a decode row's figure; the mean (graph captures of new page layouts
    included) is the per-token latency over the steps, ours and each peer's where recorded."""
    from tvm_dsm.gpu.llm import _decode_timing
    from tvm_dsm.gpu.llm_results import merge

    steps = [1.0] * 13 + [1.3, 1.3, 2.5]  # a page's worth of steps: two eager, one capture
    ours = _decode_timing(steps, 0.5)
    assert (ours["decode_ms_per_step"], ours["decode_ms_mean"], ours["multiple_of_floor"]) == (1.0, 1.1313, 2.0)
    run = _run("day 1", {"tvm_dsm_step_graphs": {"batches": {"1": ours}},
                         "torch_compile": {"batches": {"1": _decode_timing([1.2, 1.2, 1.2], 0.5)}},
                         "tvm_mlc": {"batches": {"1": {"decode_ms_per_step": 2.0, "floor_ms": 0.5}}}})
    (tmp_path / "run.json").write_text(json.dumps(run))
    row = merge([tmp_path / "run.json"], tmp_path / "merged.json")["rows"][0]
    assert row["ours_us"] == 1000.0 and row["ours_mean_us"] == pytest.approx(1131.3)
    assert row["peers_mean"] == {"torch_compile": pytest.approx(1200.0)}  # tvm_mlc's run has none


def test_each_timed_point_is_profiled_from_its_own_prompts_and_times():
    """The profiling pass (after every timing) re-creates what each timed point ran: the main
    prompts cut to the batch, the other lengths' prompts drawn as their timing drew them; points
    that were not timed (a failed batch) are left out."""
    from tvm_dsm.gpu.llm import context_prompts, profiled_points

    prompts = np.arange(8 * 5).reshape(8, 5)
    rows = {"batches": {"1": {"decode_ms_per_step": 1.0, "prefill_ms": 2.0},
                        "8": {"decode_ms_per_step": 1.5, "prefill_ms": 9.0}},
            "contexts": {"16": {"1": {"decode_ms_per_step": 3.0, "prefill_ms": 4.0},
                                "8": {"decode_ms_per_step": 5.0, "prefill_ms": 6.0}}}}
    points = profiled_points(rows, LLAMA_TINY, prompts, [1, 4, 8], [16])
    assert [p[3] for p in points] == [("batches", "1"), ("batches", "8"), ("contexts", "16", "1"),
                                      ("contexts", "16", "8")]
    assert [p[1:3] for p in points] == [(1.0, 2.0), (1.5, 9.0), (3.0, 4.0), (5.0, None)]
    assert points[1][0].shape == (8, 5) and (points[0][0] == prompts[:1]).all()
    drawn = {(c, b): t for c, b, t in context_prompts(LLAMA_TINY, [16], [1, 4, 8])}
    assert (points[3][0] == drawn[(16, 8)]).all() and points[3][0].shape == (8, 16)
