"""Reductions over an axis that is not the innermost, or over a window the points slide along
(tvm_dsm.rules.strided_rows): the forms users write (ConvNeXt's channels-first LayerNorm,
TOPI's softmax and sum over ``axis=1``, a 1-D conv net's norm over its channels, TOPI's
depthwise convolution and average pooling), one kernel a thread per point; what it refuses, by
name; on the GPU against float64."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.strided_rows import StridedRows
from tvm_dsm.hardware import load_hardware
from tvm_dsm.rules.strided_rows import MAX_ROW, find_strided_rows

from conftest import TARGET


def convnext_norm(b=32, c=96, h=56, w=56):
    """``LayerNorm(data_format="channels_first")`` as ConvNeXt's class writes it: the mean, the
    mean of the centred squares, over the channels of NCHW."""
    x = te.placeholder((b, c, h, w), "float16", name="x")
    g, beta = te.placeholder((c,), "float16", name="g"), te.placeholder((c,), "float16", name="beta")
    r1, r2 = te.reduce_axis((0, c), name="r1"), te.reduce_axis((0, c), name="r2")
    total = te.compute((b, h, w), lambda n, i, j: te.sum(x[n, r1, i, j].astype("float32"), axis=r1), name="total")
    mean = te.compute((b, h, w), lambda n, i, j: total[n, i, j] / c, name="mean")
    squares = te.compute((b, h, w), lambda n, i, j: te.sum(
        (x[n, r2, i, j].astype("float32") - mean[n, i, j]) * (x[n, r2, i, j].astype("float32") - mean[n, i, j]),
        axis=r2), name="squares")
    var = te.compute((b, h, w), lambda n, i, j: squares[n, i, j] / c, name="var")
    y = te.compute((b, c, h, w), lambda n, k, i, j: ((x[n, k, i, j].astype("float32") - mean[n, i, j])
                                                     * te.rsqrt(var[n, i, j] + 1e-6) * g[k].astype("float32")
                                                     + beta[k].astype("float32")).astype("float16"), name="y")
    return te.create_prim_func([x, g, beta, y])


def channel_softmax(b=16, c=64, h=32, w=32):
    x = te.placeholder((b, c, h, w), "float16", name="x")
    return te.create_prim_func([x, topi.cast(topi.nn.softmax(topi.cast(x, "float32"), axis=1), "float16")])


def channel_sum(b=8, c=48, h=64, w=64):
    x = te.placeholder((b, c, h, w), "float32", name="x")
    return te.create_prim_func([x, topi.sum(x, axis=1)])


def sequence_norm(b=32, c=128, t=1000):
    """A 1-D conv net's norm over the channels of ``[B, C, T]``, its variance as
    ``E[x^2] - E[x]^2``."""
    x = te.placeholder((b, c, t), "float16", name="x")
    r1, r2 = te.reduce_axis((0, c), name="r1"), te.reduce_axis((0, c), name="r2")
    s1 = te.compute((b, t), lambda n, i: te.sum(x[n, r1, i].astype("float32"), axis=r1), name="s1")
    s2 = te.compute((b, t), lambda n, i: te.sum(x[n, r2, i].astype("float32") * x[n, r2, i].astype("float32"),
                                                axis=r2), name="s2")
    y = te.compute((b, c, t), lambda n, k, i: ((x[n, k, i].astype("float32") - s1[n, i] / c) * te.rsqrt(
        s2[n, i] / c - s1[n, i] / c * (s1[n, i] / c) + 1e-5)).astype("float16"), name="y")
    return te.create_prim_func([x, y])


FORMS = [convnext_norm, channel_softmax, channel_sum, sequence_norm]


@pytest.mark.parametrize("make", FORMS, ids=lambda m: m.__name__)
def test_reductions_over_the_channels_are_one_kernel_a_thread_per_point(make, ptxas_report):
    func = make()
    assert tvm_dsm.plan(func).family.name == "strided_rows"
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    report = ptxas_report(source, make.__name__)
    assert report.count("Compiling entry function") == 1 and "0 bytes spill stores" in report


def test_a_row_read_by_several_passes_is_held_in_registers():
    found = find_strided_rows(convnext_norm())
    assert [t.name for t in found.held] == ["x"] and found.row == 96 and found.points == 32 * 56 * 56
    assert tvm_dsm.plan(convnext_norm()).plans[0].config.held
    assert "x_local" in tvm_dsm.build(convnext_norm()).mod.imports[0].inspect_source()


def _innermost_softmax():
    x = te.placeholder((4096, 200), "float16", name="x")
    return te.create_prim_func([x, topi.nn.softmax(topi.cast(x, "float32"), axis=1)])


@pytest.mark.parametrize("make, limit", [
    (_innermost_softmax, "over its innermost axis"),
    (lambda: channel_sum(8, MAX_ROW + 1, 64, 64), f"a row of at most {MAX_ROW}"),
])
def test_it_refuses_with_the_limit_named(make, limit):
    with pytest.raises(ClusterError, match=limit):
        find_strided_rows(make())


def test_too_few_points_to_fill_the_sms_are_left_to_the_other_families():
    with pytest.raises(ClusterError, match="fewer than 64 an SM"):
        StridedRows().rank(find_strided_rows(channel_sum(2, 48, 8, 8)), load_hardware())


def depthwise_conv(b=8, c=64, h=56, w=56, k=7):
    """TOPI's depthwise 7 x 7 convolution (ConvNeXt's), padded by 3, fp32 sums, a bias, fp16 out."""
    x = te.placeholder((b, c, h, w), "float16", name="x")
    kernel = te.placeholder((c, 1, k, k), "float16", name="kernel")
    bias = te.placeholder((c,), "float16", name="bias")
    y = topi.nn.depthwise_conv2d_nchw(x, kernel, 1, k // 2, 1, out_dtype="float32")
    return te.create_prim_func([x, kernel, bias, te.compute(
        y.shape, lambda n, o, i, j: (y[n, o, i, j] + bias[o].astype("float32")).astype("float16"), name="out")])


def average_pool(b=8, c=64, h=56, w=56):
    """TOPI's 3 x 3 average pooling, stride 1, padded by 1 (the padding counted)."""
    x = te.placeholder((b, c, h, w), "float32", name="x")
    return te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg", layout="NCHW")])


