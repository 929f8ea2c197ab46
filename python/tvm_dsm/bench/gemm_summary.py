"""Summarise the GEMM suite: per layer shape the planner's pick, the measured best, stock TVM
(dlight; stock MetaSchedule where ``bench/results/gemm_meta_schedule/latest.json`` has it), torch
eager (cuBLAS), torch.compile and the HBM floor; the model's rank correlation; the
cluster-size ablation. ``python -m tvm_dsm.bench.gemm_summary bench/results/gemm/latest.json``
writes ``summary.json`` and ``plot.png`` beside it (the plot is not committed) and prints the
table; given a ``gemm_m`` run (``bench/results/gemm_m/latest.json``), its ``summary.json``: the
pick against cuBLAS per batch; given a ``gemm_k_scaling`` run, its fixed part and main-loop rate
per series against cuBLAS's. Another file (``archive/X.json``) gets ``X_summary.json``."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from .results import LATEST, derived_path, geomean, plot_path, source_name


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = rank
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1)) if n > 2 else math.nan


def _stock_meta_schedule(baseline: dict | None, label: str, m: int) -> tuple[float | None, int | None]:
    """Stock MetaSchedule's time for one layer at its largest measured trial budget
    (:mod:`tvm_dsm.gpu.meta_schedule_baseline`, M = 128 only), or (None, None)."""
    rows = [r for r in (baseline or {}).get("rows", [])
            if r["shape"] == label and r["m"] == m and "_meta_schedule_" in r["name"] and r["ok"]]
    if not rows:
        return None, None
    row = max(rows, key=lambda r: r["trials"])
    return row["ours_us"], row["trials"]


def summarise(results: dict, baseline: dict | None = None, source: str = "gemm/latest.json") -> dict:
    groups = defaultdict(list)
    bf16 = []  # the planner's pick per shape in bf16, against cuBLAS in bf16
    for row in results["rows"]:
        if row["dtype"] == "bfloat16":
            bf16.append({"name": row["name"], "ok": row["ok"], "rel_err": row["rel_err"],
                         "us": row["ours_us"], **row["peers"],
                         "vs_cublas": row["peers"]["torch_eager"] / row["ours_us"]})
        else:
            groups[(row["shape"], row["m"])].append(row)
    shapes = []
    for (label, m), rows in groups.items():
        ours = [r for r in rows if "predicted_us" in r["plan"] and "silu" not in r["name"]]
        pick = next(r for r in ours if r["plan"]["plan_rank"] == 0)
        best = min(ours, key=lambda r: r["ours_us"])
        stock = next(r for r in rows if r.get("stock") == "dlight")
        epilogue = [r for r in rows if "silu" in r["name"]]
        peers = pick["peers"]
        meta_schedule_us, meta_schedule_trials = _stock_meta_schedule(baseline, label, m)
        shapes.append({
            "shape": label, "m": m, "n": pick["n"], "k": pick["k"],
            "label": f"{label} {m}x{pick['n']}x{pick['k']}",
            "all_correct": all(r["ok"] for r in rows), "kernels": len(rows),
            "planner_pick": pick["name"], "pick_us": pick["ours_us"],
            "best": best["name"], "best_us": best["ours_us"],
            "dlight_us": stock["ours_us"], "meta_schedule_us": meta_schedule_us,
            "meta_schedule_trials": meta_schedule_trials, "torch_eager_us": peers["torch_eager"],
            "torch_compile_us": peers["torch_compile"], "floor_us": pick["floor_us"],
            "pick_vs_cublas": peers["torch_eager"] / pick["ours_us"],
            "best_vs_cublas": peers["torch_eager"] / best["ours_us"],
            "pick_hbm_fraction": pick["floor_us"] / pick["ours_us"],
            "model_spearman": spearman([r["plan"]["predicted_us"] for r in ours],
                                        [r["ours_us"] for r in ours]),
            "bias_silu_us": epilogue[0]["ours_us"] if epilogue else None,
            "bias_silu_peers": epilogue[0]["peers"] if epilogue else None,
        })
    small = [s for s in shapes if s["m"] <= 256]
    ablation = sorted(
        ((r["plan"]["cluster_size"], r["ours_us"]) for r in groups[("G5b", 128)]
         if r["plan"].get("block_m") == 128 and r["plan"].get("block_n") == 128
         and r["plan"].get("stages") == 3 and "silu" not in r["name"]),
    )
    return {
        "device": results["device"], "date": results["date"], "source": source,
        "geomean_pick_vs_cublas_m_le_256": geomean([s["pick_vs_cublas"] for s in small]),
        "geomean_best_vs_cublas_m_le_256": geomean([s["best_vs_cublas"] for s in small]),
        "geomean_bf16_pick_vs_cublas": geomean([r["vs_cublas"] for r in bf16]),
        "ablation_G5b_128x128x64_s3_cluster_us": dict(ablation),
        "shapes": shapes,
        "bf16": bf16,
    }


def summarise_batches(results: dict) -> dict:
    """The ``gemm_m`` suite (one kernel per layer shape and batch: the planner's pick, or at
    M = 1 the stock fallback): per batch, each shape's time against cuBLAS and their geomean."""
    batches = defaultdict(list)
    for row in results["rows"]:
        batches[row["m"]].append({"shape": row["shape"], "name": row["name"], "ok": row["ok"],
                                  "us": row["ours_us"], "cublas_us": row["peers"]["torch_eager"],
                                  "vs_cublas": row["peers"]["torch_eager"] / row["ours_us"]})
    return {
        "device": results["device"], "date": results["date"], "source": results["suite"],
        "geomean_vs_cublas_by_m": {m: geomean([r["vs_cublas"] for r in rows])
                                   for m, rows in sorted(batches.items())},
        "all_correct": all(r["ok"] for rows in batches.values() for r in rows),
        "batches": {m: rows for m, rows in sorted(batches.items())},
    }


