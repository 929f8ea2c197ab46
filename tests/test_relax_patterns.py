"""tvm_dsm.relax_patterns: a decomposed RMSNorm (as torch.export and from_exported_program leave
it) put back as ``R.nn.rms_norm``, computing the same values, taken by the row_norm family; a
graph that is not exactly that left unchanged."""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (numpy's "bfloat16")
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_patterns import RewriteToRelaxOps, rewrite_rms_norms
from conftest import LLVM

WIDTH = 64


@I.ir_module
class TorchStyle:
    """HF's LlamaRMSNorm on fp16: statistics in fp32, rounded to fp16, then times the weight."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float16"), w: R.Tensor((64,), "float16")):
        with R.dataflow():
            x32 = R.astype(x, "float32")
            square = R.power(x32, R.const(2.0, "float32"))
            mean = R.mean(square, axis=[-1], keepdims=True)
            rms = R.rsqrt(R.add(mean, R.const(1e-5, "float32")))
            normed = R.astype(R.multiply(x32, rms), "float16")
            out = R.multiply(w, normed)
            R.output(out)
        return out


@I.ir_module
class Float32:
    """The same in fp32 with ``x * x``, the weight multiplied straight away: TOPI's own form."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), w: R.Tensor((64,), "float32")):
        with R.dataflow():
            mean = R.mean(R.multiply(x, x), axis=[2], keepdims=True)
            out = R.multiply(R.multiply(R.rsqrt(R.add(R.const(1e-6, "float32"), mean)), x), w)
            R.output(out)
        return out


@I.ir_module
class SymbolicRows:
    """HF's form on a symbolic number of bf16 rows, the weight on the left of the cast."""

    @R.function
    def main(x: R.Tensor(("n", 64), "bfloat16"), w: R.Tensor((64,), "bfloat16")):
        with R.dataflow():
            x32 = R.astype(x, "float32")
            mean = R.mean(R.power(x32, R.const(2.0, "float32")), axis=[1], keepdims=True)
            out = R.multiply(w, R.astype(R.multiply(x32, R.rsqrt(R.add(mean, R.const(1e-5, "float32")))),
                                         "bfloat16"))
            R.output(out)
        return out


@I.ir_module
class Float32Row:
    """An fp32 row (the residual stream from_exported_program makes), rounded to fp16 before the
    fp16 weight."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), w: R.Tensor((64,), "float16")):
        with R.dataflow():
            x32 = R.astype(x, "float32")
            mean = R.mean(R.power(x32, R.const(2.0, "float32")), axis=[-1], keepdims=True)
            out = R.multiply(R.astype(R.multiply(x32, R.rsqrt(R.add(mean, R.const(1e-5, "float32")))),
                                      "float16"), w)
            R.output(out)
        return out


@I.ir_module
class CastTwice:
    """Qwen2's and T5's form: ``w * (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).to(t)``,
    the row widened twice (two casts of one value until common subexpressions are merged)."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float16"), w: R.Tensor((64,), "float16")):
        with R.dataflow():
            mean = R.mean(R.power(R.astype(x, "float32"), R.const(2.0, "float32")), axis=[-1], keepdims=True)
            normed = R.multiply(R.astype(x, "float32"), R.rsqrt(R.add(mean, R.const(1e-6, "float32"))))
            out = R.multiply(w, R.astype(normed, "float16"))
            R.output(out)
        return out


def _calls(mod: tvm.IRModule) -> list[relax.Call]:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found.append(expr)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _ops(mod: tvm.IRModule) -> list[str]:
    return [call.op.name for call in _calls(mod)]


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


@pytest.mark.parametrize("mod, dtype, shape", [(TorchStyle, "float16", (2, 3, WIDTH)),
                                               (Float32, "float32", (2, 3, WIDTH)),
                                               (SymbolicRows, "bfloat16", (5, WIDTH)),
                                               (Float32Row, "float32", (2, 3, WIDTH))],
                         ids=["fp16", "fp32", "bf16_symbolic_rows", "fp32_row_fp16_weight"])
