"""Summarise a fused GEMM chain run: per workload the planner's pick, the best measured
configuration, torch eager / torch.compile and the HBM floor, and the cost model's rank
correlation where a random sample of the pruned space was measured.
``python -m tvm_dsm.bench.chain_summary bench/results/chains.json [bench/results/gemm_summary.json]``
writes ``chains_summary.json`` and ``chains.png`` beside it (``<run>_summary.json`` and
``<run>.png`` for another run, e.g. the M sweep ``chains_m.json``) and prints the table. With the dense
layer summary it adds the ablation for the chains whose two layers that suite measured: no fusion
(the two cluster split-K GEMMs, planner's picks), SMEM-only fusion (the best planned one-CTA
cluster, where one fits), DSM fusion with random plans (median of the
sampled configurations) and with the searched plan (the planner's pick)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from .gemm_summary import plot, spearman
from .results import geomean

#: Workloads with at least this many measured configurations get a model check.
_MODEL_CHECK_MIN = 30
_TOP = 11  # FlashFuser measures the model's top 11


def ablation(shapes: list[dict], dense: dict) -> dict:
    """Per chain with both layers in the dense suite (labels ``<chain>a``, ``<chain>b``)."""
    layers = {s["shape"]: s for s in dense["shapes"] if s["m"] == 128}
    table = {}
    for s in shapes:
        first, second = layers.get(f"{s['shape']}a"), layers.get(f"{s['shape']}b")
        if first and second and s["m"] == 128 and "random_median_us" in s:
            table[s["shape"]] = {
                "no_fusion_split_k_gemms_us": first["pick_us"] + second["pick_us"],
                "smem_only_fusion_us": s["smem_only_us"],  # None: no one-CTA configuration fits
                "dsm_fused_random_plan_us": s["random_median_us"],
                "dsm_fused_searched_plan_us": s["pick_us"],
                "torch_better_peer_us": min(s["torch_eager_us"], s["torch_compile_us"]),
            }
    return table


def summarise(results: dict, dense: dict | None = None, source: str = "chains.json") -> dict:
    groups = defaultdict(list)
    for row in results["rows"]:
        groups[row["shape"], row["m"]].append(row)
    shapes = []
    for (label, m), every in groups.items():
        rows = [r for r in every if not r["plan"].get("smem_only")]  # the DSM space
        smem = [r for r in every if r["plan"].get("smem_only")]
        pick = next(r for r in rows if r["plan"]["plan_rank"] == 0)
        best = min(rows, key=lambda r: r["ours_us"])
        peer = min(pick["peers"].values())
        entry = {
            "shape": label, "m": m,
            "label": f"{label} m{m} n{pick['n']} k{pick['k']} l{pick['l']}",
            "all_correct": all(r["ok"] for r in rows), "kernels": len(rows),
            "planner_pick": pick["name"], "pick_us": pick["ours_us"],
            "best": best["name"], "best_us": best["ours_us"],
            "torch_eager_us": pick["peers"]["torch_eager"],
            "torch_compile_us": pick["peers"]["torch_compile"], "floor_us": pick["floor_us"],
            "best_vs_better_peer": peer / best["ours_us"], "pick_vs_better_peer": peer / pick["ours_us"],
            # SMEM-only fusion (one-CTA clusters), where a configuration fits and was measured
            "smem_only_us": smem[0]["ours_us"] if smem else None,
        }
        if len(rows) >= _MODEL_CHECK_MIN:
            predicted = [r["plan"]["predicted_us"] for r in rows]
            top = sorted(range(len(rows)), key=predicted.__getitem__)[:_TOP]
            entry["model_spearman"] = spearman(predicted, [r["ours_us"] for r in rows])
            entry["best_in_predicted_top_11"] = rows.index(best) in top
            measured = sorted(r["ours_us"] for r in rows if r["plan"]["plan_rank"] >= 3)
            entry["random_median_us"] = measured[len(measured) // 2]
        shapes.append(entry)
    chains = [s for s in shapes if s["shape"].startswith("G")]
    swiglus = [s for s in shapes if s["shape"].startswith("S")]

    return {
        "device": results["device"], "date": results["date"], "source": source,
        "geomean_best_vs_better_peer_gemm_chains": geomean([s["best_vs_better_peer"] for s in chains]),
        "geomean_best_vs_better_peer_swiglu": geomean([s["best_vs_better_peer"] for s in swiglus]),
        "ablation": ablation(shapes, dense) if dense else {},
        "shapes": shapes,
    }


SERIES = [("tvm-dsm fused (planner)", "pick_us"), ("tvm-dsm fused (best measured)", "best_us"),
          ("torch eager", "torch_eager_us"), ("torch.compile", "torch_compile_us"),
          ("HBM floor", "floor_us")]


def main() -> None:
    source = Path(sys.argv[1])
    dense = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
    summary = summarise(json.loads(source.read_text()), dense, source.name)
    (source.parent / f"{source.stem}_summary.json").write_text(json.dumps(summary, indent=1))
    batches = ", ".join(str(m) for m in sorted({s["m"] for s in summary["shapes"]}))
    plot(summary, source.parent / f"{source.stem}.png", SERIES, f"fused fp16 GEMM chains, M={batches}")
    for s in summary["shapes"]:
        model = (f"  rho {s['model_spearman']:.2f} best in top-11 {s['best_in_predicted_top_11']}"
                 if "model_spearman" in s else "")
        print(f"{s['label']:>30}: pick {s['pick_us']:7.1f} best {s['best_us']:7.1f} eager "
              f"{s['torch_eager_us']:6.1f} compile {s['torch_compile_us']:6.1f} floor "
              f"{s['floor_us']:6.1f}  best/peer {s['best_vs_better_peer']:.2f}x{model}")
    print({k: v for k, v in summary.items() if k.startswith(("geomean", "ablation"))})


if __name__ == "__main__":
    main()
