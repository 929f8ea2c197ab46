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


@T.prim_func(private=True, s_tir=True)
def _scale(x: T.Buffer((4,), "float32"), w: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
    for i in range(4):
        with T.sblock("y"):
            v = T.axis.spatial(4, i)
            y[v] = x[v] * w[v]


@T.prim_func(private=True, s_tir=True)
def _bump(w: T.Buffer((4,), "float32")):
    for i in range(4):
        with T.sblock("w"):
            v = T.axis.spatial(4, i)
            w[v] = w[v] + T.float32(1)


def _two_calls(second) -> tvm.IRModule:
    """``main(x, w)`` with ``w`` a weight (``num_input`` 1) passed to ``scale`` by ``call_tir``,
    then whatever ``second(builder, scale, y, w)`` emits."""
    builder = relax.BlockBuilder()
    x, w = relax.Var("x", R.Tensor((4,), "float32")), relax.Var("w", R.Tensor((4,), "float32"))
    with builder.function("main", [x, w], attrs={"num_input": 1}):
        gv = builder.add_func(_scale, "scale")
        y = builder.emit(relax.call_tir(gv, [x, w], R.Tensor((4,), "float32")))
        builder.emit_func_output(second(builder, gv, y, w))
    return builder.get()


def _plain(builder, gv, y, w):
    return y


def _bumped(builder, gv, y, w):  # an in-place call writes the weight
    builder.emit(relax.call_tir_inplace(builder.add_func(_bump, "bump"), [w], [0], R.Tensor((4,), "float32")))
    return y


def _called_in_place(builder, gv, y, w):  # scale itself called with an activation where w goes
    return builder.emit(relax.call_tir_inplace(gv, [y, y, y], [2], R.Tensor((4,), "float32")))


def _packed_tuple(builder, gv, y, w):
    t = builder.emit(relax.Tuple([w]))
    return builder.emit(relax.call_dps_packed("writes_it", [t], R.Tensor((4,), "float32")))


def _returned(builder, gv, y, w):
    return builder.emit(relax.Tuple([y, w]))


def test_only_a_weight_nothing_else_can_write_is_marked():
    """The weight passed by ``call_tir`` alone is marked; written in place, reached through a
    tuple by a packed call, returned, or its callee called in place otherwise: nothing is."""
    assert read_only_params(_two_calls(_plain)) == {"scale": ["w"]}
    for second in (_bumped, _called_in_place, _packed_tuple, _returned):
        assert read_only_params(_two_calls(second)) == {}, second.__name__
