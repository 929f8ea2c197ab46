"""Launch exported kernels and their torch peers once each, for a profiler to read.

``ncu --kernel-name regex:... python -m tvm_dsm.gpu.profile .gpu/kernels/SUITE NAME ...``

Timing belongs to :mod:`tvm_dsm.gpu.run`; this driver only gives Nsight Compute one launch of
each named kernel (fresh random inputs, after one warm-up launch) and of torch eager on the same
inputs, so hardware counters of ours and cuBLAS's kernels sit side by side in one report.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import tvm
import tvm_ffi

from .references import REFERENCES
from .run import _random_inputs, _split, precompile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    manifest = json.loads((args.folder / "manifest.json").read_text())
    kernels = [k for k in manifest["kernels"] if k["name"] in args.names]
    precompile(args.folder, [k["name"] for k in kernels])
    peers_done = set()
    for kernel in kernels:
        func = tvm.runtime.load_module(str(args.folder / kernel["lib"]))["main"]
        tensors = _random_inputs(kernel["args"], 1)[0]
        wrapped = [tvm_ffi.from_dlpack(t) for t in tensors]
        for _ in range(2):
            func(*wrapped)
        inputs, _ = _split(kernel, tensors)
        key = json.dumps(kernel["args"])
        if key not in peers_done:
            peers_done.add(key)
            for _ in range(2):
                REFERENCES[kernel["workload"]].torch_eager(*inputs, **kernel.get("reference_kwargs", {}))
        torch.cuda.synchronize()
        print("launched", kernel["name"])


if __name__ == "__main__":
    main()
