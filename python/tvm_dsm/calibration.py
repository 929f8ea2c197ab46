"""The cost models' fitted constants, with where each value came from.

A planner predicts time from the hardware description (:mod:`tvm_dsm.hardware`: capacities,
bandwidths, latencies measured by microbenchmarks) and from a few constants fitted on measured
kernels: launch and step overheads, loaded latencies, efficiencies, the fused model's bias.
Those live in ``data/<gpu>_calibration.json``, each with what it is and the measurement it was
fitted on, so refitting changes data, not code.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

DATA = Path(__file__).parent / "data"


@functools.cache
def calibration(name: str = "h100_sxm") -> dict[str, dict]:
    """Every fitted constant of ``data/<name>_calibration.json``: {"value", "what", "source"}."""
    return json.loads((DATA / f"{name}_calibration.json").read_text())["constants"]


def fitted(key: str, name: str = "h100_sxm") -> float:
    """The fitted value of ``key`` (e.g. ``"gemm.launch_s"``)."""
    return calibration(name)[key]["value"]