def summarise_depths(results: dict) -> dict:
    """The ``gemm_k_scaling`` suite (one configuration per series, timed at several K): per
    series, and per row count for cuBLAS, the line through its times against K: the fixed part
    (us at K = 0: launch, fill, reduction, epilogue, tail) and the part per 1024 of K (the main
    loop's rate)."""
    series, cublas = defaultdict(list), defaultdict(dict)
    for row in results["rows"]:
        if not row.get("peers"):  # a kernel that did not build or run: no shape, no timing
            continue
        if row["ok"]:
            series[(row["m"], row["n"], row["name"].rsplit(f"_m{row['m']}_", 1)[1])].append((row["k"], row["ours_us"]))
        cublas[(row["m"], row["n"])][row["k"]] = row["peers"]["torch_eager"]

    def fitted(points):  # the least-squares line through the times against K / 1024
        per_k, fixed = np.polyfit([k / 1024 for k, _ in points], [us for _, us in points], 1)
        return {"fixed_us": float(fixed), "us_per_1024_k": float(per_k), "points": sorted(points)}

    def lines(groups: dict) -> list[tuple]:  # those timed at two depths or more: a line through them
        return [(key, points) for key, points in sorted(groups.items()) if len({k for k, _ in points}) > 1]

    return {
        "device": results["device"], "date": results["date"], "source": results["suite"],
        "series": [{"m": m, "n": n, "config": tag, **fitted(points)} for (m, n, tag), points in lines(series)],
        "cublas": [{"m": m, "n": n, **fitted(points)}
                   for (m, n), points in lines({key: list(times.items()) for key, times in cublas.items()})],
    }


