"""DSM bandwidth of each collective, against the DSM peak of the hardware description.

``python -m tvm_dsm.bench.dsm_bandwidth bench/results/collectives/latest.json`` writes
``bandwidth.json`` beside it (``<stem>_bandwidth.json`` for another file) and prints a table of the ``resident_*`` kernels (tile
made in SMEM, only a sum written: the traffic is DSM alone). Two figures per kernel: a lower
bound (remote bytes / whole-kernel time) and the exchange phase (remote bytes / (kernel time -
the no-exchange ``copy`` kernel of the same configuration, which makes and sums the same
tiles)), each as a fraction of the peak (best of register loads and bulk copies at that cluster
size, ``src/hwbench``), with issue 4's target for the collective. Reduce-scatter writes 1/S of
the tile, so the copy kernel overstates its non-exchange work: only its lower bound is given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..hardware import load_hardware
from .results import derived_path, source_name

#: Fraction of the DSM peak each collective should reach (issue 4).
TARGETS = {"shuffle": 0.8, "broadcast": 0.8, "all_exchange": 0.6, "all_exchange_rs_ag": 0.6,
           "reduce_scatter": 0.6, "gated": 0.6}


def bandwidth_rows(results: dict) -> list[dict]:
    hw = load_hardware()
    times = {r["name"]: r["ours_us"] for r in results["rows"]}
    rows = []
    for r in results["rows"]:
        if not r.get("resident") or r.get("collective") in (None, "copy"):
            continue
        peak = hw.dsm_peak_bw(r["cluster_size"])
        phase_us = r["ours_us"] - times[r["baseline"]]
        whole = r["dsm_bytes"] / (r["ours_us"] * 1e-6)
        comparable = not r["collective"].startswith("reduce_scatter")
        phase = r["dsm_bytes"] / (phase_us * 1e-6) if comparable and phase_us > 0 else None
        target = TARGETS[r["collective"].removesuffix("_bulk")]
        rows.append({
            "name": r["name"], "ok": r["ok"], "collective": r["collective"],
            "cluster_size": r["cluster_size"], "dtype": r["dtype"], "dsm_bytes": r["dsm_bytes"],
            "kernel_us": r["ours_us"], "baseline_us": times[r["baseline"]],
            "peak_dsm_bytes_per_s": peak,
            "lower_bound_bytes_per_s": whole, "lower_bound_fraction_of_peak": whole / peak,
            "phase_bytes_per_s": phase, "phase_fraction_of_peak": phase / peak if phase else None,
            "target_fraction": target,
            "meets_target": max(whole, phase or 0) / peak >= target,
        })
    return rows


def main() -> None:
    for name in sys.argv[1:]:
        path = Path(name)
        results = json.loads(path.read_text())
        rows = bandwidth_rows(results)
        out = derived_path(path, "bandwidth")
        out.write_text(json.dumps({"device": results["device"], "date": results["date"],
                                   "source": source_name(path), "rows": rows}, indent=1) + "\n")
        print(f"{'name':40} ok    {'peak TB/s':>9} {'bound':>6} {'phase':>6} target")
        for r in rows:
            phase = r["phase_fraction_of_peak"]
            print(f"{r['name']:40} {str(r['ok']):5} {r['peak_dsm_bytes_per_s'] / 1e12:9.2f} "
                  f"{r['lower_bound_fraction_of_peak']:6.2f} "
                  f"{'-' if phase is None else f'{phase:.2f}':>6} {r['target_fraction']}")
        print("wrote", out)


if __name__ == "__main__":
    main()
