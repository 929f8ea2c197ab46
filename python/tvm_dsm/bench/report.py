"""Generate ``bench/RESULTS.md`` (and ``bench/results/archive/INDEX.md``) from the results JSON.

``python -m tvm_dsm.bench.report`` (from the repository root; the defaults are
``--results bench/results --out bench/RESULTS.md``) writes one section per suite from its
``<suite>/latest.json``: device, date, versions, the planner's picks as a table (name, ok,
rel_err, ours_us, each peer, floor_us, the better peer's time over ours), their geomean, and
NOT-MET markers where a file says so (a wrong result, a bandwidth target missed). It also writes
``archive/INDEX.md`` from ``archive/index.json``. The output depends on the JSON alone: run it
again after any results change and commit both files.

``python -m tvm_dsm.bench.report report FILE`` prints one results file, every row, as a table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .results import LATEST, geomean, merge, schema_errors

#: Rows shown per suite in RESULTS.md; the rest: ``report FILE``.
MAX_ROWS = 40


def load_suites(root: str | Path) -> dict[str, dict]:
    """``{suite: results}`` for every ``<root>/<suite>/latest.json``, by suite name."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(root).glob(f"*/{LATEST}"))}


def is_pick(row: dict) -> bool:
    """The row of a kernel the planner picks: ``plan.pick`` or ``plan.planner`` where the suite
    marks them, else the rank-0 plan."""
    plan = row.get("plan") or {}
    if "pick" in plan or "planner" in plan:
        return bool(plan.get("pick") or plan.get("planner"))
    return plan.get("plan_rank") == 0


def better_peer_ratio(row: dict) -> float | None:
    """The better (faster) peer's time over ours: above 1, ours is faster."""
    peers = [v for v in (row.get("peers") or {}).values() if v]
    ours = row.get("ours_us")
    return min(peers) / ours if peers and ours else None


def _geomean_ratios(rows: list[dict]) -> list[float]:
    """The ratios a geomean is taken over: correct rows with a peer."""
    return [x for r in rows if r["ok"] and (x := better_peer_ratio(r)) is not None]


def marker(row: dict) -> str:
    if row.get("ok") is False:
        return "expected failure" if row.get("expected_ok") is False else "**NOT MET**: wrong result"
    if row.get("meets_target") is False:
        return "**NOT MET**: target"
    return ""