def test_a_decomposed_rms_norm_becomes_r_nn_rms_norm_with_the_same_values(mod, dtype, shape):
    rewritten = RewriteToRelaxOps(mod)
    ops = _ops(rewritten)
    assert ops.count("relax.nn.rms_norm") == 1, rewritten.script()
    assert not {"relax.power", "relax.mean", "relax.rsqrt"} & set(ops)
    # rounded to 16 bits before the weight as the graph was: a norm of unit weight, then the weight
    assert ops.count("relax.multiply") == (0 if mod is Float32 else 1)
    assert tvm_ffi.structural_equal(rewritten["main"].ty, mod["main"].ty)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    w = rng.standard_normal(WIDTH).astype(str(mod["main"].params[1].ty.dtype))
    before, after = _run(mod, x, w), _run(rewritten, x, w)
    np.testing.assert_array_equal(after, before)  # the same arithmetic, the sum in the same order


def test_a_row_widened_twice_is_one_norm_once_its_casts_are_merged():
    """The rewrite matches the row as one value: after Relax's common-subexpression elimination
    (the pipeline's first pass) the two casts are one, and the norm the same values."""
    assert "relax.nn.rms_norm" not in _ops(RewriteToRelaxOps(CastTwice))
    rewritten = RewriteToRelaxOps(relax.transform.EliminateCommonSubexpr()(CastTwice))
    assert _ops(rewritten).count("relax.nn.rms_norm") == 1, rewritten.script()
    rng = np.random.default_rng(1)
    x, w = (rng.standard_normal((2, 3, WIDTH)) * 3).astype("float16"), rng.standard_normal(WIDTH).astype("float16")
    np.testing.assert_array_equal(_run(rewritten, x, w), _run(CastTwice, x, w))


@pytest.mark.parametrize("mod", [TorchStyle, SymbolicRows, Float32Row, CastTwice],
                         ids=["fp16", "bf16_symbolic_rows", "fp32_row_fp16_weight", "cast_twice"])
def test_the_rewritten_norm_is_one_kernel_the_row_norm_family_takes(mod):
    """Without the rewrite Relax cuts it in three (the cast, the square, the rest)."""
    report = relax_report(mod)
    assert [row.where for row in report.rows] == ["row_norm"], report.format()


@I.ir_module
class MeanOverRows:
    """Near miss: the mean over axis 1 (a norm over the sequence, not the row)."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), w: R.Tensor((64,), "float32")):
        with R.dataflow():
            mean = R.mean(R.multiply(x, x), axis=[1], keepdims=True)
            out = R.multiply(R.multiply(x, R.rsqrt(R.add(mean, R.const(1e-6, "float32")))), w)
            R.output(out)
        return out


@I.ir_module
class Cube:
    """Near miss: x ** 3."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), w: R.Tensor((64,), "float32")):
        with R.dataflow():
            mean = R.mean(R.power(x, R.const(3.0, "float32")), axis=[-1], keepdims=True)
            out = R.multiply(R.multiply(x, R.rsqrt(R.add(mean, R.const(1e-6, "float32")))), w)
            R.output(out)
        return out


@I.ir_module
class Float16Statistics:
    """The whole norm in fp16: its statistics rounded to 11 bits (TOPI's rms_norm widens them)."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float16"), w: R.Tensor((64,), "float16")):
        with R.dataflow():
            mean = R.mean(R.multiply(x, x), axis=[-1], keepdims=True)
            out = R.multiply(R.multiply(x, R.rsqrt(R.add(mean, R.const(1e-5, "float16")))), w)
            R.output(out)
        return out


@I.ir_module
class RowWeight:
    """Near miss: multiplied by a tensor of the row's shape, not a per-column weight."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), w: R.Tensor((2, 3, 64), "float32")):
        with R.dataflow():
            mean = R.mean(R.multiply(x, x), axis=[-1], keepdims=True)
            out = R.multiply(R.multiply(x, R.rsqrt(R.add(mean, R.const(1e-6, "float32")))), w)
            R.output(out)
        return out


@I.ir_module
class OtherRow:
    """Near miss: the statistics of one tensor applied to another."""

    @R.function
    def main(x: R.Tensor((2, 3, 64), "float32"), y: R.Tensor((2, 3, 64), "float32"),
             w: R.Tensor((64,), "float32")):
        with R.dataflow():
            mean = R.mean(R.multiply(x, x), axis=[-1], keepdims=True)
            out = R.multiply(R.multiply(y, R.rsqrt(R.add(mean, R.const(1e-6, "float32")))), w)
            R.output(out)
        return out


