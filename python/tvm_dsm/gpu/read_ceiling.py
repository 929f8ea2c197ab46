"""How close a plain read of N bytes gets to the floor the suites divide by.

``python -m tvm_dsm.gpu.read_ceiling --out read_ceiling.json`` (on the GPU machine, torch only).
Every result's floor is its bytes over the 1-GiB copy rate (:func:`.run.measure_hbm_bandwidth`);
a kernel that reads fewer bytes also pays its launch, ramp-up and tail. Torch's sum over the
same bytes, timed like every contender (CUDA events over CUDA-graph replays, inputs rotated
past L2, median), says what share of that floor a read of this size reaches at all, which is
what a "within 1.1x of the floor" target has to be judged against.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from ..bench.results import GRAPH_TIMING
from ..bench.timing import graph_time_us, input_sets_for
from .run import measure_hbm_bandwidth

#: Bytes of the decode shapes' K and V (rows x keys x head dim x 2 tensors x fp16) and of the
#: fp8 4096 x 4096 weight.
SIZES = {"decode 64x8192x64": 64 * 8192 * 64 * 4, "decode 32x16384x128": 32 * 16384 * 128 * 4,
         "decode 256x4096x128": 256 * 4096 * 128 * 4, "fp8 weight 4096x4096": 4096 * 4096}


def read_ceiling(nbytes: int, rows: int, hbm_bw: float) -> dict:
    """Torch's row sums over ``nbytes`` of fp16 in ``rows`` rows: time and share of the floor."""
    sets = [torch.randn(rows, nbytes // 2 // rows, device="cuda", dtype=torch.float16)
            for _ in range(input_sets_for(nbytes))]
    out = torch.empty(rows, device="cuda", dtype=torch.float32)
    us = graph_time_us(lambda i: torch.sum(sets[i], dim=1, dtype=torch.float32, out=out), len(sets))
    floor_us = nbytes / hbm_bw * 1e6
    return {"bytes": nbytes, "rows": rows, "torch_sum_us": us, "floor_us": floor_us,
            "floor_share": floor_us / us, "read_bytes_per_s": nbytes / us * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hbm_bw = measure_hbm_bandwidth()
    rows = []
    for label, nbytes in SIZES.items():
        for row_count in (64, 1024):
            rows.append({"label": label, **read_ceiling(nbytes, row_count, hbm_bw)})
            print(f"{label:24s} rows {row_count:5d}: {rows[-1]['torch_sum_us']:7.1f} us, "
                  f"floor {rows[-1]['floor_us']:6.1f} us ({rows[-1]['floor_share']:.2f} of it)")
    args.out.write_text(json.dumps({
        "suite": "read_ceiling", "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(), "hbm_copy_bytes_per_s": hbm_bw,
        "timing": GRAPH_TIMING,
        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