def _us(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _err(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(rows: list[dict]) -> str:
    """A markdown table of ``rows``: name, ok, rel_err, ours, each peer, floor, ratio, marker."""
    peers = sorted({p for r in rows for p in (r.get("peers") or {})})
    head = ["name", "ok", "rel_err", "ours_us", *[f"{p}_us" for p in peers], "floor_us",
            "better peer / ours", ""]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r['name']}`", "yes" if r["ok"] else "**no**", _err(r.get("rel_err")), _us(r.get("ours_us"))]
        cells += [_us((r.get("peers") or {}).get(p)) for p in peers]
        cells += [_us(r.get("floor_us")), _ratio(better_peer_ratio(r)), marker(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _versions(results: dict) -> str:
    v = results.get("versions") or {}
    keys = [k for k in ("tvm", "tvm_dsm", "torch", "cuda") if k in v]
    return ", ".join(f"{k} `{v[k]}`" for k in keys) or "-"


def _selection(results: dict) -> tuple[list[dict], str]:
    rows = results["rows"]
    picks = [r for r in rows if is_pick(r)]
    chosen, what = (picks, "the planner's picks") if picks else (rows, "every row")
    failed = [r for r in rows if not r["ok"] and r not in chosen]
    return failed + chosen, what


def section(suite: str, results: dict, folder: Path) -> str:
    rows = results["rows"]
    chosen, what = _selection(results)
    ratios = _geomean_ratios(chosen)
    failed = [r for r in rows if not r["ok"] and r.get("expected_ok") is not False]
    expected = [r for r in rows if not r["ok"] and r.get("expected_ok") is False]
    out = [f"## {suite}", "",
           f"{results['device']}, {results['date']}; {_versions(results)}. "
           f"`bench/results/{suite}/{LATEST}`: {len(rows)} rows, "
           f"{sum(r['ok'] for r in rows)} correct"
           + (f", {len(expected)} expected failure(s)" if expected else "")
           + (f", **NOT MET: {len(failed)} wrong**" if failed else "") + "."]
    if ratios:
        out.append(f"Geomean of the better peer's time over ours, {what}: **{geomean(ratios):.3f}x** "
                   f"({len(ratios)} rows; above 1: ours faster).")
    summary = folder / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        keys = sorted(k for k, v in s.items() if k.startswith("geomean") and isinstance(v, (int, float)))
        if keys:
            out.append("From `summary.json`: " + ", ".join(f"{k} {s[k]:.3f}" for k in keys) + ".")
    bandwidth = folder / "bandwidth.json"
    if bandwidth.exists():
        b = json.loads(bandwidth.read_text())["rows"]
        met = [r["name"] for r in b if r.get("meets_target")]
        out.append(f"DSM bandwidth targets (`bandwidth.json`): {len(met)} of {len(b)} met"
                   + (f" ({', '.join(f'`{n}`' for n in met)}); **NOT MET** for the other {len(b) - len(met)}"
                      if len(met) < len(b) else "") + ".")
    shown = chosen[:MAX_ROWS]
    out += ["", table(shown)]
    if len(shown) < len(rows):
        out.append(f"\n{len(shown)} of {len(rows)} rows ({what}"
                   + (f", first {MAX_ROWS}" if len(chosen) > MAX_ROWS else "") + "); every row: "
                   f"`python -m tvm_dsm.bench.report report bench/results/{suite}/{LATEST}`.")
    return "\n".join(out)


def generate(root: str | Path) -> str:
    root = Path(root)
    suites = load_suites(root)
    lines = ["# Benchmark results", "",
             "Generated by `python -m tvm_dsm.bench.report` from `bench/results/<suite>/latest.json`; "
             "do not edit. Older runs, A/B experiments and one-offs: `bench/results/archive/INDEX.md`. "
             "Ratios are the better peer's GPU time over ours (above 1: ours faster).", "",
             "| suite | date | device | rows | correct | geomean better peer / ours (picks) |",
             "|---|---|---|---|---|---|"]
    for suite, results in suites.items():
        chosen, _ = _selection(results)
        ratios = _geomean_ratios(chosen)
        ok = sum(r["ok"] for r in results["rows"])
        wrong = sum(not r["ok"] and r.get("expected_ok") is not False for r in results["rows"])
        lines.append(f"| [{suite}](#{suite}) | {results['date']} | {results['device']} | {len(results['rows'])} | "
                     f"{ok}{f' **NOT MET: {wrong} wrong**' if wrong else ''} | "
                     f"{_ratio(geomean(ratios)) if ratios else '-'} |")
    for suite, results in suites.items():
        lines += ["", section(suite, results, root / suite)]
    return "\n".join(lines) + "\n"


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") if text is not None else "-"


def index_markdown(entries: list[dict]) -> str:
    """``archive/INDEX.md`` from ``archive/index.json``."""
    kinds = {"ab": "A/B experiments", "older_run": "Older runs of a suite", "partial_run": "Partial re-runs of a suite",
             "check_only": "Check-only runs (no timing)", "summary": "Summaries of archived runs",
             "one_off": "One-off sweeps, probes and prototypes", "profile": "Profiles (Nsight Compute)",
             "microbenchmark": "CUDA microbenchmarks", "tool_run": "Runs of other tools in the tree"}
    n_repro = sum(e["reproducible"] for e in entries)
    lines = ["# Archived results", "",
             "Generated by `python -m tvm_dsm.bench.report` from `index.json` (edit that file, not this one). "
             "Every result file that is not a suite's current `../<suite>/latest.json`, under its original name. "
             "'what it measured' is from the file's own `note` (or `command`); 'reproducible' says whether code "
             "in the tree can produce it (its suite in `tvm_dsm.gpu.suites.SUITES`, a tool or a summary in the tree) "
             "and, where not, why.", "",
             f"{len(entries)} files, {n_repro} reproducible by the tree's code, {len(entries) - n_repro} not."]
    for kind, title in kinds.items():
        group = [e for e in entries if e["kind"] == kind]
        if not group:
            continue
        lines += ["", f"## {title} ({len(group)})", "",
                  "| file | suite | date | device | rows | what it measured | reproducible | status |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in group:
            status = e.get("superseded_by") or ""
            repro = "yes: " + _cell(e["how"]) if e["reproducible"] else "**no**: " + _cell(e["reason"])
            rows = "-" if e.get("rows") is None else str(e["rows"]) + ("" if e.get("all_ok") in (None, True) else " (not all ok)")
            lines.append(f"| `{e['file']}` | {_cell(e['suite'])} | {_cell(e['date'])} | {_cell(e['device'])} | {rows} | "
                         f"{_cell(e['measured'])} | {repro} | {_cell(status)} |")
    return "\n".join(lines) + "\n"


def write_all(root: str | Path, out: str | Path) -> list[Path]:
    root, out = Path(root), Path(out)
    bad = {s: errs for s, r in load_suites(root).items() if (errs := schema_errors(r))}
    if bad:
        raise SystemExit(f"not in the results schema: {bad}")
    out.write_text(generate(root))
    written = [out]
    index = root / "archive" / "index.json"
    if index.exists():
        md = index.with_name("INDEX.md")
        md.write_text(index_markdown(json.loads(index.read_text())))
        written.append(md)
    return written


def print_file(path: str | Path, picks: bool = False) -> None:
    results = json.loads(Path(path).read_text())
    rows = [r for r in results["rows"] if is_pick(r)] if picks else results["rows"]
    print(f"{results['suite']} on {results['device']}, {results['date']}; {_versions(results)}")
    print(table(rows))
    ratios = _geomean_ratios(rows)
    if ratios:
        print(f"geomean better peer / ours over {len(ratios)} correct rows: {geomean(ratios):.3f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tvm_dsm.bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="bench/results", help="results folder (default: bench/results)")
    parser.add_argument("--out", default="bench/RESULTS.md", help="markdown to write (default: bench/RESULTS.md)")
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("report", help="print one results file as a table")
    one.add_argument("file", help="a results JSON, e.g. bench/results/gemm/latest.json")
    one.add_argument("--picks", action="store_true", help="only the planner's picks")
    both = sub.add_parser("merge", help="merge runs of one suite, later rows replacing earlier ones by name")
    both.add_argument("runs", nargs="+", help="results JSON, oldest first")
    both.add_argument("--into", required=True, help="results JSON to write (e.g. bench/results/SUITE/latest.json)")
    args = parser.parse_args(argv)
    if args.command == "report":
        print_file(args.file, args.picks)
        return
    if args.command == "merge":
        merged = merge([json.loads(Path(p).read_text()) for p in args.runs])
        Path(args.into).write_text(json.dumps(merged, indent=1) + "\n")
        print(f"{len(merged['rows'])} rows of {len(merged['runs'])} runs -> {args.into}")
        return
    for path in write_all(args.results, args.out):
        print("wrote", path)


if __name__ == "__main__":
    main()
