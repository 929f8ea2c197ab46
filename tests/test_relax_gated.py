"""A fused gate/up projection (``relax.frontend.nn``'s SwiGLU: one linear layer, split in halves,
``silu(gate) * up``), or a gate and an up projection of one input, as one gated GEMM
(tvm_dsm.relax_gated): what the pipeline makes of it, the same values on llvm, the forms it
leaves alone, and (GPU) the model against float64."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_dsm.relax_gated import FuseGatedProjections
from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.relax_matmuls import MatmulsAsMatrices
from conftest import LLVM


def _nn_swiglu(hidden: int, inner: int, sections: int | list = 2, axis: int = -1, silu_of: int = 0,
               shape: tuple = ("batch", "seq")):
    """A ``relax.frontend.nn`` SwiGLU MLP (fp16, no bias) over ``[*shape, hidden]``: the gate/up
    projection split into ``sections`` along ``axis`` (a count, or the indices it is cut at:
    torch's ``chunk(2)`` as imported), SiLU of piece ``silu_of`` times the next; the module and
    its parameter spec."""
    from tvm.relax.frontend import nn

    cuts = sections if isinstance(sections, list) else [2 * inner // sections * n for n in range(1, sections)]
    width = cuts[0] if axis == -1 else 2 * inner  # of the first piece

    class MLP(nn.Module):
        def __init__(self):
            self.gate_up = nn.Linear(hidden, 2 * inner, bias=False, dtype="float16")
            self.down = nn.Linear(width, hidden, bias=False, dtype="float16")

        def forward(self, x):
            pieces = nn.op.split(self.gate_up(x), sections, axis=axis)
            return self.down(nn.op.silu(pieces[silu_of]) * pieces[1 - silu_of])

    return MLP().export_tvm({"forward": {"x": nn.spec.Tensor([*shape, hidden], "float16")}})


def _calls(mod: tvm.IRModule) -> list[str]:
    return [line for line in mod["forward"].script().splitlines() if "call_tir(" in line]


def test_a_fused_gate_up_projection_becomes_one_gated_gemm():
    """One call of a gated GEMM where the projection and the split/SiLU/multiply were two, taken
    by the split-K GEMM per range of rows."""
    from tvm_dsm.model_report import relax_report

    mod, _ = _nn_swiglu(256, 512)
    calls = _calls(lower_to_tir(mod))
    assert sum("gated_projection" in c for c in calls) == 1 and not any("split" in c for c in calls), calls
    assert len([c for c in calls if "reshape" not in c]) == 2  # the gated GEMM, the down projection
    rows = [line for line in relax_report(mod).format().splitlines() if line.startswith("gated_projection")]
    assert len(rows) == 1 and "split_k_gemm" in rows[0], rows


@pytest.mark.parametrize("sections", [2, [128]])
def test_the_rewrite_keeps_the_values_on_llvm(sections):
    mod, spec = _nn_swiglu(64, 128, sections)
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 8).astype("float16") for _, p in spec]
    x = rng.standard_normal((2, 5, 64)).astype("float16")
    h = x.astype(np.float64) @ weights[0].astype(np.float64).T
    gate, up = h[..., :128], h[..., 128:]
    ref = (gate / (1 + np.exp(-gate)) * up) @ weights[1].astype(np.float64).T
    rewritten = FuseGatedProjections(MatmulsAsMatrices(mod))
    assert any(gv.name_hint.startswith("gated_projection") for gv in rewritten.functions)
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["forward"](tvm.runtime.tensor(x), *(tvm.runtime.tensor(w) for w in weights)).numpy()
    assert got.shape == (2, 5, 64) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _nn_swiglu_pair(hidden: int, inner: int, up_input: str = "x", activation: str = "silu"):
    """A SwiGLU MLP with a gate and an up projection of their own (as torch and Hugging Face
    write it): ``down(silu(gate(x)) * up(x))`` (GeGLU: ``activation`` "gelu_tanh"), or with
    ``up_input`` "other" the up projection of a second input (not a gated layer)."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.gate = nn.Linear(hidden, inner, bias=False, dtype="float16")
            self.up = nn.Linear(hidden, inner, bias=False, dtype="float16")
            self.down = nn.Linear(inner, hidden, bias=False, dtype="float16")

        def forward(self, x, other):
            g = self.gate(x)
            act = nn.op.silu(g) if activation == "silu" else nn.op.gelu(g, approximate="tanh")
            return self.down(act * self.up(x if up_input == "x" else other))

    spec = {"x": nn.spec.Tensor(["batch", "seq", hidden], "float16"),
            "other": nn.spec.Tensor(["batch", "seq", hidden], "float16")}
    return MLP().export_tvm({"forward": spec})


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_a_gate_and_an_up_projection_of_one_input_become_one_gated_gemm_with_the_same_values(activation):
    mod, spec = _nn_swiglu_pair(64, 128, activation=activation)
    calls = _calls(lower_to_tir(mod))
    assert sum("gated_projection" in c for c in calls) == 1, calls
    assert len([c for c in calls if "reshape" not in c]) == 2, calls  # the gated GEMM, the down projection
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 8).astype("float16") for _, p in spec]
    x, other = (rng.standard_normal((2, 5, 64)).astype("float16") for _ in range(2))
    gate, up = (x.astype(np.float64) @ w.astype(np.float64).T for w in weights[:2])
    act = (gate / (1 + np.exp(-gate)) if activation == "silu"
           else 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3))))
    ref = (act * up) @ weights[2].astype(np.float64).T
    vm = relax.VirtualMachine(tvm.compile(FuseGatedProjections(MatmulsAsMatrices(mod)), target=LLVM), tvm.cpu())
    got = vm["forward"](*(tvm.runtime.tensor(a) for a in (x, other, *weights))).numpy()
    assert got.shape == (2, 5, 64) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_projections_of_two_inputs_are_not_a_gated_layer():
    mod, _ = _nn_swiglu_pair(64, 128, up_input="other")
    rewritten = FuseGatedProjections(MatmulsAsMatrices(mod))
    assert not any(gv.name_hint.startswith("gated_projection") for gv in rewritten.functions)


