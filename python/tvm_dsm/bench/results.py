"""Benchmark results: one JSON file per suite, ``bench/results/<suite>/latest.json`` (the
current canonical run; every other run lives in ``bench/results/archive/``, listed in its
``INDEX.md``), a table, and a plot. Plots are generated, never committed: beside their source,
``plot.png`` for a ``latest.json`` (``<stem>.png`` for any other file)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections import Counter
from datetime import date
from pathlib import Path


#: The results folder of the repository (``bench/results``), whatever the working directory.
RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
#: Every file of a suite's current run lives in its own folder under this name.
LATEST = "latest.json"
#: The keys every suite header and every row must have (``bench/results/<suite>/latest.json``).
HEADER_KEYS = ("suite", "device", "date", "versions", "timing", "rows")
#: What a run's "timing" says where each call read fresh inputs from HBM (tvm_dsm.bench.timing),
#: as tvm_dsm.bench.calibrate tells such runs from those of a warm L2.
L2_ROTATED = "inputs rotated past L2"
#: The "timing" of the GPU suites (tvm_dsm.bench.timing.graph_time_us).
GRAPH_TIMING = f"CUDA events over CUDA-graph replays ({L2_ROTATED}), median of 50"
ROW_KEYS = ("name", "ok", "rel_err")


def latest_path(suite: str, root: str | Path = RESULTS) -> Path:
    """``<root>/<suite>/latest.json``: where a suite's current results are."""
    return Path(root) / suite / LATEST


def derived_path(source: str | Path, kind: str, suffix: str = ".json") -> Path:
    """A file derived from a results file, beside it: ``<kind><suffix>`` for a ``latest.json``
    (``gemm/summary.json``, ``gemm/plot.png``), ``<stem>_<kind><suffix>`` for another file
    (``archive/chains_summary.json``); a plot of another file keeps the bare ``<stem>.png``."""
    source = Path(source)
    if source.name == LATEST:
        return source.with_name(kind + suffix)
    return source.with_name(source.stem + ("" if kind == "plot" else f"_{kind}") + suffix)


def plot_path(source: str | Path) -> Path:
    return derived_path(source, "plot", ".png")


def source_name(source: str | Path) -> str:
    """How a summary names its source: ``gemm/latest.json`` for a suite's current run, the
    file name otherwise."""
    source = Path(source)
    return f"{source.parent.name}/{source.name}" if source.name == LATEST else source.name


def git_sha() -> str:
    """The short commit of the working tree results are taken from: ``TVM_DSM_GIT_SHA`` where
    set (the GPU machine's copy of the tree may carry a stale ``.git``; the command sent there
    passes the sha), else git's ("unknown" outside git)."""
    if os.environ.get("TVM_DSM_GIT_SHA"):
        return os.environ["TVM_DSM_GIT_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def schema_errors(results: dict) -> list[str]:
    """What keeps ``results`` from the results schema (empty: none): the header keys, a list of
    rows, each with a name, a boolean ``ok`` and a ``rel_err``."""
    errors = [f"no '{k}'" for k in HEADER_KEYS if k not in results]
    rows = results.get("rows")
    if not isinstance(rows, list) or not rows:
        return errors + ["'rows' is not a non-empty list"]
    for i, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            errors.append(f"row {i} ({row.get('name')}): no {', '.join(missing)}")
        elif not isinstance(row["ok"], bool):
            errors.append(f"row {i} ({row['name']}): 'ok' is {row['ok']!r}, not a boolean")
    return errors


def relative_error(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN (an unwritten element) gives inf."""
    out, ref = out.double(), ref.double()
    err = (out - ref).norm().item() / max(ref.norm().item(), 1e-300)
    return err if math.isfinite(err) else math.inf


def geomean(values: list[float]) -> float | None:
    """Geometric mean of ratios; None (JSON null) for none."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def new_suite(suite: str, device: str, versions: dict, timing: str) -> dict:
    """The suite header of the results schema (see the project README)."""
    return {
        "suite": suite,
        "device": device,
        "date": date.today().isoformat(),
        "host": platform.node(),
        "versions": versions,
        "timing": timing,
        "rows": [],
    }


def write(results: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    return path


def table(results: dict) -> str:
    """A fixed-width table: ours vs each peer vs the floor, per row."""
    rows = results["rows"]
    peers = sorted({p for r in rows for p in r.get("peers", {})})
    head = ["name", "ok", "rel_err", "ours_us", *[f"{p}_us" for p in peers], "floor_us"]
    lines = ["  ".join(f"{h:>14}" for h in head)]
    for r in rows:
        cells = [r["name"], str(r["ok"]), f"{r['rel_err']:.1e}", _us(r.get("ours_us"))]
        cells += [_us(r.get("peers", {}).get(p)) for p in peers]
        cells.append(_us(r.get("floor_us")))
        lines.append("  ".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def plot(results: dict, path: str | Path) -> Path:
    """Bar chart of GPU time per row: ours, each peer and the floor (log scale)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r.get("ours_us") is not None]
    peers = sorted({p for r in rows for p in r.get("peers", {})})
    series = [("ours", [r["ours_us"] for r in rows])]
    series += [(p, [r.get("peers", {}).get(p, float("nan")) for r in rows]) for p in peers]
    series.append(("floor", [r.get("floor_us", float("nan")) for r in rows]))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows) * len(series)), 4.5))
    for n, (label, values) in enumerate(series):
        ax.bar([i + n * width for i in range(len(rows))], values, width, label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([r["name"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("GPU time per call (us)")
    ax.set_title(f"{results['suite']} on {results['device']} ({results['date']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def merge(runs: list[dict]) -> dict:
    """Runs of one suite, oldest first, as one: a later run's row replaces an earlier row of the
    same name; each row's ``run`` and ``device`` name the git sha and GPU it ran on (kept where a
    merged run's rows already name theirs), the merged ``device`` counts the rows per GPU where
    they differ, and ``runs`` lists every run merged."""
    rows: dict[str, dict] = {}
    listed: list[dict] = []
    for run in runs:
        sha = run["versions"]["tvm_dsm"]
        for row in run["rows"]:
            rows[row["name"]] = {**row, "run": row.get("run", sha), "device": row.get("device", run["device"])}
        listed += run.get("runs", [{"git_sha": sha, "date": run["date"], "device": run["device"]}])
    devices = Counter(row["device"] for row in rows.values())
    device = next(iter(devices)) if len(devices) == 1 else "; ".join(f"{d} ({n} rows)" for d, n in devices.items())
    return {**runs[-1], "device": device, "rows": list(rows.values()), "runs": listed,
            "how_merged": "a later run's row replaces an earlier row of the same name; each row's 'run' names its git sha"}


def main(argv: list[str] | None = None) -> None:
    """``python -m tvm_dsm.bench.results FILE.json``: print the table and write the plot beside
    it (``plot.png`` for ``<suite>/latest.json``, else ``FILE.png``; not committed)."""
    import sys

    for name in argv if argv is not None else sys.argv[1:]:
        results = json.loads(Path(name).read_text())
        print(table(results))
        print("plot:", plot(results, plot_path(name)))


if __name__ == "__main__":
    main()
