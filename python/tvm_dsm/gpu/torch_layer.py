"""A torch user's model through TVM: the 1B Llama's decoder layer written in torch
(:mod:`tvm_dsm.workloads.torch_layers`), exported with ``torch.export``, imported, compiled and run.

``bash .gpu/full-b/on-device python3 -m tvm_dsm.gpu.torch_layer --out $OUT/torch_layer.json``
(the full compiler: see ../shared/gpu/README.md).

Per shape (batch x tokens, fp16, random weights), in one run:

- ``ours``: imported with :func:`tvm_dsm.relax_torch.from_exported_program` (torch's types, the
  attention whole) and compiled with the "tvm_dsm" pipeline;
- ``tvm_import_tvm_dsm``: TVM's own importer, the "tvm_dsm" pipeline;
- ``tvm_stock``: TVM's own importer and pipeline (dlight, under sm_90);
- ``torch_eager`` and ``torch_compile``: the layer itself on the GPU (SDPA's flash kernels).

Every output against the layer evaluated in float64 on the GPU from the same fp16 weights; every
contender timed with :func:`tvm_dsm.bench.timing.graph_time_us` (CUDA events over CUDA-graph
replays, inputs rotated past L2; a Relax VM call is captured like any other), the Relax VM's
time evaluator where a capture fails (the row says which).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import tvm
from tvm import relax

from ..bench import results as res
from ..bench.timing import graph_time_us, input_sets_for
from ..hardware import H100
from ..relax_torch import from_exported_program
from ..stock import stock_target
from ..workloads.llama import LLAMA_1B
from ..workloads.torch_layers import DecoderLayer, exported_decoder_layer

SHAPES = ((1, 128), (1, 512), (1, 2048), (8, 512))
#: ``||out - ref|| / ||ref||`` of an fp16 layer with fp32 accumulation.
TOLERANCE = 5e-3


def _layer() -> DecoderLayer:
    c = LLAMA_1B
    layer = DecoderLayer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                         c.intermediate_size).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) / (p.shape[-1] ** 0.5) if p.dim() == 2 else 1 + 0.1 * torch.randn_like(p))
    return layer.half()


def _compile(name: str, layer: DecoderLayer, x: torch.Tensor):
    """(the compiled module, its parameters) of configuration ``name``."""
    from tvm.relax.frontend.torch import from_exported_program as tvm_import

    mod, params = exported_decoder_layer(layer, x, from_exported_program if name == "ours" else tvm_import)
    target = tvm.target.Target(H100, host="llvm")
    if name == "tvm_stock":
        executable = tvm.compile(mod, stock_target(target), relax_pipeline="default", tir_pipeline="s_tir_stock")
    else:
        executable = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline("tvm_dsm"))
    return executable, params


def _vm_step(executable, params, inputs):
    dev = tvm.cuda()
    vm = relax.VirtualMachine(executable, dev)
    weights = [tvm.runtime.tensor(p.numpy(), dev) for p in params]
    xs = [tvm.runtime.tensor(x.numpy(), dev) for x in inputs]
    main = vm["main"]

    def step(i):
        return main(xs[i], *weights)
    return step, vm, xs, weights


def _time_vm(step, vm, xs, weights, sets: int) -> tuple[float, str]:
    try:
        return graph_time_us(step, sets), "graph"
    except Exception as err:  # noqa: BLE001 - a capture TVM's VM refuses: say so and use its timer
        print("  graph capture failed, time evaluator:", str(err).splitlines()[0][:120])
        timer = vm.time_evaluator("main", tvm.cuda(), number=10, repeat=20)
        return timer(xs[0], *weights).median * 1e6, "time_evaluator"


def run_shape(batch: int, tokens: int, configs: list[str]) -> dict:
    torch.manual_seed(batch * 10_000 + tokens)
    layer = _layer()
    x_bytes = batch * tokens * LLAMA_1B.hidden_size * 2
    sets = input_sets_for(x_bytes, cap=8)
    inputs = [torch.randn(batch, tokens, LLAMA_1B.hidden_size, dtype=torch.float16) for _ in range(sets)]
    with torch.no_grad():
        ref = layer.cuda().double()(inputs[0].cuda().double()).cpu().numpy()
    layer = layer.half().cpu()
    row = {"name": f"decoder_layer_b{batch}_t{tokens}", "shape": [batch, tokens], "dtype": "float16",
           "peers": {}, "errors": {}, "timing": {}, "compile_s": {}}
    for name in configs:
        start = time.time()
        try:
            if name.startswith("torch"):
                model = layer.cuda()
                model = torch.compile(model) if name == "torch_compile" else model
                xs = [x.cuda() for x in inputs]
                with torch.no_grad():
                    out = model(xs[0]).float().cpu().numpy()
                    us = graph_time_us(lambda i: model(xs[i]), sets)
                how = "graph"
                layer = layer.cpu()
            else:
                executable, params = _compile(name, layer, inputs[0])
                row["compile_s"][name] = round(time.time() - start, 1)
                step, vm, xs, weights = _vm_step(executable, params, inputs)
                got = step(0)
                out = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float32)
                us, how = _time_vm(step, vm, xs, weights, sets)
        except Exception as err:  # noqa: BLE001 - a contender that fails is a row's finding
            row["errors"][name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            print(f"  {name}: {row['errors'][name]}")
            continue
        err = res.relative_error(torch.from_numpy(out.astype(np.float64)), torch.from_numpy(ref))
        row["errors"][name] = err
        row["timing"][name] = how
        if name == "ours":
            row["ours_us"], row["rel_err"] = us, err
        else:
            row["peers"][name] = us
        print(f"  {row['name']} {name}: {us:.1f} us, rel err {err:.2e} ({how})", flush=True)
    row["ok"] = row.get("rel_err") is not None and row["rel_err"] < TOLERANCE
    return row


CONFIGS = ("ours", "tvm_import_tvm_dsm", "tvm_stock", "torch_eager", "torch_compile")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="torch_layer.json")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    args = parser.parse_args(argv)
    results = res.new_suite("torch_layer", torch.cuda.get_device_name(0),
                            {"tvm": tvm.__version__, "torch": torch.__version__, "tvm_dsm": res.git_sha()},
                            "CUDA events over CUDA-graph replays (inputs rotated past L2), median")
    results["command"] = f"python -m tvm_dsm.gpu.torch_layer --configs {args.configs} --shapes {args.shapes}"
    for shape in args.shapes.split(","):
        batch, tokens = (int(v) for v in shape.split("x"))
        results["rows"].append(run_shape(batch, tokens, args.configs.split(",")))
        res.write(results, args.out)
    print(res.table(results))


if __name__ == "__main__":
    main()
