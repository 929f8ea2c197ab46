"""Summarise a run whose variants of one workload shape differ in their split or tiles (the
``cascades``, ``decode`` and ``lm_head`` suites): per workload shape the planner's pick, the
best measured variant, the torch peers (eager, torch.compile, SDPA where the suite timed it)
and the HBM floor.
``python -m tvm_dsm.bench.cascade_summary bench/results/decode/latest.json`` writes
``summary.json`` and ``plot.png`` beside it (the plot is not committed) and prints the table;
given another file (``bench/results/archive/softmax_v.json``), ``<stem>_summary.json`` and
``<stem>.png``."""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from .gemm_summary import plot
from .results import derived_path, geomean, plot_path, source_name

_PEERS = {"torch_eager": "torch eager", "torch_compile": "torch.compile", "torch_sdpa": "torch SDPA"}


def _label(rows: list[dict]) -> str:
    """The workload and its shape: what the variant names share, up to the split."""
    common = os.path.commonprefix([r["name"] for r in rows])
    return common[: common.rindex("_")] if len(rows) > 1 else common


def summarise(results: dict, source: str) -> dict:
    groups = defaultdict(list)
    for row in results["rows"]:
        groups[row["name"].split("_")[0], json.dumps(row["shape"]), row.get("causal", False)].append(row)
    shapes = []
    for rows in groups.values():
        label = _label(rows)
        pick = next(r for r in rows if r["plan"].get("planner"))
        best = min(rows, key=lambda r: r["ours_us"])
        entry = {"shape": label, "label": label, "all_correct": all(r["ok"] for r in rows),
                 "kernels": len(rows), "planner_pick": pick["name"], "pick_us": pick["ours_us"],
                 "best": best["name"], "best_us": best["ours_us"], "floor_us": pick["floor_us"]}
        entry.update({f"{peer}_us": us for peer, us in pick["peers"].items()})
        better = min(pick["peers"].values())
        entry["pick_vs_best_peer"] = better / pick["ours_us"]
        entry["pick_vs_floor"] = pick["ours_us"] / pick["floor_us"]
        shapes.append(entry)
    return {
        "device": results["device"], "date": results["date"], "source": source,
        "geomean_pick_vs_best_peer": geomean([s["pick_vs_best_peer"] for s in shapes]),
        "shapes": shapes,
    }


def main() -> None:
    source = Path(sys.argv[1])
    summary = summarise(json.loads(source.read_text()), source_name(source))
    stem = source.parent.name if source.name == "latest.json" else source.stem
    derived_path(source, "summary").write_text(json.dumps(summary, indent=1))
    peers = [p for p in _PEERS if all(f"{p}_us" in s for s in summary["shapes"])]
    series = [("tvm-dsm (planner)", "pick_us"), ("tvm-dsm (best measured)", "best_us")]
    series += [(_PEERS[p], f"{p}_us") for p in peers] + [("HBM floor", "floor_us")]
    plot(summary, plot_path(source), series, what=stem)
    for s in summary["shapes"]:
        others = " ".join(f"{p.removeprefix('torch_')} {s[p + '_us']:7.1f}" for p in peers)
        print(f"{s['shape']:>34}: pick {s['pick_us']:7.1f} best {s['best_us']:7.1f} {others} "
              f"floor {s['floor_us']:6.1f}  pick/floor {s['pick_vs_floor']:.2f} "
              f"vs best peer {s['pick_vs_best_peer']:.2f}x")
    print({k: v for k, v in summary.items() if k.startswith("geomean")})


if __name__ == "__main__":
    main()
