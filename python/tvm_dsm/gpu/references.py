"""Float64 references and torch peers per workload, by name (runtime side: torch only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Reference:
    """How to check and compete with one workload: ``inputs`` are the kernel's input tensors."""

    float64: Callable[..., torch.Tensor]
    torch_eager: Callable[..., torch.Tensor]


REFERENCES: dict[str, Reference] = {
    "row_sum": Reference(
        float64=lambda a: a.double().sum(1),
        torch_eager=lambda a: a.float().sum(1),
    ),
    "gemv": Reference(
        float64=lambda a, x: a.double() @ x.double(),
        torch_eager=lambda a, x: torch.mv(a, x).float(),
    ),
}