@pytest.mark.parametrize("form", [dict(sections=4), dict(sections=[64, 128]), dict(axis=1, shape=(2, 4)),
                                  dict(silu_of=1), dict(hidden=60)])
def test_other_splits_are_left_alone(form):
    """Quarters, two cuts (quarters and a half), halves of the sequence, the SiLU of the second
    half (not SwiGLU's halves), or halves of a product over a 60-wide input, which the gated GEMM
    does not take (rows of 120 bytes: its copies move 16-byte pieces): left as Relax writes them."""
    mod, _ = _nn_swiglu(form.get("hidden", 64), 128,
                        **{key: value for key, value in form.items() if key != "hidden"})
    rewritten = FuseGatedProjections(MatmulsAsMatrices(mod))
    assert not any(gv.name_hint.startswith("gated_projection") for gv in rewritten.functions)


@pytest.mark.gpu
def test_gpu_a_swiglu_mlp_matches_float64_at_every_batch_and_length():
    """Compiled by tvm-dsm's pipeline, run at several batch and sequence lengths (a range's
    kernel each), against a float64 evaluation of the same weights."""
    mod, spec = _nn_swiglu(512, 1024)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("tvm_dsm")), tvm.cuda())
    rng = np.random.default_rng()
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 16).astype("float16") for _, p in spec]
    gate_up, down = (w.astype(np.float64) for w in weights)
    for b, s in ((1, 1), (2, 37), (3, 300)):
        x = rng.standard_normal((b, s, 512)).astype("float16")
        h = x.astype(np.float64) @ gate_up.T
        gate, up = h[..., :1024], h[..., 1024:]
        ref = (gate / (1 + np.exp(-gate)) * up) @ down.T
        out = vm["forward"](tvm.runtime.tensor(x, tvm.cuda()), *(tvm.runtime.tensor(w, tvm.cuda()) for w in weights))
        got = out.numpy().astype(np.float64)
        assert got.shape == (b, s, 512) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, (b, s)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gpu_a_gated_mlp_of_two_projections_matches_float64(activation):
    mod, spec = _nn_swiglu_pair(512, 1024, activation=activation)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=relax.get_pipeline("tvm_dsm")), tvm.cuda())
    rng = np.random.default_rng()
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 16).astype("float16") for _, p in spec]
    for b, s in ((1, 1), (2, 37), (3, 300)):
        x = rng.standard_normal((b, s, 512)).astype("float16")
        gate, up = (x.astype(np.float64) @ w.astype(np.float64).T for w in weights[:2])
        act = (gate / (1 + np.exp(-gate)) if activation == "silu"
               else 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3))))
        ref = (act * up) @ weights[2].astype(np.float64).T
        out = vm["forward"](*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, x, *weights)))
        got = out.numpy().astype(np.float64)
        assert got.shape == (b, s, 512) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, (b, s)


