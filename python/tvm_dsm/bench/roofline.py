"""A results file's kernels on the GPU's roofline: achieved FLOP/s against arithmetic intensity,
under the HBM bandwidth the run measured and the tensor cores' fitted peak.

A row's bytes are its floor (``floor_us`` x the run's measured HBM copy bandwidth: every operand
read once, the output written once), its FLOPs the row's ``flops``; rows without FLOPs (copies,
collectives) are left out. The torch peers are drawn beside ours where the row has them.
"""

from __future__ import annotations

from pathlib import Path

from ..hardware import load_hardware

#: Marker of each series: ours, then the torch peers.
_MARKERS = {"ours": "o", "torch_eager": "x", "torch_compile": "+", "torch_sdpa": "^"}


def points(results: dict) -> dict[str, list[tuple[float, float]]]:
    """``{series: [(FLOP per byte, FLOP/s)]}`` of the rows with FLOPs and a floor."""
    bandwidth = results.get("versions", {}).get("hbm_copy_bytes_per_s") or results.get("hbm_bytes_per_s")
    series: dict[str, list[tuple[float, float]]] = {}
    for row in results["rows"]:
        flops, floor_us = row.get("flops"), row.get("floor_us")
        if not (flops and floor_us and bandwidth and row.get("ours_us")):
            continue
        intensity = flops / (floor_us * 1e-6 * bandwidth)
        for name, us in [("ours", row["ours_us"]), *(row.get("peers") or {}).items()]:
            if us:
                series.setdefault(name, []).append((intensity, flops / (us * 1e-6)))
    return series


def plot(results: dict, path: str | Path) -> Path:
    """Write the roofline of ``results`` to ``path`` (PNG); ValueError if no row has FLOPs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = points(results)
    if not series:
        raise ValueError(f"{results['suite']}: no row has flops and a floor to place on a roofline")
    bandwidth = results.get("versions", {}).get("hbm_copy_bytes_per_s") or results.get("hbm_bytes_per_s")
    peak = load_hardware().fitted("gemm.wgmma_flops")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    low = min(x for pts in series.values() for x, _ in pts) / 2
    high = max(x for pts in series.values() for x, _ in pts) * 2
    knee = peak / bandwidth
    xs = [low, min(max(knee, low), high), high]
    ax.plot(xs, [min(peak, x * bandwidth) for x in xs], "k-", lw=1,
            label=f"HBM {bandwidth / 1e12:.2f} TB/s, tensor cores {peak / 1e12:.0f} TFLOP/s")
    for name, pts in series.items():
        ax.scatter([x for x, _ in pts], [y for _, y in pts], marker=_MARKERS.get(name, "s"), label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte (operands read once)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{results['suite']} on {results['device']}, {results['date']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
