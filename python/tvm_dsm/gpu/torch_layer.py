"""A torch user's models through TVM: transformer layers written in torch
(:mod:`tvm_dsm.workloads.torch_layers`: the 1B Llama's decoder layer, GPT-2, BERT, Qwen2-0.5B,
ViT-B/16, Gemma-2B, Phi-2, Mistral-7B, Whisper-large-v3's encoder, CLIP-L, Pythia-1.4B, Falcon-7B,
BLOOM-560m and OPT-1.3B layers, a Mixtral-style MoE block), exported with ``torch.export``,
imported, compiled and run.

``bash .gpu/full-b/on-device python3 -m tvm_dsm.gpu.torch_layer --out $OUT/torch_layer.json``
(the full compiler: see ../shared/gpu/README.md).

Per model and shape (batch x tokens, fp16, random weights), in one run:

- ``ours``: imported with :func:`tvm_dsm.relax_torch.from_exported_program` (torch's types, the
  attention whole) and compiled with the "tvm_dsm" pipeline;
- ``tvm_import_tvm_dsm``: TVM's own importer, the "tvm_dsm" pipeline;
- ``tvm_stock``: TVM's own importer and pipeline (dlight, under sm_90);
- ``torch_eager`` and ``torch_compile``: the layer itself on the GPU (SDPA's flash kernels).

Every output against the layer evaluated in float64 on the GPU from the same fp16 weights; every
contender timed with :func:`tvm_dsm.bench.timing.graph_time_us` (CUDA events over CUDA-graph
replays, inputs rotated past L2; a Relax VM call is captured like any other), the Relax VM's
time evaluator where a capture fails (the row says which). After every timing of the run (a
profiler session slows later graph launches: :func:`tvm_dsm.gpu.llm._profile_config`), each
row's ``ours`` call is profiled kernel by kernel (``kernels``:
:func:`tvm_dsm.gpu.kernel_breakdown.profile_kernels`).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
import tvm
from tvm import relax

from ..bench import results as res
from ..bench.timing import graph_time_us, input_sets_for
from .kernel_breakdown import profile_kernels
from ..hardware import H100
from ..relax_torch import from_exported_program
from ..stock import stock_target
from ..workloads.llama import LLAMA_1B
from ..workloads.torch_layers import (BertLayer, BloomLayer, CLIPEncoderLayer, DecoderLayer, FalconLayer, GemmaLayer,
                                      GPT2Block, GPTNeoXLayer, MistralLayer, MixtralMoEBlock, OPTDecoderLayer, Phi2Layer,
                                      QwenLayer, ViTBlock, WhisperEncoderLayer, exported_decoder_layer)

#: model name: (the layer, its hidden width, the shapes (batch, tokens) it runs at).
MODELS = {
    "llama": (lambda: DecoderLayer(LLAMA_1B.hidden_size, LLAMA_1B.num_attention_heads, LLAMA_1B.num_key_value_heads,
                                   LLAMA_1B.head_dim, LLAMA_1B.intermediate_size),
              LLAMA_1B.hidden_size, ((1, 128), (1, 512), (1, 2048), (8, 512))),
    "gpt2": (GPT2Block, 768, ((1, 1024), (8, 512))),
    "bert": (BertLayer, 768, ((8, 128), (8, 512))),
    "qwen2": (lambda: QwenLayer(896, 14, 2, 4864), 896, ((1, 512), (8, 512))),  # Qwen2-0.5B
    "vit": (ViTBlock, 768, ((8, 197), (32, 197))),  # ViT-B/16 at 224 x 224
    "gemma": (lambda: GemmaLayer(2048, 8, 1, 256, 16384, positions=8192), 2048, ((1, 2048), (8, 512))),  # Gemma-2B
    "phi2": (lambda: Phi2Layer(2560, 32, 10240, 32), 2560, ((1, 2048), (8, 512))),
    "mistral": (lambda: MistralLayer(4096, 32, 8, 14336, window=4096, positions=8192), 4096,
                ((1, 2048), (1, 8192))),  # Mistral-7B: the window bites past 4096 tokens
    "whisper": (lambda: WhisperEncoderLayer(1280, 20, 5120), 1280, ((1, 1500), (4, 1500))),  # large-v3 encoder
    "clip": (lambda: CLIPEncoderLayer(1024, 16, 4096), 1024, ((8, 257), (32, 257))),  # ViT-L/14 at 224 x 224
    "neox": (lambda: GPTNeoXLayer(2048, 16, 8192, 0.25), 2048, ((1, 2048), (8, 512))),  # Pythia-1.4B
    "falcon": (lambda: FalconLayer(4544, 71, 18176), 4544, ((1, 2048), (8, 512))),  # Falcon-7B
    "bloom": (lambda: BloomLayer(1024, 16, 4096), 1024, ((1, 2048), (8, 512))),  # BLOOM-560m
    "opt": (lambda: OPTDecoderLayer(2048, 32, 8192), 2048, ((1, 2048), (8, 512))),  # OPT-1.3B
    "moe": (lambda: MixtralMoEBlock(1024, 2816, 8, 2), 1024, ((1, 2048), (8, 512))),  # 8 experts, top 2
}
#: ``||out - ref|| / ||ref||`` of an fp16 layer with fp32 accumulation; a layer whose model
#: rounds more than that itself (BLOOM builds its ALiBi bias in fp16) is held to torch's own error
#: (:func:`within_bound`).
TOLERANCE = 5e-3


def within_bound(error: float, torch_errors: list[float]) -> bool:
    """Whether ``error`` (from float64) is within :data:`TOLERANCE`, or no further than 1.1x the
    closest of torch's own runs of the same fp16 layer (``torch_errors``)."""
    return error < TOLERANCE or bool(torch_errors) and error <= 1.1 * min(torch_errors)


