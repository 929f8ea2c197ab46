"""A Llama model end to end with tvm-dsm: compile it through the "tvm_dsm" Relax pipeline, see
which kernels tvm-dsm's families take, and (with a GPU) prefill, decode and check the logits.

The model is the 1B-class Llama of ``tvm_dsm.workloads.llama``, written as TVM users write LLMs
(``relax.frontend.nn`` over ``nn.llm``'s paged KV cache), with symbolic batch and sequence
lengths. ``tvm.compile(..., relax_pipeline="tvm_dsm")`` schedules every matmul with a tvm-dsm
family, one kernel per range of rows; the report says which family took each kernel, with the
planner's predicted time, or why dlight schedules it. On a Hopper GPU the weights are random:
a prompt is prefilled, a few tokens decoded (each step replayed as one CUDA graph once the
cache's page layout holds, ``tvm_dsm.step_graphs``), and the logits compared with an fp32
evaluation of the same weights. Run: ``python tutorials/llm_end_to_end.py``.
"""

from __future__ import annotations

import time

import numpy as np
import tvm

import tvm_dsm  # noqa: F401  (registers tvm-dsm's pipelines)
from tvm_dsm.bench.demo import section
from tvm_dsm.device import gpu_or_reason
from tvm_dsm.model_report import compile_with_report
from tvm_dsm.workloads.llama import LLAMA_1B, LlamaSession, export_llama, random_weights

CONFIG = LLAMA_1B
BATCH, PROMPT, STEPS = 4, 64, 8
PAGE_SIZE = 16
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def run_on_gpu(executable, names: list[str]) -> None:
    from tvm_dsm.gpu.llm import LOGITS_TOLERANCE, logit_errors, torch_reference

    dev = tvm.cuda(0)
    weights = random_weights(CONFIG)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, CONFIG.vocab_size, (BATCH, PROMPT))
    forced = rng.integers(0, CONFIG.vocab_size, (BATCH, STEPS))  # teacher-forced next tokens
    pages = -(-(PROMPT + STEPS) // PAGE_SIZE) + 1
    session = LlamaSession(executable, dev, weights, names, CONFIG, max_batch_size=BATCH,
                           max_total_seq_len=BATCH * pages * PAGE_SIZE,
                           prefill_chunk_size=BATCH * PROMPT, page_size=PAGE_SIZE, step_graphs=True)
    logits = [session.prefill(prompts).numpy()[0]]  # [batch, vocab] at each prompt's last token
    step_ms = []
    for step in range(STEPS):
        token = tvm.runtime.tensor(forced[:, step:step + 1].astype(np.int32), dev)
        dev.sync()
        start = time.perf_counter()
        out = session.decode(token)
        dev.sync()
        step_ms.append((time.perf_counter() - start) * 1e3)
        logits.append(out.numpy()[:, 0])
    counts = session.graphs.counts
    session.close()
    print(f"prefilled {BATCH} x {PROMPT} tokens, decoded {STEPS} steps: "
          f"{np.median(step_ms):.2f} ms/step (median, batch {BATCH}; {counts['replayed']} steps "
          f"replayed from CUDA graphs, {counts['captured']} captured, {counts['eager']} run by the VM)")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed (pip install 'tvm-dsm[bench]'): logits not checked")
        return
    errors = logit_errors(np.stack(logits, axis=1), torch_reference(CONFIG, weights, prompts, forced, STEPS))
    verdict = "ok" if errors["rel_l2_max"] < LOGITS_TOLERANCE else "WRONG"
    print(f"logits vs fp32 torch: relative L2 error {errors['rel_l2_max']:.2e} ({verdict}), "
          f"argmax agreement {errors['argmax_agree_clear']} over {errors['clear_rows']} clear rows")


def main() -> None:
    section(f"export: Llama {CONFIG.num_layers} layers x {CONFIG.hidden_size} "
            f"({CONFIG.weight_bytes / 2**30:.1f} GiB of fp16 weights), symbolic batch and length")
    mod, names = export_llama(CONFIG, TARGET)
    print("Relax functions:", ", ".join(sorted(gv.name_hint for gv, f in mod.functions.items()
                                               if isinstance(f, tvm.relax.Function))))

    section('compile: tvm.compile(mod, relax_pipeline="tvm_dsm"), one line per kernel')
    start = time.perf_counter()
    executable, report = compile_with_report(mod, TARGET)
    print(report.format())
    print(f"compiled in {time.perf_counter() - start:.1f} s")

    section("run")
    reason = gpu_or_reason()
    if reason:
        print(f"{reason}: compiled and reported above; on an H100 this runs a prefill and "
              f"{STEPS} decode steps (`python -m tvm_dsm.gpu.llm` benchmarks it against TVM's "
              "default and MLC-style pipelines).")
    else:
        run_on_gpu(executable, names)


if __name__ == "__main__":
    main()