def _hand_written(divisor: float) -> tvm.IRModule:
    """An fp32 norm written by hand: the sum of squares divided by ``divisor`` (the width makes it
    the mean), ``x / sqrt(..)``, times the weight."""
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", R.Tensor((2, 3, WIDTH), "float32")), relax.Var("w", R.Tensor((WIDTH,), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            var = relax.op.divide(relax.op.sum(relax.op.multiply(x, x), axis=[-1], keepdims=True),
                                  relax.const(divisor, "float32"))
            root = relax.op.sqrt(relax.op.add(var, relax.const(1e-6, "float32")))
            out = bb.emit_output(relax.op.multiply(relax.op.divide(x, root), w))
        bb.emit_func_output(out)
    return bb.get()


HandWritten = _hand_written(WIDTH)
SumOverOtherWidth = _hand_written(WIDTH / 2)  # near miss: not the mean


@pytest.mark.parametrize("mod", [MeanOverRows, Cube, RowWeight, OtherRow, SumOverOtherWidth],
                         ids=["mean_over_rows", "cube", "row_weight", "other_row", "sum_over_other_width"])
def test_a_near_miss_is_left_unchanged(mod):
    assert rewrite_rms_norms(mod["main"]).same_as(mod["main"])
    assert tvm_ffi.structural_equal(RewriteToRelaxOps(mod), mod)


@pytest.mark.parametrize("mod, dtype", [(HandWritten, "float32"), (Float16Statistics, "float16")],
                         ids=["fp32_sum_and_sqrt", "fp16_statistics"])
def test_a_norm_written_otherwise_becomes_r_nn_rms_norm_no_further_from_float64(mod, dtype):
    """A sum over the width and a division by the root (fp32: the same values up to one
    rounding), or a norm wholly in fp16, whose statistics TOPI computes in fp32 (closer to
    float64 than the graph's fp16 roundings)."""
    rewritten = RewriteToRelaxOps(mod)
    ops = _ops(rewritten)
    assert ops == ["relax.nn.rms_norm"], rewritten.script()
    assert [row.where for row in relax_report(mod).rows] == ["row_norm"]
    rng = np.random.default_rng(1)
    x, w = (rng.standard_normal(shape).astype(dtype) for shape in ((2, 3, WIDTH), (WIDTH,)))
    before, after = (_run(m, x, w).astype(np.float64) for m in (mod, rewritten))
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + (1e-6 if dtype == "float32" else 1e-5)) * w
    error = lambda got: np.linalg.norm(got - ref) / np.linalg.norm(ref)  # noqa: E731
    if dtype == "float32":  # both at fp32's rounding
        assert error(after) < 1e-6 and np.linalg.norm(after - before) / np.linalg.norm(before) < 1e-6
    else:
        assert error(after) < error(before)


