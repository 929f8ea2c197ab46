"""MoE routing (RedFuser) with tvm-dsm: fuse the cascade, plan the split, compile, and (with a GPU)
check and time.

Routing 4096 tokens over 4096 experts to their top 8: softmax statistics (max, exp-sum) and the
top-k of the same fp16 logits. Written as three reductions, it reads the logits three times; the
pass proves the cascade fusible, and the planner gives it the top-k rows kernel
(tvm_dsm.kernels.top_k_rows): each row read once into shared memory by the 32 lanes of a warp, its
max and exp-sum by shuffles, then only the elements at or above the 8th-largest lane maximum
enter the lanes' top 8, which merge by shuffles.
Run: ``python tutorials/moe_routing.py``.
"""

from __future__ import annotations

import tvm

import tvm_dsm
from tvm_dsm.bench.demo import assemble, kernel_source, run_section, section
from tvm_dsm.hardware import load_hardware
from tvm_dsm.transform import fuse_cascaded_reductions
from tvm_dsm.workloads.cascades import moe_routing

TOKENS, EXPERTS, K = 4096, 4096, 8
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def run_on_gpu(executable) -> None:
    import torch

    from tvm_dsm.bench.timing import graph_time_us, input_sets_for, python_call_us

    func = executable["main"]

    def inputs():
        return (torch.randn(TOKENS, EXPERTS, device="cuda").half(),
                torch.full((TOKENS, K), float("nan"), device="cuda"),  # poisoned outputs
                torch.full((TOKENS, K), torch.iinfo(torch.int32).min, device="cuda", dtype=torch.int32))

    x, weights, indices = inputs()
    func(*(tvm.runtime.from_dlpack(t) for t in (x, weights, indices)))
    order = torch.sort(x.double(), dim=1, descending=True, stable=True).indices[:, :K]
    want = torch.softmax(x.double(), 1).gather(1, order)
    same = torch.equal(indices.long(), order)
    err = ((weights.double() - want).norm() / want.norm()).item()
    print(f"indices equal to a stable sort: {same}; weights vs float64: {err:.2e} "
          f"({'ok' if same and err < 1e-5 else 'WRONG'})")
    n = input_sets_for(TOKENS * EXPERTS * 2)
    sets = [inputs() for _ in range(n)]
    wrapped = [[tvm.runtime.from_dlpack(t) for t in s] for s in sets]

    def eager(x):
        return torch.softmax(x.float(), 1).topk(K)

    compiled = torch.compile(eager)
    times = {
        "tvm-dsm fused": graph_time_us(lambda i: func(*wrapped[i]), n),
        "torch eager": graph_time_us(lambda i: eager(sets[i][0]), n),
        "torch.compile": graph_time_us(lambda i: compiled(sets[i][0]), n),
        "HBM floor": TOKENS * (EXPERTS * 2 + K * 8) / load_hardware().hbm_bw * 1e6,
    }
    print("GPU time per call (CUDA graphs): " + " | ".join(f"{k} {v:.1f} us" for k, v in times.items()))
    print(f"Python-call latency: tvm-dsm {python_call_us(lambda: func(*wrapped[0])):.1f} us")


def main() -> None:
    func = moe_routing(TOKENS, EXPERTS, K)
    section(f"fuse: MoE routing, {TOKENS} tokens x {EXPERTS} experts, top {K} (fp16 logits)")
    _, reports = fuse_cascaded_reductions(func)
    for report in reports:
        print(report)

    section("plan: the kernel and how each row is split (no measurement)")
    ranking = tvm_dsm.plan(func)
    print(ranking.best.config.explain())
    sch = ranking.schedule()

    section("generated CUDA of the fused kernel (TVM codegen, sm_90a)")
    executable = tvm.compile(sch.mod, target=TARGET)
    source = executable.mod.imports[0].inspect_source()
    print(kernel_source(source)[:3000] + "\n[...]")
    print(f"warp shuffles (row max and sum, threshold, merges): {source.count('__shfl')}")
    print("nvcc sm_90a:", assemble(source, "moe_routing"))

    run_section(run_on_gpu, executable, "cascades")


if __name__ == "__main__":
    main()
