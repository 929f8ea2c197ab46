"""Seconds from a fresh Python process to a first plan, the figure a new user meets first.

``python -m tvm_dsm.bench.cold_start [--repeats 5]`` starts ``python -m tvm_dsm plan`` on the
FFN 128x512 -> 2048 -> 512 that many times and writes ``bench/results/cold_start/latest.json``
(process wall time, median; the import of TVM included)."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import results as res

COMMAND = ["plan", "ffn", "128", "2048", "512", "512"]


def measure(repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tvm_dsm", *COMMAND], check=True, capture_output=True)
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=res.latest_path("cold_start"))
    args = parser.parse_args(argv)
    import tvm

    seconds = measure(args.repeats)
    results = res.new_suite("cold_start", f"CPU: {platform.processor() or platform.machine()}, "
                            f"{os.cpu_count()} cores", {"tvm": tvm.__version__, "tvm_dsm": res.git_sha()},
                            f"process wall time of `tvm-dsm {' '.join(COMMAND)}`, median of {args.repeats}")
    results["rows"].append({"name": "cold plan, FFN 128x512->2048->512", "ok": True, "rel_err": None,
                            "seconds": statistics.median(seconds), "all_seconds": seconds, "target_s": 5.0})
    res.write(results, args.out)
    print(f"cold plan: median {statistics.median(seconds):.2f} s over {args.repeats} (target 5 s) -> {args.out}")


if __name__ == "__main__":
    main()