#: (legend, key of a shape's summary) per bar series of the dense-layer plot.
SERIES = [("tvm-dsm (planner)", "pick_us"), ("tvm-dsm (best measured)", "best_us"),
          ("TVM dlight", "dlight_us"), ("TVM MetaSchedule (stock)", "meta_schedule_us"),
          ("torch eager (cuBLAS)", "torch_eager_us"),
          ("torch.compile", "torch_compile_us"), ("HBM floor", "floor_us")]


def plot(summary: dict, path: Path, series: list = SERIES, what: str = "fp16 dense layers") -> None:
    """Bars per shape (log scale) of each series' GPU time, labelled by the shape's ``label``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = summary["shapes"]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(14, 4.5))
    for n, (label, key) in enumerate(series):
        heights = [float("nan") if s[key] is None else s[key] for s in shapes]  # None: not measured
        ax.bar([i + n * width for i in range(len(shapes))], heights, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
    ax.set_xticklabels([s["label"] for s in shapes], rotation=30,
                       ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (us)")
    ax.set_title(f"{what} on {summary['device']} ({summary['date']})")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def meta_schedule_baseline(source: Path) -> Path | None:
    """Stock MetaSchedule's run for a GEMM results file: ``gemm_meta_schedule.json`` beside it,
    else the suite's current one (``<results>/gemm_meta_schedule/latest.json``; the results folder
    is the parent of a suite's or the archive's folder)."""
    for path in (source.parent / "gemm_meta_schedule.json",
                 source.parent.parent / "gemm_meta_schedule" / LATEST):
        if path.exists():
            return path
    return None


def main() -> None:
    source = Path(sys.argv[1])
    results = json.loads(source.read_text())
    if results["suite"] == "gemm_m":  # several files (gemm_m/latest.json, archive/gemm_m1.json) hold it
        summary = summarise_batches(results)
        derived_path(source, "summary").write_text(json.dumps(summary, indent=1))
        for m, rows in summary["batches"].items():
            print(f"M={m:>5}: " + "  ".join(f"{r['shape']} {r['us']:.1f}/{r['cublas_us']:.1f}"
                                             for r in rows)
                  + f"  geomean vs cuBLAS {summary['geomean_vs_cublas_by_m'][m]:.2f}x")
        return
    if results["suite"] == "gemm_k_scaling":
        summary = summarise_depths(results)
        derived_path(source, "summary").write_text(json.dumps(summary, indent=1))
        for line in (*summary["series"], *({"config": "cuBLAS", **c} for c in summary["cublas"])):
            print(f"M={line['m']:>4} N={line['n']} {line['config']:>24}: {line['fixed_us']:6.2f} us "
                  f"+ {line['us_per_1024_k']:6.2f} us per 1024 of K")
        return
    baseline = meta_schedule_baseline(source)
    summary = summarise(results, json.loads(baseline.read_text()) if baseline else None, source_name(source))
    derived_path(source, "summary").write_text(json.dumps(summary, indent=1))
    plot(summary, plot_path(source))
    for s in summary["shapes"]:
        print(f"{s['shape']:>6} {s['m']:>5}x{s['n']}x{s['k']}: pick {s['pick_us']:7.1f} best "
              f"{s['best_us']:7.1f} dlight {s['dlight_us']:7.1f} cuBLAS {s['torch_eager_us']:6.1f} "
              f"compile {s['torch_compile_us']:6.1f} floor {s['floor_us']:6.1f}  "
              f"pick/cuBLAS {s['pick_vs_cublas']:.2f}x rho {s['model_spearman']:.2f}"
              + (f"  MetaSchedule ({s['meta_schedule_trials']} trials) {s['meta_schedule_us']:.1f}"
                 if s["meta_schedule_us"] else ""))
    for r in summary["bf16"]:
        print(f"{r['name']:>34}: {r['us']:7.1f} cuBLAS {r['torch_eager']:6.1f} ok {r['ok']}")
    print({k: v for k, v in summary.items() if k.startswith(("geomean", "ablation"))})


if __name__ == "__main__":
    main()
