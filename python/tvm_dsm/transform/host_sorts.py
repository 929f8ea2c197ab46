"""Functions that compute on the host: TOPI's generic sorts (``topi.topk``, ``topi.sort``,
``topi.argsort``) are extern calls of TVM's CPU sorts (``tvm.contrib.sort.*``), packed functions
the host calls on the arguments' data. Built for a GPU, that data lives in device memory and no
kernel computes the sort (TVM's own build makes no CUDA kernel for it either), so the module
would fail only when it runs. :func:`refuse_host_sorts` refuses such a function at build time,
naming TVM's GPU form of the operator (``topi.gpu.*``, which Relax's DispatchSortScan picks for
GPU targets). TOPI's generic scans (``topi.cumsum``, ``topi.cumprod``) are a host loop of the same
kind (``T.parallel``, no thread bound): :func:`refuse_host_loops` refuses them likewise.

One such function has a kernel of its own: a MoE router written with TOPI, the k best of
``topi.topk(topi.nn.softmax(logits [cast to fp32]), k, ret_type="both", dtype=...)`` with int32
or int64 indices (``topi.topk``'s default), or the same with ``topi.gpu.topk``, the form the
refusal above names.
:func:`router_top_k` recognizes it by rebuilding that composition at the function's shape and
comparing, and gives the fused router's form (:func:`tvm_dsm.workloads.cascades.moe_routing`:
the experts ranked by their logits, which the softmax keeps in order, ties to the lower index as
TVM's sort keeps them; their probabilities from the row max and exp-sum), which the top-k rows
family takes."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import te, tirx, topi

from ..errors import ClusterError
from ..hardware import H100
from ..ir import binds_threads, find_all
from ..workloads.cascades import moe_routing

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


def _host_sort(func: tirx.PrimFunc) -> str | None:
    """The name of the first of TVM's CPU sorts ``func`` calls, if any."""
    return next((n for n in map(_packed_name, find_all(func.body, tvm.ir.Call)) if n in CPU_SORTS), None)


def refuse_host_sorts(func: tirx.PrimFunc) -> None:
    """ClusterError if ``func`` calls one of TVM's CPU sorts, naming it and the GPU form."""
    sort = _host_sort(func)
    if sort is None:
        return
    generic, gpu = CPU_SORTS[sort]
    raise ClusterError(
        f"the function calls {sort}, TVM's CPU sort ({generic}'s generic form): built for a GPU, "
        f"the host would run it on device memory and no kernel computes it. Write the operator "
        f"with {gpu}, TVM's GPU sort (the one Relax's DispatchSortScan picks for GPU targets), "
        "and give its outputs distinct names: TVM 0.27 cannot bind two parameters of one name "
        "for a GPU (topk's two slices are both T_strided_slice)")


def refuse_host_loops(func: tirx.PrimFunc) -> None:
    """ClusterError if ``func`` holds a parallel loop (TOPI's generic scans write one): a GPU
    build runs it on the host over device memory, and no kernel computes it."""
    if any(loop.kind == tirx.ForKind.PARALLEL for loop in find_all(func.body, tirx.For)):
        raise ClusterError(
            "the function holds a parallel loop, the host's (TOPI's generic scans write one: topi.cumsum, "
            "topi.cumprod): built for a GPU, the host would run it on device memory and no kernel computes it. "
            "Write the operator with its GPU form (topi.gpu.cumsum, topi.gpu.cumprod: the one Relax's "
            "DispatchSortScan picks for GPU targets)")


def router_top_k(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` as the fused router where it is TOPI's topk (the generic one, the host's sort, or
    ``topi.gpu.topk``, a CUDA target's) of a softmax of 2-D logits (see the module docstring),
    else None."""
    params = list(func.params)
    sorts_on_host = _host_sort(func) == "tvm.contrib.sort.topk"
    if not (sorts_on_host or binds_threads(func)) or len(params) != 3 or not all(
            isinstance(p.ty, tvm.tirx.buffer.BufferType) for p in params):
        return None
    logits, values, indices = (p.ty for p in params)
    if len(logits.shape) != 2 or len(values.shape) != 2 or str(indices.dtype) not in ("int32", "int64"):
        return None
    try:
        tokens, experts, k = (int(d) for d in (*logits.shape, values.shape[1]))
    except TypeError:  # a symbolic extent
        return None
    x = te.placeholder((tokens, experts), str(logits.dtype), name="logits")
    wide = x if x.dtype == "float32" else topi.cast(x, "float32")
    probabilities = topi.nn.softmax(wide)
    if sorts_on_host:
        top = topi.topk(probabilities, k=k, ret_type="both", dtype=str(indices.dtype))
    else:
        with tvm.target.Target(H100):  # (its threads a CTA: every CUDA target's 1024)
            top = topi.gpu.topk(probabilities, k=k, ret_type="both", dtype=str(indices.dtype))
    written = te.create_prim_func([x, *top])
    # parameters and body in one comparison: one mapping of the variables for both
    if not tvm_ffi.structural_equal([written.params, written.body], [func.params, func.body], map_free_vars=True):
        return None
    return moe_routing(tokens, experts, k, str(logits.dtype), str(indices.dtype)).with_attr(
        "global_symbol", (func.attrs or {}).get("global_symbol", "main"))