def _torch_form_mlp(hidden: int, inner: int) -> tvm.IRModule:
    """A SwiGLU MLP with its residual as ``tvm_dsm.relax_torch`` imports a torch model's: each
    ``mm`` 2-D over ``view``s of ``[batch, tokens, hidden]``, its fp32 result rounded to fp16,
    ``silu`` as torch decomposes it (``x * sigmoid(x)`` in fp32 between casts), the residual added
    to the 3-D view."""
    from tvm.script import relax as R

    rows = 2 * 5

    @R.function
    def main(x: R.Tensor((2, 5, hidden), "float16"), w_gate: R.Tensor((inner, hidden), "float16"),
             w_up: R.Tensor((inner, hidden), "float16"), w_down: R.Tensor((hidden, inner), "float16")):
        with R.dataflow():
            x_gate = R.reshape(x, (rows, hidden))
            gate = R.astype(R.matmul(x_gate, R.permute_dims(w_gate, [1, 0]), out_dtype="float32"), "float16")
            gate32 = R.astype(R.reshape(gate, (2, 5, inner)), "float32")
            act = R.astype(R.multiply(gate32, R.sigmoid(gate32)), "float16")
            x_up = R.reshape(x, (rows, hidden))
            up = R.astype(R.matmul(x_up, R.permute_dims(w_up, [1, 0]), out_dtype="float32"), "float16")
            h = R.reshape(R.multiply(act, R.reshape(up, (2, 5, inner))), (rows, inner))
            down = R.astype(R.matmul(h, R.permute_dims(w_down, [1, 0]), out_dtype="float32"), "float16")
            out = R.add(x, R.reshape(down, (2, 5, hidden)))
            R.output(out)
        return out

    return tvm.IRModule({"main": main})


def test_a_torch_imported_swiglu_is_one_gated_gemm_and_its_residual_in_the_down_projection():
    """The gate (torch's SiLU between casts) and up projections over two views of one input
    become one gated GEMM; the residual add of the 3-D view runs in the down projection's
    epilogue (no add function of its own); the same values on llvm."""
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    mod = _torch_form_mlp(64, 128)
    lowered = lower_to_tir(mod)
    calls = [line for line in lowered["main"].script().splitlines() if "call_tir(" in line]
    assert sum("gated_projection" in c for c in calls) == 1, calls
    products = [c for c in calls if "matmul" in c]
    assert len(products) == 1 and "add" in products[0].split("call_tir(")[1].split(",")[0], calls
    assert not [c for c in calls if "add" in c and "matmul" not in c], calls
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 64)).astype("float16")
    weights = [(rng.standard_normal(s) / 8).astype("float16") for s in ((128, 64), (128, 64), (64, 128))]
    gate, up = (x.astype(np.float64) @ w.astype(np.float64).T for w in weights[:2])
    ref = x + (gate / (1 + np.exp(-gate)) * up) @ weights[2].astype(np.float64).T
    rewritten = FuseGatedProjections(MatmulsAsMatrices(RewriteToRelaxOps(mod)))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, *weights))).numpy()
    assert got.shape == (2, 5, 64) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("cut", [2, [64]])
def test_halves_of_a_view_that_regroups_the_products_rows_are_left_alone(cut):
    """The product ``[4, 256]`` viewed as ``[8, 128]`` and cut in two: each piece is a quarter of
    a product row, not the gate or the up half."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64), "float16"))
    w = relax.Var("w", relax.TensorType((256, 64), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w, [1, 0])), out_dtype="float32"))
            rows = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(product, "float16")), [8, 128]))
            pieces = bb.emit(relax.op.split(rows, cut, axis=-1))
            gate, up = (bb.emit(relax.TupleGetItem(pieces, n)) for n in range(2))
            out = bb.emit_output(relax.op.multiply(bb.emit(relax.op.nn.silu(gate)), up))
        bb.emit_func_output(out)
    rewritten = FuseGatedProjections(bb.get())
    assert not any(gv.name_hint.startswith("gated_projection") for gv in rewritten.functions)
