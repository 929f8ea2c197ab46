"""Whole models tuned with MetaSchedule on the GPU machine: tvm-dsm's ``tune_relax`` against the
same model compiled untuned, both through the "tvm_dsm" Relax pipeline.

``bash .gpu/full-b/on-device python3 -m tvm_dsm.gpu.tune_models --out $OUT/tune_models.json``
(the full compiler: see ../shared/gpu/README.md).

Models (random fp16 weights):

- ``llama_mlp``: the 1B Llama's SwiGLU block as ``relax.frontend.nn`` writes it
  (:class:`tvm_dsm.workloads.llama.LlamaMLP`) on 512 tokens;
- ``torch_decoder_layer``: a decoder layer of the same configuration written in torch
  (:mod:`tvm_dsm.workloads.torch_layers`), exported at batch 1 x 512 tokens.

Per model: compiled untuned; its tasks tuned (:func:`tvm_dsm.meta_schedule.tune_relax`: one round
of ``--trials`` measured candidates per task, into one JSON database); compiled again from that
database; both compiled models checked against the model in fp32 (float64 for the MLP) and
timed with the Relax VM's time evaluator (median of ``REPEATS``). Results are written after each
model; with ``--work-dir`` a run cut short resumes its tuning from the databases kept there
(:func:`~tvm_dsm.meta_schedule.tune_relax` measures only what a database lacks).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.s_tir import meta_schedule as ms

from ..bench import results as res
from ..driver import H100
from ..hardware import load_hardware
from ..meta_schedule import tune_relax
from ..meta_schedule.relax_tuning import H100_TAG, tuning_tasks
from ..relax_integration import TUNED_IN_TVM_SPACE
from ..relax_torch import from_exported_program
from ..workloads.llama import LLAMA_1B, LlamaMLP
from ..workloads.torch_layers import DecoderLayer, exported_decoder_layer

TOKENS = 512
#: The time evaluator's repeats (each of ``NUMBER`` calls).
REPEATS, NUMBER = 20, 10
#: ``||out - ref|| / ||ref||`` of an fp16 model with fp32 accumulation.
TOLERANCE = 5e-3


def llama_mlp(rng: np.random.Generator) -> tuple[tvm.IRModule, str, list[np.ndarray], np.ndarray]:
    """The MLP module, its entry function, its inputs (tokens, then weights) and the float64
    reference output."""
    c = LLAMA_1B
    mod, spec = LlamaMLP(c).export_tvm({"forward": {"x": nn.spec.Tensor((TOKENS, c.hidden_size), "float16")}})
    x = rng.standard_normal((TOKENS, c.hidden_size)).astype(np.float16)
    weights = [(rng.standard_normal(p.shape) / np.sqrt(p.shape[-1])).astype(np.float16) for _, p in spec]
    gate_up, down = (w.astype(np.float64) for w in weights)
    gate, up = np.split(x.astype(np.float64) @ gate_up.T, 2, axis=-1)
    return mod, "forward", [x, *weights], (gate / (1 + np.exp(-gate)) * up) @ down.T


def torch_decoder_layer(rng: np.random.Generator) -> tuple[tvm.IRModule, str, list[np.ndarray], np.ndarray]:
    """The torch layer exported (as :func:`llama_mlp`); its reference is torch's fp32 evaluation."""
    c = LLAMA_1B
    torch.manual_seed(int(rng.integers(1 << 31)))
    layer = DecoderLayer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                         c.intermediate_size).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5) if p.dim() == 2 else 1 + 0.1 * torch.randn_like(p))
    layer = layer.half().float()  # the reference computes with the weights the model holds
    x = torch.from_numpy(rng.standard_normal((1, TOKENS, c.hidden_size)).astype(np.float16))
    with torch.no_grad():
        ref = layer.cuda()(x.float().cuda()).double().cpu().numpy()
    mod, params = exported_decoder_layer(layer.half().cpu(), x, from_exported_program)
    return mod, "main", [x.numpy(), *(p.numpy() for p in params)], ref


MODELS = {"llama_mlp": llama_mlp, "torch_decoder_layer": torch_decoder_layer}


def _compile(mod: tvm.IRModule, database: ms.Database | None) -> tuple[relax.VMExecutable, dict, dict]:
    coverage, choices = {}, {}
    pipeline = relax.get_pipeline("tvm_dsm", database=database, coverage=coverage, choices=choices)
    return tvm.compile(mod, tvm.target.Target(H100, host="llvm"), relax_pipeline=pipeline), coverage, choices


def _run(executable, entry: str, inputs: list[np.ndarray], ref: np.ndarray) -> tuple[float, float]:
    """The output's relative error against ``ref`` and the median time in microseconds."""
    dev = tvm.cuda()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    out = vm[entry](*args)
    out = out if hasattr(out, "numpy") else out[0]  # torch's export returns a tuple
    out = out.numpy().astype(np.float64).reshape(ref.shape)
    timer = vm.time_evaluator(entry, dev, number=NUMBER, repeat=REPEATS)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    return float(err) if np.isfinite(err) else float("inf"), timer(*args).median * 1e6


def run_model(name: str, trials: int, work_dir: str) -> dict:
    """One results row: the model untuned and tuned, checked and timed."""
    mod, entry, inputs, ref = MODELS[name](np.random.default_rng(0))
    start = time.time()
    untuned, coverage, _ = _compile(mod, None)
    untuned_err, untuned_us = _run(untuned, entry, inputs, ref)
    compile_s = time.time() - start
    tasks = tuning_tasks(mod, tvm.target.Target(H100_TAG), load_hardware())
    start = time.time()
    database = tune_relax(mod, work_dir, max_trials_global=trials * len(tasks), num_trials_per_iter=trials,
                          tasks=tasks)
    tune_s = time.time() - start
    tuned, tuned_coverage, choices = _compile(mod, database)
    err, us = _run(tuned, entry, inputs, ref)
    return {"name": name, "ok": max(err, untuned_err) < TOLERANCE, "rel_err": err, "untuned_rel_err": untuned_err,
            "ours_us": us, "untuned_us": untuned_us, "speedup_over_untuned": untuned_us / us,
            "tasks": len(tasks), "trials_per_task": trials, "tune_s": round(tune_s, 1),
            "compile_s": round(compile_s, 1),
            "tuned_functions": sorted(n for n, c in choices.items() if c.tuned),
            "tuned_in_tvm_space": sorted(n for n, w in tuned_coverage.items() if w == TUNED_IN_TVM_SPACE),
            "coverage": coverage}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials", type=int, default=16, help="measured candidates per task")
    parser.add_argument("--out", default="tune_models.json")
    parser.add_argument("--work-dir", help="the tuning databases' folder (one per model), kept: a run cut "
                        "short resumes from it (default: a temporary folder)")
    args = parser.parse_args(argv)
    results = res.new_suite("tune_models", torch.cuda.get_device_name(0),
                            {"tvm": tvm.__version__, "torch": torch.__version__, "tvm_dsm": res.git_sha()},
                            f"Relax VM time_evaluator, median of {REPEATS} x {NUMBER} calls")
    results["command"] = f"python -m tvm_dsm.gpu.tune_models --trials {args.trials}"
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="tvm_dsm_tune_models_"))
    for name in args.models.split(","):
        (root / name).mkdir(parents=True, exist_ok=True)
        results["rows"].append(run_model(name, args.trials, str(root / name)))
        res.write(results, Path(args.out))
        print(res.table(results), flush=True)


if __name__ == "__main__":
    main()
