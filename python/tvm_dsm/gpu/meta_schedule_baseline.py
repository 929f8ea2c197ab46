"""Stock MetaSchedule and tvm-dsm at equal measured-trial budgets, on the GPU machine.

``bash .gpu/full-b/on-device python3 -m tvm_dsm.gpu.meta_schedule_baseline --out X.json G5b``
(the full compiler: see ../shared/gpu/README.md).

Per dense layer (M = 128, a weight shape of :data:`tvm_dsm.gpu.suites.GEMM_SHAPES`): TVM's stock
MetaSchedule (its tensor-core design space for CUDA, XGBoost cost model, evolutionary search)
tuned with each budget of measured trials; :func:`tvm_dsm.tune` measuring the planner's top
candidates with the smallest budget; the planner's pick without measurement; dlight; torch.
Every module's output is checked against float64 (outputs poisoned) and timed the same way as
:mod:`tvm_dsm.gpu.run` (CUDA events over CUDA-graph replays).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import torch
import tvm
from tvm.s_tir import meta_schedule as ms

from ..bench import results as res
from ..bench.timing import input_sets_for
from ..driver import BUILD_TIMEOUT_S, _module, load_tvm_dsm, schedule, stock_schedule, tune
from ..workloads.dense import dense
from .export import TARGET
from .run import _random_inputs, _time_peers, measure_hbm_bandwidth, time_call, verdict
from .suites import GEMM_SHAPES
from .suites.base import args_of, nbytes_of


#: MetaSchedule's stock rules read the thread limits from the target: the H100 tag has them.
STOCK_TARGET = "nvidia/nvidia-h100"


def _build_stock(mod: tvm.IRModule, target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build with StorageRewrite off. On, it lets an fp16 shared tile reuse
    a dead fp32 one, and the access-pointer lowering rejects the retyped buffer (the stock
    tensor-core space's candidates for G5b fail so on the CPU and compile with it off). Returns
    the runtime module, which MetaSchedule's builder exports (tvm.compile's Executable reached
    it as a bare function: every build of the 2026-11-23 run failed so)."""
    with tvm.transform.PassContext(config={"tirx.disable_storage_rewrite": True}):
        return tvm.compile(mod, target=target, tir_pipeline="s_tir_stock").mod


def _tune_stock(mod: tvm.IRModule, target, trials: int, work_dir: str) -> tvm.IRModule:
    space = ms.space_generator.PostOrderApply(
        sch_rules="cuda-tensorcore", postprocs="cuda-tensorcore", mutator_probs="cuda-tensorcore")
    database = ms.tir_integration.tune_tir(
        mod, target=target, work_dir=work_dir, max_trials_global=trials,
        num_trials_per_iter=min(trials, 32), space=space,
        builder=ms.builder.LocalBuilder(f_build=_build_stock, timeout_sec=BUILD_TIMEOUT_S,
                                        initializer=load_tvm_dsm))
    sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        raise RuntimeError(f"stock MetaSchedule found no valid schedule in {trials} trials")
    return sch.mod


def _measure(name: str, mod: tvm.IRModule, kernel: dict, target, hbm_bw: float, stock: bool,
             **extra) -> dict:
    if stock:
        func = _build_stock(mod, target, None)["main"]
    else:
        func = tvm.compile(mod, target=target)["main"]
    return {"name": name, **verdict(func, kernel), "ours_us": time_call(func, kernel)[0],
            "floor_us": kernel["bytes"] / hbm_bw * 1e6, **extra}


@contextlib.contextmanager
def _work_dir(root: str | None, name: str):
    """A MetaSchedule work directory: ``root/name`` if kept, else a temporary one."""
    if root is None:
        with tempfile.TemporaryDirectory() as work_dir:
            yield work_dir
    else:
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        yield path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", choices=sorted(GEMM_SHAPES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--skip-tvm-dsm", action="store_true", help="only the stock rows (a re-run)")
    parser.add_argument("--work-dir", help="keep MetaSchedule's databases and logs here")
    args = parser.parse_args()
    target = tvm.target.Target(TARGET, host="llvm")
    stock_target = tvm.target.Target(STOCK_TARGET, host="llvm")
    results = res.new_suite("gemm_meta_schedule", torch.cuda.get_device_name(),
                            {"tvm": tvm.__version__, "torch": torch.__version__},
                            res.GRAPH_TIMING)
    hbm_bw = measure_hbm_bandwidth()
    for label in args.shapes:
        n, k = GEMM_SHAPES[label]
        func = dense(128, n, k)
        operands = args_of(func)
        kernel = {"workload": "dense", "args": operands, "bytes": nbytes_of(operands), "peers": []}  # torch eager
        peers = _time_peers(kernel, _random_inputs(operands, input_sets_for(kernel["bytes"])))
        shape = {"shape": label, "m": 128, "n": n, "k": k, "peers": peers}

        def row(name: str, mod: tvm.IRModule, stock: bool = False, **extra) -> None:
            # Stock schedules compile with TVM's own pipeline (tvm-dsm keeps it as "s_tir_stock").
            results["rows"].append(_measure(f"{label}_{name}", mod, kernel, stock_target if stock
                                            else target, hbm_bw, stock, **shape, **extra))
            res.write(results, args.out)
            r = results["rows"][-1]
            print(f"{r['name']}: ok={r['ok']} {r['ours_us']:.1f} us (torch {peers['torch_eager']:.1f})", flush=True)

        row("dlight", stock_schedule(func, target).mod, stock=True, trials=0)
        if not args.skip_tvm_dsm:
            row("tvm_dsm_planner_pick", schedule(func, target).mod, trials=0)
            smallest = min(args.budgets)
            with _work_dir(args.work_dir, f"{label}_tvm_dsm") as work_dir:
                start = time.time()
                measured = tune(func, work_dir, target=target, top_k=smallest)
                database = ms.database.JSONDatabase(work_dir=work_dir)
                row("tvm_dsm_tuned", schedule(func, target, database=database).mod, trials=smallest,
                    tuning_s=time.time() - start, measured_us=[m.measured_us for m in measured])
        for budget in args.budgets:
            with _work_dir(args.work_dir, f"{label}_stock_{budget}") as work_dir:
                start = time.time()
                mod = _tune_stock(_module(func), stock_target, budget, work_dir)
                row(f"meta_schedule_{budget}", mod, stock=True, trials=budget, tuning_s=time.time() - start)
    print(res.table(results))


if __name__ == "__main__":
    main()