def _spelled_out(form: str, dtype: str, last_axis: bool = True) -> tvm.IRModule:
    """A softmax or log-softmax over rows of ``[2, 3, 64]`` written with max, exp, sum, log (over
    the middle axis instead where not ``last_axis``: a near miss)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((2, 3, WIDTH), dtype))
    axis = [-1] if last_axis else [1]
    with bb.function("main", [x]):
        with bb.dataflow():
            shifted = bb.emit(relax.op.subtract(x, relax.op.max(x, axis=axis, keepdims=True)))
            exp = bb.emit(relax.op.exp(shifted))
            total = bb.emit(relax.op.sum(exp, axis=axis, keepdims=True))
            out = relax.op.divide(exp, total) if form == "softmax" else relax.op.subtract(shifted, relax.op.log(total))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("form", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_spelled_out_softmax_becomes_the_relax_operator_with_the_same_values(form, dtype):
    mod = _spelled_out(form, dtype)
    rewritten = RewriteToRelaxOps(mod)
    assert _ops(rewritten) == [f"relax.nn.{form}"], rewritten.script()
    assert [row.where for row in relax_report(mod).rows] == ["row_norm"]
    x = (np.random.default_rng(2).standard_normal((2, 3, WIDTH)) * 3).astype(dtype)
    np.testing.assert_allclose(_run(rewritten, x), _run(mod, x), rtol=1e-6 if dtype == "float32" else 2e-3,
                               atol=1e-7 if dtype == "float32" else 1e-3)
    assert tvm_ffi.structural_equal(RewriteToRelaxOps(_spelled_out(form, dtype, last_axis=False)),
                                    _spelled_out(form, dtype, last_axis=False), map_free_vars=True)


def test_transposes_that_undo_each_other_are_removed_and_others_composed():
    """torch's ``transpose(1, 2)`` then the attention operator's layout back: no transpose; two
    that do not cancel: one transpose of their composition, the same values."""
    from tvm.script import relax as R
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    @R.function
    def main(x: R.Tensor((2, 3, 4, 5), "float32")):
        with R.dataflow():
            undone = R.permute_dims(R.permute_dims(x, [0, 2, 1, 3]), [0, 2, 1, 3])
            composed = R.permute_dims(R.permute_dims(x, [0, 2, 1, 3]), [3, 0, 2, 1])
            out = (R.add(undone, x), composed)
            R.output(out)
        return out

    mod = tvm.IRModule({"main": main})
    rewritten = RewriteToRelaxOps(mod)
    assert _ops(rewritten).count("relax.permute_dims") == 1, rewritten.script()
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    doubled, composed = vm["main"](tvm.runtime.tensor(x))
    np.testing.assert_array_equal(doubled.numpy(), 2 * x)
    np.testing.assert_array_equal(composed.numpy(), x.transpose(0, 2, 1, 3).transpose(3, 0, 2, 1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_product_of_operands_widened_to_fp32_is_their_16_bit_product_accumulated_in_fp32(dtype):
    """``a.float() @ b.float()`` (GPT-BigCode's and GPT-J's scores): one matmul of the 16-bit
    operands with an fp32 result, bit for bit the same values; a product of operands of two
    types, or narrowed, is left alone."""
    a, b = relax.Var("a", relax.TensorType((2, 8, 16), dtype)), relax.Var("b", relax.TensorType((2, 16, 4), dtype))
    c = relax.Var("c", relax.TensorType((2, 16, 4), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [a, b, c]):
        with builder.dataflow():
            wide_a = builder.emit(relax.op.astype(a, "float32"))
            wide = builder.emit(relax.op.matmul(wide_a, builder.emit(relax.op.astype(b, "float32"))))
            mixed = builder.emit(relax.op.matmul(wide_a, c))
            out = builder.emit_output(relax.Tuple([wide, mixed]))
        builder.emit_func_output(out)
    mod = builder.get()
    rewritten = RewriteToRelaxOps(mod)
    assert _ops(rewritten).count("relax.astype") == 1, rewritten.script()  # the mixed product's
    rng = np.random.default_rng(0)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    inputs = [rng.standard_normal((2, 8, 16)).astype(dt), rng.standard_normal((2, 16, 4)).astype(dt),
              rng.standard_normal((2, 16, 4)).astype("float32")]
    runs = []
    for m in (mod, rewritten):
        vm = relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())
        runs.append([o.numpy() for o in vm["main"](*(tvm.runtime.tensor(x) for x in inputs))])
    for got, want in zip(*runs):
        np.testing.assert_array_equal(got, want)


def test_a_packed_projection_unbound_after_its_transpose_is_sliced_where_it_lies():
    """timm's ViT: ``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``, then the
    attention operator's layout: each part a slice of the reshaped projection, no transpose left
    (the whole-tensor transpose kernel gone); a slice and squeeze whose transpose moves only a
    unit axis (``y.permute(1, 0, 2)[:, 1:3].squeeze(0)``) none either; one that stays
    (``y.permute(2, 0, 1)[1:3]``) keeps it; the same values."""

    @R.function
    def main(qkv: R.Tensor((2, 5, 96), "float32"), y: R.Tensor((4, 1, 6), "float32")):
        with R.dataflow():
            packed = R.permute_dims(R.reshape(qkv, R.shape([2, 5, 3, 2, 16])), [2, 0, 3, 1, 4])
            parts = [R.permute_dims(R.squeeze(R.strided_slice(packed, [0], [i], [i + 1]), [0]), [0, 2, 1, 3])
                     for i in range(3)]
            kept = R.squeeze(R.strided_slice(R.permute_dims(y, [1, 0, 2]), [1], [1], [3]), [0])
            moved = R.strided_slice(R.permute_dims(y, [2, 0, 1]), [0], [1], [3])
            out = (R.nn.attention(parts[0], parts[1], parts[2]), kept, moved)
            R.output(out)
        return out

    mod = tvm.IRModule({"main": main})
    rewritten = RewriteToRelaxOps(mod)
    assert _ops(rewritten).count("relax.permute_dims") == 1, rewritten.script()
    assert tvm_ffi.structural_equal(rewritten["main"].ty, mod["main"].ty)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal((2, 5, 96)).astype("float32"), rng.standard_normal((4, 1, 6)).astype("float32")]
    vms = [relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu()) for m in (mod, rewritten)]
    (want_a, want_k, want_m), (got_a, got_k, got_m) = (vm["main"](*(tvm.runtime.tensor(a) for a in args))
                                                       for vm in vms)
    np.testing.assert_allclose(got_a.numpy(), want_a.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_k.numpy(), args[1].transpose(1, 0, 2)[0, 1:3])
    np.testing.assert_array_equal(want_k.numpy(), got_k.numpy())
    np.testing.assert_array_equal(got_m.numpy(), args[1].transpose(2, 0, 1)[1:3])
    np.testing.assert_array_equal(want_m.numpy(), got_m.numpy())


def _spelled_attention(scale_op: str = "divide", mask: bool = True, dtype: str = "float16") -> tvm.IRModule:
    """BERT's attention as tvm_dsm.relax_torch imports ``softmax(q @ k.transpose(-1, -2) / 8 +
    mask) @ v`` over ``[2, 4, 16, 64]``: batched views of each operand, each product's fp32
    result cast and viewed back."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((2, 4, 16, 64), dtype)) for n in "qkv")
    m = relax.Var("m", relax.TensorType((2, 1, 1, 16), dtype))
    with bb.function("main", [q, k, v, m]):
        with bb.dataflow():
            def batched(t, shape):
                return bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(t, t.ty.shape)), shape))

            def product(a, b, shape):
                wide = bb.emit(relax.op.matmul(a, b, out_dtype="float32"))
                return bb.emit(relax.op.reshape(bb.emit(relax.op.astype(wide, dtype)), shape))

            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            s = product(batched(q, (8, 16, 64)), batched(kt, (8, 64, 16)), (2, 4, 16, 16))
            if scale_op == "divide":
                s = bb.emit(relax.op.divide(s, relax.const(8.0, dtype)))
            if mask:
                s = bb.emit(relax.op.add(s, m))
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            out = bb.emit_output(product(batched(p, (8, 16, 16)), batched(v, (8, 16, 64)), (2, 4, 16, 64)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("scale_op, mask", [("divide", True), ("none", False)])
def test_spelled_out_16_bit_attention_becomes_r_nn_attention_the_family_takes(scale_op, mask):
    from tvm_dsm.model_report import relax_report
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    mod = _spelled_attention(scale_op, mask)
    rewritten = RewriteToRelaxOps(mod)
    ops = _ops(rewritten)
    assert "relax.nn.softmax" not in ops and "relax.matmul" not in ops, rewritten.script()
    assert relax_report(mod).counts().get("attention", 0) == 1
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 4, 16, 64)).astype("float16") for _ in range(3))
    m = np.where(rng.random((2, 1, 1, 16)) < 0.2, -1e4, 0).astype("float16")
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / (8.0 if scale_op == "divide" else 1.0)
    s = s + (m.astype(np.float64) if mask else 0)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v, m))).numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3


