"""Summarise a results file whose rows carry an op ``class`` (the real-shapes and generality
suites): per class the geomean of the better peer's time over ours, the rows below 0.8x, the
worst row, and the rows by M. ``python -m tvm_dsm.bench.class_summary
bench/results/real_shapes/latest.json [--evidence FILE ...]`` writes ``summary.json`` beside it
and prints the table; the report (:mod:`tvm_dsm.bench.report`) shows its ``geomean_<class>`` keys.

Each row below 0.8x is explained by what was measured of its workload elsewhere: the
``--evidence`` files (configuration sweeps, runs under other plannings or other builds) hold
rows named after it, alone or with a configuration suffix, each timed beside its own peers. The
fastest of them says which part trails: where even it stays below 0.8x of its peer, the kernels
(no build measured keeps up); else the plan (a build measured faster than the one picked)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from .report import better_peer_ratio
from .results import derived_path, geomean, source_name

#: A workload below this fraction of the better peer is listed by name.
SLOW = 0.8


def builds_of(name: str, evidence: dict[str, dict]) -> list[tuple[float, dict, str]]:
    """The correct, timed rows of the ``evidence`` files (by name) that build workload ``name``:
    (their better peer's time over theirs, the row, the file)."""
    found = []
    for source, results in evidence.items():
        for row in results["rows"]:
            if row["ok"] and (row["name"] == name or row["name"].startswith(name + "_")):
                ratio = better_peer_ratio(row)
                if ratio is not None:
                    found.append((ratio, row, source))
    return found


def why_below(name: str, evidence: dict[str, dict]) -> str:
    """Which part holds workload ``name`` below :data:`SLOW`, by the builds of it measured in
    ``evidence`` (see the module docstring)."""
    found = builds_of(name, evidence)
    if not found:
        return "no other build of it measured"
    ratio, row, source = max(found, key=lambda f: f[0])
    part = "the kernels trail" if ratio < SLOW else "the plan trails"
    return (f"{part}: the fastest build measured ({len(found)} in all), {row['name']} ({source}), "
            f"ran {row['ours_us']:.1f} us, {ratio:.2f}x the better peer of its run")


def summarise(results: dict, evidence: dict[str, dict] | None = None) -> dict:
    """``{"geomean_<class>": x, "classes": {class: {...}}}`` over the correct, timed rows; each
    row below :data:`SLOW` explained by the ``evidence`` results (by file name), if any."""
    evidence = evidence or {}
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
            "below_why": {row["name"]: why_below(row["name"], evidence)
                          for ratio, row in sorted(rows, key=lambda x: x[1]["name"]) if ratio < SLOW},
            "worst": {"name": worst["name"], "ratio": worst_ratio},
            "geomean_by_m": {str(m): geomean(v) for m, v in sorted(by_m.items())},
        }
    failed = [r["name"] for r in results["rows"] if not r["ok"]]
    return {"source": None, "device": results["device"], "date": results["date"], "slow_below": SLOW,
            "evidence": sorted(evidence),
            "not_ok": failed, **{f"geomean_{c}": v["geomean"] for c, v in classes.items()}, "classes": classes}


def table(summary: dict) -> str:
    lines = [f"{'class':18s} {'rows':>5s} {'geomean':>8s} {'<' + str(SLOW):>6s}  worst"]
    for cls, c in summary["classes"].items():
        lines.append(f"{cls:18s} {c['rows']:5d} {c['geomean']:8.3f} {len(c['below']):6d}  "
                     f"{c['worst']['name']} {c['worst']['ratio']:.2f}x")
    if summary["not_ok"]:
        lines.append(f"not ok: {', '.join(summary['not_ok'])}")
    return "\n".join(lines)


def load_evidence(paths: list[str]) -> dict[str, dict]:
    """Results files by their paths as given (the summary records them so)."""
    return {Path(p).as_posix(): json.loads(Path(p).read_text()) for p in paths}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("--evidence", nargs="*", default=[], help="results files that build the workloads below 0.8x")
    args = parser.parse_args(argv)
    source = Path(args.source)
    summary = summarise(json.loads(source.read_text()), load_evidence(args.evidence))
    summary["source"] = source_name(source)
    out = derived_path(source, "summary")
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
