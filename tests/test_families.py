"""The cascade families with kernels of their own (attention, softmax·V, top-k rows): each takes
its workload and refuses the others with a reason, ranks its configurations with a compute term
beside the bytes, and the driver picks it ahead of the fused rows."""

from __future__ import annotations

import pytest

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.families import FAMILIES
from tvm_dsm.families.attention import Attention
from tvm_dsm.families.fused_cascade import element_ops
from tvm_dsm.families.softmax_gemm import SoftmaxGemm
from tvm_dsm.families.top_k_rows import TopKRows
from tvm_dsm.hardware import load_hardware
from tvm_dsm.kernels import softmax_gemm, top_k_rows
from tvm_dsm.kernels.attention import default_config as attention_default
from tvm_dsm.workloads import cascades

WORKLOADS = {
    "attention": lambda: cascades.attention(4, 256, 256, 64),
    "softmax_gemm": lambda: cascades.softmax_pv(256, 512, 64),
    "top_k_rows": lambda: cascades.moe_routing(256, 1024, 8),
}
OWN_KERNELS = {"attention": Attention(), "softmax_gemm": SoftmaxGemm(), "top_k_rows": TopKRows()}


@pytest.mark.parametrize("family", sorted(OWN_KERNELS))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_family_takes_its_workload_and_refuses_the_others_with_a_reason(family, workload):
    func = WORKLOADS[workload]()
    if family == workload:
        assert OWN_KERNELS[family].match(func) is not None
        assert tvm_dsm.plan(func).family.name == family
        return
    with pytest.raises(ClusterError) as err:
        OWN_KERNELS[family].recognize(func)
    assert len(str(err.value)) > 20  # says what the function lacks


def test_own_kernels_are_tried_before_the_fused_rows():
    names = [f.name for f in FAMILIES]
    assert max(names.index(n) for n in OWN_KERNELS) < names.index("fused_cascade")


def test_prefill_attention_is_compute_bound_and_planned_as_attention():
    """16 heads x 2048 x 2048 x 64: 17 GFLOP on tensor cores outweigh the 17 MB from HBM (the
    key/value tiles re-read from L2 per 64-row query tile are of the same order)."""
    func = cascades.attention(16, 2048, 2048, 64)
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == "attention"
    best = ranking.best
    assert best.config == attention_default(ranking.shape)
    assert best.seconds["mma"] > best.seconds["hbm"] and best.seconds["mma"] > 0.5 * best.seconds["l2"]
    assert best.seconds["mma"] == pytest.approx(4 * 16 * 2048 * 2048 * 64 / 989e12)
    causal = Attention().recognize(cascades.attention(16, 2048, 2048, 64, causal=True))
    masked = Attention().predict(causal, best.config, load_hardware())
    assert masked.seconds["mma"] == pytest.approx(best.seconds["mma"] / 2)
    assert masked.bytes["l2"] < 0.6 * best.bytes["l2"]  # no key tiles past a CTA's diagonal


def test_attention_ranks_every_valid_configuration_with_the_measured_default_first():
    shape = Attention().recognize(WORKLOADS["attention"]())
    plans = Attention().rank(shape, load_hardware())
    assert len(plans) > 1 and plans[0].config == attention_default(shape)
    rest = [p.predicted_us for p in plans[1:]]
    assert rest == sorted(rest)


def test_softmax_gemm_counts_its_products_on_cuda_cores():
    found = SoftmaxGemm().recognize(cascades.softmax_pv(2048, 512, 64))
    plans = SoftmaxGemm().rank(found, load_hardware())
    assert plans[0].config == softmax_gemm.default_config(found.shape, load_hardware())
    products = 2 * 2048 * 512 * 64
    assert plans[0].seconds["fp32"] > products / 66.9e12
    for p in plans:
        softmax_gemm.check_config(found.shape, p.config)  # ClusterError for a configuration that does not fit


def test_top_k_rows_plans_the_default_split_at_the_hbm_floor():
    func = cascades.moe_routing(4096, 4096, 8)
    (plan,) = TopKRows().rank(TopKRows().recognize(func), load_hardware())
    assert plan.config == top_k_rows.default_config(top_k_rows.find_top_k_rows(func))
    assert plan.bytes == {"hbm": 4096 * 4096 * 2 + 4096 * 8 * (4 + 4)}


