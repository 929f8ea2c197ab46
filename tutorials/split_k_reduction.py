"""Cluster split-K GEMV with tvm-dsm: plan, schedule, compile, and (with a GPU) check and time.

A 256 x 16384 GEMV has too few rows to fill an H100's 132 SMs with one CTA per row group. tvm-dsm
splits K over the CTAs of a thread-block cluster and adds their partial sums through distributed
shared memory (DSM), in one kernel. Run: ``make demo`` (or ``python tutorials/split_k_reduction.py``).
"""

from __future__ import annotations

import numpy as np
import tvm

import tvm_dsm  # noqa: F401  (registers tvm-dsm's pipeline)
from tvm_dsm.bench.demo import assemble, kernel_source, run_section, section
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners import plan_split_k_reduction
from tvm_dsm.rules import schedule_split_k_reduction
from tvm_dsm.transform import fuse_cascaded_reductions
from tvm_dsm.workloads import cascades, gemv

M, K = 256, 16384
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def run_on_gpu(executable) -> None:
    import torch

    from tvm_dsm.bench.timing import graph_time_us, input_sets_for, python_call_us

    func = executable["main"]
    a = torch.randn(M, K, device="cuda")
    x = torch.randn(K, device="cuda")
    y = torch.full((M,), float("nan"), device="cuda")  # poisoned: unwritten rows fail
    func(tvm.runtime.from_dlpack(a), tvm.runtime.from_dlpack(x), tvm.runtime.from_dlpack(y))
    ref = a.double() @ x.double()
    err = ((y.double() - ref).norm() / ref.norm()).item()
    print(f"relative error vs float64: {err:.2e} ({'ok' if err < 1e-5 else 'WRONG'})")
    n = input_sets_for(M * K * 4)
    sets = [(torch.randn(M, K, device="cuda"), torch.randn(K, device="cuda"), torch.empty(M, device="cuda")) for _ in range(n)]
    wrapped = [[tvm.runtime.from_dlpack(t) for t in s] for s in sets]
    ours = graph_time_us(lambda i: func(*wrapped[i]), n)
    eager = graph_time_us(lambda i: torch.mv(sets[i][0], sets[i][1]), n)
    compiled_mv = torch.compile(torch.mv)
    compiled = graph_time_us(lambda i: compiled_mv(sets[i][0], sets[i][1]), n)
    floor = M * K * 4 / load_hardware().hbm_bw * 1e6
    print(f"GPU time per call (CUDA graphs): tvm-dsm {ours:.1f} us | torch.mv {eager:.1f} us | "
          f"torch.compile {compiled:.1f} us | HBM floor {floor:.1f} us")
    print(f"Python-call latency: tvm-dsm {python_call_us(lambda: func(*wrapped[0])):.1f} us")


def main() -> None:
    hw = load_hardware()
    section(f"plan: GEMV {M} x {K} fp32 on {hw.device} (measured hardware model)")
    plans = plan_split_k_reduction(M, K, hw, extra_input_bytes=4 * K)
    for rank, plan in enumerate(plans[:3], 1):
        print(f"#{rank} " + plan.explain())
    best = plans[0]

    section("schedule: recorded trace (replayable by MetaSchedule)")
    sch = schedule_split_k_reduction(gemv(M, K), best.config)
    print(sch.trace)

    section("generated CUDA (TVM codegen, sm_90a)")
    executable = tvm.compile(sch.mod, target=TARGET)
    source = executable.mod.imports[0].inspect_source()
    print(kernel_source(source))
    print("nvcc sm_90a:", assemble(source, "gemv"))

    section("RedFuser: cascaded reductions fused into one loop (tvm_dsm.transform)")
    for name, func in (("softmax(x)V", cascades.softmax_pv(128, 512, 64)),
                       ("RMSNorm+GEMV", cascades.rmsnorm_gemv(128, 4096)),
                       ("MoE routing (softmax + top-8)", cascades.moe_routing(128, 4096, 8))):
        _, reports = fuse_cascaded_reductions(func, parts=32)
        print(f"{name}:", *reports, sep="\n")

    run_section(run_on_gpu, executable, "split_k")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