WINDOWS = [depthwise_conv, average_pool]


@pytest.mark.parametrize("make", WINDOWS, ids=lambda m: m.__name__)
def test_windows_the_points_slide_along_are_one_kernel_a_thread_per_point(make, ptxas_report):
    func = make()
    assert tvm_dsm.plan(func).family.name == "strided_rows"
    report = ptxas_report(tvm_dsm.build(func).mod.imports[0].inspect_source(), make.__name__)
    assert report.count("Compiling entry function") == 1 and "0 bytes spill stores" in report


def test_a_windows_padding_is_read_without_branches_and_gives_the_same_numbers():
    """Each padded read becomes a select of a load at clamped indices: the same values on llvm,
    and no ``if_then_else`` left for the kernel to branch on per term."""
    from tvm_dsm.ir import IF_THEN_ELSE, find_all

    func = depthwise_conv(2, 8, 9, 10)
    found = find_strided_rows(func)
    assert not find_all(found.func.body, tvm.ir.Call, lambda c: c.op.same_as(IF_THEN_ELSE))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params[:-1]]
    outs = []
    for f in (func, found.func):
        out = tvm.runtime.tensor(np.full([int(d) for d in func.params[-1].ty.shape], np.nan, "float16"))
        tvm.compile(f, target="llvm")(*(tvm.runtime.tensor(a) for a in arrays), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_product_over_a_short_k_is_left_to_the_gemm_families():
    a, b = te.placeholder((4096, 64), "float16", name="a"), te.placeholder((64, 4096), "float16", name="b")
    r = te.reduce_axis((0, 64), name="r")
    func = te.create_prim_func([a, b, te.compute((4096, 4096), lambda i, j: te.sum(
        a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r))])
    with pytest.raises(ClusterError, match="a matmul"):
        find_strided_rows(func)


def test_a_product_of_two_tensors_at_one_point_is_a_row_and_a_convolution_over_channels_a_matmul():
    """``sum_c x * y`` over the channels (a cosine similarity's numerator) is the family's; a
    3 x 3 convolution over 16 input channels (144 terms) multiplies tensors over points each
    varies with alone: the GEMM families' form, refused."""
    x, y = te.placeholder((8, 96, 32, 32), "float16", name="x"), te.placeholder((8, 96, 32, 32), "float16", name="y")
    c = te.reduce_axis((0, 96), name="c")
    dot = te.compute((8, 32, 32), lambda n, i, j: te.sum(
        x[n, c, i, j].astype("float32") * y[n, c, i, j].astype("float32"), axis=c), name="dot")
    assert find_strided_rows(te.create_prim_func([x, y, dot])).row == 96
    image, kernel = te.placeholder((8, 16, 56, 56), "float16", name="image"), te.placeholder((32, 16, 3, 3), "float16")
    conv = topi.nn.conv2d_nchw(image, kernel, 1, 1, 1, out_dtype="float32")
    with pytest.raises(ClusterError, match="a matmul"):
        find_strided_rows(te.create_prim_func([image, kernel, conv]))


def test_a_sum_over_the_last_axis_kept_as_a_unit_axis_is_the_row_norms_form():
    x = te.placeholder((4096, 128), "float32", name="x")
    with pytest.raises(ClusterError, match="the row norm's form"):
        find_strided_rows(te.create_prim_func([x, topi.sum(x, axis=-1, keepdims=True)]))


def test_a_window_read_two_points_apart_is_refused():
    x = te.placeholder((8, 64, 112, 112), "float32", name="x")
    with pytest.raises(ClusterError, match="innermost axis"):
        find_strided_rows(te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "avg",
                                                                 layout="NCHW")]))


