"""The learned cost model (:mod:`tvm_dsm.meta_schedule.learned_cost_model`) checked offline on
committed H100 measurements: suites that measured shapes of one family under many
configurations.

Each measurement becomes what MetaSchedule would hand the model: a ``MeasureCandidate`` (the
task's function, its configuration recorded as :class:`~tvm_dsm.meta_schedule.PlannedSpace`
records it; the feature extractor reads nothing else of the schedule, so nothing is scheduled)
and a ``RunnerResult`` with the measured time, under a ``TuneContext`` per shape and results file
(a group: times of one run, ranked against each other). Per family and repeat (fixed seeds), a
share of the shapes is held out; the model trains on 32, 64 and 128 measurements drawn from the
other shapes (or all there are) and ranks each held-out group. Reported per family and training
size, averaged over held-out groups and repeats: Spearman's rank correlation with the measured
speed of the analytical prediction and of the learned model, and the top-1 regret of each (the
measured time of its pick over the group's fastest, minus 1). A family whose analytical model
predicts one time for every configuration of a shape (top-k rows) has an analytical Spearman of
0 and picks the first configuration measured.

``python -m tvm_dsm.bench.learned_cost_model --out bench/results/learned_cost_model/latest.json``
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tvm
from scipy.stats import spearmanr
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from ..driver import H100
from ..hardware import load_hardware
from ..kernels.attention import AttentionConfig
from ..kernels.softmax_gemm import SoftmaxGemmConfig
from ..kernels.top_k_rows import TopKRowsConfig
from ..meta_schedule.candidate_config import annotate_config
from ..meta_schedule.learned_cost_model import plan_xgb_model
from ..rules.split_k_gemm import SplitKGemmConfig
from ..rules.split_k_reduction import SplitKReductionConfig
from ..workloads.cascades import attention, moe_routing, softmax_pv
from ..workloads.dense import dense, scaled_dense
from ..workloads.reductions import gemv, row_sum
from .results import RESULTS, git_sha, new_suite, write

SUITE = "learned_cost_model"
TRAIN_SIZES = (32, 64, 128)
REPEATS = 5
HELD_OUT_SHARE = 0.3


@dataclass(frozen=True)
class Measurement:
    """One committed measurement: the results file and run it comes from (``group``), the
    workload (``shape``, a key of the function builders), the configuration, the time."""

    group: str
    shape: tuple
    config: Any
    us: float


def _fields(cls, plan: dict) -> dict:
    return {k: plan[k] for k in cls.__dataclass_fields__ if k in plan and k != "programmatic_launch"}


def gemm_measurements(rows: list[dict], group: str) -> list[Measurement]:
    """Split-K GEMMs (dense fp16/bf16, with or without the bias+SiLU epilogue, and fp8 with
    scales in one kernel); quantize-then-GEMM forms and stock schedules are left out."""
    out = []
    for r in rows:
        plan = r.get("plan") or {}
        if "block_m" not in plan or r.get("quantized") or plan.get("form", "one_kernel") != "one_kernel":
            continue
        if r["name"].startswith("fp8_"):
            shape = ("fp8", r["m"], r["n"], r["k"])
        elif r["dtype"] in ("float16", "bfloat16") and not r["name"].startswith("quant"):
            shape = ("dense", r["m"], r["n"], r["k"], r["dtype"], r["name"].endswith("_bias_silu"))
        else:
            continue
        out.append(Measurement(group, shape, SplitKGemmConfig(**_fields(SplitKGemmConfig, plan)), r["ours_us"]))
    return out


def _named(rows: list[dict], pattern: str, config_type) -> list[tuple[re.Match, dict, Any]]:
    """(name match, row, configuration of type ``config_type`` from its plan) of each row whose
    name matches ``pattern`` whole."""
    return [(found, r, config_type(**_fields(config_type, r["plan"])))
            for r in rows if (found := re.fullmatch(pattern, r["name"]))]


def reduction_measurements(rows: list[dict], group: str) -> list[Measurement]:
    """Cluster split-K row sums and GEMVs."""
    return [Measurement(group, (found[1], int(found[2]), int(found[3])), config, r["ours_us"])
            for found, r, config in _named(rows, r"(row_sum|gemv)_(\d+)x(\d+)_c\d+", SplitKReductionConfig)]


def attention_measurements(rows: list[dict], group: str) -> list[Measurement]:
    """Attention kernels (every run of a file its own group)."""
    pattern = r"(?:(r\d+)_)?attention_(\d+)x(\d+)x(\d+)x(\d+)(_causal)?_m\d+n\d+(?:_w\d+)?"
    return [Measurement(f"{group}:{found[1] or ''}",
                        ("attention", *(int(x) for x in found.group(2, 3, 4, 5)), bool(found[6])), config, r["ours_us"])
            for found, r, config in _named(rows, pattern, AttentionConfig)]


def softmax_gemm_measurements(rows: list[dict], group: str) -> list[Measurement]:
    """softmax(X)·V as the tiled kernel, in configurations named by their tiles (the planner's
    own picks, named by the fused-cascade split they were compared with, are left out)."""
    pattern = r"softmax_pv_(\d+)x(\d+)x(\d+)(?:x(\w+?))?_m\d+k\d+j\d+t\d+x\d+(?:_c\d+)?"
    return [Measurement(group, ("softmax_pv", *(int(x) for x in found.group(1, 2, 3)), found[4] or "float32"),
                        config, r["ours_us"])
            for found, r, config in _named(rows, pattern, SoftmaxGemmConfig)]


def top_k_rows_measurements(rows: list[dict], group: str) -> list[Measurement]:
    """MoE routers as the top-k rows kernel (not as fused cascades)."""
    pattern = r"moe_routing_(\d+)x(\d+)x(\d+)(?:x(\w+?))?_rows_l\d+_r\d+(?:_plan)?"
    return [Measurement(group, ("moe_routing", *(int(x) for x in found.group(1, 2, 3)), found[4] or "float16"),
                        config, r["ours_us"])
            for found, r, config in _named(rows, pattern, TopKRowsConfig)]


#: Per family: the results files (relative to bench/results) and how their rows read.
SOURCES: dict[str, tuple[tuple[str, ...], Callable]] = {
    "split_k_gemm": (tuple(f"{s}/latest.json" for s in (
        "gemm", "gemm_stages", "gemm_tma", "gemm_wgmma", "gemm_m", "gemm_large_m", "gemm_depths",
        "fp8_sweep", "fp8_depths")), gemm_measurements),
    "split_k_reduction": (("split_k/latest.json",), reduction_measurements),
    "attention": (("attention/latest.json", "archive/attention_warpgroups_ab.json"), attention_measurements),
    "softmax_gemm": (("softmax_gemm/latest.json",), softmax_gemm_measurements),
    "top_k_rows": (("top_k_rows/latest.json",), top_k_rows_measurements),
}


def workload(shape: tuple) -> tvm.tirx.PrimFunc:
    """The function a measurement's shape key names."""
    kind, *dims = shape
    if kind == "dense":
        m, n, k, dtype, epilogue = dims
        return dense(m, n, k, dtype=dtype, bias=epilogue, activation="silu" if epilogue else "identity")
    if kind == "fp8":
        return scaled_dense(*dims)
    if kind in ("row_sum", "gemv"):
        return (row_sum if kind == "row_sum" else gemv)(*dims)
    if kind in ("softmax_pv", "moe_routing"):
        return (softmax_pv if kind == "softmax_pv" else moe_routing)(*dims)
    return attention(*dims)


