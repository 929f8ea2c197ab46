"""Row-wise normalizations as TOPI writes them (what Relax legalizes ``R.nn.softmax``,
``R.nn.rms_norm`` and ``R.nn.layer_norm`` to): the schedule ``tvm_dsm.build`` gives them (the
row-norm family's kernel, each row read once) beside TVM's stock dlight schedule, at the sizes
of issue 50 (softmax 4096 x 32000, RMSNorm and LayerNorm 4096 x 4096) and real models' widths
(hidden sizes 2048-8192, a 128K-vocabulary softmax of 8 rows)."""

from __future__ import annotations

from ...workloads.norms import topi_norm
from .base import Variant, ours_and_dlight

#: (operator, rows, width, dtype)
NORMS = [
    ("softmax", 4096, 32000, "float16"), ("softmax", 4096, 32000, "float32"),
    ("log_softmax", 4096, 32000, "float16"),
    ("softmax", 8, 128256, "float16"), ("softmax", 8, 128256, "float32"),
    *[("rms_norm", 4096, width, "float16") for width in (2048, 4096, 8192)],
    *[("layer_norm", 4096, width, "float16") for width in (2048, 4096, 8192)],
    ("layer_norm", 4096, 4096, "float32"),
]


def norms() -> list[Variant]:
    return [variant for operator, rows, width, dtype in NORMS
            for variant in ours_and_dlight(f"{operator}_{rows}x{width}_{dtype}", operator,
                                           topi_norm(operator, rows, width, dtype), ("torch_eager",),
                                           {"class": operator})]
