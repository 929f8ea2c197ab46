"""Per-call GPU time against the calls captured in one CUDA graph, for kernels and their peers.

``python -m tvm_dsm.gpu.graph_calls FOLDER NAME[,NAME...] --out graph_calls.json`` (on the GPU
machine). A replay pays the graph's own launch before its first kernel starts; a suite that
captures only the two calls its input rotation needs (kernels reading hundreds of MB) divides
that over two calls. This measures how per-call time settles as more calls share one replay,
the evidence for :data:`tvm_dsm.bench.timing.MIN_CALLS_PER_GRAPH`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import tvm
import tvm_ffi

from ..bench.timing import graph_time_us, input_sets_for
from .references import REFERENCES
from .run import _random_inputs, peer_steps, precompile

CALLS = (2, 4, 10, 20, 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("names", help="comma-separated kernel names of the folder's manifest")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    manifest = json.loads((args.folder / "manifest.json").read_text())
    kernels = [k for k in manifest["kernels"] if k["name"] in args.names.split(",")]
    precompile(args.folder, [k["name"] for k in kernels])
    rows = []
    for kernel in kernels:
        func = tvm.runtime.load_module(str(args.folder / kernel["lib"]))["main"]
        sets = _random_inputs(kernel["args"], input_sets_for(kernel["bytes"]))
        wrapped = [[tvm_ffi.from_dlpack(t) for t in s] for s in sets]
        sdpa = REFERENCES[kernel["workload"]].torch_sdpa is not None
        contenders = {"ours": lambda i: func(*wrapped[i]),
                      **peer_steps(kernel, sets, ["torch_sdpa"] if sdpa else [])}
        for calls in CALLS:
            for name, step in contenders.items():
                us = graph_time_us(step, len(sets), calls=calls)
                rows.append({"kernel": kernel["name"], "input_sets": len(sets), "calls_per_graph": calls,
                             "contender": name, "us": us})
                print(f"{kernel['name']} {name:12s} {calls:3d} calls/graph: {us:8.2f} us", flush=True)
    args.out.write_text(json.dumps({"suite": "graph_calls", "device": torch.cuda.get_device_name(),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