def load(family: str, root: Path = RESULTS) -> list[Measurement]:
    """The correct measurements of ``family``, one per configuration, group and shape (repeats
    averaged)."""
    files, read = SOURCES[family]
    times = defaultdict(list)
    for name in files:
        rows = [r for r in json.loads((root / name).read_text())["rows"] if r.get("ok") and r.get("ours_us")]
        for m in read(rows, name):
            times[(m.group, m.shape, m.config)].append(m.us)
    return [Measurement(g, s, c, float(np.mean(t))) for (g, s, c), t in times.items()]


class Groups:
    """The MetaSchedule inputs of the measurements: a TuneContext per (group, shape)."""

    def __init__(self, measurements: list[Measurement]):
        self.by_group: dict[tuple, list[Measurement]] = defaultdict(list)
        for m in measurements:
            self.by_group[(m.group, m.shape)].append(m)
        funcs = {shape: workload(shape) for shape in {m.shape for m in measurements}}
        self.contexts = {key: ms.TuneContext(tvm.IRModule({"main": funcs[key[1]]}), target=tvm.target.Target(H100))
                         for key in self.by_group}
        self.args = {shape: ms.arg_info.ArgInfo.from_prim_func(f) for shape, f in funcs.items()}

    def candidates(self, key: tuple, measurements: list[Measurement]) -> list:
        func = self.contexts[key].mod["main"]
        out = []
        for m in measurements:
            sch = s_tir.Schedule(func)
            annotate_config(sch, m.config)
            out.append(ms.MeasureCandidate(sch, self.args[m.shape]))
        return out


