"""The hardware description the cost model reads: measured, not copied from papers.

``python -m tvm_dsm.hardware measure --out FILE`` builds ``src/hwbench/hwbench.cu`` with nvcc on
a GPU machine, runs it and writes its JSON (plus the date); one description per GPU is committed
as ``tvm_dsm/data/<gpu>.json`` (``h100_sxm``, ``h200_sxm``), beside the cost models' constants
fitted on that GPU (``<gpu>_calibration.json``, :mod:`tvm_dsm.calibration`).
:func:`load_hardware` loads the GPU this process plans for: ``TVM_DSM_GPU`` where set (to plan
on a machine without the GPU), else the CUDA device present, else the H100.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from .calibration import calibration

DATA = Path(__file__).parent / "data"
#: The description planned for where neither ``TVM_DSM_GPU`` nor a CUDA device names one.
DEFAULT_GPU = "h100_sxm"
#: The environment variable naming the description to plan for (a file name in DATA, no suffix).
GPU_VARIABLE = "TVM_DSM_GPU"
#: Threads a CTA may have: CUDA's limit on every GPU tvm-dsm targets.
MAX_CTA_THREADS = 1024
#: The TVM target of an H100 SXM (sm_90a: the cluster and DSM instructions need the
#: architecture-specific set), tvm-dsm's default.
H100 = {"kind": "cuda", "arch": "sm_90a"}

logger = logging.getLogger(__name__)
BENCH_SOURCE = Path(__file__).resolve().parents[2] / "src" / "hwbench" / "hwbench.cu"


@dataclass(frozen=True)
class Hardware:
    """Capacities (bytes), bandwidths (bytes/s) and latencies (ns) of one GPU."""

    device: str
    sm_count: int
    smem_per_cta: int
    smem_per_sm: int
    regs_per_sm: int
    l2_bytes: int
    max_cluster_size: int
    hbm_bw: float
    l2_bw: float
    smem_bw: float
    dsm_bw_by_cluster: dict[int, float]
    latency_ns: dict[str, float]
    #: Best of 8-deep register loads and bulk copies (empty in descriptions measured before it),
    #: and how many clusters of 128 KB-SMEM CTAs were resident at once in that probe.
    dsm_peak_by_cluster: dict[int, float] = field(default_factory=dict)
    dsm_peak_clusters: dict[int, int] = field(default_factory=dict)
    #: Clusters of each size resident at once, by CTAs per SM (1 and 2 measured).
    active_clusters: dict[int, dict[int, int]] = field(default_factory=dict)
    #: The cost models' constants fitted on this GPU (:mod:`tvm_dsm.calibration`), by key.
    calibration: dict[str, float] = field(default_factory=dict)

    def fitted(self, key: str) -> float:
        """The constant ``key`` (e.g. ``"gemm.launch_s"``) fitted on this GPU."""
        try:
            return self.calibration[key]
        except KeyError:
            raise KeyError(f"no fitted constant {key!r} for {self.device}: add it to its "
                           "data/<gpu>_calibration.json") from None

    def dsm_bw(self, cluster_size: int) -> float:
        """Aggregate DSM read bandwidth with clusters of ``cluster_size`` CTAs."""
        if cluster_size <= 1:
            return self.smem_bw
        sizes = sorted(self.dsm_bw_by_cluster)
        fit = min(sizes, key=lambda s: abs(s - cluster_size))
        return self.dsm_bw_by_cluster[fit]

    def dsm_peak_bw(self, cluster_size: int) -> float:
        """The DSM bandwidth ceiling at ``cluster_size`` (the collectives' yardstick): the peak
        probe where measured, else the read probe the cost model uses."""
        return self.dsm_peak_by_cluster.get(cluster_size) or self.dsm_bw(cluster_size)

    def concurrent_ctas(self, cluster_size: int, ctas_per_sm: int) -> int:
        """CTAs of a grid that run at once. A cluster's CTAs must share a GPC, so clusters of
        3 or more strand SMs: measured on the H100 at one CTA per SM, 30 clusters of 4 (120
        CTAs), 15 of 8 (120), 7 of 16 (112). A 128-CTA grid of clusters of 4 runs in two
        waves: twice the time of one (G5b's second GEMM, measured)."""
        if not self.active_clusters:
            return self.sm_count * ctas_per_sm // cluster_size * cluster_size
        measured = max(k for k in self.active_clusters if k <= max(1, ctas_per_sm))
        clusters = self.active_clusters[measured][cluster_size] * ctas_per_sm // measured
        return clusters * cluster_size

    @classmethod
    def from_json(cls, raw: dict) -> Hardware:
        bw = raw["bandwidth_bytes_per_s"]
        peak = raw.get("dsm_peak_by_cluster_size", {})
        return cls(
            device=raw["device"],
            sm_count=raw["sm_count"],
            smem_per_cta=raw["smem_per_cta_optin_bytes"],
            smem_per_sm=raw["smem_per_sm_bytes"],
            regs_per_sm=raw["regs_per_sm"],
            l2_bytes=raw["l2_bytes"],
            max_cluster_size=raw["max_cluster_size"],
            hbm_bw=bw["hbm_copy"],
            l2_bw=bw["l2_read"],
            smem_bw=bw["smem_read"],
            dsm_bw_by_cluster={
                int(s): v["bytes_per_s"] for s, v in raw["dsm_read_by_cluster_size"].items()
            },
            latency_ns=dict(raw["latency_ns"]),
            dsm_peak_by_cluster={int(s): v["bytes_per_s"] for s, v in peak.items()},
            dsm_peak_clusters={int(s): v["active_clusters"] for s, v in peak.items()},
            active_clusters={
                int(per_sm): {int(s): n for s, n in row.items()}
                for per_sm, row in raw.get("active_clusters_by_ctas_per_sm", {}).items()
            },
        )


@functools.cache
def load_hardware(name: str | None = None) -> Hardware:
    """A committed hardware description (``tvm_dsm/data/<name>.json``) with the constants fitted
    on that GPU, once per process; ``name`` None: the GPU this process plans for
    (:func:`gpu_name`)."""
    name = name or gpu_name()
    path = DATA / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no hardware description {path}; measure one with `python -m tvm_dsm.hardware "
            "measure` on the GPU"
        )
    constants = {key: entry["value"] for key, entry in calibration(name).items()}
    return dataclasses.replace(Hardware.from_json(json.loads(path.read_text())), calibration=constants)


def refitted(hw: Hardware, **constants: float) -> Hardware:
    """``hw`` with the fitted constants named (by key, e.g. ``**{"gemm.step_s": 2e-8}``) set to
    other values: what a fit tries, what a test asks of the model."""
    unknown = sorted(set(constants) - set(hw.calibration))
    if unknown:
        raise KeyError(f"no fitted constants {unknown} for {hw.device}")
    return dataclasses.replace(hw, calibration={**hw.calibration, **constants})


def descriptions() -> dict[str, str]:
    """The committed descriptions: the device name each was measured on -> its file name."""
    return {json.loads(p.read_text())["device"]: p.stem for p in sorted(DATA.glob("*.json"))
            if (DATA / f"{p.stem}_calibration.json").exists()}


def description_for(device: str) -> str | None:
    """The description measured on a device named ``device`` (as CUDA names it), None if none."""
    return descriptions().get(device)


def check_planned_for(manifest: dict, device: str) -> None:
    """Refuse exported kernels (``manifest``: :mod:`tvm_dsm.gpu.export`'s) planned for another GPU
    than ``device`` (as CUDA names it): their times are not what a user of this GPU gets, whose
    build plans for it. A manifest naming no GPU, or a device without a description, passes."""
    planned, present = manifest.get("planned_for"), description_for(device)
    if planned and present and planned != present:
        raise SystemExit(f"{manifest['suite']}: kernels planned for {planned}, this GPU is {device} ({present}): "
                         f"export them with --gpu {present}")


def forget_planned_gpu() -> None:
    """Forget the GPU this process plans for and its description (:func:`gpu_name` and
    :func:`load_hardware` keep them once read), so that the next call reads ``TVM_DSM_GPU``
    again."""
    gpu_name.cache_clear()
    load_hardware.cache_clear()


@functools.cache
def gpu_name() -> str:
    """The description to plan for: ``TVM_DSM_GPU`` where set, else the first CUDA device's
    where one is present and described, else :data:`DEFAULT_GPU` (logged where a device
    without a description is present)."""
    named = os.environ.get(GPU_VARIABLE)
    if named:
        return named
    import tvm

    device = tvm.cuda(0)
    if not device.exist:
        return DEFAULT_GPU
    found = description_for(device.device_name)
    if found is None:
        logger.warning("no hardware description for %s: planning for %s (measure one with "
                       "`python -m tvm_dsm.hardware measure`)", device.device_name, DEFAULT_GPU)
    return found or DEFAULT_GPU


def measure(out: Path, arch: str = "sm_90a") -> dict:
    """Build and run the microbenchmark on this machine's GPU; write and return its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "hwbench"
        subprocess.run(
            ["nvcc", "-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-o", str(exe),
             str(BENCH_SOURCE)],
            check=True,
        )
        raw = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    raw["date"] = date.today().isoformat()
    raw["source"] = "src/hwbench/hwbench.cu (python -m tvm_dsm.hardware measure)"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=1) + "\n")
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description="tvm-dsm hardware description")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("measure", help="run the microbenchmark on this machine's GPU")
    run.add_argument("--out", type=Path, default=DATA / "h100_sxm.json")
    run.add_argument("--arch", default="sm_90a")
    args = parser.parse_args()
    print(json.dumps(measure(args.out, args.arch), indent=1))


if __name__ == "__main__":
    main()