def test_spelled_out_fp32_attention_is_left_alone():
    """The attention family computes 16-bit attention (probabilities rounded): an fp32 one
    stays as written."""
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    assert "relax.nn.softmax" in _ops(RewriteToRelaxOps(_spelled_attention(dtype="float32")))


def _bmm(bb: relax.BlockBuilder, a, b, shape) -> relax.Var:
    """torch's ``matmul`` of two 4-D 16-bit tensors as its exporter writes it: each broadcast and
    viewed ``[batch * heads, ..]``, the product in fp32 rounded back and viewed as ``shape``."""
    def batched(t):
        lead = int(t.ty.shape.values[0]) * int(t.ty.shape.values[1])
        return bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(t, t.ty.shape)), (lead, *t.ty.shape.values[2:])))
    wide = bb.emit(relax.op.matmul(batched(a), batched(b), out_dtype="float32"))
    return bb.emit(relax.op.reshape(bb.emit(relax.op.astype(wide, "float16")), shape))


def test_k_transposed_into_heads_then_its_last_axes_is_attention():
    """Hugging Face's eager attention (BERT, Llama): q, k and v ``[B, S, H, D]`` transposed into
    heads, k's last two axes then swapped for the scores, the products over torch's batched
    views: ``R.nn.attention`` (the view rewrites merge only transposes that undo each other or
    transpose an ``expand_dims``; merged, k's two read as one the pattern does not name)."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((2, 16, 4, 64), "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            qh, kh, vh = (bb.emit(relax.op.permute_dims(t, [0, 2, 1, 3])) for t in (q, k, v))
            kt = bb.emit(relax.op.permute_dims(kh, [0, 1, 3, 2]))
            s = _bmm(bb, qh, kt, (2, 4, 16, 16))
            p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.multiply(s, relax.const(0.125, "float16"))), axis=-1))
            out = bb.emit_output(_bmm(bb, p, vh, (2, 4, 16, 64)))
        bb.emit_func_output(out)
    ops = _ops(RewriteToRelaxOps(bb.get()))
    assert "relax.nn.attention" in ops and "relax.nn.softmax" not in ops, ops


def test_a_batched_product_viewed_straight_to_the_tokens_is_a_four_d_matmul():
    """Hugging Face's eager decode: the weighted sum over ``[batch * heads]`` views, viewed back
    to ``[B, H, 1, D]``, transposed to ``[B, 1, H, D]`` (a unit axis moved) and viewed as the
    tokens ``[B, 1, H * D]``: the view rewrites fold the back-view and the transpose into one
    reshape, so the product is viewed straight to the tokens; it is still Relax's 4-D ``matmul``
    (no batched views copied), then that reshape, the same values on llvm."""
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    bb = relax.BlockBuilder()
    p = relax.Var("p", relax.TensorType((2, 4, 1, 16), "float16"))
    v = relax.Var("v", relax.TensorType((2, 4, 16, 8), "float16"))
    with bb.function("main", [p, v]):
        with bb.dataflow():
            out = _bmm(bb, p, v, (2, 4, 1, 8))
            out = bb.emit(relax.op.permute_dims(out, [0, 2, 1, 3]))
            out = bb.emit_output(relax.op.reshape(out, (2, 1, 32)))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = RewriteToRelaxOps(mod)
    assert "relax.broadcast_to" not in _ops(rewritten) and "relax.matmul" in _ops(rewritten)
    rng = np.random.default_rng(4)
    args = [rng.standard_normal(s).astype("float16") for s in ((2, 4, 1, 16), (2, 4, 16, 8))]
    got, want = (relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in args)).numpy().astype(np.float64) for m in (rewritten, mod))
    assert np.array_equal(got, want)


def _head_rows_attention(scale_twice: bool) -> tvm.IRModule:
    """GPT-BigCode's multi-query attention as torch exports it: q ``[2, 16, 4 * 64]`` viewed as
    rows ``[2, 64, 64]`` (token-major, heads inside), scores against one KV head ``k^T [2, 64,
    16]`` in fp32 viewed as ``[2, 16, 4, 16]``, scaled (``scale_twice``: by 1/16, rounded to
    fp16, widened, by 2, as its fp32-softmax layers do), a causal ``where`` over ``[1, 16, 1,
    16]``, softmax rounded back, viewed as rows for the product with ``v [2, 16, 64]``."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((2, 16, 256), "float16"))
    k, v = (relax.Var(n, relax.TensorType((2, 16, 64), "float16")) for n in "kv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(q, (2, 64, 64)))
            s = bb.emit(relax.op.matmul(rows, bb.emit(relax.op.permute_dims(k, [0, 2, 1])), out_dtype="float32"))
            s = bb.emit(relax.op.reshape(s, (2, 16, 4, 16)))
            if scale_twice:
                s = bb.emit(relax.op.astype(bb.emit(relax.op.multiply(s, relax.const(1 / 16, "float32"))), "float16"))
                s = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(s, "float32")), relax.const(2.0, "float32")))
            else:
                s = bb.emit(relax.op.multiply(s, relax.const(0.125, "float32")))
            keep = relax.const(np.tril(np.ones((16, 16), bool))[None, :, None, :])
            s = bb.emit(relax.op.where(keep, s, relax.const(np.finfo(np.float32).min, "float32")))
            p = bb.emit(relax.op.astype(bb.emit(relax.op.nn.softmax(s, axis=-1)), "float16"))
            out = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(p, (2, 64, 16))), v, out_dtype="float32"))
            out = bb.emit_output(relax.op.reshape(bb.emit(relax.op.astype(out, "float16")), (2, 16, 256)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("scale_twice", [False, True])
def test_query_rows_holding_the_heads_are_multi_query_attention(scale_twice):
    """The scores are transposed to heads first, the mask with them, the two scalings folded:
    ``R.nn.attention`` (the mask then a bias the pipeline reads as causal), within fp16's
    rounding of the spelled-out graph's values on llvm."""
    mod = _head_rows_attention(scale_twice)
    rewritten = RewriteToRelaxOps(mod)
    ops = _ops(rewritten)
    assert "relax.nn.attention_bias" in ops and "relax.nn.softmax" not in ops, ops
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype("float16") for s in ((2, 16, 256), (2, 16, 64), (2, 16, 64))]
    got, want = (relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in args)).numpy().astype(np.float64) for m in (rewritten, mod))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_a_bias_over_the_batch_viewed_by_windows_and_a_second_bias_are_one_mask():
    """Swin's attention: the scores plus a relative position bias ``[1, H, N, N]`` (a constant),
    then viewed ``[B / W, W, H, N, N]`` plus a shifted-window mask ``[1, W, 1, N, N]`` (a
    constant), viewed back: ``R.nn.attention_bias`` with the two summed, the same values on llvm."""
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((8, 2, 16, 32), "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            s = _bmm(bb, q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])), (8, 2, 16, 16))
            s = bb.emit(relax.op.divide(s, relax.const(5.65625, "float16")))
            s = bb.emit(relax.op.add(s, relax.const(rng.standard_normal((1, 2, 16, 16)).astype("float16"))))
            mask = np.where(rng.random((1, 4, 1, 16, 16)) < 0.3, -100.0, 0.0).astype("float16")
            s = bb.emit(relax.op.add(bb.emit(relax.op.reshape(s, (2, 4, 2, 16, 16))), relax.const(mask)))
            p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.reshape(s, (8, 2, 16, 16))), axis=-1))
            out = bb.emit_output(_bmm(bb, p, v, (8, 2, 16, 32)))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = RewriteToRelaxOps(mod)
    assert "relax.nn.attention_bias" in _ops(rewritten) and "relax.nn.softmax" not in _ops(rewritten)
    args = [rng.standard_normal((8, 2, 16, 32)).astype("float16") for _ in range(3)]
    got, want = (relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in args)).numpy().astype(np.float64) for m in (rewritten, mod))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


