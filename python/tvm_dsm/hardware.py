"""The hardware description the cost model reads: measured, not copied from papers.

``python -m tvm_dsm.hardware measure --out FILE`` builds ``src/hwbench/hwbench.cu`` with nvcc on
a GPU machine, runs it and writes its JSON (plus the date); the H100 result is committed as
``tvm_dsm/data/h100_sxm.json`` and loaded by :func:`load_hardware`.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

DATA = Path(__file__).parent / "data"
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
def load_hardware(name: str = "h100_sxm") -> Hardware:
    """Load a committed hardware description (``tvm_dsm/data/<name>.json``), once per process."""
    path = DATA / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no hardware description {path}; measure one with `python -m tvm_dsm.hardware "
            "measure` on the GPU"
        )
    return Hardware.from_json(json.loads(path.read_text()))


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
