"""A Llama decoder end to end on the GPU: TVM's own LLM stack against tvm-dsm's Relax pipeline.

On the device machine (full TVM compiler, torch, one GPU)::

    python3 -m tvm_dsm.gpu.llm --out $OUT/llm.json

The 1B-class model of :mod:`tvm_dsm.workloads.llama` (random fp16 weights, ``nn.llm``'s TIR
paged KV cache) is compiled in up to four ways, each in its own process and all at once (a compile that
crashes its process costs that configuration only):

- ``tvm_default``: ``tvm.compile(relax_pipeline="default")``, TVM's stock TIR pipeline, arch
  sm_90 (dlight skips tensor cores on "sm_90a");
- ``tvm_mlc``: as MLC-LLM builds it: weight transposes folded into the matmuls, the matmuls of a
  symbolic batch dispatched over dlight's low-batch GEMV (up to 8 rows) and matmul rules, dlight
  for the rest, TVM's stock TIR pipeline, sm_90;
- ``tvm_dsm``: ``relax_pipeline="tvm_dsm"`` (:mod:`tvm_dsm.relax_pipeline`), tvm-dsm's TIR
  pipeline, sm_90a, ``nn.llm``'s decode and prefill attention replaced by tvm-dsm's; its per-kernel
  coverage (family or dlight) goes into the results;
- ``tvm_dsm_nn_llm_attention``: the same keeping ``nn.llm``'s decode and prefill attention
  (``kv_cache_kernels=(KV_APPEND,)``);
- ``tvm_dsm_step_graphs``: ``tvm_dsm`` compiled without Relax's CUDA-graph rewrite, its decode
  steps replayed whole from CUDA graphs, the KV cache's attention calls included
  (:class:`tvm_dsm.workloads.llama.LlamaSession` with ``step_graphs``), each next step's
  ``begin_forward`` called while the device computes this one (the session's default);
- ``tvm_dsm_step_graphs_late``: the same with only the kernels whose schedules ask for it
  launched programmatically (``relax.get_pipeline("tvm_dsm", launch_early=False)``): the A/B of
  each kernel launching while the one before it runs;
- ``tvm_dsm_step_graphs_ungated``: the same with each SwiGLU's gate/up projection a GEMM and a
  split/SiLU/multiply kernel (``gated_projections=False``): the A/B of one gated GEMM;
- ``tvm_dsm_step_graphs_behind``: ``tvm_dsm_step_graphs`` whose session calls each step's
  ``begin_forward`` at the step's start (``prepare_ahead=False``): the A/B of the host's
  page-table bookkeeping between steps;
- ``tvm_dsm_tuned``: ``tvm_dsm`` compiled from the tuning records in ``--database``, which
  ``python3 -m tvm_dsm.gpu.llm tune --work-dir DIR`` writes (:func:`tune_model`);

and the same weights in torch (:mod:`tvm_dsm.gpu.torch_llama`: static KV cache, SDPA) eager and
under ``torch.compile`` (decode with ``mode="reduce-overhead"``, prefill Inductor's kernels
without CUDA graphs), prefill and decode also at each ``--contexts`` length (``--no-torch`` leaves
them out).

Then, one configuration at a time on the GPU (its weights copied there once, shared by its
sessions as a server holds them), for each batch size: prefill a random prompt per
sequence in ragged prefills (whole sequences, up to ``PREFILL_CHUNK_TOKENS`` a call), decode
``--check-steps`` teacher-forced steps (fixed random tokens) whose logits and the prefill's are
compared with an fp32 torch evaluation of the same weights
(:func:`tvm_dsm.workloads.llama.reference_logits`), then, after a few untimed steps, time
``--steps`` decode steps: host wall time around each step with the device synchronized before
and after, the median (the row's figure) and the mean (a new page layout's capture included);
last, the prefill is timed again, warm, into an emptied cache. ``--contexts`` times prefill and
decode at more prompt lengths (random tokens, not checked). After every timing, torch's
included, each point is broken down by kernel in a fresh session (the weights copied again):
decode steps under the CUDA profiler (:mod:`tvm_dsm.gpu.kernel_breakdown`), and the prefill (at
the first batch size only for the ``--contexts`` lengths); see :func:`_profile_config`.
Every configuration is compiled with Relax's CUDA-graph rewrite on (``--no-cuda-graph`` turns it
off): the kernels between the KV cache's calls are captured once per batch size and replayed, as
MLC-LLM serves. The floor is the bytes one step must read (weights and KV cache) over the HBM
bandwidth measured in the same run. Results are written after every step, so a job cut short
leaves what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..bench.results import git_sha
from .llm_results import merge, schema_rows
from ..relax_pipeline import DEFAULT_KV_CACHE_KERNELS, KV_APPEND
from .kernel_breakdown import profile_kernels
from ..workloads.llama import LLAMA_1B, LLAMA_TINY, LlamaConfig

MODELS = {"1b": LLAMA_1B, "1b_bf16": dataclasses.replace(LLAMA_1B, dtype="bfloat16"), "tiny": LLAMA_TINY}
CONFIGS = ("tvm_default", "tvm_mlc", "tvm_dsm", "tvm_dsm_nn_llm_attention", "tvm_dsm_tuned", "tvm_dsm_step_graphs",
           "tvm_dsm_step_graphs_late", "tvm_dsm_step_graphs_ungated", "tvm_dsm_step_graphs_behind")
#: The configurations whose sessions replay decode steps from graphs of their own.
STEP_GRAPH_CONFIGS = ("tvm_dsm_step_graphs", "tvm_dsm_step_graphs_late", "tvm_dsm_step_graphs_ungated",
                      "tvm_dsm_step_graphs_behind")
#: The configurations whose sessions never prepare a decode step ahead (``prepare_ahead=False``;
#: the others take the session's default).
PREPARE_BEHIND_CONFIGS = ("tvm_dsm_step_graphs_behind",)
#: The configurations whose gate/up projections stay a GEMM and a split/SiLU/multiply.
UNGATED_CONFIGS = ("tvm_dsm_step_graphs_ungated",)
#: The configurations whose kernels launch programmatically only where their schedules ask
#: (``launch_early=False``; the others launch every kernel so).
LAUNCH_LATE_CONFIGS = ("tvm_dsm_step_graphs_late",)
#: The ``nn.llm`` kernels each tvm-dsm configuration replaces (:mod:`tvm_dsm.relax_pipeline`).
KV_CACHE_KERNELS = {"tvm_dsm": DEFAULT_KV_CACHE_KERNELS, "tvm_dsm_nn_llm_attention": (KV_APPEND,),
                    "tvm_dsm_tuned": DEFAULT_KV_CACHE_KERNELS, "tvm_dsm_step_graphs": DEFAULT_KV_CACHE_KERNELS,
                    "tvm_dsm_step_graphs_late": DEFAULT_KV_CACHE_KERNELS,
                    "tvm_dsm_step_graphs_ungated": DEFAULT_KV_CACHE_KERNELS,
                    "tvm_dsm_step_graphs_behind": DEFAULT_KV_CACHE_KERNELS}
#: Untimed decode steps before the timed ones (the first steps of a batch size capture its
#: CUDA graph; a fresh process also runs its first steps slower).
WARMUP_STEPS = 10
#: Decode steps of a point's per-kernel breakdown (:func:`_profile_config`; one outside the profiler).
PROFILED_STEPS = 6
#: Prefills timed (into an emptied cache) after the first; the median is reported.
PREFILL_REPEATS = 3
#: Prefills the per-kernel breakdown of a prefill runs (after one outside the profiler).
PREFILL_PROFILED = 2
#: Seconds one configuration's compile process may take.
COMPILE_TIMEOUT_S = 300
PAGE_SIZE = 16
#: The most tokens one prefill call takes (whole sequences a call, as a server chunks its
#: prefill): the tvm-dsm kernels' tensors stay under 2^31 elements (the widest activation, the
#: 16384-wide gate/up product, at 65536 tokens holds 2^30).
PREFILL_CHUNK_TOKENS = 65536


def _log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


def mlc_pipeline():
    """TVM's CUDA Relax pipeline as MLC-LLM arranges its scheduling part: transposes folded into
    the matmuls, the matmuls of a symbolic batch dispatched over dlight's low-batch GEMV and
    matmul rules (:class:`tvm_dsm.relax_pipeline.LowBatchDispatch`), dlight for the rest,
    under :func:`stock_target`."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda

    from ..stock import stock_rules, stock_target
    from ..relax_pipeline import LowBatchDispatch

    @tvm.transform.module_pass(opt_level=0, name="tvm_dsm.gpu.MlcStylePipeline")
    def _pipeline(mod, _ctx):
        target = tvm.target.Target.current(allow_none=False)
        with target:
            mod = tvm.transform.Sequential(cuda.library_dispatch_passes(target) + [
                relax.transform.FuseTransposeMatmul(), relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
                relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
        with stock_target(target):
            mod = stock_rules()(LowBatchDispatch(mod))
        with target:
            return tvm.transform.Sequential(cuda.dataflow_lower_passes(target)
                                            + cuda.finalize_passes(target))(mod)

    return _pipeline


def compile_config(name: str, config: LlamaConfig, lib: Path, info: Path, cuda_graph: bool = False,
                   database: str | None = None) -> None:
    """Export and compile the model as configuration ``name``; the library to ``lib``, the
    weight names, compile seconds and (tvm_dsm) kernel coverage as JSON to ``info``.
    ``cuda_graph``: Relax's ``RewriteCUDAGraph`` captures the kernels between the KV cache's
    calls into CUDA graphs, replayed on later calls (``relax.backend.use_cuda_graph``; never for
    :data:`STEP_GRAPH_CONFIGS`, whose sessions capture whole steps)."""
    import tvm

    from ..hardware import H100
    from ..stock import stock_target
    from ..workloads.llama import export_llama

    target = tvm.target.Target(H100, host="llvm")
    cuda_graph = cuda_graph and name not in STEP_GRAPH_CONFIGS
    if not name.startswith("tvm_dsm"):
        target = stock_target(target)
    start = time.time()
    mod, names = export_llama(config, target)
    coverage: dict[str, str] = {}
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": cuda_graph}):
        executable = _compile(name, mod, target, coverage, database)
    executable.export_library(str(lib))
    info.write_text(json.dumps({"names": names, "compile_s": round(time.time() - start, 1),
                                "cuda_graph": cuda_graph, "step_graphs": name in STEP_GRAPH_CONFIGS,
                                "prepare_ahead": False if name in PREPARE_BEHIND_CONFIGS else None,
                                "coverage": coverage or None}))


def _compile(name: str, mod, target, coverage: dict, database: str | None = None):
    """``mod`` compiled as configuration ``name`` (see the module docstring; ``database``: the
    tuning work_dir of ``tvm_dsm_tuned``)."""
    import tvm
    from tvm import relax

    from ..tuning_database import open_database

    if name == "tvm_default":
        return tvm.compile(mod, target, relax_pipeline="default", tir_pipeline="s_tir_stock")
    if name == "tvm_mlc":
        return tvm.compile(mod, target, relax_pipeline=mlc_pipeline(), tir_pipeline="s_tir_stock")
    if name == "tvm_dsm_tuned" and not database:
        raise ValueError("tvm_dsm_tuned compiles from a tuning database: pass --database WORK_DIR")
    pipeline = relax.get_pipeline("tvm_dsm", coverage=coverage, kv_cache_kernels=KV_CACHE_KERNELS[name],
                                  database=open_database(database) if name == "tvm_dsm_tuned" else None,
                                  launch_early=name not in LAUNCH_LATE_CONFIGS,
                                  gated_projections=name not in UNGATED_CONFIGS)
    return tvm.compile(mod, target, relax_pipeline=pipeline)


def tune_model(config: LlamaConfig, work_dir: str, rows: tuple[int, ...], trials: int) -> None:
    """The model's kernels tuned into the JSON database in ``work_dir`` (resumed if it holds
    records): ``trials`` candidates for each task of :func:`tvm_dsm.meta_schedule.tune_relax`,
    the functions over the symbolic batch or sequence length at the row ranges planned for
    ``rows``."""
    import tvm

    from ..driver import H100
    from ..hardware import load_hardware
    from ..meta_schedule import tune_relax
    from ..meta_schedule.relax_tuning import H100_TAG, tuning_tasks
    from ..workloads.llama import export_llama

    mod, _ = export_llama(config, tvm.target.Target(H100, host="llvm"))
    tasks = tuning_tasks(mod, tvm.target.Target(H100_TAG), load_hardware(), rows=rows)
    _log(f"tuning {len(tasks)} tasks, {trials} trials each, into {work_dir}")
    tune_relax(mod, work_dir, max_trials_global=trials * len(tasks), num_trials_per_iter=trials, tasks=tasks)


def _compile_all(configs: list[str], model: str, folder: Path, cuda_graph: bool,
                 database: str | None = None) -> dict[str, dict]:
    """Every configuration compiled in its own process, all at once; per configuration its
    info (:func:`compile_config`) or its error."""
    procs = {}
    for name in configs:
        cmd = [sys.executable, "-m", "tvm_dsm.gpu.llm", "compile", name, "--model", model,
               "--folder", str(folder), *(["--cuda-graph"] if cuda_graph else []),
               *(["--database", database] if database else [])]
        log = open(folder / f"{name}.log", "w")
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log
    done = {}
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        info = folder / f"{name}.json"
        if proc.returncode == 0 and info.exists():
            done[name] = json.loads(info.read_text())
        else:
            tail = (folder / f"{name}.log").read_text()[-2000:]
            done[name] = {"error": f"compile process exited with {proc.returncode}", "log_tail": tail}
        _log(f"compiled {name}: {done[name].get('compile_s', done[name].get('error'))}")
    return done


def logit_errors(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Relative L2 error per row (the worst), and the argmax agreement over the rows whose
    top-2 reference gap exceeds ten times that row's largest error (random weights make
    near-ties common, so raw greedy agreement would not be a fair test)."""
    got, ref = got.reshape(-1, got.shape[-1]), ref.reshape(-1, ref.shape[-1])
    rel = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 10 * np.abs(got - ref).max(axis=-1)
    agree = got.argmax(-1) == ref.argmax(-1)
    return {"rel_l2_max": float(rel.max()), "clear_rows": int(clear.sum()),
            "argmax_agree_clear": float(agree[clear].mean()) if clear.any() else None}


def torch_reference(config: LlamaConfig, weights, prompts, forced, check_steps: int) -> np.ndarray:
    """fp32 torch logits ``[batch, 1 + check_steps, vocab]``: after the prompt, then after each
    teacher-forced token."""
    import torch

    from ..workloads.llama import reference_logits

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def asarray(a):
        return torch.as_tensor(a, device="cuda",
                               dtype=torch.float32 if a.dtype.kind == "f" else None)

    dev_weights = {name: asarray(w) for name, w in weights.items()}
    tokens = np.concatenate([prompts, forced[:, :check_steps]], axis=1)
    positions = np.arange(prompts.shape[1] - 1, tokens.shape[1])
    with torch.no_grad():
        logits = reference_logits(config, dev_weights, tokens, positions, torch, asarray)
    out = logits.cpu().numpy()
    del dev_weights, logits
    torch.cuda.empty_cache()
    return out


def _run_config(executable, info: dict, config: LlamaConfig, params: list, prompts, forced,
                reference: np.ndarray, batches: list[int], check_steps: int, steps: int,
                bandwidth: float, record) -> None:
    """Prefill, check and time decode at every batch size; each batch's row to ``record``
    (its kernels are profiled later: :func:`_profile_config`)."""
    import tvm

    dev = tvm.cuda(0)
    prompt_len = prompts.shape[1]
    for batch in batches:
        session = _session(executable, info, config, params, batch, prompt_len,
                           check_steps + WARMUP_STEPS + steps)
        logits, prefill_ms = _wall_ms(functools.partial(session.prefill, prompts[:batch]), dev.sync)
        got = [logits.numpy()[0]]
        for step in range(check_steps):
            token = tvm.runtime.tensor(forced[:batch, step:step + 1].astype(np.int32), dev)
            got.append(session.decode(token).numpy()[:, 0])
        checks = logit_errors(np.stack(got, axis=1), reference[:batch])
        token = tvm.runtime.tensor(forced[:batch, :1].astype(np.int32), dev)
        times = _decode_times(functools.partial(session.decode, token), steps, dev.sync)
        context = prompt_len + check_steps + WARMUP_STEPS + steps // 2
        floor_ms = _decode_floor_ms(config, batch, context, bandwidth)
        decode_ms = float(np.median(times))
        warm_prefill_ms = _warm_prefill_ms(session, prompts[:batch], dev.sync)
        record(batch, {"prefill_ms_first_call": round(prefill_ms, 3), "prefill_ms": round(warm_prefill_ms, 3)}
               | _decode_timing(times, floor_ms)
               | {"decode_ms_min": round(min(times), 4), "decode_ms_steps": [round(t, 3) for t in times],
                  "context": context, "logits_vs_fp32": checks})
        _log(f"  batch {batch}: decode {decode_ms:.3f} ms/step ({decode_ms / floor_ms:.2f}x "
             f"floor), prefill {warm_prefill_ms:.1f} ms (first call {prefill_ms:.1f}), "
             f"logits rel err {checks['rel_l2_max']:.2e}")
        session.close()
        del session


def _profile_config(executable, info: dict, config: LlamaConfig, params: list, points: list[tuple],
                    record) -> None:
    """The per-kernel breakdown of each timed point ``(prompts, decode_ms, prefill_ms or None,
    key)``: a fresh session prefilled with ``prompts``, ``WARMUP_STEPS`` decode steps, one more,
    then ``PROFILED_STEPS - 1`` under the CUDA profiler (and the prefill, where ``prefill_ms`` is
    given); ``record(key, {"decode_kernels": ..., "prefill_kernels": ...})``. Its steps read
    fewer keys than the timed ones (those after the check steps and half the timed steps), so
    the idle time it derives from ``decode_ms`` is a little high. Run after every
    timing of the run: a torch.profiler session leaves the CUDA profiling interface attached to
    the process, which then adds about 37 us to every CUDA-graph launch (H200, a decode step's
    graph: 5.5 us before the first profile, 41-45 after; ``bench/results/archive/llama_1b_host_parts_s61.json``),
    and torch's contenders are never profiled."""
    import tvm

    dev = tvm.cuda(0)
    for prompts, decode_ms, prefill_ms, key in points:
        session = _session(executable, info, config, params, prompts.shape[0], prompts.shape[1],
                           WARMUP_STEPS + PROFILED_STEPS)
        session.prefill(prompts)
        token = tvm.runtime.tensor(prompts[:, :1].astype(np.int32), dev)
        decode_step = functools.partial(session.decode, token)
        for _ in range(WARMUP_STEPS):
            decode_step()
        kernels = {"decode_kernels": profile_kernels(decode_step, steps=PROFILED_STEPS - 1, step_us=decode_ms * 1e3)}
        if prefill_ms is not None:
            kernels["prefill_kernels"] = _prefill_kernels(session, prompts, prefill_ms)
        record(key, kernels)
        _log(f"  {key}: {kernels['decode_kernels']['kernels_per_step']:.0f} kernels, "
             f"{kernels['decode_kernels']['kernel_us_per_step']:.0f} us of them a decode step")
        session.close()
        del session


def _session(executable, info: dict, config: LlamaConfig, params: list, batch: int, prompt_len: int,
             decode_steps: int):
    """A session on ``params`` (the device weights its configuration's sessions share) whose
    cache holds ``batch`` sequences of ``prompt_len`` tokens and ``decode_steps`` more each,
    prefilled in calls of up to :data:`PREFILL_CHUNK_TOKENS` tokens."""
    import tvm

    from ..workloads.llama import LlamaSession

    pages_per_seq = -(-(prompt_len + decode_steps) // PAGE_SIZE)
    return LlamaSession(executable, tvm.cuda(0), params, info["names"], config, max_batch_size=batch,
                        max_total_seq_len=batch * pages_per_seq * PAGE_SIZE,
                        prefill_chunk_size=min(batch * prompt_len, PREFILL_CHUNK_TOKENS), page_size=PAGE_SIZE,
                        step_graphs=info.get("step_graphs", False), prepare_ahead=info.get("prepare_ahead"))


def _decode_times(decode_step: Callable[[], Any], steps: int, sync: Callable[[], None]) -> list[float]:
    """Wall times (ms) of ``steps`` decode steps, after ``WARMUP_STEPS`` untimed ones."""
    for _ in range(WARMUP_STEPS):
        decode_step()
    return [_wall_ms(decode_step, sync)[1] for _ in range(steps)]


def _warm_prefill_ms(session, prompts: np.ndarray, sync: Callable[[], None]) -> float:
    """Median wall time of ``PREFILL_REPEATS`` prefills of ``prompts`` into an emptied cache
    (the first call of a process also loads and initializes; this is the steady state)."""
    times = []
    for _ in range(PREFILL_REPEATS):
        session.reset()
        times.append(_wall_ms(functools.partial(session.prefill, prompts), sync)[1])
    return float(np.median(times))


def _prefill_kernels(session, prompts: np.ndarray, prefill_ms: float) -> dict:
    """The per-kernel breakdown of a prefill of ``prompts`` into an emptied cache (its wall
    time ``prefill_ms``)."""
    def prefill():
        session.reset()
        session.prefill(prompts)

    return profile_kernels(prefill, steps=PREFILL_PROFILED, step_us=prefill_ms * 1e3)


def _run_contexts(executable, info: dict, config: LlamaConfig, params: list, contexts: list[int],
                  batches: list[int], steps: int, bandwidth: float, record, time_prefill: bool = True) -> None:
    """Prefill and decode timed at each prompt length of ``contexts`` and batch size (random
    tokens, :func:`context_prompts`; the logits are checked at the main prompt length only):
    one row per (context, batch) to ``record``. ``time_prefill=False`` prefills once, untimed,
    to fill the cache for decode (a stack whose prefill takes minutes at long contexts)."""
    import tvm

    dev = tvm.cuda(0)
    for context, batch, prompts in context_prompts(config, contexts, batches):
        session = _session(executable, info, config, params, batch, context, WARMUP_STEPS + steps)
        prefill = {}
        if time_prefill:
            prefill = {"prefill_ms": round(_warm_prefill_ms(session, prompts, dev.sync), 3)}
        else:
            session.prefill(prompts)
        token = tvm.runtime.tensor(prompts[:, :1].astype(np.int32), dev)
        times = _decode_times(functools.partial(session.decode, token), steps, dev.sync)
        decode_ms = float(np.median(times))
        floor_ms = _decode_floor_ms(config, batch, context + WARMUP_STEPS + steps // 2, bandwidth)
        record(context, batch, prefill | _decode_timing(times, floor_ms))
        _log(f"  context {context} batch {batch}: prefill {prefill.get('prefill_ms', 'untimed')} ms, decode "
             f"{decode_ms:.3f} ms/step ({decode_ms / floor_ms:.2f}x floor)")
        session.close()
        del session


def profiled_points(rows: dict, config: LlamaConfig, prompts: np.ndarray, batches: list[int],
                    contexts: list[int]) -> list[tuple]:
    """:func:`_profile_config`'s points for a configuration's timed ``rows`` (its results'
    ``batches`` and ``contexts``): each timed point's prompts (the main ``prompts`` cut to the
    batch; :func:`context_prompts` at the other lengths), decode step and prefill time (the
    prefill at the other lengths at the first batch size only) and where its row lies; points
    that were not timed are left out."""
    points = [(prompts[:batch], row["decode_ms_per_step"], row["prefill_ms"], ("batches", str(batch)))
              for batch in batches if (row := rows["batches"].get(str(batch)))]
    points += [(tokens, row["decode_ms_per_step"], row.get("prefill_ms") if batch == batches[0] else None,
                ("contexts", str(context), str(batch)))
               for context, batch, tokens in context_prompts(config, contexts, batches)
               if (row := rows.get("contexts", {}).get(str(context), {}).get(str(batch)))]
    return points


def context_prompts(config: LlamaConfig, contexts: list[int], batches: list[int]):
    """``(context, batch, prompts)`` of every point :func:`_run_contexts` times, in its order:
    the same random tokens each time it is called."""
    rng = np.random.default_rng(1)
    for context in contexts:
        for batch in batches:
            yield context, batch, rng.integers(0, config.vocab_size, (batch, context))


def _wall_ms(call: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """``call()``'s result and its host wall time in milliseconds, the device synchronized
    (``sync``) before and after."""
    sync()
    start = time.perf_counter()
    result = call()
    sync()
    return result, (time.perf_counter() - start) * 1e3


def _decode_floor_ms(config: LlamaConfig, batch: int, context: int, bandwidth: float) -> float:
    """The bytes one decode step must read (every weight, the batch's KV cache) over the HBM
    bandwidth, in milliseconds."""
    kv_bytes = batch * context * config.num_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    return (config.weight_bytes + kv_bytes) / bandwidth * 1e3


def _torch_prefill_ms(model, tokens) -> dict[str, float]:
    """Warm prefill times of ``model`` (a :class:`~tvm_dsm.gpu.torch_llama.TorchLlama`) over
    ``tokens``, eager and under ``torch.compile`` (Inductor's kernels; no CUDA graphs, whose
    static inputs a prefill of new prompts would copy): the median of ``PREFILL_REPEATS`` after
    the calls that compile and warm up, in milliseconds by contender."""
    import torch

    times = {}
    for name, prefill in (("torch_eager", model.prefill), ("torch_compile", torch.compile(model.prefill))):
        for _ in range(2):
            prefill(tokens)
        times[name] = float(np.median([_wall_ms(functools.partial(prefill, tokens), torch.cuda.synchronize)[1]
                                       for _ in range(PREFILL_REPEATS)]))
    return times


def _torch_decoders(model) -> list[tuple[str, Callable]]:
    """The torch contenders' decode steps of ``model``: eager, and under
    ``torch.compile(mode="reduce-overhead")`` (one CUDA graph a step)."""
    import torch

    return [("torch_eager", model.decode), ("torch_compile", torch.compile(model.decode, mode="reduce-overhead"))]


def _decode_timing(times: list[float], floor_ms: float) -> dict:
    """A results row's decode fields from the step times ``times`` (ms): the median step (the
    row's figure), the mean (the per-token latency over those steps, a step that captures a new
    page layout's graph included), the floor and the median's multiple of it."""
    decode_ms = float(np.median(times))
    return {"decode_ms_per_step": round(decode_ms, 4), "decode_ms_mean": round(float(np.mean(times)), 4),
            "floor_ms": round(floor_ms, 4), "multiple_of_floor": round(decode_ms / floor_ms, 2)}


def _torch_decode_times(step, tokens, first_position: int, steps: int) -> list[float]:
    """Wall times (ms) of ``steps`` decode steps ``step(tokens, position)`` from
    ``first_position`` on, after ``WARMUP_STEPS`` untimed ones at ``first_position`` (where
    ``mode="reduce-overhead"`` compiles and records)."""
    import torch

    positions = [torch.tensor(first_position + s, device="cuda") for s in range(steps)]
    for _ in range(WARMUP_STEPS):
        step(tokens, positions[0])
    return [_wall_ms(functools.partial(step, tokens, p), torch.cuda.synchronize)[1] for p in positions]


def _run_torch_contexts(config: LlamaConfig, contexts: list[int], batches: list[int], steps: int,
                        bandwidth: float, record) -> None:
    """The torch contenders' warm prefill (:func:`_torch_prefill_ms`) and decode (after that
    prefill, as :func:`_run_torch`) at each prompt length of ``contexts`` and batch size (random
    tokens): ``record(name, context, batch, row)``."""
    import torch

    from .torch_llama import TorchLlama
    from ..workloads.llama import random_weights

    weights = random_weights(config)
    for context, batch, prompts in context_prompts(config, contexts, batches):
        torch._dynamo.reset()  # each shape compiles afresh, never past dynamo's recompile limit
        model = TorchLlama(config, weights, batch, context + steps + 1)
        tokens = torch.as_tensor(prompts, device="cuda")
        with torch.no_grad():
            prefill_ms = _torch_prefill_ms(model, tokens)
            for name, step in _torch_decoders(model):
                times = _torch_decode_times(step, tokens[:, :1], context, steps)
                decode_ms = float(np.median(times))
                floor_ms = _decode_floor_ms(config, batch, context + steps // 2, bandwidth)
                record(name, context, batch, {"prefill_ms": round(prefill_ms[name], 3)}
                       | _decode_timing(times, floor_ms))
                _log(f"  {name} context {context} batch {batch}: prefill {prefill_ms[name]:.1f} ms, "
                     f"decode {decode_ms:.3f} ms/step ({decode_ms / floor_ms:.2f}x floor)")
        del model
        torch.cuda.empty_cache()


def _run_torch(config: LlamaConfig, weights, prompts, forced, reference: np.ndarray, batches: list[int],
               check_steps: int, steps: int, bandwidth: float, record) -> None:
    """The torch contenders (:mod:`tvm_dsm.gpu.torch_llama`) at every batch size, checked and
    timed as the TVM configurations are: ``torch_eager`` and ``torch_compile`` (decode under
    ``torch.compile(mode="reduce-overhead")``: CUDA graphs; prefill as
    :func:`_torch_prefill_ms`); each row to ``record(name, batch, row)``."""
    import torch

    from .torch_llama import TorchLlama

    prompt_len = prompts.shape[1]
    for batch in batches:
        torch._dynamo.reset()  # as in _run_torch_contexts
        model = TorchLlama(config, weights, batch, prompt_len + check_steps + steps + 1)
        tokens = torch.as_tensor(prompts[:batch], device="cuda")
        forced_tokens = torch.as_tensor(forced[:batch], device="cuda")
        with torch.no_grad():
            first, prefill_ms = _wall_ms(functools.partial(model.prefill, tokens), torch.cuda.synchronize)
            warm_prefill_ms = _torch_prefill_ms(model, tokens)
            for name, step in _torch_decoders(model):
                got = [first.cpu().numpy()]
                for s in range(check_steps):
                    position = torch.tensor(prompt_len + s, device="cuda")
                    got.append(step(forced_tokens[:, s:s + 1], position).cpu().numpy())
                checks = logit_errors(np.stack(got, axis=1), reference[:batch])
                times = _torch_decode_times(step, forced_tokens[:, :1], prompt_len + check_steps, steps)
                context = prompt_len + check_steps + steps // 2
                floor_ms = _decode_floor_ms(config, batch, context, bandwidth)
                decode_ms = float(np.median(times))  # reduce-overhead records during the warm-up
                record(name, batch, {"prefill_ms_first_call": round(prefill_ms, 3) if name == "torch_eager" else None,
                                     "prefill_ms": round(warm_prefill_ms[name], 3)} | _decode_timing(times, floor_ms)
                       | {"decode_ms_min": round(min(times), 4), "decode_ms_steps": [round(t, 3) for t in times],
                          "context": context, "logits_vs_fp32": checks})
                _log(f"  {name} batch {batch}: decode {decode_ms:.3f} ms/step ({decode_ms / floor_ms:.2f}x floor), "
                     f"logits rel err {checks['rel_l2_max']:.2e}")
        del model
        torch.cuda.empty_cache()


def _versions() -> dict:
    import torch
    import tvm

    return {"tvm": tvm.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
            "git_sha": git_sha()}


def run(args) -> None:
    import torch
    import tvm

    from .run import measure_hbm_bandwidth
    from ..workloads.llama import device_params, random_weights

    config = MODELS[args.model]
    results = {"suite": "llm", "device": torch.cuda.get_device_name(0),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "versions": _versions(), "model": asdict(config), "prompt_len": args.prompt,
               "timing": "host wall per decode step, device synchronized around it, median",
               "cuda_graph": args.cuda_graph,
               "configs": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(results | {"rows": schema_rows(results["configs"], args.prompt)}, indent=1))

    folder = Path(tempfile.mkdtemp(prefix="tvm_dsm_llm_"))
    _log(f"compiling {args.configs} ({args.model}) in {folder}")
    compiled = _compile_all(args.configs, args.model, folder, args.cuda_graph, args.database)
    for name, info in compiled.items():
        results["configs"][name] = {k: v for k, v in info.items() if k != "names"} | {"batches": {}}
    save()

    bandwidth = measure_hbm_bandwidth()
    results["hbm_bytes_per_s"] = bandwidth
    rng = np.random.default_rng(0)
    weights = random_weights(config)
    batches = args.batches
    prompts = rng.integers(0, config.vocab_size, (max(batches), args.prompt))
    forced = rng.integers(0, config.vocab_size, (max(batches), args.check_steps))
    _log("fp32 torch reference")
    reference = torch_reference(config, weights, prompts, forced, args.check_steps)
    save()

    loaded = {}  # the configurations' executables, profiled after every timing (_profile_config)
    for name in args.configs:
        info = compiled[name]
        if "error" in info:
            continue
        _log(f"loading {name} (its CUDA compiles now)")
        try:
            executable = loaded[name] = tvm.runtime.load_module(str(folder / f"{name}.so"))
        except Exception as err:  # noqa: BLE001  (recorded; the other configurations go on)
            results["configs"][name]["error"] = f"load: {type(err).__name__}: {err}"
            save()
            continue

        def record(batch, row, name=name):
            results["configs"][name]["batches"][str(batch)] = row
            save()

        def record_context(context, batch, row, name=name):
            results["configs"][name].setdefault("contexts", {}).setdefault(str(context), {})[str(batch)] = row
            save()

        try:
            params = device_params(weights, info["names"], config, tvm.cuda(0))  # shared by the sessions
        except Exception as err:  # noqa: BLE001  (recorded; the other configurations go on)
            results["configs"][name]["error"] = f"weights: {type(err).__name__}: {err}"
            save()
            continue
        parts = {  # a failure of one is recorded under its key; the other still runs
            "error": functools.partial(_run_config, executable, info, config, params, prompts, forced,
                                       reference, batches, args.check_steps, args.steps, bandwidth, record),
            "contexts_error": functools.partial(_run_contexts, executable, info, config, params, args.contexts,
                                                batches, args.steps, bandwidth, record_context,
                                                args.context_prefill),
        }
        for key, part in parts.items():
            try:
                part()
            except Exception as err:  # noqa: BLE001  (recorded; the rest goes on)
                results["configs"][name][key] = f"run: {type(err).__name__}: {err}"
                save()
                _log(f"{name} failed: {err}")
        del params, parts
    if args.torch:
        _log("torch: eager and torch.compile (reduce-overhead)")

        def record_torch(name, batch, row):
            results["configs"].setdefault(name, {"batches": {}})["batches"][str(batch)] = row
            save()

        def record_torch_context(name, context, batch, row):
            results["configs"].setdefault(name, {"batches": {}}).setdefault("contexts", {}).setdefault(
                str(context), {})[str(batch)] = row
            save()

        torch_parts = {  # as the TVM configurations' parts
            "torch_error": functools.partial(_run_torch, config, weights, prompts, forced, reference, batches,
                                             args.check_steps, args.steps, bandwidth, record_torch),
            "torch_contexts_error": functools.partial(_run_torch_contexts, config, args.contexts, batches,
                                                      args.steps, bandwidth, record_torch_context),
        }
        for key, part in torch_parts.items():
            try:
                part()
            except Exception as err:  # noqa: BLE001  (recorded; the TVM rows stand)
                results[key] = f"{type(err).__name__}: {err}"
                save()
                _log(f"torch failed: {err}")
    if args.torch:  # torch.compile's last model and graph pool freed before TVM's sessions
        import torch

        torch._dynamo.reset()
        torch.cuda.empty_cache()
    for name, executable in loaded.items():
        _log(f"profiling {name}")
        rows = results["configs"][name]
        points = profiled_points(rows, config, prompts, batches, args.contexts)
        if not points:
            continue

        def record_kernels(key, kernels, rows=rows):
            row = rows
            for part in key:
                row = row[part]
            row.update(kernels)
            save()

        try:  # the weights copied again: each configuration's copy was freed after its timings
            _profile_config(executable, compiled[name], config,
                            device_params(weights, compiled[name]["names"], config, tvm.cuda(0)), points, record_kernels)
        except Exception as err:  # noqa: BLE001  (recorded; the timings stand)
            rows["profile_error"] = f"{type(err).__name__}: {err}"
            save()
            _log(f"profiling {name} failed: {err}")
    _log(f"done: {out}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    comp = sub.add_parser("compile", help="(internal) compile one configuration")
    comp.add_argument("config", choices=CONFIGS)
    comp.add_argument("--model", choices=MODELS, default="1b")
    comp.add_argument("--folder", required=True)
    for p in (comp, parser):
        p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                       help="capture the kernels between KV-cache calls in CUDA graphs (default)")
        p.add_argument("--database", help="the tuning work_dir tvm_dsm_tuned compiles from")
    tune = sub.add_parser("tune", help="tune the model's kernels into a MetaSchedule database (tune_model)")
    tune.add_argument("--model", choices=MODELS, default="1b")
    tune.add_argument("--work-dir", required=True)
    tune.add_argument("--rows", type=lambda s: tuple(int(r) for r in s.split(",")), default=(16,),
                      help="the row ranges to tune, by their row count (default 16: decode batches)")
    tune.add_argument("--trials", type=int, default=8, help="measured candidates per task")
    join = sub.add_parser("merge", help="merge the results of runs of different configurations into one file")
    join.add_argument("paths", nargs="+", type=Path)
    join.add_argument("--out", type=Path, required=True)
    parser.add_argument("--out", default="llm.json")
    parser.add_argument("--model", choices=MODELS, default="1b")
    parser.add_argument("--configs", type=lambda s: [c for c in s.split(",") if c], default=list(CONFIGS),
                        help="the TVM configurations to compile and run (comma-separated; empty: torch only)")
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")],
                        default=[1, 8, 32])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--contexts", type=lambda s: [int(c) for c in s.split(",")], default=[],
                        help="more prompt lengths at which prefill and decode are timed (logits "
                             "are checked at --prompt), e.g. 2048,8192")
    parser.add_argument("--context-prefill", action=argparse.BooleanOptionalAction, default=True,
                        help="time prefill at the --contexts lengths (--no-context-prefill: prefill once, "
                             "untimed, and time decode only)")
    parser.add_argument("--check-steps", type=int, default=32,
                        help="teacher-forced decode steps whose logits are checked against fp32")
    parser.add_argument("--steps", type=int, default=64,
                        help="timed decode steps: four pages' worth (16 tokens a page), so that the mean holds "
                             "the new page layouts' graph captures in their share")
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the torch contenders (eager, torch.compile) on the same weights")
    args = parser.parse_args(argv)
    if args.command == "compile":
        folder = Path(args.folder)
        compile_config(args.config, MODELS[args.model], folder / f"{args.config}.so",
                       folder / f"{args.config}.json", args.cuda_graph, args.database)
    elif args.command == "tune":
        tune_model(MODELS[args.model], args.work_dir, args.rows, args.trials)
    elif args.command == "merge":
        merge(args.paths, args.out)
    else:
        run(args)


if __name__ == "__main__":
    main()
