"""Summarise a fused GEMM chain run: per workload the planner's pick, the best measured
configuration, torch eager / torch.compile and the HBM floor, and the cost model's rank
correlation where a random sample of the pruned space was measured.
``python -m tvm_dsm.bench.chain_summary bench/results/chains.json`` writes ``chains_summary.json``
and ``chains.png`` beside it and prints the table."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from .gemm_summary import plot, spearman

#: Workloads with at least this many measured configurations get a model check.
_MODEL_CHECK_MIN = 30
_TOP = 11  # FlashFuser measures the model's top 11


def summarise(results: dict) -> dict:
    groups = defaultdict(list)
    for row in results["rows"]:
        groups[row["shape"]].append(row)
    shapes = []
    for label, rows in groups.items():
        pick = next(r for r in rows if r["plan"]["plan_rank"] == 0)
        best = min(rows, key=lambda r: r["ours_us"])
        peer = min(pick["peers"].values())
        entry = {
            "shape": label, "label": f"{label} n{pick['n']} k{pick['k']} l{pick['l']}",
            "all_correct": all(r["ok"] for r in rows), "kernels": len(rows),
            "planner_pick": pick["name"], "pick_us": pick["ours_us"],
            "best": best["name"], "best_us": best["ours_us"],
            "torch_eager_us": pick["peers"]["torch_eager"],
            "torch_compile_us": pick["peers"]["torch_compile"], "floor_us": pick["floor_us"],
            "best_vs_better_peer": peer / best["ours_us"], "pick_vs_better_peer": peer / pick["ours_us"],
        }
        if len(rows) >= _MODEL_CHECK_MIN:
            predicted = [r["plan"]["predicted_us"] for r in rows]
            top = sorted(range(len(rows)), key=predicted.__getitem__)[:_TOP]
            entry["model_spearman"] = spearman(predicted, [r["ours_us"] for r in rows])
            entry["best_in_predicted_top_11"] = rows.index(best) in top
        shapes.append(entry)
    chains = [s for s in shapes if s["shape"].startswith("G")]
    swiglus = [s for s in shapes if s["shape"].startswith("S")]

    def geomean(items, key):
        return math.exp(sum(math.log(s[key]) for s in items) / len(items)) if items else None

    return {
        "device": results["device"], "date": results["date"], "source": "chains.json",
        "geomean_best_vs_better_peer_gemm_chains": geomean(chains, "best_vs_better_peer"),
        "geomean_best_vs_better_peer_swiglu": geomean(swiglus, "best_vs_better_peer"),
        "shapes": shapes,
    }


SERIES = [("tvm-dsm fused (planner)", "pick_us"), ("tvm-dsm fused (best measured)", "best_us"),
          ("torch eager", "torch_eager_us"), ("torch.compile", "torch_compile_us"),
          ("HBM floor", "floor_us")]


def main() -> None:
    source = Path(sys.argv[1])
    summary = summarise(json.loads(source.read_text()))
    (source.parent / "chains_summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, source.parent / "chains.png", SERIES, "fused fp16 GEMM chains, M=128")
    for s in summary["shapes"]:
        model = (f"  rho {s['model_spearman']:.2f} best in top-11 {s['best_in_predicted_top_11']}"
                 if "model_spearman" in s else "")
        print(f"{s['label']:>24}: pick {s['pick_us']:7.1f} best {s['best_us']:7.1f} eager "
              f"{s['torch_eager_us']:6.1f} compile {s['torch_compile_us']:6.1f} floor "
              f"{s['floor_us']:6.1f}  best/peer {s['best_vs_better_peer']:.2f}x{model}")
    print({k: v for k, v in summary.items() if k.startswith("geomean")})


if __name__ == "__main__":
    main()
