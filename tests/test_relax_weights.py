"""Parameters of a model's PrimFuncs that only ever receive its weights (tvm_dsm.relax_weights)."""

import tvm
from tvm import relax
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_dsm.relax_weights import read_only_params
from tvm_dsm.workloads.llama import LLAMA_TINY, export_llama


def test_a_llama_s_projections_and_norms_read_their_weights_only():
    """The tiny Llama as ``nn.Module`` exports it (weights in ``packed_params``, past
    ``num_input``): every GEMM names its weight, and nothing else, as read-only."""
    from tvm_dsm.relax_integration import lower_to_tir

    mod, _ = export_llama(LLAMA_TINY, tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        marked = read_only_params(lower_to_tir(mod))
    gemms = {name: params for name, params in marked.items() if "matmul" in name}
    assert len(gemms) >= 4
    assert all(len(params) == 1 and params[0].endswith(("weight", "weight1")) for params in gemms.values())
    assert any("norm" in name for name in marked)


def _module(inplace: bool) -> tvm.IRModule:
    @T.prim_func(private=True, s_tir=True)
    def scale(x: T.Buffer((4,), "float32"), w: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("y"):
                v = T.axis.spatial(4, i)
                y[v] = x[v] * w[v]

    @T.prim_func(private=True, s_tir=True)
    def bump(w: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("w"):
                v = T.axis.spatial(4, i)
                w[v] = w[v] + T.float32(1)

    builder = relax.BlockBuilder()
    x, w = relax.Var("x", R.Tensor((4,), "float32")), relax.Var("w", R.Tensor((4,), "float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        with builder.dataflow():
            scale_gv = builder.add_func(scale, "scale")
            y = builder.emit(relax.call_tir(scale_gv, [x, w], R.Tensor((4,), "float32")))
            out = builder.emit_output(y)
        if inplace:
            bump_gv = builder.add_func(bump, "bump")
            builder.emit(relax.call_tir_inplace(bump_gv, [w], [0], R.Tensor((4,), "float32")))
        builder.emit_func_output(out)
    return builder.get()


def test_a_weight_an_in_place_call_receives_is_not_read_only():
    assert read_only_params(_module(inplace=False)) == {"scale": ["w"]}
    assert read_only_params(_module(inplace=True)) == {}
