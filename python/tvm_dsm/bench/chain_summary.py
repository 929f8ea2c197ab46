"""Summarise a GEMM chain run: per workload the chain family's pick (fused or unfused, as
:func:`tvm_dsm.plan` ranks them), the best measured fused and unfused kernels, torch eager /
torch.compile and the HBM floor, and the cost model's rank correlation where a random sample of
the fused space was measured.
``python -m tvm_dsm.bench.chain_summary bench/results/chains/latest.json`` writes
``summary.json`` and ``plot.png`` beside it (``<run>_summary.json`` and ``<run>.png`` for another
file, e.g. the full sweep ``archive/chains.json``; plots are not committed) and prints the table. Where the random
sample was measured it adds FlashFuser's ablation: no fusion (the best measured pair of split-K
GEMMs), SMEM-only fusion (the best planned one-CTA cluster, where one fits), DSM fusion with
random plans (median of the sample) and with the searched plan (the fused planner's best)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from .gemm_summary import plot, spearman
from .results import derived_path, geomean, plot_path, source_name

#: Workloads with at least this many measured configurations get a model check.
_MODEL_CHECK_MIN = 30
_TOP = 11  # FlashFuser measures the model's top 11


def _fastest(rows: list[dict]) -> dict | None:
    return min(rows, key=lambda r: r["ours_us"]) if rows else None


def summarise(results: dict, source: str = "chains/latest.json") -> dict:
    groups = defaultdict(list)
    for row in results["rows"]:
        groups[row["shape"], row["m"]].append(row)
    shapes = []
    for (label, m), every in groups.items():
        fused = [r for r in every if not r["plan"].get("smem_only") and not r["plan"].get("unfused")]
        smem = [r for r in every if r["plan"].get("smem_only")]
        unfused = [r for r in every if r["plan"].get("unfused")]
        pick = next(r for r in every if r["plan"]["pick"])
        best = _fastest(every)  # any kind: DSM or SMEM-only fused, or unfused
        best_fused, best_unfused = _fastest(fused), _fastest(unfused)
        peer = min(pick["peers"].values())
        entry = {
            "shape": label, "m": m,
            "label": f"{label} m{m} n{pick['n']} k{pick['k']} l{pick['l']}",
            "all_correct": all(r["ok"] for r in every), "kernels": len(every),
            "planner_pick": pick["name"], "pick_unfused": bool(pick["plan"].get("unfused")),
            "pick_us": pick["ours_us"],
            "best": best["name"], "best_us": best["ours_us"],
            "best_fused_us": best_fused["ours_us"] if best_fused else None,
            "best_unfused_us": best_unfused["ours_us"] if best_unfused else None,
            "torch_eager_us": pick["peers"]["torch_eager"],
            "torch_compile_us": pick["peers"]["torch_compile"], "floor_us": pick["floor_us"],
            "best_vs_better_peer": peer / best["ours_us"], "pick_vs_better_peer": peer / pick["ours_us"],
            "pick_floor_share": pick["floor_us"] / pick["ours_us"],
            # SMEM-only fusion (one-CTA clusters), where a configuration fits and was measured
            "smem_only_us": smem[0]["ours_us"] if smem else None,
        }
        if len(fused) >= _MODEL_CHECK_MIN:
            predicted = [r["plan"]["predicted_us"] for r in fused]
            top = sorted(range(len(fused)), key=predicted.__getitem__)[:_TOP]
            entry["model_spearman"] = spearman(predicted, [r["ours_us"] for r in fused])
            entry["best_in_predicted_top_11"] = fused.index(best_fused) in top
            measured = sorted(r["ours_us"] for r in fused if r["plan"]["plan_rank"] >= 3)
            entry["random_median_us"] = measured[len(measured) // 2]
            entry["ablation"] = {
                "no_fusion_split_k_gemms_us": entry["best_unfused_us"],
                "smem_only_fusion_us": entry["smem_only_us"],  # None: no one-CTA configuration fits
                "dsm_fused_random_plan_us": entry["random_median_us"],
                "dsm_fused_searched_plan_us": next(
                    r["ours_us"] for r in fused if r["plan"]["plan_rank"] == 0),
                "torch_better_peer_us": peer,
            }
        shapes.append(entry)
    chains = [s for s in shapes if s["shape"].startswith("G")]
    swiglus = [s for s in shapes if s["shape"].startswith("S")]
    return {
        "device": results["device"], "date": results["date"], "source": source,
        "geomean_pick_vs_better_peer_gemm_chains": geomean([s["pick_vs_better_peer"] for s in chains]),
        "geomean_pick_vs_better_peer_swiglu": geomean([s["pick_vs_better_peer"] for s in swiglus]),
        "geomean_best_vs_better_peer_gemm_chains": geomean([s["best_vs_better_peer"] for s in chains]),
        "geomean_best_vs_better_peer_swiglu": geomean([s["best_vs_better_peer"] for s in swiglus]),
        "shapes": shapes,
    }


SERIES = [("tvm-dsm (planner's pick)", "pick_us"), ("tvm-dsm fused (best measured)", "best_fused_us"),
          ("tvm-dsm unfused (best measured)", "best_unfused_us"),
          ("torch eager", "torch_eager_us"), ("torch.compile", "torch_compile_us"),
          ("HBM floor", "floor_us")]


def main() -> None:
    source = Path(sys.argv[1])
    summary = summarise(json.loads(source.read_text()), source_name(source))
    derived_path(source, "summary").write_text(json.dumps(summary, indent=1))
    batches = ", ".join(str(m) for m in sorted({s["m"] for s in summary["shapes"]}))
    plot(summary, plot_path(source), SERIES, f"fp16 GEMM chains, M={batches}")
    for s in summary["shapes"]:
        model = (f"  rho {s['model_spearman']:.2f} best in top-11 {s['best_in_predicted_top_11']}"
                 if "model_spearman" in s else "")
        kind = "unfused" if s["pick_unfused"] else "fused"
        print(f"{s['label']:>30}: pick ({kind:>7}) {s['pick_us']:7.1f} best {s['best_us']:7.1f} eager "
              f"{s['torch_eager_us']:6.1f} compile {s['torch_compile_us']:6.1f} floor "
              f"{s['floor_us']:6.1f}  pick/peer {s['pick_vs_better_peer']:.2f}x{model}")
    print({k: v for k, v in summary.items() if k.startswith("geomean")})


if __name__ == "__main__":
    main()
