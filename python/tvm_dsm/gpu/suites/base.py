"""What a suite is made of: a Variant (one kernel to build, check and time) and its argument specs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import tvm
from tvm import s_tir
from ... import driver
from ...errors import ClusterError
from ...hardware import load_hardware
from ...transform.programmatic_launch import launch_programmatically


@dataclass
class Variant:
    """One kernel to build, check and time."""

    name: str
    workload: str  # key of tvm_dsm.gpu.references.REFERENCES
    mod: tvm.IRModule
    args: list[dict]  # {"name", "shape", "dtype", "output": bool} in call order
    bytes: int  # fewest HBM bytes one call must move (each input read once, output written)
    flops: int
    plan: dict = field(default_factory=dict)
    pipeline: str = "default"
    expect_correct: bool = True  # False for kernels built to show a stock-TVM trap
    peers: tuple[str, ...] = ("torch_eager", "torch_compile")
    extra: dict = field(default_factory=dict)  # copied into the result row
    reference_kwargs: dict = field(default_factory=dict)


def args_of(func, n_out: int = 1) -> list[dict]:
    params = list(func.params)
    return [
        {
            "name": p.name,
            "shape": [int(d) for d in p.ty.shape],
            "dtype": str(p.ty.dtype),
            "output": i >= len(params) - n_out,
        }
        for i, p in enumerate(params)
    ]


def nbytes_of(args: list[dict]) -> int:
    total = 0
    for a in args:
        n = 1
        for d in a["shape"]:
            n *= d
        total += n * tvm.DataType(a["dtype"]).bits // 8
    return total


def ours_and_dlight(name: str, workload: str, func, peers: tuple[str, ...], extra: dict) -> list[Variant]:
    """``func`` twice: as ``tvm_dsm.build`` schedules it (``NAME_tvm_dsm``, the planner's pick)
    and as dlight does (``NAME_dlight``)."""
    args = args_of(func)
    return [Variant(name=f"{name}_{label}", workload=workload, mod=mod, args=args, bytes=nbytes_of(args), flops=0,
                    plan={"planner": label == "tvm_dsm"}, peers=peers, extra=extra)
            for label, mod in (("tvm_dsm", driver.schedule(func).mod), ("dlight", driver.stock_schedule(func).mod))]


def fitting(func, schedule, plans: list, count: int) -> list:
    """The first ``count`` of ``plans`` that ``schedule`` accepts (an epilogue of its own thread
    loops keeps the output tile in shared memory, which the largest tiles overflow)."""
    fitting = []
    for plan in plans:
        try:
            schedule(func, plan.config, load_hardware())
        except ClusterError:
            continue
        fitting.append(plan)
        if len(fitting) == count:
            break
    return fitting


def launched(variant: Variant, programmatically: bool) -> Variant:
    """``variant`` with its kernels launched programmatically (``_pdl`` in the name) or not."""
    sch = s_tir.Schedule(variant.mod)
    launch_programmatically(sch, programmatically)
    return dataclasses.replace(variant, name=variant.name + ("_pdl" if programmatically else ""),
                               mod=sch.mod, plan={**variant.plan, "programmatic_launch": programmatically})


#: FlashFuser's GEMM chains (n, k, l) and SwiGLU FFNs (n, k, l), evaluated at M = 128.
CHAINS = {
    "G1": (512, 32, 256), "G2": (256, 512, 64), "G3": (512, 416, 256), "G4": (3072, 768, 768),
    "G5": (16384, 4096, 4096), "G6": (4096, 1024, 1024), "G7": (768, 768, 768),
    "G8": (8192, 2048, 2048), "G9": (2048, 512, 512), "G10": (1536, 384, 384),
}


SWIGLUS = {
    "S1": (8192, 3072, 3072), "S2": (5632, 2048, 2048), "S3": (11008, 4096, 4096),
    "S4": (8192, 2048, 2048), "S5": (11008, 2048, 2048), "S6": (8960, 1536, 1536),
    "S7": (9728, 2560, 2560), "S8": (3072, 1024, 1024),
}