def _window_reference(make, x, extra):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (3, 3), (3, 3)) if make is depthwise_conv else
               ((0, 0), (0, 0), (1, 1), (1, 1)))
    size = 7 if make is depthwise_conv else 3
    h, w = x.shape[2] - size + 1, x.shape[3] - size + 1
    out = np.zeros(x.shape[:2] + (h, w))
    for i in range(size):
        for j in range(size):
            weight = extra[0][None, :, 0, i, j, None, None].astype(np.float64) if extra else 1 / 9
            out += x[:, :, i:i + h, j:j + w] * weight
    return out + extra[1].astype(np.float64)[None, :, None, None] if extra else out


@pytest.mark.gpu
@pytest.mark.parametrize("make", WINDOWS, ids=lambda m: m.__name__)
def test_gpu_windows_match_float64(make):
    func = make()
    rng = np.random.default_rng()
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    dtypes = [str(p.ty.dtype) for p in func.params]
    x = rng.standard_normal(shapes[0]).astype(dtypes[0])
    extra = [(rng.standard_normal(s) / 7).astype(t) for s, t in zip(shapes[1:-1], dtypes[1:-1])]
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, dtypes[-1]), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in [x, *extra]), out)
    ref = _window_reference(make, x, extra)
    bound = 1e-5 if dtypes[-1] == "float32" else 2e-3
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < bound


def _reference(make, x):
    x = x.astype(np.float64)
    if make is channel_sum:
        return x.sum(1)
    if make is channel_softmax:
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    mean = x.mean(1, keepdims=True)
    var = ((x - mean) ** 2).mean(1, keepdims=True)
    return (x - mean) / np.sqrt(var + (1e-6 if make is convnext_norm else 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("make", FORMS, ids=lambda m: m.__name__)
def test_gpu_it_matches_float64(make):
    func = make()
    params = [p for p in func.params]
    rng = np.random.default_rng()
    x = (rng.standard_normal([int(d) for d in params[0].ty.shape]) * 3 + 1).astype(str(params[0].ty.dtype))
    extra = [np.ones(int(p.ty.shape[0]), "float16") if p.name == "g" else np.zeros(int(p.ty.shape[0]), "float16")
             for p in params[1:-1]]
    out_shape = [int(d) for d in params[-1].ty.shape]
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, str(params[-1].ty.dtype)), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in [x, *extra]), out)
    ref = _reference(make, x)
    bound = 1e-5 if str(params[-1].ty.dtype) == "float32" else 2e-3
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < bound