@I.ir_module
class TokenMixing:
    """MLP-Mixer's token mixing as torch's importer writes a Linear over a transposed 3-D input:
    ``bmm`` of both operands expanded to the batch (the weight's transpose copied per sample)."""

    @R.function
    def main(x: R.Tensor((3, 20, 8), "float32"), w: R.Tensor((12, 20), "float32"), b: R.Tensor((12,), "float32")):
        with R.dataflow():
            xt = R.permute_dims(x, axes=[0, 2, 1])
            wt = R.permute_dims(w, axes=[1, 0])
            xb = R.broadcast_to(xt, R.shape([3, 8, 20]))
            wb = R.broadcast_to(wt, R.shape([3, 20, 12]))
            y = R.add(R.matmul(xb, wb, out_dtype="float32"), b)
            out = R.permute_dims(y, axes=[0, 2, 1])
            R.output(out)
        return out


@I.ir_module
class OuterBroadcasts:
    """Both operands of a product broadcast from matrices: dropping both would change its shape,
    the weight's alone does not."""

    @R.function
    def main(x: R.Tensor((8, 20), "float32"), w: R.Tensor((20, 12), "float32")):
        with R.dataflow():
            out = R.matmul(R.broadcast_to(x, R.shape([3, 8, 20])), R.broadcast_to(w, R.shape([3, 20, 12])))
            R.output(out)
        return out


def test_a_product_of_operands_broadcast_along_the_batch_reads_them_unbroadcast():
    rewritten = RewriteToRelaxOps(TokenMixing)
    assert "broadcast_to" not in rewritten.script()
    assert RewriteToRelaxOps(OuterBroadcasts).script().count("R.broadcast_to") == 1
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(s).astype("float32") for s in ((3, 20, 8), (12, 20), (12,))]
    outs = [relax.VirtualMachine(tvm.compile(m, LLVM), tvm.cpu())["main"](*map(tvm.runtime.tensor, inputs)).numpy()
            for m in (TokenMixing, rewritten)]
    ref = (inputs[0].transpose(0, 2, 1).astype(np.float64) @ inputs[1].T + inputs[2]).transpose(0, 2, 1)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5
