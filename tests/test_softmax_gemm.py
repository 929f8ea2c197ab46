"""softmax·V as one tiled kernel (tvm_dsm.kernels.softmax_gemm): what it accepts, what it refuses
and why, the kernel's structure and assembly, and on the GPU its results against float64."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from conftest import TARGET, cuda_source, host_launch
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.cascade_split import CascadeSplit
from tvm_dsm.kernels.softmax_gemm import (SoftmaxGemmConfig, check_config, default_config, find_softmax_gemm,
                                        fuse_softmax_gemm)
from tvm_dsm.workloads.cascades import softmax_pv, softmax_stats


def _cascade(m: int, k: int, j: int, scale: float = 1.0, outputs: str = "mlo", normalized: bool = False):
    """softmax(scale * X)·V written by hand: ``outputs`` names the results that are parameters
    (m: max, l: exp-sum, o: products); ``normalized`` adds o / l as a further stage."""
    x = te.placeholder((m, k), name="x")
    v = te.placeholder((k, j), name="v")
    r0, r1, r2 = (te.reduce_axis((0, k), n) for n in ("mk", "lk", "ok"))
    mx = te.compute((m,), lambda i: te.max(x[i, r0], axis=r0), name="mx")
    l = te.compute((m,), lambda i: te.sum(te.exp(scale * (x[i, r1] - mx[i])), axis=r1), name="l")
    o = te.compute((m, j), lambda i, c: te.sum(te.exp(scale * (x[i, r2] - mx[i])) * v[r2, c], axis=r2), name="o")
    results = {"m": mx, "l": l, "o": o}
    params = [x, v, *(results[n] for n in outputs)]
    if normalized:
        params.append(te.compute((m, j), lambda i, c: o[i, c] / l[i], name="out"))
    return te.create_prim_func(params)


def test_finds_the_cascade_and_its_element_function():
    found = find_softmax_gemm(softmax_pv(256, 512, 64))
    assert (found.shape.rows, found.shape.keys, found.shape.columns) == (256, 512, 64)
    assert str(found.element) == "exp(-m + x)" and found.written == (True, True, True)
    scaled = find_softmax_gemm(_cascade(64, 128, 32, scale=0.5))
    assert "0.5" in str(scaled.element)  # the function's own element, not a hard-coded exp(x - m)
    assert find_softmax_gemm(softmax_pv(64, 128, 32, "float16")).shape.x_dtype == "float16"


def test_refuses_what_it_does_not_compute_with_a_reason():
    with pytest.raises(ClusterError, match="row max, then a rescaled sum of products"):
        find_softmax_gemm(softmax_stats(64, 128))
    x = te.placeholder((64, 32), name="x")  # a stage reading X again
    v = te.placeholder((32, 16), name="v")
    r0, r1 = te.reduce_axis((0, 32), "mk"), te.reduce_axis((0, 32), "ok")
    mx = te.compute((64,), lambda i: te.max(x[i, r0], axis=r0), name="mx")
    o = te.compute((64, 16), lambda i, c: te.sum(te.exp(x[i, r1] - mx[i]) * v[r1, c], axis=r1), name="o")
    shifted = te.compute((64, 16), lambda i, c: o[i, c] - x[i, c], name="shifted")
    with pytest.raises(ClusterError, match="only the cascade's results of its row"):
        find_softmax_gemm(te.create_prim_func([x, v, shifted]))
    x = te.placeholder((64, 64), name="x")  # softmax(X)·X: V must be another matrix
    r0, r1 = te.reduce_axis((0, 64), "mk"), te.reduce_axis((0, 64), "ok")
    mx = te.compute((64,), lambda i: te.max(x[i, r0], axis=r0), name="mx")
    o = te.compute((64, 64), lambda i, c: te.sum(te.exp(x[i, r1] - mx[i]) * x[r1, c], axis=r1), name="o")
    with pytest.raises(ClusterError, match="times V"):
        find_softmax_gemm(te.create_prim_func([x, o]))
    with pytest.raises(ClusterError, match="not a multiple of block_m"):
        fuse_softmax_gemm(softmax_pv(64, 128, 32), SoftmaxGemmConfig(block_m=48))
    with pytest.raises(ClusterError, match="ranks"):
        check_config(find_softmax_gemm(softmax_pv(64, 1024, 64)).shape, SoftmaxGemmConfig(ranks=32))


def _normalized_p(m: int, k: int, j: int):
    """softmax(X)·V as usually written: P = exp(x - max) / sum, then P·V (P inlined into the
    product, which then reads the sum)."""
    x = te.placeholder((m, k), name="x")
    v = te.placeholder((k, j), name="v")
    r0, r1, r2 = (te.reduce_axis((0, k), n) for n in ("mk", "lk", "ok"))
    mx = te.compute((m,), lambda i: te.max(x[i, r0], axis=r0), name="mx")
    l = te.compute((m,), lambda i: te.sum(te.exp(x[i, r1] - mx[i]), axis=r1), name="l")
    p = te.compute((m, k), lambda i, t: te.exp(x[i, t] - mx[i]) / l[i], name="p")
    o = te.compute((m, j), lambda i, c: te.sum(p[i, r2] * v[r2, c], axis=r2), name="o")
    return te.create_prim_func([x, v, o])


def test_normalized_softmax_v_in_both_forms_takes_the_tiled_kernel():
    """P normalized before the product (the product reads the sum: the kernel scales by 1 / l
    when it writes) and o / l as a stage after the cascade (evaluated where O is written)."""
    inline = find_softmax_gemm(_normalized_p(256, 512, 64))
    assert str(inline.normalizer) == "1/l" and inline.written == (False, False, True)
    staged = find_softmax_gemm(_cascade(256, 512, 64, outputs="", normalized=True))
    assert [b.name_hint for b in staged.epilogue] == ["out"] and staged.normalizer == 1
    for func in (_normalized_p(256, 512, 64), _cascade(256, 512, 64, outputs="", normalized=True)):
        assert isinstance(tvm_dsm.plan(func).best.config, SoftmaxGemmConfig)
    source = cuda_source(fuse_softmax_gemm(_cascade(512, 4096, 64, outputs="", normalized=True),
                                           SoftmaxGemmConfig(32, 32, 64, 4, 8, 4)))
    assert "out_ptr[" in source and "o_ptr" not in source


def test_the_driver_takes_the_tiled_kernel_and_falls_back_where_no_tile_fits():
    tiled = tvm_dsm.plan(softmax_pv(2048, 512, 64))
    assert tiled.family.name == "softmax_gemm" and "softmax·V tiled" in tiled.best.config.explain()
    rows = tvm_dsm.plan(softmax_pv(8, 512, 64))  # 8 rows: below the smallest tile
    assert rows.family.name == "fused_cascade" and isinstance(rows.best.config, CascadeSplit)
    assert "__global__" in cuda_source(rows.schedule().mod)


@pytest.mark.parametrize("shape, ranks", [((2048, 512, 64), 8), ((512, 4096, 64), 16), ((4096, 1024, 128), 2)])
def test_default_config_gives_two_ctas_per_sm_with_the_fewest_ranks(shape, ranks):
    config = default_config(find_softmax_gemm(softmax_pv(*shape)).shape, load_hardware())
    assert config.ranks == ranks
    ctas = shape[0] // config.block_m * (shape[2] // config.block_j) * config.ranks
    assert ctas >= 264


def test_cluster_kernel_launches_every_cta_and_merges_through_dsm():
    """The grid counts every CTA (blockIdx.x = row blocks x ranks) and the cluster dimension is a
    launch parameter; the merge reads peers with mapa + ld.shared::cluster between cluster
    barriers."""
    mod = fuse_softmax_gemm(softmax_pv(512, 4096, 64), SoftmaxGemmConfig(32, 32, 64, 4, 8, 4))
    launch = host_launch(mod)[0]
    assert "clusterCtaIdx.x" in launch and "128, 1, 128, 8" in launch  # 16 row blocks x 8 ranks
    source = cuda_source(mod)
    assert "mapa.shared::cluster" in source and "ld.shared::cluster.f32" in source
    assert source.count("tvm_builtin_cuda_cluster_sync();") == 2


def test_parameters_follow_the_function():
    """Results the function keeps internal are not written; the kernel takes its parameters."""
    mod = fuse_softmax_gemm(_cascade(64, 256, 64, outputs="o"), hw=load_hardware())
    assert [p.name for p in mod["main"].params] == ["x", "v", "o"]
    assert "mx" not in host_launch(mod)[0]


@pytest.mark.parametrize("config", [SoftmaxGemmConfig(), SoftmaxGemmConfig(32, 32, 64, 4, 4, 4),
                                    SoftmaxGemmConfig(32, 64, 64, 4, 2, 8)])
def test_assembles_without_spills(config, ptxas_report):
    report = ptxas_report(cuda_source(fuse_softmax_gemm(softmax_pv(512, 1024, 64), config)), "softmax_gemm")
    assert "0 bytes spill stores" in report and "0 bytes stack frame" in report


def _run(func, mod, x: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
    lib = tvm.compile(mod, target=TARGET)
    dev = tvm.cuda(0)
    outs = [tvm.runtime.tensor(np.full([int(d) for d in p.ty.shape], np.nan, np.float32), dev)
            for p in func.params[2:]]
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(v, dev), *outs)
    return [o.numpy() for o in outs]


def _reference(x: np.ndarray, v: np.ndarray, scale: float = 1.0) -> dict[str, np.ndarray]:
    x, v = x.astype(np.float64), v.astype(np.float64)
    m = x.max(1)
    p = np.exp(scale * (x - m[:, None]))
    return {"m": m, "l": p.sum(1), "o": p @ v}


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dtype", [((2048, 512, 64), "float32"), ((64, 8192, 64), "float32"),
                                          ((4096, 1024, 128), "float32"), ((256, 2048, 64), "float16"),
                                          ((48, 96, 16), "float32")])
def test_gpu_planned_kernel_matches_float64(shape, dtype):
    func = softmax_pv(*shape, dtype)
    ranking = tvm_dsm.plan(func)
    sch, config = ranking.schedule(), ranking.best.config
    assert isinstance(config, SoftmaxGemmConfig)
    rng = np.random.default_rng()
    x = (rng.standard_normal(shape[:2]) * 3).astype(dtype)
    v = rng.standard_normal(shape[1:]).astype(dtype)
    ref = _reference(x, v)
    for out, name in zip(_run(func, sch.mod, x, v), "mlo"):
        assert np.linalg.norm(out - ref[name]) / np.linalg.norm(ref[name]) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.parametrize("form, config", [("inline", None), ("staged", None),
                                          ("inline", SoftmaxGemmConfig(32, 32, 64, 4, 1, 4)),
                                          ("staged", SoftmaxGemmConfig(16, 32, 64, 2, 16, 8))])
def test_gpu_normalized_softmax_v_matches_float64(form, config):
    """softmax(X)·V normalized, P before the product or o / l after it, planned (clusters) and
    in one CTA per tile; only the final output is a parameter (NaN-poisoned)."""
    m, k, j = 512, 2048, 64
    func = _normalized_p(m, k, j) if form == "inline" else _cascade(m, k, j, outputs="", normalized=True)
    mod = tvm_dsm.plan(func).schedule().mod if config is None else fuse_softmax_gemm(func, config)
    rng = np.random.default_rng()
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    v = rng.standard_normal((k, j)).astype(np.float32)
    (out,) = _run(func, mod, x, v)
    ref = _reference(x, v)
    want = ref["o"] / ref["l"][:, None]
    assert np.linalg.norm(out - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("config", [SoftmaxGemmConfig(16, 64, 32, 2, 16, 4), SoftmaxGemmConfig(32, 32, 64, 4, 1, 8),
                                    SoftmaxGemmConfig(16, 32, 64, 2, 4, 8)])
def test_gpu_other_configs_and_element_functions_match_float64(config):
    """A scaled exponent (the element and correction come from the function), only O a
    parameter, clusters of 1-16 and both output shapes per thread."""
    func = _cascade(256, 2048, 64, scale=0.25, outputs="o")
    rng = np.random.default_rng()
    x = (rng.standard_normal((256, 2048)) * 4).astype(np.float32)
    v = rng.standard_normal((2048, 64)).astype(np.float32)
    (out,) = _run(func, fuse_softmax_gemm(func, config), x, v)
    ref = _reference(x, v, 0.25)["o"]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
