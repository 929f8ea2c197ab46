"""Build a suite's kernels here and export them for the device machine.

``python -m tvm_dsm.gpu.export SUITE [--out .gpu/kernels] [--only NAME ...]`` writes
``<out>/<SUITE>/`` with one shared library per kernel (those whose name contains one of the
``--only`` strings, if given) (CUDA source inside: TVM compiles it when the module is loaded) and a
``manifest.json`` the device runner (:mod:`tvm_dsm.gpu.run`) reads. Kernels are planned for
``--gpu`` (a description under ``tvm_dsm/data``; by default the GPU this process plans for:
:func:`~tvm_dsm.hardware.gpu_name`), which the manifest names: the runner refuses them on another
GPU, whose users would get other plans.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import tvm

from ..errors import ClusterError
from ..bench import results as res
from ..hardware import GPU_VARIABLE, descriptions, forget_planned_gpu, gpu_name
from .suites import SUITES

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def export_suite(suite: str, out_dir: Path, only: list[str] | None = None) -> Path:
    variants = (v for v in SUITES[suite]() if not only or any(part in v.name for part in only))
    return export_variants(suite, variants, out_dir)


def export_variants(suite: str, variants, out_dir: Path) -> Path:
    """Build and export ``variants`` into ``out_dir/suite`` with their manifest."""
    target = tvm.target.Target(TARGET, host="llvm")
    folder = out_dir / suite
    folder.mkdir(parents=True, exist_ok=True)
    kernels = []
    for variant in variants:
        try:
            executable = tvm.compile(variant.mod, target=target, tir_pipeline=variant.pipeline)
        except ClusterError as err:  # e.g. more shared memory than the planner's estimate
            print(f"refused {variant.name}: {err}")
            continue
        lib = f"{variant.name}.so"
        executable.export_library(str(folder / lib))
        # The source again beside it: the device compiles every kernel in parallel up front.
        (folder / f"{variant.name}.cu").write_text(executable.mod.imports[0].inspect_source())
        kernels.append(
            {
                "name": variant.name,
                "workload": variant.workload,
                "lib": lib,
                "args": variant.args,
                "bytes": variant.bytes,
                "flops": variant.flops,
                "plan": variant.plan,
                "pipeline": variant.pipeline,
                "expect_correct": variant.expect_correct,
                "peers": list(variant.peers),
                "extra": variant.extra,
                "reference_kwargs": variant.reference_kwargs,
            }
        )
        print(f"built {variant.name}")
    manifest = {"suite": suite, "tvm": tvm.__version__, "tvm_dsm": res.git_sha(), "planned_for": gpu_name(),
                "kernels": kernels}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--out", type=Path, default=Path(".gpu/kernels"))
    parser.add_argument("--only", nargs="*", help="export the kernels whose name contains one of these")
    parser.add_argument("--gpu", choices=sorted(descriptions().values()),
                        help=f"the GPU description planned for (default: {GPU_VARIABLE} where set, else the GPU "
                             "present, else the default description)")
    args = parser.parse_args(argv)
    if args.gpu:
        os.environ[GPU_VARIABLE] = args.gpu
        forget_planned_gpu()
    print("exported to", export_suite(args.suite, args.out, args.only))


if __name__ == "__main__":
    main()
