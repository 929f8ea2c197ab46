"""Whether this machine can run CUDA kernels, and if not, why (one line for the user)."""

from __future__ import annotations

import tvm


def gpu_or_reason() -> str | None:
    """None where a CUDA GPU of compute capability 9.x is usable here, else the reason."""
    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return "no CUDA GPU on this machine (TVM's CUDA runtime finds none)"
        major = int(str(dev.compute_version).split(".")[0])
    except Exception as err:  # noqa: BLE001  (a missing driver raises from the runtime library)
        return f"no usable CUDA runtime here: {str(err).strip().splitlines()[-1]}"
    if major != 9:
        return f"the GPU is compute capability {dev.compute_version}; tvm-dsm's kernels need 9.x (Hopper)"
    return None
