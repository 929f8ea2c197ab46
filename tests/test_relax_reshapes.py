"""tvm_dsm.relax_reshapes: TOPI reshapes over products of extent variables (a symbolic model's
token matrix reshaped back to ``[batch, seq, hidden]``) become views, not copies."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx, topi

from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.relax_reshapes import ReshapesAsViews, is_layout_copy, is_topi_reshape

from conftest import LLVM, TARGET


def _reshape(source, target):
    x = te.placeholder(source, "float16", name="x")
    return te.create_prim_func([x, topi.reshape(x, target)])


def test_a_reshape_is_recognized_and_nothing_else():
    b, s, rows = (tirx.Var(n, "int64") for n in ("b", "s", "rows"))
    assert is_topi_reshape(_reshape((rows, 64), (b, s, 64)))
    assert is_topi_reshape(_reshape((b, s, 64), (b * s, 64)))
    x = te.placeholder((rows, 64), "float16", name="x")
    assert not is_topi_reshape(te.create_prim_func([x, topi.transpose(x)]))
    assert not is_topi_reshape(te.create_prim_func([x, topi.negative(x)]))


def test_a_transpose_of_a_unit_axis_is_a_layout_copy_and_a_real_transpose_is_not():
    """``[B, H, 1, D]`` to ``[B, 1, H, D]`` (a decode query put in ``[B, S, H, D]`` order),
    fused with a multiply by one as Relax leaves it after moving attention's scale, moves no
    element; a multiply by two computes, and swapping two axes of more than one element moves."""
    q = te.placeholder((4, 32, 1, 128), "float16", name="q")
    moved = topi.transpose(q, (0, 2, 1, 3))
    def times(c):
        return te.create_prim_func([q, te.compute(moved.shape, lambda *i: moved(*i) * tirx.const(c, "float16"))])

    assert is_layout_copy(times(1.0)) and not is_layout_copy(times(2.0))
    x = te.placeholder((4, 32, 2, 128), "float16", name="x")
    assert not is_layout_copy(te.create_prim_func([x, topi.transpose(x, (0, 2, 1, 3))]))


def _mlp():
    """``down(silu(up(x)))`` of ``x [batch, seq, 64]``, both extents symbolic, as a
    ``relax.frontend.nn`` model exports it."""
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import op, spec

    class MLP(nn.Module):
        def __init__(self):
            self.up = nn.Linear(64, 128, bias=False)
            self.down = nn.Linear(128, 64, bias=False)

        def forward(self, x: nn.Tensor):
            return self.down(op.silu(self.up(x)))

    model = MLP()
    model.to("float16")
    mod, params = model.export_tvm(spec={"forward": {"x": spec.Tensor(["batch", "seq", 64], "float16")}})
    return mod, params


def _calls(func: relax.Function) -> list[str]:
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e.args[0].name_hint) if isinstance(
        e, relax.Call) and e.args and isinstance(e.args[0], tvm.ir.GlobalVar) else None)
    return found


def test_a_symbolic_model_reshapes_its_token_matrix_back_in_place():
    """The pipeline computes the model's products over a token matrix; the reshape back to
    ``[batch, seq, 64]`` runs no kernel, and the model computes what it did (on the CPU)."""
    mod, params = _mlp()
    with tvm.target.Target(TARGET):
        before = lower_to_tir(mod)
        after = ReshapesAsViews(before)
    def copies(mod):  # reshapes Relax's own rewrite would leave kernels
        return [n for n in _calls(mod["forward"]) if n.startswith("reshape")
                and not relax.analysis.has_reshape_pattern(mod[n])]

    assert copies(before) and not copies(after)
    vm = relax.VirtualMachine(tvm.compile(after, target=LLVM), tvm.cpu())
    rng = np.random.default_rng()
    weights = [(rng.standard_normal(shape) / 8).astype("float16") for shape in ((128, 64), (64, 128))]
    for batch, seq in ((1, 7), (3, 5)):
        x = rng.standard_normal((batch, seq, 64)).astype("float16")
        got = vm["forward"](tvm.runtime.tensor(x), *(tvm.runtime.tensor(w) for w in weights)).numpy()
        up = x.astype(np.float64) @ weights[0].astype(np.float64).T
        want = (up / (1 + np.exp(-up))) @ weights[1].astype(np.float64).T
        assert got.shape == (batch, seq, 64)
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 2e-2
