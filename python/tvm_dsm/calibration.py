"""The cost models' fitted constants, with where each value came from.

A planner predicts time from the hardware description (:mod:`tvm_dsm.hardware`: capacities,
bandwidths, latencies measured by microbenchmarks) and from a few constants fitted on measured
kernels: launch and step overheads, loaded latencies, efficiencies, the fused model's bias.
Those live in ``data/<gpu>_calibration.json`` beside the GPU's description, each with what it
is and the measurement it was fitted on, so refitting changes data, not code; the description
loaded for a GPU (:func:`tvm_dsm.hardware.load_hardware`) carries its constants
(``hw.fitted(key)``), so a plan for one GPU never mixes in another's.
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