def _score(speed: np.ndarray, measured_us: np.ndarray) -> tuple[float, float]:
    """(Spearman of ``speed`` against measured speed, top-1 regret of ``speed``'s pick)."""
    rho = spearmanr(speed, -measured_us).statistic if len(set(speed)) > 1 else 0.0
    return float(rho), float(measured_us[int(np.argmax(speed))] / measured_us.min() - 1.0)


def evaluate(family: str, measurements: list[Measurement], sizes=TRAIN_SIZES, repeats: int = REPEATS,
             seed: int = 0) -> list[dict]:
    """One row per training size: mean Spearman and regret of the analytical and the learned
    model over the held-out groups of ``repeats`` splits by shape."""
    from ..families import FAMILIES

    hw = load_hardware()
    groups = Groups(measurements)
    fam = next(f for f in FAMILIES if f.name == family)
    extractor = plan_xgb_model(hw).extractor
    predicted = {}
    for key, ms_ in groups.by_group.items():
        _, shape, _, _ = extractor.task(groups.contexts[key].mod)
        for m in ms_:
            predicted[m] = fam.predict(shape, m.config, hw).predicted_us
    shapes = sorted({m.shape for m in measurements}, key=str)
    results = defaultdict(lambda: defaultdict(list))
    for r in range(repeats):
        rng = np.random.default_rng(seed + r)
        held_out = set(rng.permutation(len(shapes))[: max(1, round(HELD_OUT_SHARE * len(shapes)))])
        test = {k: v for k, v in groups.by_group.items() if shapes.index(k[1]) in held_out and len(v) > 1}
        pool = [(k, m) for k, v in groups.by_group.items() if shapes.index(k[1]) not in held_out for m in v]
        for size in sizes:
            n = min(size, len(pool))
            model = plan_xgb_model(hw)
            train = defaultdict(list)
            for i in sorted(rng.choice(len(pool), n, replace=False)):
                train[pool[i][0]].append(pool[i][1])
            for key, chosen in train.items():
                model.update(groups.contexts[key], groups.candidates(key, chosen),
                             [ms.runner.RunnerResult([m.us * 1e-6], None) for m in chosen])
            for key, chosen in test.items():
                measured = np.array([m.us for m in chosen])
                learned = model.predict(groups.contexts[key], groups.candidates(key, chosen))
                analytical = -np.array([predicted[m] for m in chosen])
                row = results[size]
                row["train"].append(n)
                for name, speed in (("analytical", analytical), ("learned", learned)):
                    rho, regret = _score(speed, measured)
                    row[f"spearman_{name}"].append(rho)
                    row[f"regret_{name}"].append(regret)
    rows = []
    for size, row in results.items():
        rows.append({
            "name": f"{family}_train{size}", "ok": True, "rel_err": None, "family": family,
            "train_size": size, "trained_on": int(np.mean(row["train"])),
            "measurements": len(measurements), "shapes": len(shapes), "repeats": repeats,
            "held_out_groups": len(row["train"]),
            **{k: float(np.mean(v)) for k, v in row.items() if k != "train"},
        })
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS / SUITE / "latest.json"))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    import xgboost

    results = new_suite(SUITE, "CPU (offline, from committed H100 measurements)",
                        {"tvm": tvm.__version__, "tvm_dsm": git_sha(), "xgboost": xgboost.__version__},
                        "no timing: committed ours_us of the H100 suites listed in 'sources'")
    results["command"] = "python -m tvm_dsm.bench.learned_cost_model --out " + args.out
    results["sources"] = {family: list(files) for family, (files, _) in SOURCES.items()}
    for family in SOURCES:
        rows = evaluate(family, load(family), repeats=args.repeats)
        for row in rows:
            print(f"{row['name']:>28}: trained on {row['trained_on']:>3}, Spearman analytical "
                  f"{row['spearman_analytical']:+.2f} learned {row['spearman_learned']:+.2f}; regret "
                  f"{row['regret_analytical']:.1%} / {row['regret_learned']:.1%}")
        results["rows"] += rows
    write(results, args.out)


if __name__ == "__main__":
    main()
