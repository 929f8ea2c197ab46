"""Functions that sort on the host: TOPI's generic sorts (``topi.topk``, ``topi.sort``,
``topi.argsort``) are extern calls of TVM's CPU sorts (``tvm.contrib.sort.*``), packed functions
the host calls on the arguments' data. Built for a GPU, that data lives in device memory and no
kernel computes the sort (TVM's own build makes no CUDA kernel for it either), so the module
would fail only when it runs. :func:`refuse_host_sorts` refuses such a function at build time,
naming TVM's GPU form of the operator (``topi.gpu.*``, which Relax's DispatchSortScan picks for
GPU targets)."""

from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import ClusterError
from ..ir import find_all

#: TVM's CPU sorts, by packed-function name: the TOPI operator whose generic form calls it, and
#: the TOPI operator that sorts on the GPU.
CPU_SORTS = {
    "tvm.contrib.sort.topk": ("topi.topk", "topi.gpu.topk"),
    "tvm.contrib.sort.sort": ("topi.sort", "topi.gpu.sort"),
    "tvm.contrib.sort.argsort": ("topi.argsort", "topi.gpu.argsort"),
    "tvm.contrib.sort.argsort_nms": ("topi.argsort", "topi.gpu.argsort"),
}


def _packed_name(call: tvm.ir.Call) -> str | None:
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.tvm_call_packed" and call.args):
        return None
    name = call.args[0]
    return name.value if isinstance(name, tvm.ir.StringImm) else None


def refuse_host_sorts(func: tirx.PrimFunc) -> None:
    """ClusterError if ``func`` calls one of TVM's CPU sorts, naming it and the GPU form."""
    sort = next((n for n in map(_packed_name, find_all(func.body, tvm.ir.Call)) if n in CPU_SORTS), None)
    if sort is None:
        return
    generic, gpu = CPU_SORTS[sort]
    raise ClusterError(
        f"the function calls {sort}, TVM's CPU sort ({generic}'s generic form): built for a GPU, "
        f"the host would run it on device memory and no kernel computes it. Write the operator "
        f"with {gpu}, TVM's GPU sort (the one Relax's DispatchSortScan picks for GPU targets), "
        "and give its outputs distinct names: TVM 0.27 cannot bind two parameters of one name "
        "for a GPU (topk's two slices are both T_strided_slice)")