def _layer(model: str) -> torch.nn.Module:
    layer = MODELS[model][0]().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5) if p.dim() == 2 else 1 + 0.1 * torch.randn_like(p))
    return layer.half()


def _inputs(model: str, batch: int, tokens: int) -> tuple[torch.Tensor, ...]:
    """One call's inputs: the activations, and for BERT an additive mask hiding a sequence's
    last quarter."""
    x = torch.randn(batch, tokens, MODELS[model][1], dtype=torch.float16)
    if model != "bert":
        return (x,)
    mask = torch.zeros(batch, 1, 1, tokens, dtype=torch.float16)
    mask[..., tokens - tokens // 4:] = -1e4
    return x, mask


def _compile(name: str, layer: torch.nn.Module, example: tuple):
    """(the compiled module, its parameters) of configuration ``name``."""
    from tvm.relax.frontend.torch import from_exported_program as tvm_import

    ours = name in ("ours", *ABLATIONS)
    mod, params = exported_decoder_layer(layer, example, from_exported_program if ours else tvm_import)
    target = tvm.target.Target(H100, host="llvm")
    if name == "tvm_stock":
        executable = tvm.compile(mod, stock_target(target), relax_pipeline="default", tir_pipeline="s_tir_stock")
    else:
        pipeline = relax.get_pipeline("tvm_dsm", launch_early=name != "ours_launch_late")
        executable = tvm.compile(mod, target, relax_pipeline=pipeline)
    return executable, params


def _vm_step(executable, params, inputs):
    dev = tvm.cuda()
    vm = relax.VirtualMachine(executable, dev)
    weights = [tvm.runtime.tensor(p.numpy(), dev) for p in params]
    sets = [[tvm.runtime.tensor(t.numpy(), dev) for t in one] for one in inputs]
    main = vm["main"]

    def step(i):
        return main(*sets[i], *weights)
    return step, vm, sets, weights


def _time_vm(step, vm, sets, weights) -> tuple[float, str]:
    try:
        return graph_time_us(step, len(sets)), "graph"
    except Exception as err:  # noqa: BLE001 - a capture TVM's VM refuses: say so and use its timer
        print("  graph capture failed, time evaluator:", str(err).splitlines()[0][:120])
        timer = vm.time_evaluator("main", tvm.cuda(), number=10, repeat=20)
        return timer(*sets[0], *weights).median * 1e6, "time_evaluator"


#: Profiled calls of a row's ``ours`` module (after one untimed).
PROFILED_CALLS = 5


def run_shape(model: str, batch: int, tokens: int, configs: list[str], keep: dict | None = None) -> dict:
    """The row of ``model`` at ``batch`` x ``tokens``; ``keep[row name]``: its ``ours`` call
    (a closure holding the VM and its tensors), for a profile after the run's timings."""
    torch.manual_seed(batch * 10_000 + tokens)
    sets = input_sets_for(batch * tokens * MODELS[model][1] * 2, cap=8)
    name = "decoder_layer" if model == "llama" else f"{model}_layer"
    row = {"name": f"{name}_b{batch}_t{tokens}", "model": model, "shape": [batch, tokens], "dtype": "float16"}
    return run_layer(row, _layer(model), [_inputs(model, batch, tokens) for _ in range(sets)], configs, keep)


def run_script(path: Path, configs: list[str], keep: dict | None = None) -> dict:
    """The row of a model a user wrote: ``path`` defines ``make()``, returning the module and
    one call's inputs, and ``WRITTEN_AS``, saying how it is written."""
    spec = importlib.util.spec_from_file_location(f"user_model_{path.stem}", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    torch.manual_seed(0)
    layer, example = script.make()
    floats = [t for t in example if t.is_floating_point()]
    row = {"name": path.stem, "model": path.stem, "written_as": script.WRITTEN_AS,
           "shape": list(example[0].shape), "dtype": str(floats[0].dtype if floats else layer_dtype(layer))[6:]}
    sets = input_sets_for(sum(t.numel() * t.element_size() for t in example), cap=8)
    inputs = [example] + [tuple(_like(t) for t in example) for _ in range(sets - 1)]
    return run_layer(row, layer.eval(), inputs, configs, keep)


def layer_dtype(layer: torch.nn.Module) -> torch.dtype:
    return next(p.dtype for p in layer.parameters())


def _like(t: torch.Tensor) -> torch.Tensor:
    """Another input like ``t``: fresh values for floating-point data, the same indices."""
    return torch.randn_like(t) if t.is_floating_point() else t.clone()


def _first_output(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def run_layer(row: dict, layer: torch.nn.Module, inputs: list[tuple], configs: list[str],
              keep: dict | None = None) -> dict:
    """``row`` with ``layer``'s result per configuration: its error on ``inputs[0]`` against the
    layer evaluated in float64 on the GPU, and its time over the input sets ``inputs``."""
    with torch.no_grad():
        reference = copy.deepcopy(layer).cuda().double()
        ref = _first_output(reference(*(t.cuda().double() if t.is_floating_point() else t.cuda()
                                        for t in inputs[0]))).cpu().numpy()
    del reference
    sets = len(inputs)
    row.update({"peers": {}, "errors": {}, "timing": {}, "compile_s": {}})
    for config in configs:
        start = time.time()
        try:
            if config.startswith("torch"):
                module = layer.cuda()
                module = torch.compile(module) if config == "torch_compile" else module
                on_gpu = [tuple(t.cuda() for t in one) for one in inputs]
                with torch.no_grad():
                    out = _first_output(module(*on_gpu[0])).float().cpu().numpy()
                    us = graph_time_us(lambda i: module(*on_gpu[i]), sets)
                how = "graph"
                layer = layer.cpu()
            else:
                executable, params = _compile(config, layer, inputs[0])
                row["compile_s"][config] = round(time.time() - start, 1)
                step, vm, on_gpu, weights = _vm_step(executable, params, inputs)
                got = step(0)
                out = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float32)
                us, how = _time_vm(step, vm, on_gpu, weights)
                if config == "ours" and keep is not None:
                    keep[row["name"]] = step
        except Exception as err:  # noqa: BLE001 - a contender that fails is a row's finding
            row["errors"][config] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            print(f"  {config}: {row['errors'][config]}")
            continue
        err = res.relative_error(torch.from_numpy(out.astype(np.float64)), torch.from_numpy(ref.astype(np.float64)))
        row["errors"][config] = err
        row["timing"][config] = how
        if config == "ours":
            row["ours_us"], row["rel_err"] = us, err
        elif config in ABLATIONS:
            row.setdefault("ablations", {})[config] = us
        else:
            row["peers"][config] = us
        print(f"  {row['name']} {config}: {us:.1f} us, rel err {err:.2e} ({how})", flush=True)
    torch_errors = [e for name, e in row["errors"].items() if name.startswith("torch") and isinstance(e, float)]
    row["ok"] = row.get("rel_err") is not None and within_bound(row["rel_err"], torch_errors)
    return row


CONFIGS = ("ours", "tvm_import_tvm_dsm", "tvm_stock", "torch_eager", "torch_compile")
#: Variants of ``ours``, timed under ``ablations`` (not peers): ``ours_launch_late`` is the
#: "tvm_dsm" pipeline with ``launch_early=False`` (only the kernels whose schedules ask for
#: programmatic launch get it).
ABLATIONS = ("ours_launch_late",)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="torch_layer.json")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--scripts", type=Path, help="a folder of models users wrote (run_script), instead")
    args = parser.parse_args(argv)
    results = res.new_suite("torch_layer", torch.cuda.get_device_name(0),
                            {"tvm": tvm.__version__, "torch": torch.__version__, "tvm_dsm": res.git_sha()},
                            "CUDA events over CUDA-graph replays (inputs rotated past L2), median")
    results["command"] = f"python -m tvm_dsm.gpu.torch_layer --configs {args.configs} --models {args.models}"
    calls: dict = {}
    configs = args.configs.split(",")
    if args.scripts:
        results["command"] = f"python -m tvm_dsm.gpu.torch_layer --configs {args.configs} --scripts {args.scripts}"
        for path in sorted(args.scripts.glob("*.py")):
            results["rows"].append(run_script(path, configs, calls))
            res.write(results, args.out)
    for model in [] if args.scripts else args.models.split(","):
        for batch, tokens in MODELS[model][2]:
            results["rows"].append(run_shape(model, batch, tokens, configs, calls))
            res.write(results, args.out)
    for row in results["rows"]:
        if row["name"] in calls:
            step = calls.pop(row["name"])
            row["kernels"] = profile_kernels(lambda: step(0), steps=PROFILED_CALLS, step_us=row["ours_us"])
            res.write(results, args.out)
    print(res.table(results))


if __name__ == "__main__":
    main()
