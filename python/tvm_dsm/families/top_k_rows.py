"""A top-k of rows with the row's softmax statistics (MoE routing) as one kernel that stages each
row in shared memory and inserts only the elements that can still make the top k
(:mod:`tvm_dsm.kernels.top_k_rows`).

The model is the HBM floor of the function's operands, read and written once; it has no
products, and its element work (a max, an exp-sum and a threshold test an element, the k-best
network for the few elements past the threshold) is a few operations an element, far below the
HBM time. Every split of a row moves the same bytes, so the model cannot order them: the plan is
:func:`~tvm_dsm.kernels.top_k_rows.default_config`'s alone, at or near the fastest on every
router measured (bench/results/top_k_rows/latest.json).
"""

from __future__ import annotations

from ..hardware import Hardware
from ..kernels import top_k_rows as rule
from ..transform.buffers import buffer_bytes
from .kernel_plan import KernelPlan, roofline
from .template_family import TemplateFamily


class TopKRows(TemplateFamily):
    name = "top_k_rows"
    template = rule.TEMPLATE
    symbolic_rows = True  # a token count known when called: the last CTA's spare row slots write nothing

    def predict(self, found: rule.TopKRows, config: rule.TopKRowsConfig, hw: Hardware) -> KernelPlan:
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)}, {}, hw)
