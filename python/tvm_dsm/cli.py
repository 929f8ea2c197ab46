"""The ``tvm-dsm`` command: plan, build, tune, benchmark and report from a shell.

A function is named as ``FILE.py:NAME`` or ``package.module:NAME`` (a PrimFunc, an IRModule
with one function, or a callable returning either; arguments after the name are passed to the
callable as integers where they parse as integers), or as one of tvm-dsm's workload builders,
``WORKLOAD ARG...`` (``tvm-dsm plan dense 128 4096 4096``; ``tvm-dsm workloads`` lists them).
A model for ``compile-model`` is named the same way (a Relax IRModule, a ``torch.export``
program, or a callable returning either), or as one of tvm-dsm's models (``llama``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path

#: The workload builders the command knows by name: module of tvm_dsm.workloads and function.
WORKLOADS = {
    "dense": ("dense", "dense"),
    "gated_dense": ("dense", "gated_dense"),
    "split_silu_mul": ("elementwise", "split_silu_mul"),
    "ffn": ("chains", "gemm_chain"),
    "swiglu_ffn": ("chains", "swiglu_ffn"),
    "conv_chain": ("chains", "conv_chain"),
    "lm_head_max": ("lm_head", "lm_head_max"),
    "softmax_stats": ("cascades", "softmax_stats"),
    "logsumexp": ("cascades", "logsumexp"),
    "layernorm_stats": ("cascades", "layernorm_stats"),
    "rmsnorm_gemv": ("cascades", "rmsnorm_gemv"),
    "decode_attention": ("cascades", "decode_attention"),
    "attention": ("cascades", "attention"),
    "moe_routing": ("cascades", "moe_routing"),
    "row_sum": ("reductions", "row_sum"),
    "gemv": ("reductions", "gemv"),
}


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return {"true": True, "false": False}.get(text.lower(), text)


def _builder(name: str):
    if name in WORKLOADS:
        module, func = WORKLOADS[name]
        return getattr(importlib.import_module(f"tvm_dsm.workloads.{module}"), func)
    source, _, attr = name.rpartition(":")
    if not source:
        raise SystemExit(f"tvm-dsm: {name!r} is neither FILE.py:NAME, module:NAME nor a workload "
                         f"({', '.join(sorted(WORKLOADS))})")
    if source.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(source).stem, source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    return getattr(module, attr)


def load_function(spec: list[str]):
    """The PrimFunc ``spec`` names (see the module doc)."""
    import tvm
    from tvm import tirx

    obj = _builder(spec[0])
    if callable(obj) and not isinstance(obj, (tirx.PrimFunc, tvm.IRModule)):
        obj = obj(*(_value(a) for a in spec[1:]))
    if isinstance(obj, tvm.IRModule):
        funcs = [f for f in obj.functions.values() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) != 1:
            raise SystemExit(f"tvm-dsm: {spec[0]} holds {len(funcs)} PrimFuncs; name one")
        obj = funcs[0]
    if not isinstance(obj, tirx.PrimFunc):
        raise SystemExit(f"tvm-dsm: {spec[0]} gave a {type(obj).__name__}, not a PrimFunc")
    return obj


def _target(args):
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": args.arch}, host="llvm")


def _database(args):
    """The tuning database of ``--database`` (None without it)."""
    if not args.database:
        return None
    from tvm_dsm.tuning_database import open_database

    return open_database(args.database)


def cmd_plan(args) -> None:
    import tvm_dsm

    start = time.perf_counter()
    ranking = tvm_dsm.plan(load_function(args.function), target=_target(args))
    print(ranking.explain(args.alternatives))
    print(f"(planned in {time.perf_counter() - start:.2f} s)")


def cmd_build(args) -> None:
    import tvm_dsm

    target = _target(args)
    executable = tvm_dsm.build(load_function(args.function), target, database=_database(args))
    if args.cuda:
        print(executable.mod.imports[0].inspect_source())
    if args.output:
        executable.export_library(args.output)
        print(f"wrote {args.output}")


def _runner(args):
    """TVM's RPCRunner on the servers ``--rpc-tracker`` holds under ``--rpc-key``, one candidate
    in flight per server; None without ``--rpc-tracker`` (this machine's GPU measures)."""
    if not args.rpc_tracker:
        return None
    if not args.rpc_key:
        raise SystemExit(f"tvm-dsm {args.command}: --rpc-tracker needs --rpc-key, the key its GPU servers "
                         "registered under")
    from tvm_dsm.meta_schedule.rpc import rpc_runner

    try:
        return rpc_runner(args.rpc_tracker, args.rpc_key)
    except (ValueError, ConnectionError) as err:
        raise SystemExit(f"tvm-dsm {args.command}: {err}") from None


def cmd_tune(args) -> None:
    import tvm_dsm
    from tvm_dsm.device import gpu_or_reason

    runner = _runner(args)
    reason = gpu_or_reason() if runner is None else None
    if reason:
        raise SystemExit(f"tvm-dsm tune: {reason} (to measure on RPC servers: --rpc-tracker HOST:PORT "
                         "--rpc-key KEY)")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    measured = tvm_dsm.tune(load_function(args.function), args.work_dir, target=_target(args), top_k=args.top_k,
                            runner=runner)
    print(f"{'rank':>4}  {'predicted us':>12}  {'measured us':>11}  configuration")
    for m in measured:
        shown = f"{m.measured_us:11.1f}" if m.measured_us is not None else f"{'failed':>11}"
        print(f"{m.rank + 1:>4}  {m.plan.predicted_us:12.1f}  {shown}  {m.plan.config}"
              + (f"\n      {m.error.strip().splitlines()[-1]}" if m.error else ""))
    print(f"records in {args.work_dir}")


def cmd_bench(args) -> None:
    from tvm_dsm.gpu.export import export_suite
    from tvm_dsm.gpu.suites import SUITES
    from tvm_dsm.device import gpu_or_reason

    if args.suite not in SUITES:
        raise SystemExit(f"tvm-dsm bench: no suite {args.suite!r}; one of {', '.join(sorted(SUITES))}")
    folder = export_suite(args.suite, Path(args.kernels), args.only)
    reason = gpu_or_reason()
    if reason:
        print(f"exported {folder}; not run: {reason}")
        return
    from tvm_dsm.gpu import run

    out = Path(args.out or f"bench/results/{args.suite}/latest.json")
    run.main([str(folder), "--out", str(out), *(["--only", *args.only] if args.only else [])])
    from tvm_dsm.bench.report import print_file

    print_file(out)
    if args.plot:
        _plot(out, args.plot)


def _plot(results_path, png: str) -> None:
    from tvm_dsm.bench.roofline import plot

    try:
        print(f"wrote {plot(json.loads(Path(results_path).read_text()), png)}")
    except ImportError as err:
        raise SystemExit(f"tvm-dsm: --plot needs matplotlib (pip install 'tvm-dsm[bench]'): {err}") from err


def cmd_report(args) -> None:
    from tvm_dsm.bench import report

    if args.file:
        report.print_file(args.file, picks=args.picks)
        if args.plot:
            _plot(args.file, args.plot)
    else:
        for path in report.write_all(args.results, args.out):
            print(f"wrote {path}")


def _llama(config: str, target):
    from tvm_dsm.gpu.llm import MODELS
    from tvm_dsm.workloads.llama import export_llama

    if config not in MODELS:
        raise SystemExit(f"tvm-dsm compile-model: llama has no configuration {config!r}; "
                         f"one of {', '.join(MODELS)}")
    return export_llama(MODELS[config], target)[0]


#: The Relax models ``compile-model`` knows by name: each a function of the configuration's
#: name and the target, returning the model's IRModule.
RELAX_MODELS = {"llama": _llama}


def load_model(spec: list[str], config: str, target):
    """The Relax IRModule ``spec`` names: one of :data:`RELAX_MODELS` (of configuration
    ``config``), or an IRModule, a ``torch.export`` program (imported by
    :func:`tvm_dsm.relax_torch.from_exported_program`), or a callable returning either."""
    import tvm
    from tvm import relax

    if spec[0] in RELAX_MODELS:
        return RELAX_MODELS[spec[0]](config, target)
    if ":" not in spec[0]:
        raise SystemExit(f"tvm-dsm compile-model: no model {spec[0]!r}; one of {', '.join(RELAX_MODELS)}, "
                         "or FILE.py:NAME / module:NAME")
    obj = _builder(spec[0])
    if callable(obj) and not isinstance(obj, tvm.IRModule):
        obj = obj(*(_value(a) for a in spec[1:]))
    if type(obj).__name__ == "ExportedProgram":
        from tvm_dsm.relax_torch import from_exported_program

        obj = from_exported_program(obj)
    if not isinstance(obj, tvm.IRModule) or not any(isinstance(f, relax.Function) for f in obj.functions.values()):
        raise SystemExit(f"tvm-dsm compile-model: {spec[0]} gave a {type(obj).__name__}, not a Relax IRModule "
                         "or a torch.export program")
    return obj


def cmd_compile_model(args) -> None:
    from tqdm import tqdm

    from tvm_dsm.model_report import compile_with_report, measured_kernels

    target = _target(args)
    start = time.perf_counter()

    def stage(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)

    stage(f"loading {' '.join(args.model)}")
    mod = load_model(args.model, args.model_config, target)
    stage('compiling through the "tvm_dsm" Relax pipeline')
    compiling = time.perf_counter()
    with tqdm(unit="kernel", desc="scheduling", file=sys.stderr, disable=None) as bar:

        def progress(done: int, total: int, name: str) -> None:
            bar.total = total
            bar.update(done - bar.n)
            bar.set_postfix_str(name, refresh=True)

        executable, report = compile_with_report(mod, target, database=_database(args), progress=progress)
        bar.update(bar.total - bar.n if bar.total else 0)
    seconds = time.perf_counter() - compiling
    if args.measured:
        report = report.with_measured(measured_kernels(args.measured, batch=args.measured_batch))
    print(report.format())
    print(f"compiled in {seconds:.1f} s")
    if args.out:
        stage(f"exporting the library to {args.out}")
        executable.export_library(args.out)
        print(f"wrote {args.out}")


def cmd_workloads(args) -> None:
    for name, (module, func) in sorted(WORKLOADS.items()):
        builder = getattr(importlib.import_module(f"tvm_dsm.workloads.{module}"), func)
        print(f"{name:18s} {inspect.signature(builder)}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tvm-dsm", description=__doc__.split("\n\n")[0],
                                  epilog=__doc__.split("\n\n", 1)[1])
    sub = top.add_subparsers(dest="command", required=True)

    def command(name: str, func, help_text: str, function: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(run=func)
        if function:
            p.add_argument("function", nargs="+", help="FILE.py:NAME, module:NAME or WORKLOAD ARG...")
            p.add_argument("--arch", default="sm_90a", help="CUDA architecture (default sm_90a)")
        return p

    p = command("plan", cmd_plan, "rank the valid configurations and explain the best (no GPU needed)")
    p.add_argument("--alternatives", type=int, default=3, help="runners-up to list (default 3)")
    p = command("build", cmd_build, "build a module: the best tuned record, else the planner's best")
    p.add_argument("-o", "--output", help="export the module (a .so holding CUDA source) to this path")
    p.add_argument("--cuda", action="store_true", help="print the generated CUDA")
    p.add_argument("--database", help="a MetaSchedule work_dir to take tuned records from")
    p = command("export", cmd_build, "build and export a module (same as build -o)")
    p.add_argument("-o", "--output", required=True, help="path of the exported .so")
    p.add_argument("--cuda", action="store_true", help="print the generated CUDA")
    p.add_argument("--database", help="a MetaSchedule work_dir to take tuned records from")
    p = command("tune", cmd_tune, "measure the planner's top configurations on this machine's GPU "
                "or on RPC servers (docs/rpc.md)")
    p.add_argument("work_dir", help="MetaSchedule JSON database folder (created if missing)")
    p.add_argument("--top-k", type=int, default=8, help="configurations to measure (default 8)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on the GPU servers of this TVM RPC tracker")
    p.add_argument("--rpc-key", metavar="KEY", help="with --rpc-tracker: the key the servers registered under")
    p = command("bench", cmd_bench, "build a benchmark suite's kernels and, with a GPU, check and time them",
                function=False)
    p.add_argument("suite", help="suite name (tvm_dsm.gpu.suites.SUITES)")
    p.add_argument("--kernels", default=".gpu/kernels", help="where exported kernels go")
    p.add_argument("--only", nargs="*", help="kernel name substrings to keep")
    p.add_argument("--out", help="results JSON (default bench/results/SUITE/latest.json)")
    p.add_argument("--plot", metavar="PNG", help="also draw the kernels on the GPU's roofline")
    p = command("report", cmd_report, "tables from results JSON: one file, or regenerate bench/RESULTS.md",
                function=False)
    p.add_argument("file", nargs="?", help="a results JSON to print as a table")
    p.add_argument("--picks", action="store_true", help="only the planner's picks")
    p.add_argument("--plot", metavar="PNG", help="with FILE: also draw its kernels on the GPU's roofline")
    p.add_argument("--results", default="bench/results", help="results folder (default bench/results)")
    p.add_argument("--out", default="bench/RESULTS.md", help="generated summary (default bench/RESULTS.md)")
    p = command("compile-model", cmd_compile_model, "compile a Relax model through the tvm_dsm "
                "pipeline and report each kernel's family and predicted time", function=False)
    p.add_argument("model", nargs="+", help=f"one of tvm-dsm's models ({', '.join(RELAX_MODELS)}), or "
                   "FILE.py:NAME / module:NAME [ARG...]: a Relax IRModule, a torch.export program, or a "
                   "callable returning either")
    p.add_argument("--model-config", default="1b", help="llama's configuration: 1b or tiny (default 1b)")
    p.add_argument("--out", help="export the compiled library (a .so holding CUDA source) to this path")
    p.add_argument("--arch", default="sm_90a", help="CUDA architecture (default sm_90a)")
    p.add_argument("--measured", metavar="RESULTS", help="an LLM run's results (python -m "
                   "tvm_dsm.gpu.llm): each kernel's measured time per decode step beside its prediction")
    p.add_argument("--measured-batch", type=int, default=1, help="the batch size of those measurements (default 1)")
    p.add_argument("--database", help="a MetaSchedule work_dir (tvm_dsm.meta_schedule.tune_relax) to take "
                   "tuned records from")
    command("workloads", cmd_workloads, "list the workload builders and their arguments", function=False)
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from tvm_dsm.errors import ClusterError

    try:
        args.run(args)
    except ClusterError as err:
        raise SystemExit(f"tvm-dsm {args.command}: {err}") from None
    except BrokenPipeError:  # output piped into a command that stopped reading (head)
        sys.stderr.close()


if __name__ == "__main__":
    main()
