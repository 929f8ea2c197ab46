"""Summarise a results file whose rows carry an op ``class`` (the real-shapes and generality
suites): per class the geomean of the better peer's time over ours, the rows below 0.8x, the
worst row, and the rows by M. ``python -m tvm_dsm.bench.class_summary
bench/results/real_shapes/latest.json`` writes ``summary.json`` beside it and prints the table;
the report (:mod:`tvm_dsm.bench.report`) shows its ``geomean_<class>`` keys."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from .report import better_peer_ratio
from .results import derived_path, geomean, source_name

#: A workload below this fraction of the better peer is listed by name.
SLOW = 0.8


def summarise(results: dict) -> dict:
    """``{"geomean_<class>": x, "classes": {class: {...}}}`` over the correct, timed rows."""
    by_class: dict[str, list[tuple[float, dict]]] = defaultdict(list)
    for row in results["rows"]:
        ratio = better_peer_ratio(row) if row["ok"] else None
        if ratio is not None and row.get("class"):
            by_class[row["class"]].append((ratio, row))
    classes = {}
    for cls, rows in sorted(by_class.items()):
        ratios = [r for r, _ in rows]
        by_m: dict[int, list[float]] = defaultdict(list)
        for ratio, row in rows:
            if "m" in row:
                by_m[row["m"]].append(ratio)
        worst_ratio, worst = min(rows, key=lambda x: x[0])
        classes[cls] = {
            "rows": len(rows),
            "geomean": geomean(ratios),
            "below": sorted(row["name"] for ratio, row in rows if ratio < SLOW),
            "worst": {"name": worst["name"], "ratio": worst_ratio},
            "geomean_by_m": {str(m): geomean(v) for m, v in sorted(by_m.items())},
        }
    failed = [r["name"] for r in results["rows"] if not r["ok"]]
    return {"source": None, "device": results["device"], "date": results["date"], "slow_below": SLOW,
            "not_ok": failed, **{f"geomean_{c}": v["geomean"] for c, v in classes.items()}, "classes": classes}


def table(summary: dict) -> str:
    lines = [f"{'class':18s} {'rows':>5s} {'geomean':>8s} {'<' + str(SLOW):>6s}  worst"]
    for cls, c in summary["classes"].items():
        lines.append(f"{cls:18s} {c['rows']:5d} {c['geomean']:8.3f} {len(c['below']):6d}  "
                     f"{c['worst']['name']} {c['worst']['ratio']:.2f}x")
    if summary["not_ok"]:
        lines.append(f"not ok: {', '.join(summary['not_ok'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    source = Path((argv if argv is not None else sys.argv[1:])[0])
    summary = summarise(json.loads(source.read_text()))
    summary["source"] = source_name(source)
    out = derived_path(source, "summary")
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
