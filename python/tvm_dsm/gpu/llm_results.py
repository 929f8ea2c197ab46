"""The results of the LLM run (:mod:`tvm_dsm.gpu.llm`) as rows of tvm_dsm.bench.results'
schema: one per tvm-dsm configuration, phase, prompt length and batch, with the other
contenders at the same point as peers; and runs of different contenders or points merged into
one results file.
"""

from __future__ import annotations

import json
from pathlib import Path


#: Logits of the fp16 model against the fp32 evaluation, teacher-forced: the bound of a correct
#: decode (issue 51's acceptance).
LOGITS_TOLERANCE = 5e-3


def _points(found: dict, prompt_len: int) -> dict[tuple[str, int, int], tuple[float, dict]]:
    """A configuration's measurements by (phase, prompt length, batch): the time in
    microseconds (a decode step's, or a prefill's) and the row it came from."""
    points = {}
    rows = [(prompt_len, int(b), row) for b, row in found.get("batches", {}).items()]
    rows += [(int(c), int(b), row) for c, by_batch in found.get("contexts", {}).items() for b, row in by_batch.items()]
    for context, batch, row in rows:  # a --contexts length equal to the prompt's keeps the checked row
        if row.get("decode_ms_per_step") is not None:
            points.setdefault(("decode", context, batch), (row["decode_ms_per_step"] * 1e3, row))
        if row.get("prefill_ms") is not None:
            points.setdefault(("prefill", context, batch), (row["prefill_ms"] * 1e3, row))
    return points


def schema_rows(configs: dict, prompt_len: int) -> list[dict]:
    """One results row (tvm_dsm.bench.results' schema) per tvm-dsm configuration, phase, prompt
    length and batch: its time, the other configurations' (TVM's stack, torch) at the same point
    as peers, the decode floor, where the logits were checked their error against fp32, where
    the phase was profiled its heaviest kernels, and where recorded the mean decode steps."""
    points = {name: _points(found, prompt_len) for name, found in configs.items()}
    rows = []
    for name, own in points.items():
        if not name.startswith("tvm_dsm"):
            continue
        for (phase, context, batch), (us, row) in sorted(own.items()):
            checked = row.get("logits_vs_fp32")
            err = checked["rel_l2_max"] if checked else None
            rows.append({"name": f"{name}_{phase}_len{context}_batch{batch}", "phase": phase, "context": context,
                         "batch": batch, "ok": err is None or err < LOGITS_TOLERANCE, "rel_err": err, "ours_us": us,
                         "peers": {other: found[phase, context, batch][0] for other, found in points.items()
                                   if not other.startswith("tvm_dsm") and (phase, context, batch) in found},
                         "floor_us": row["floor_ms"] * 1e3 if phase == "decode" and "floor_ms" in row else None,
                         "kernels": _heaviest(row.get(f"{phase}_kernels"))}
                        | _means(phase, row, {other: found[phase, context, batch][1] for other, found in points.items()
                                              if not other.startswith("tvm_dsm") and (phase, context, batch) in found}))
    return rows


def _means(phase: str, row: dict, peers: dict[str, dict]) -> dict:
    """A decode row's mean steps in microseconds, ours and the peers' where their runs recorded
    them (``decode_ms_mean``, or every step's time: the per-token latency, graph captures of new
    page layouts included; the row's own figure is the median)."""
    ours = _mean_ms(row) if phase == "decode" else None
    if ours is None:
        return {}
    means = {name: _mean_ms(r) for name, r in peers.items()}
    return {"ours_mean_us": ours * 1e3,
            "peers_mean": {name: mean * 1e3 for name, mean in means.items() if mean is not None}}


def _mean_ms(row: dict) -> float | None:
    if row.get("decode_ms_mean") is not None:
        return row["decode_ms_mean"]
    steps = row.get("decode_ms_steps")
    return sum(steps) / len(steps) if steps else None


#: Kernels a results row names, the most time first.
HEAVIEST = 4


def _heaviest(breakdown: dict | None) -> list[dict] | None:
    """The :data:`HEAVIEST` functions of a per-kernel breakdown (:mod:`tvm_dsm.gpu.kernel_breakdown`)
    that took the most time, with their microseconds and launches a call: what holds a row back.
    Where the breakdown has each function's time on the critical path (what it adds to the GPU's
    busy time, a programmatic launch's wait not counted), ranked and given by that (``us``),
    with the device time beside it (``device_us``)."""
    if not breakdown:
        return None
    key = "critical_us_per_step" if all("critical_us_per_step" in r for r in breakdown["rows"]) else "us_per_step"
    ranked = sorted(breakdown["rows"], key=lambda r: -r[key])[:HEAVIEST]
    return [{"function": r["function"], "us": round(r[key], 1), "launches": r["launches_per_step"],
             **({"device_us": round(r["us_per_step"], 1)} if key != "us_per_step" else {})}
            for r in ranked]


def merge(paths: list[Path], out: Path) -> dict:
    """The LLM results of ``paths`` (runs of different configurations, as a torch-only run beside
    a tvm-dsm one, or of other points of one) as one results file at ``out``: their
    configurations together, a later file's point replacing an earlier one's, each run's device,
    date and versions under ``runs``, and the rows of :func:`schema_rows` over them all."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    for key in ("model", "prompt_len"):
        if len({json.dumps(r.get(key), sort_keys=True) for r in results}) > 1:
            raise ValueError(f"the runs differ in {key}: their points are not the same points")
    merged = {k: v for k, v in results[-1].items() if k not in ("configs", "rows")}
    merged["configs"] = {}
    for r in results:
        for name, found in r["configs"].items():
            earlier = merged["configs"].get(name, {})
            # the latest run of a configuration says how it compiled and what failed
            into = {k: v for k, v in found.items() if k not in ("batches", "contexts")}
            into["batches"] = {**earlier.get("batches", {}), **found.get("batches", {})}
            contexts = {c: dict(by_batch) for c, by_batch in earlier.get("contexts", {}).items()}
            for context, by_batch in found.get("contexts", {}).items():
                contexts.setdefault(context, {}).update(by_batch)
            into["contexts"] = contexts
            merged["configs"][name] = into
    merged["runs"] = [{"file": str(p), **{k: r.get(k) for k in ("device", "date", "versions")},
                       "configs": sorted(r["configs"])} for p, r in zip(paths, results)]
    merged["rows"] = schema_rows(merged["configs"], merged["prompt_len"])
    out.write_text(json.dumps(merged, indent=1))
    return merged
