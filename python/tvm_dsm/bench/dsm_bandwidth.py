"""DSM bandwidth of each collective, against the raw DSM bandwidth of the hardware description.

``python -m tvm_dsm.bench.dsm_bandwidth bench/results/collectives.json`` writes
``collectives_bandwidth.json`` beside it and prints a table. Two figures per kernel: a lower bound
(remote bytes / whole-kernel time) and the exchange phase (remote bytes / (kernel time - the
no-exchange ``copy`` baseline of the same configuration), which loads and stores the same tiles).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..hardware import load_hardware


def bandwidth_rows(results: dict) -> list[dict]:
    hw = load_hardware()
    times = {r["name"]: r["ours_us"] for r in results["rows"]}
    rows = []
    for r in results["rows"]:
        if r.get("collective") in (None, "copy"):
            continue
        raw = hw.dsm_peak_bw(r["cluster_size"])
        phase_us = r["ours_us"] - times[r["baseline"]]
        whole = r["dsm_bytes"] / (r["ours_us"] * 1e-6)
        phase = r["dsm_bytes"] / (phase_us * 1e-6) if phase_us > 0 else None
        rows.append({
            "name": r["name"], "ok": r["ok"], "collective": r["collective"],
            "cluster_size": r["cluster_size"], "dtype": r["dtype"], "dsm_bytes": r["dsm_bytes"],
            "kernel_us": r["ours_us"], "baseline_us": times[r["baseline"]],
            "raw_dsm_bytes_per_s": raw,
            "lower_bound_bytes_per_s": whole, "lower_bound_fraction_of_raw": whole / raw,
            "phase_bytes_per_s": phase, "phase_fraction_of_raw": phase / raw if phase else None,
        })
    return rows


def main() -> None:
    for name in sys.argv[1:]:
        path = Path(name)
        results = json.loads(path.read_text())
        rows = bandwidth_rows(results)
        out = path.with_name(path.stem + "_bandwidth.json")
        out.write_text(json.dumps({"device": results["device"], "date": results["date"],
                                   "source": path.name, "rows": rows}, indent=1) + "\n")
        print(f"{'name':28} ok  {'raw TB/s':>8} {'bound':>6} {'phase':>6}  (fraction of raw)")
        for r in rows:
            phase = r["phase_fraction_of_raw"]
            print(f"{r['name']:28} {str(r['ok']):5} {r['raw_dsm_bytes_per_s'] / 1e12:6.2f} "
                  f"{r['lower_bound_fraction_of_raw']:6.2f} {phase if phase is None else round(phase, 2)!s:>6}")
        print("wrote", out)


if __name__ == "__main__":
    main()