def test_fused_rows_count_element_work_beside_the_bytes():
    """Decode attention's scores (q . k over the head dim, an FMA a term) are computed in the
    fused loop: their operations are counted on the CUDA cores."""
    rows, keys, dim = 8, 1024, 64
    func = cascades.decode_attention(rows, keys, dim)
    assert element_ops(func) >= 2 * rows * keys * dim
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == "fused_cascade"
    assert 0 < ranking.best.seconds["fp32"] < ranking.best.seconds["hbm"]


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_fused_rows_take_sums_along_rows_not_across_them(layout):
    """One row's gated products (silu(x W_g) * (x W_u)) are two sums per output column: the
    fused rows take them where each column's weights are a contiguous row (W [N, K]), and refuse
    W [K, N], whose column walk reads one 2-byte element per sector."""
    from tvm import te

    from tvm_dsm.families.fused_cascade import FusedCascade

    k, n = 1024, 512
    x = te.placeholder((1, k), "float16", name="x")
    wg, wu = (te.placeholder((n, k) if layout == "nk" else (k, n), "float16", name=name) for name in ("wg", "wu"))

    def product(w):
        r = te.reduce_axis((0, k), "r")
        at = (lambda j: w[j, r]) if layout == "nk" else (lambda j: w[r, j])
        return te.compute((1, n), lambda i, j: te.sum(x[i, r].astype("float32") * at(j).astype("float32"), axis=r))

    gate, up = product(wg), product(wu)
    y = te.compute((1, n), lambda i, j: (gate[i, j] / (1 + te.exp(-gate[i, j])) * up[i, j]).astype("float16"))
    func = te.create_prim_func([x, wg, wu, y])
    if layout == "nk":
        assert FusedCascade().recognize(func) is func
    else:
        with pytest.raises(ClusterError, match="read with a row index innermost"):
            FusedCascade().recognize(func)


def test_fused_rows_read_a_scalar_tensor_in_a_reduction():
    """A 0-d tensor read in a reduced level (a fill held as ``torch.full([], c)``, as GPT-BigCode
    masks its scores) has no index to walk: the fused rows take the function."""
    from tvm import te

    from tvm_dsm.families.fused_cascade import FusedCascade

    x, fill = te.placeholder((64, 256), "float32", name="x"), te.placeholder((), "float32", name="fill")
    r, t = te.reduce_axis((0, 256), "r"), te.reduce_axis((0, 256), "t")
    row_max = te.compute((64,), lambda i: te.max(te.max(x[i, r], fill[()]), axis=r), name="row_max")
    total = te.compute((64,), lambda i: te.sum(te.exp(te.max(x[i, t], fill[()]) - row_max[i]), axis=t), name="total")
    func = te.create_prim_func([x, fill, total])
    assert FusedCascade().recognize(func) is func


def test_fused_rows_take_attention_over_heads_stored_after_the_keys():
    """Decode attention over K/V stored [B, S, H, D] reads V[b, t, h, e]: a row index (h) after
    the key, but each key's values a contiguous row of D."""
    from tvm_dsm.families.fused_cascade import FusedCascade
    from tvm_dsm.workloads.attention_forms import te_attention

    func = te_attention(1, 8, 1, 1024, 80, layout="bshd", dtype="float32")
    assert FusedCascade().recognize(func) is func


def test_symbolic_extents_are_refused_by_name_and_built_per_range_of_rows():
    """A Relax model with a dynamic batch gives PrimFuncs with symbolic extents: families plan
    constant extents (refused by name, not a crash inside a family, pointing to the ranges), and
    build plans the function per range of rows, a kernel each (neighbouring ranges of one
    configuration sharing one)."""
    import re

    from tvm import te

    from conftest import TARGET
    from tvm_dsm.families import match_family

    m = te.var("m")
    x = te.placeholder((m, 256), "float16", name="x")
    w = te.placeholder((512, 256), "float16", name="w")
    k = te.reduce_axis((0, 256), "k")
    y = te.compute((m, 512), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k),
                   name="y")
    func = te.create_prim_func([x, w, y])
    with pytest.raises(ClusterError, match=r"x\[m, 256\], y\[m, 512\] are symbolic .*per range of rows"):
        match_family(func, TARGET)
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source))) > 1


def test_a_record_written_before_a_field_existed_takes_the_fields_default():
    """Tuning records and measured plans store configurations as their fields: a field added
    since (nested ones included) takes its default, not the example's value; a field the type
    lacks, or a missing one without a default, finds no type."""
    import dataclasses

    from tvm_dsm.families.configs import config_from
    from tvm_dsm.rules.fused_chain import FusedChainConfig
    from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig
    from tvm_dsm.rules.unfused_chain import UnfusedChainConfig

    fused = FusedChainConfig(2, 32, 64, 1, 16, 1, 2, 1, reduce="gathered")
    gemm = SplitKGemmConfig(2, wgmma=True, tma=True)
    examples = [fused, UnfusedChainConfig(gemm, gemm)]
    record = {k: v for k, v in dataclasses.asdict(fused).items() if k != "reduce"}
    assert config_from(record, examples) == dataclasses.replace(fused, reduce="kernel")
    nested = dataclasses.asdict(SplitKGemmConfig(4, 64, 64))
    del nested["wgmma"]
    config = config_from({"gemm0": nested, "gemm1": nested}, examples)
    assert config.gemm0 == SplitKGemmConfig(4, 64, 64) and not config.gemm1.wgmma
    with pytest.raises(ValueError, match="no configuration type"):
        config_from({**record, "unknown": 1}, examples)
    with pytest.raises(ValueError, match="no configuration type"):
        config_from({"gemm1": nested}, examples)  # gemm0 has no default
