"""Fused FFN (FlashFuser) with tvm-dsm: prune, plan, schedule, compile, and (with a GPU) check and time.

``Out = relu(A @ W1^T) @ W2^T`` at M = 128 (G9: 2048 hidden, 512 in/out). The intermediate stays
on chip: a thread-block cluster splits the first GEMM's K, exchanges the partial tiles through
distributed shared memory, and multiplies the activated tile by its own columns of W2.
Run: ``python tutorials/fused_ffn.py``.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

import tvm_dsm
from tvm_dsm.bench.demo import assemble, kernel_source, run_section, section
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.fused_chain import candidate_configs, plan_chain, schedule_chain
from tvm_dsm.rules.fused_chain import find_chain
from tvm_dsm.rules.unfused_chain import UnfusedChainConfig
from tvm_dsm.workloads.chains import gemm_chain

M, N, K, L = 128, 2048, 512, 512
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def run_on_gpu(executable) -> None:
    import torch
    import torch.nn.functional as F

    from tvm_dsm.bench.timing import graph_time_us, input_sets_for, python_call_us

    func = executable["main"]

    def inputs():
        return (torch.randn(M, K, device="cuda").half(),
                (torch.randn(N, K, device="cuda") / K ** 0.5).half(),
                (torch.randn(L, N, device="cuda") / N ** 0.5).half(),
                torch.full((M, L), float("nan"), device="cuda").half())  # poisoned

    a, w1, w2, out = inputs()
    func(*(tvm.runtime.from_dlpack(t) for t in (a, w1, w2, out)))
    ref = torch.relu(a.double() @ w1.double().T) @ w2.double().T
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print(f"relative error vs float64: {err:.2e} ({'ok' if err < 2e-3 else 'WRONG'})")
    n = input_sets_for((N * K + L * N) * 2)
    sets = [inputs() for _ in range(n)]
    wrapped = [[tvm.runtime.from_dlpack(t) for t in s] for s in sets]

    def eager(a, w1, w2):
        return F.linear(torch.relu(F.linear(a, w1)), w2)

    compiled = torch.compile(eager)
    times = {
        "tvm-dsm (plan pick)": graph_time_us(lambda i: func(*wrapped[i]), n),
        "torch eager": graph_time_us(lambda i: eager(*sets[i][:3]), n),
        "torch.compile": graph_time_us(lambda i: compiled(*sets[i][:3]), n),
        "HBM floor": (M * K + N * K + L * N + M * L) * 2 / load_hardware().hbm_bw * 1e6,
    }
    print("GPU time per call (CUDA graphs): " + " | ".join(f"{k} {v:.1f} us" for k, v in times.items()))
    print(f"Python-call latency: tvm-dsm {python_call_us(lambda: func(*wrapped[0])):.1f} us")


def main() -> None:
    hw = load_hardware()
    func = gemm_chain(M, N, K, L, "relu")
    _, shape = find_chain(s_tir.Schedule(func))
    section(f"prune: FFN {M}x{K} -> {N} -> {L} fp16 on {hw.device}")
    _, counts = candidate_configs(shape)
    print("candidates after each pruning rule:", counts)

    section("plan: the cost model's top 3 (bytes and time per level)")
    for rank, plan in enumerate(plan_chain(shape, hw)[:3], 1):
        print(f"#{rank} " + plan.explain())

    ranking = tvm_dsm.plan(func)  # the chain family: fused plans and unfused ones, one model
    kind = "unfused" if isinstance(ranking.best.config, UnfusedChainConfig) else "fused"
    unfused = next(p for p in ranking.plans if isinstance(p.config, UnfusedChainConfig))
    print(f"tvm_dsm.plan picks the {kind} plan: {ranking.best.predicted_us:.1f} us predicted "
          f"(best unfused, two split-K GEMMs: {unfused.predicted_us:.1f} us)")

    section("generated CUDA of the best fused kernel (TVM codegen, sm_90a)")
    sch, _ = schedule_chain(func, hw)
    source = tvm.compile(sch.mod, target=TARGET).mod.imports[0].inspect_source()
    print(kernel_source(source)[:4000] + "\n[...]")
    print("nvcc sm_90a:", assemble(source, "fused_ffn"))

    # Timed: what tvm_dsm.build gives a user, the plan's pick (fused or not).
    run_section(run_on_gpu, tvm_dsm.build(func, TARGET), "chains")


if __name__ == "__main__":
    main()
