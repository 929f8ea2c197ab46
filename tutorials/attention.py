"""Attention (RedFuser) with tvm-dsm: prove the cascade, fuse it into one kernel, compile, and
(with a GPU) check and time it against PyTorch's SDPA.

Attention written the way a user writes it, unfused: scores, row max, exp-sum, the exp-weighted
sum of V, a divide. The prover shows the max -> sum cascade fuses with the correction
exp(m_old - m_new); ``fuse_attention`` writes the incremental form as one FlashAttention-style
kernel whose scores stay in registers and whose two products run on warpgroup MMAs.
Run: ``python tutorials/attention.py``.
"""

from __future__ import annotations

import tvm

import tvm_dsm  # noqa: F401  (registers tvm-dsm's pipeline)
from tvm_dsm.bench.demo import assemble, kernel_source, run_section, section
from tvm_dsm.fusion.cascade import analyze
from tvm_dsm.kernels.attention import default_config, find_attention, fuse_attention
from tvm_dsm.workloads.cascades import attention

HEADS, SEQ, DIM = 128 * 16, 512, 64  # [batch 128, 16 heads, 512 tokens, head dim 64]
TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")


def run_on_gpu(executable) -> None:
    import torch
    import torch.nn.functional as F

    from tvm_dsm.bench.timing import graph_time_us, input_sets_for, python_call_us

    func = executable["main"]

    def inputs():
        q, k, v = (torch.randn(HEADS, SEQ, DIM, device="cuda").half() for _ in range(3))
        return q, k, v, torch.full((HEADS, SEQ, DIM), float("nan"), device="cuda").half()  # poisoned

    q, k, v, out = inputs()
    func(*(tvm.runtime.from_dlpack(t) for t in (q, k, v, out)))
    s = q.double() @ k.double().transpose(1, 2) * DIM ** -0.5
    want = torch.softmax(s, -1) @ v.double()
    err = ((out.double() - want).norm() / want.norm()).item()
    print(f"vs float64: relative error {err:.2e} ({'ok' if err < 2e-3 else 'WRONG'})")
    n = input_sets_for(4 * HEADS * SEQ * DIM * 2)
    sets = [inputs() for _ in range(n)]
    wrapped = [[tvm.runtime.from_dlpack(t) for t in s] for s in sets]
    times = {
        "tvm-dsm fused": graph_time_us(lambda i: func(*wrapped[i]), n),
        # 4-D [1, heads, seq, dim]: 3-D inputs take SDPA's slow math path
        "torch SDPA": graph_time_us(lambda i: F.scaled_dot_product_attention(*(t[None] for t in sets[i][:3])), n),
    }
    print("GPU time per call (CUDA graphs): " + " | ".join(f"{k} {v:.1f} us" for k, v in times.items()))
    print(f"Python-call latency: tvm-dsm {python_call_us(lambda: func(*wrapped[0])):.1f} us")


def main() -> None:
    func = attention(HEADS, SEQ, SEQ, DIM)
    section(f"prove: attention, {HEADS} heads x {SEQ} queries x {SEQ} keys, head dim {DIM} (fp16)")
    for _, report in analyze(func):
        print(report)
    shape = find_attention(func)
    print(f"scale {shape.scale}, causal {shape.causal}, layouts {shape.layouts}")

    section("configuration (no measurement)")
    config = default_config(shape)
    print(f"{config}: {config.block_m} query rows per CTA ({config.warpgroups} warpgroup(s) of 4 "
          f"warps, 16 rows each per 64-row block), {config.block_n} keys per tile, "
          f"{HEADS * SEQ // config.block_m} CTAs")

    section("generated CUDA of the fused kernel (TVM codegen, sm_90a)")
    executable = tvm.compile(fuse_attention(func, config), target=TARGET)
    source = executable.mod.imports[0].inspect_source()
    print(kernel_source(source)[:3000] + "\n[...]")
    print(f"warpgroup MMAs: {source.count('wgmma.mma_async')}, TMA tile copies: "
          f"{source.count('cp_async_bulk_tensor')}, quad shuffles: {source.count('__shfl_xor_sync')}")
    print("nvcc sm_90a:", assemble(source, "attention"))

    run_section(run_on_gpu, executable, "attention")


if __name__ == "__main__":
    main()
