"""tvm_dsm.plan / tune / build: family dispatch, the stock fallback, and the MetaSchedule database
round trip (a scripted runner here; the real one on the GPU)."""

from __future__ import annotations

import logging
import tempfile

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx, topi
from tvm.ir.utils import derived_object
from tvm.script import tirx as T
from tvm.s_tir import meta_schedule as ms

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.gemm_chain import chain_rank_key
from tvm_dsm.workloads import cascades, gemv
from tvm_dsm.workloads.chains import gemm_chain
from tvm_dsm.workloads.dense import dense

CHAIN = (64, 512, 256, 256)  # M, N, K, L: small enough to build a few configs quickly


@pytest.mark.parametrize("func, family", [
    (gemm_chain(*CHAIN, "relu"), "gemm_chain"),
    (dense(128, 1024, 1024), "split_k_gemm"),
    (gemv(1024, 4096), "split_k_reduction"),
])
def test_plan_finds_the_family_and_explains_the_winner(func, family):
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == family
    # chains rank fused plans at their prediction times the fused model's measured optimism;
    # the analytical order, before measurements re-rank its first plans (learned_ranking)
    key = (lambda p: chain_rank_key(p, ranking.hw)) if family == "gemm_chain" else (lambda p: p.predicted_us)
    predicted = [key(p) for p in ranking.family.rank(ranking.shape, ranking.hw)]
    assert predicted == sorted(predicted) and len(predicted) > 1
    text = ranking.explain()
    assert f"{family}: {len(predicted)} valid configurations" in text
    assert "hbm" in text and "predicted:" in text and "#2:" in text


def _unfusible_cascade(rows: int = 256, cols: int = 1024):
    """sum(sin(x - max x)): a cascade whose correction would depend on x, so it does not fuse."""
    x = te.placeholder((rows, cols), name="x")
    r, r2 = te.reduce_axis((0, cols), "r"), te.reduce_axis((0, cols), "r2")
    m = te.compute((rows,), lambda i: te.max(x[i, r], axis=r), name="m")
    s = te.compute((rows,), lambda i: te.sum(te.sin(x[i, r2] - m[i]), axis=r2), name="s")
    return te.create_prim_func([x, s])


@pytest.mark.parametrize("func, family, kernel", [
    (cascades.moe_routing(256, 1024, 8), "top_k_rows", "top-k rows"),
    (cascades.softmax_v(256, 512, 64), "softmax_gemm", "softmax·V tiled"),
    (cascades.attention(4, 256, 256, 64), "attention", "attention: 64 query rows"),
    (cascades.logsumexp(256, 1024), "fused_cascade", "fused cascade: 256 rows, a cluster of"),
])
def test_cascades_are_planned_and_built_through_the_driver(func, family, kernel):
    """tvm_dsm.plan / build give a cascade its own kernel where one takes it, else the fused
    rows; every plan shows at least the HBM time of reading the operands once."""
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == family and not ranking.family.traced
    assert kernel in ranking.explain() and ranking.best.seconds["hbm"] > 0
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert "__global__" in source


def test_a_cascade_whose_stage_reads_the_data_again_goes_to_the_row_norm_kernel():
    """TOPI's softmax normalizes every element from X after the statistics: the fused rows ran it
    1.4-25x slower than dlight (bench/results/softmax.json), so that family refuses it; the
    row-norm family holds the row and reads it once."""
    from tvm import topi

    from tvm_dsm.families.fused_cascade import FusedCascade

    x = te.placeholder((256, 1024), "float32", name="x")
    func = te.create_prim_func([x, topi.nn.softmax(x)])
    with pytest.raises(ClusterError, match="T_softmax_norm reads .'x'. besides the cascade's"):
        FusedCascade().recognize(func)
    assert tvm_dsm.plan(func).family.name == "row_norm"


def test_a_reduction_over_the_rows_of_a_cascades_results_is_built_by_dlight():
    """A mean over the rows of each row's cross-entropy (a row max, an exp-sum, then a sum over
    rows): the fused cascade runs its rows in CTAs of their own, so it refuses the function and
    build falls back to dlight, which compiles it (it crashed in lowering when taken)."""
    from tvm_dsm.families.fused_cascade import FusedCascade

    rows, width = 256, 1000
    logits = te.placeholder((rows, width), "float16", name="logits")
    labels = te.placeholder((rows,), "int64", name="labels")
    k, k2, r = te.reduce_axis((0, width), "k"), te.reduce_axis((0, width), "k2"), te.reduce_axis((0, rows), "r")
    mx = te.compute((rows,), lambda i: te.max(logits[i, k].astype("float32"), axis=k), name="mx")
    s = te.compute((rows,), lambda i: te.sum(te.exp(logits[i, k2].astype("float32") - mx[i]), axis=k2), name="s")
    loss = te.compute((rows,), lambda i: te.log(s[i]) + mx[i] - logits[i, labels[i]].astype("float32"), name="loss")
    mean = te.compute((1,), lambda _: te.sum(loss[r] / rows, axis=r), name="mean_loss")
    func = te.create_prim_func([logits, labels, mean])
    with pytest.raises(ClusterError, match="mean_loss reduces .* over the rows"):
        FusedCascade().recognize(func)
    tvm_dsm.build(func)


def test_a_form_the_planner_took_is_tuned_and_replayed(tmp_path):
    """TOPI's gated layer is planned with its reductions first: tune records that form, and
    schedule and build find and replay its record from the function as written."""
    from test_reductions_first import topi_gated

    func = topi_gated(128, 512, 1024)
    measured = tvm_dsm.tune(func, str(tmp_path), top_k=2, builder=InProcessBuilder(), runner=_ScriptedRunner())
    assert [m.rank for m in measured] == [1, 0]
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    chosen = tvm_dsm.driver.schedule(func, database=database)
    expected = tvm_dsm.plan(func).schedule(1)
    tvm.ir.assert_structural_equal(chosen.mod, expected.mod)
    tvm_dsm.build(func, database=database)


def test_tune_records_a_generated_kernel_and_build_replays_it(tmp_path):
    """A fused cascade's kernel is generated, not a trace of the function: tune records the
    function marked with its configuration, and a build from the database writes that kernel."""
    from conftest import cuda_source, named_alike

    func = cascades.moe_routing(256, 1024, 8)
    measured = tvm_dsm.tune(func, str(tmp_path), top_k=3, builder=InProcessBuilder(),
                            runner=_ScriptedRunner())
    assert len(measured) == 1 and measured[0].measured_us is not None
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(database) == 1
    chosen = tvm_dsm.driver.schedule(func, database=database)
    assert named_alike(cuda_source(chosen.mod)) == named_alike(cuda_source(tvm_dsm.plan(func).schedule().mod))


def test_unsupported_function_gets_the_reasons_and_a_stock_build(caplog):
    func = _unfusible_cascade()
    with pytest.raises(ClusterError) as err:
        tvm_dsm.plan(func)
    for family in ("gemm_chain", "split_k_gemm", "split_k_reduction"):
        assert family in str(err.value)
    assert "fused_cascade: cascade m -> s: not fused" in str(err.value)
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        sch = tvm_dsm.driver.schedule(func)
    assert "falls back from its families" in caplog.text
    source = tvm.compile(sch.mod, target=tvm_dsm.driver.H100).mod.imports[0].inspect_source()
    assert "__cluster_dims__" not in source and "mapa" not in source


def _two_outputs_named_alike():
    """Two TOPI dense layers of one input, of different widths: both outputs are named
    ``T_matmul_NT``."""
    x = te.placeholder((64, 256), "float16", "x")
    w1, w2 = te.placeholder((128, 256), "float16", "w1"), te.placeholder((96, 256), "float16", "w2")
    return te.create_prim_func([x, w1, w2, topi.nn.dense(x, w1, out_dtype="float32"),
                                topi.nn.dense(x, w2, out_dtype="float32")])


def test_arguments_named_alike_build_each_checked_against_its_own_shape():
    func = _two_outputs_named_alike()
    assert [p.name for p in func.params][3:] == ["T_matmul_NT", "T_matmul_NT"]
    host = tvm_dsm.build(func).mod.inspect_source("ll")
    assert "Invalid T_matmul_NT.shape[1] when calling `main`: expected 128" in host
    assert "Invalid T_matmul_NT.shape[1] when calling `main`: expected 96" in host


@pytest.mark.gpu
def test_arguments_named_alike_run_on_the_gpu():
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(s).astype("float16") for s in ((64, 256), (128, 256), (96, 256)))
    dev = tvm.cuda(0)
    outs = [tvm.runtime.tensor(np.full((64, n), np.nan, "float32"), dev) for n in (128, 96)]
    tvm_dsm.build(_two_outputs_named_alike())(*(tvm.runtime.tensor(a, dev) for a in (x, w1, w2)), *outs)
    for out, w in zip(outs, (w1, w2)):
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5


def test_build_takes_the_next_plan_where_one_does_not_lower(monkeypatch, caplog):
    """A plan whose kernel needs more shared memory than the planner counted is refused when it
    lowers; ``build`` logs that and builds the next one, or (none lowers) TVM's stock schedule."""
    import tvm_dsm.transform.cluster_launch as cluster_launch

    check, refused = cluster_launch.check_shared_memory, []

    def refuse_first(body, cluster_size, hw):
        if not refused:
            refused.append(cluster_size)
            raise ClusterError("refused by the test")
        check(body, cluster_size, hw)

    monkeypatch.setattr(cluster_launch, "check_shared_memory", refuse_first)
    with caplog.at_level(logging.WARNING, logger="tvm_dsm.driver"):
        source = tvm_dsm.build(dense(128, 1024, 4096)).mod.imports[0].inspect_source()
    assert refused and "__global__" in source  # built: the second plan
    assert "plan #1 does not lower: refused by the test" in caplog.text

    monkeypatch.setattr(cluster_launch, "check_shared_memory", lambda *_: (_ for _ in ()).throw(
        ClusterError("refused by the test")))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tvm_dsm.driver"):
        source = tvm_dsm.build(dense(128, 1024, 4096)).mod.imports[0].inspect_source()
    assert "none of tvm-dsm's 4 best plans lowers" in caplog.text  # then TVM's stock schedule
    assert "__global__" in source and "barrier.cluster" not in source


def test_a_gemm_no_plan_of_which_lowers_still_builds():
    """Qwen2-0.5B's projections at decode batches of 2-8 rows: every split-K plan's padded TMA
    tile copy is refused when it lowers; build returns TVM's stock schedule."""
    assert tvm_dsm.build(dense(4, 1152, 896)) is not None


def test_stock_schedule_keeps_tensor_cores_on_sm_90a():
    """dlight cannot parse "sm_90a" and would schedule a matmul on CUDA cores: the stock
    fallback schedules it for "sm_90" and compiles it for the H100 target."""
    sch = tvm_dsm.driver.stock_schedule(dense(128, 256, 256))
    source = tvm.compile(sch.mod, target=tvm_dsm.driver.H100).mod.imports[0].inspect_source()
    assert "wmma::mma_sync" in source


@derived_object
class _ScriptedFuture(ms.runner.PyRunnerFuture):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def done(self) -> bool:
        return True

    def result(self) -> ms.runner.RunnerResult:
        return ms.runner.RunnerResult([self.seconds] * 3, None)


@derived_object
class InProcessBuilder(ms.builder.PyBuilder):
    """Builds candidates in the test's own process: MetaSchedule's LocalBuilder starts worker
    processes that each import TVM and tvm-dsm again (tens of seconds on the CI machine)."""

    def build(self, build_inputs):
        results = []
        for build_input in build_inputs:
            try:
                path = tempfile.mkdtemp(prefix="tvm_dsm_candidate_") + "/candidate.so"
                tvm.compile(build_input.mod, target=build_input.target).export_library(path)
                results.append(ms.builder.BuilderResult(path, None))
            except Exception as err:  # noqa: BLE001  (a candidate's failure is its result)
                results.append(ms.builder.BuilderResult(None, str(err)))
        return results


@derived_object
class _ScriptedRunner(ms.runner.PyRunner):
    """Reports the later candidates as faster, so the database must overrule the planner."""

    def run(self, runner_inputs):
        return [_ScriptedFuture(1e-3 / (n + 1)) for n in range(len(runner_inputs))]


def test_tune_records_measurements_and_build_uses_the_fastest(tmp_path):
    func = gemm_chain(*CHAIN, "relu")
    measured = tvm_dsm.tune(func, str(tmp_path), top_k=3, builder=InProcessBuilder(),
                            runner=_ScriptedRunner())
    assert [m.rank for m in measured] == [2, 1, 0]
    assert all(m.error == "" for m in measured)
    assert measured[0].measured_us == pytest.approx(1e3 / 3)
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(database) == 3
    chosen = tvm_dsm.driver.schedule(func, database=database)
    expected = tvm_dsm.plan(func).schedule(2)
    tvm.ir.assert_structural_equal(chosen.mod, expected.mod)


@pytest.mark.gpu
def test_tune_on_the_gpu_then_build_is_correct(tmp_path):
    m, n, k, l = CHAIN
    func = gemm_chain(m, n, k, l, "relu")
    measured = tvm_dsm.tune(func, str(tmp_path), top_k=3)
    assert all(r.measured_us is not None for r in measured), [r.error for r in measured]
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    lib = tvm_dsm.build(func, database=database)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float16")
    w1 = (rng.standard_normal((n, k)) / np.sqrt(k)).astype("float16")
    w2 = (rng.standard_normal((l, n)) / np.sqrt(n)).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, l), np.nan, "float16"), dev)
    lib(*(tvm.runtime.tensor(x, dev) for x in (a, w1, w2)), out)
    h = np.maximum(a.astype("float64") @ w1.astype("float64").T, 0).astype("float16")
    ref = h.astype("float64") @ w2.astype("float64").T
    got = out.numpy().astype("float64")
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_plan_takes_the_family_predicted_fastest_of_those_that_take_the_function():
    """Decode attention of one query per head, MQA (one key head for 8 query heads), head dim 96:
    the prefill attention family takes it too (its query tiles mostly padding, 32.3 us on the
    H200 against torch's 23.6), the decode family predicts it 6x faster and gets it; the fused
    rows, whose model counts bytes alone, take neither it nor any attention another family
    takes."""
    from tvm_dsm.families import matching_families
    from tvm_dsm.workloads.generated import _decode_attention_te

    func = _decode_attention_te(1, 8, 1, 2048, 96, "float16")
    assert [f.name for f, _ in matching_families(func)] == ["attention", "decode_attention", "fused_cascade"]
    assert tvm_dsm.plan(func).family.name == "decode_attention"
    assert tvm_dsm.plan(_decode_attention_te(1, 32, 4, 128, 64, "float16")).family.name == "decode_attention"


def _prefill_attention(b: int, h: int, s: int, d: int, rounded: bool = True):
    """Self-attention over ``s`` tokens as a user writes it in TE: scores scaled in the sum,
    TOPI's softmax, its probabilities rounded to fp16 (unless not ``rounded``), then V."""
    q, k, v = (te.placeholder((b, h, s, d), "float16", name=n) for n in "qkv")
    r = te.reduce_axis((0, d), "r")
    scores = te.compute((b, h, s, s), lambda i, j, m, n: te.sum(
        q[i, j, m, r].astype("float32") * k[i, j, n, r].astype("float32") * (1 / d ** 0.5), axis=r), name="scores")
    p = topi.nn.softmax(scores, axis=-1)
    p = topi.cast(p, "float16") if rounded else p
    t = te.reduce_axis((0, s), "t")
    o = te.compute((b, h, s, d), lambda i, j, m, c: te.sum(
        p[i, j, m, t].astype("float32") * v[i, j, t, c].astype("float32"), axis=t), name="o")
    return te.create_prim_func([q, k, v, topi.cast(o, "float16")])


@pytest.mark.parametrize("dim", [80, 128])
def test_a_short_prefill_goes_to_the_attention_kernel_not_the_decode_kernel(dim):
    """77 tokens of 12 heads (a CLIP text encoder's): the decode family takes the queries as rows
    of one K/V group, and its model without a compute term predicted it faster; on the H200 the
    decode kernel ran 2-3x slower than the attention kernel at 77 tokens
    (bench/results/archive/short_attention_families_s86.json)."""
    from tvm_dsm.families import matching_families

    func = _prefill_attention(1, 12, 77, dim)
    assert "decode_attention" in [f.name for f, _ in matching_families(func)]
    assert tvm_dsm.plan(func).family.name == "attention"


def test_where_the_families_that_take_it_cannot_plan_it_the_error_names_why_the_others_do_not():
    """Attention at head dim 100 over 77 keys, its probabilities kept in fp32: only the generic
    cascade family takes it, and it cannot split 77 keys; the error also names the attention
    families' own limit (the head dim). (Rounded to fp16, the cascade family refuses it too: a
    rounding cast inside the cascade.)"""
    with pytest.raises(ClusterError) as refusal:
        tvm_dsm.plan(_prefill_attention(1, 4, 77, 100, rounded=False))
    text = str(refusal.value)
    assert text.startswith("fused_cascade cannot plan it: reduction extent 77"), text
    assert "attention: head dim 100" in text and "decode_attention:" in text, text
    with pytest.raises(ClusterError, match="fused_cascade: cascade .* a rounding cast inside it"):
        tvm_dsm.plan(_prefill_attention(1, 4, 77, 100))


def test_another_family_displaces_the_most_specific_only_by_the_margin():
    """The families' models are fitted each on its own kernels: a later family is taken only
    where predicted faster by FAMILY_MARGIN; a generic one only alone; one that declines the
    function (ScheduleFamily.declines) not at all."""
    from types import SimpleNamespace

    from tvm_dsm.families import FAMILY_MARGIN, fastest_family

    def family(name, us, generic=False, declines=None):
        return SimpleNamespace(name=name, generic=generic, rank=lambda shape, hw: [SimpleNamespace(predicted_us=us)],
                               declines=lambda shape, plans, hw: declines)

    def pick(*families):
        return fastest_family([(f, None) for f in families], hw=None)[0].name

    assert pick(family("first", 10.0), family("later", 10.0 / FAMILY_MARGIN * 1.01)) == "first"
    assert pick(family("first", 10.0), family("later", 10.0 / FAMILY_MARGIN * 0.99), family("last", 5.0)) == "last"
    assert pick(family("first", 10.0), family("generic", 1.0, generic=True)) == "first"
    assert pick(family("generic", 1.0, generic=True), family("other generic", 0.5, generic=True)) == "generic"
    assert pick(family("first", 10.0, declines="apart is faster"), family("later", 20.0)) == "later"
    with pytest.raises(ClusterError, match="apart is faster"):
        pick(family("first", 10.0, declines="apart is faster"))


@pytest.mark.parametrize("shape", [(0, 64, 64), (4, 64, 0)], ids=["no_rows", "no_depth"])
def test_a_tensor_of_no_elements_is_refused_by_name(shape):
    """Stock TVM fails on these too (a schedule error, an internal check): the error names the
    tensor and its zero extent besides."""
    for make in (lambda: tvm_dsm.build(dense(*shape), {"kind": "cuda", "arch": "sm_90a"}),
                 lambda: tvm_dsm.plan(dense(*shape))):
        with pytest.raises(ClusterError, match=r"an extent of 0 \(no elements\)"):
            make()


def _int8_products():
    """An int8 GEMM accumulating in int32 (dlight's int8 WMMA schedule for "sm_90" does not lower)."""
    x, w = te.placeholder((256, 256), "int8", name="x"), te.placeholder((256, 256), "int8", name="w")
    k = te.reduce_axis((0, 256), name="k")
    y = te.compute((256, 256), lambda i, j: te.sum(x[i, k].astype("int32") * w[j, k].astype("int32"), axis=k), name="y")
    return te.create_prim_func([x, w, y])


def _two_columns_of_one_product():
    """``silu(c[:, j]) * c[:, j + 1]`` of one product: an epilogue reading two columns (not a
    fused gate/up weight's halves, which the GEMM family takes as two products)."""
    x, w = te.placeholder((128, 512), "float16", name="x"), te.placeholder((2048, 512), "float16", name="w")
    k = te.reduce_axis((0, 512), name="k")
    c = te.compute((128, 2048), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k),
                   name="c")
    h = te.compute((128, 1024), lambda i, j: (c[i, j] * te.sigmoid(c[i, j]) * c[i, j + 1]).astype("float16"),
                   name="h")
    return te.create_prim_func([x, w, h])


def _product_to_two_outputs(m: int = 128):
    """``y = x @ w^T`` written out twice, as ``cast(y)`` and ``cast(relu(y))`` (a layer keeping
    its pre-activation): dlight's whole schedule of it is ill-formed."""
    x, w = te.placeholder((m, 1024), "float16", name="x"), te.placeholder((4096, 1024), "float16", name="w")
    k = te.reduce_axis((0, 1024), name="k")
    y = te.compute((m, 4096), lambda i, j: te.sum(x[i, k].astype("float32") * w[j, k].astype("float32"), axis=k),
                   name="y")
    return te.create_prim_func([x, w, topi.cast(y, "float16"), topi.cast(topi.nn.relu(y), "float16")])


@T.prim_func(s_tir=True)
def _gemv_into_a_plain_allocation(a: T.Buffer((2, 4096), "float16"), w: T.Buffer((1000, 4096), "float16"),
                                  o: T.Buffer((2, 1000), "float16")):
    c = T.alloc_buffer((2, 1000), "float32")  # not a block's allocation
    for i, j, k in T.grid(2, 1000, 4096):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + T.Cast("float32", a[vi, vk]) * T.Cast("float32", w[vj, vk])
    for i, j in T.grid(2, 1000):
        with T.sblock("gelu"):
            vi, vj = T.axis.remap("SS", [i, j])
            o[vi, vj] = T.Cast("float16", c[vi, vj] * T.float32(0.5) * (T.float32(1) + T.erf(c[vi, vj] * T.float32(0.7071))))


@T.prim_func(s_tir=True)
def _update_without_init(a: T.Buffer((128, 128), "float16"), b: T.Buffer((128, 128), "float16"),
                         c: T.Buffer((128, 128), "float32")):
    for i, j in T.grid(128, 128):
        with T.sblock("zero"):
            vi, vj = T.axis.remap("SS", [i, j])
            c[vi, vj] = T.float32(0)
    for i, j, k in T.grid(128, 128, 128):
        with T.sblock("update"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            c[vi, vj] = c[vi, vj] + T.Cast("float32", a[vi, vk]) * T.Cast("float32", b[vk, vj])


def _batch_of_one_row_products():
    """Decode's ``q @ k^T`` in fp32 as TOPI's batch_matmul: one row a product, 32 products (no
    family takes fp32 products in a batch)."""
    a = te.placeholder((32, 1, 128), "float32", name="a")
    b = te.placeholder((32, 1000, 128), "float32", name="b")
    return te.create_prim_func([a, b, topi.nn.batch_matmul(a, b)])


@pytest.mark.parametrize("make", [_int8_products, _two_columns_of_one_product, _product_to_two_outputs,
                                  _batch_of_one_row_products])
def test_functions_the_families_refuse_and_dlight_fails_on_still_build(make):
    """Written by users (sweeps of independently written functions): dlight's tensor-core
    schedule of an int8 GEMM for "sm_90" does not lower, so its CUDA-core one builds it; an
    epilogue over two columns of one product, which the GEMM families refuse and dlight's
    matmul rule asserts on, gets dlight's fallback rule; a product written to two outputs, whose
    whole schedule by dlight does not lower, one schedule per operator (the product, then each
    output's epilogue); a batch of fp32 one-row products, on which dlight's GEMV rule raises an
    AttributeError, dlight's fallback rule."""
    lib = tvm_dsm.build(make())
    assert "__global__" in lib.mod.imports[0].inspect_source()


def _patch_embedding():
    """ViT's patch embedding as TOPI writes it: a convolution whose stride is its kernel, its
    bias, a cast, then the image's pixels flattened into tokens (reshape, transpose)."""
    x = te.placeholder((2, 3, 64, 64), "float16", name="img")
    w = te.placeholder((96, 3, 16, 16), "float16", name="w")
    b = te.placeholder((96,), "float16", name="b")
    y = topi.nn.conv2d_nchw(x, w, stride=16, padding=0, dilation=1, out_dtype="float32")
    y = topi.cast(topi.add(y, topi.reshape(topi.cast(b, "float32"), (1, 96, 1, 1))), "float16")
    return te.create_prim_func([x, w, b, topi.transpose(topi.reshape(y, (2, 96, 16)), (0, 2, 1))])


def test_a_product_no_family_takes_keeps_dlights_whole_schedule_and_its_fused_operators(caplog):
    """Its one product taken by no family, the function is dlight's whole: apart, its
    operators would only be more kernels (the padding copy, the bias, the transpose)."""
    func = _patch_embedding()
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        ours = tvm_dsm.build(func).mod.imports[0].inspect_source()
    stock = tvm.compile(tvm_dsm.driver.stock_schedule(func).mod, target=tvm_dsm.driver.H100)
    assert "one operator at a time" not in caplog.text
    assert ours.count("__global__") == stock.mod.imports[0].inspect_source().count("__global__")


def test_an_intermediate_allocated_outside_the_blocks_is_the_root_blocks():
    """``T.alloc_buffer`` outside a block (a statement, which s_tir's primitives take for an
    output) is allocated by the root block, as ``T.sblock_alloc_buffer`` writes it: the row GEMV
    takes the function and its schedule applies."""
    assert tvm_dsm.plan(_gemv_into_a_plain_allocation).family.name == "row_gemv"
    source = tvm_dsm.build(_gemv_into_a_plain_allocation).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # one kernel (declaration and definition)


def test_a_function_nothing_schedules_is_refused_with_both_reasons():
    with pytest.raises(ClusterError, match="neither tvm-dsm nor TVM's stock schedules"):
        tvm_dsm.build(_update_without_init)


def test_an_epilogue_reading_another_column_of_its_product_is_refused_by_the_gemm_families():
    with pytest.raises(ClusterError, match=r"split_k_gemm: the epilogue h reads c\[v_i, v_j \+ 1\], not the element"):
        tvm_dsm.plan(_two_columns_of_one_product())


def test_a_family_schedule_that_fails_is_a_warning_and_a_stock_build(monkeypatch, caplog):
    """A family that takes a function and then fails on it (a tvm-dsm bug: s_tir refusing a
    primitive) does not fail the build: a warning, then TVM's stock schedule."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    func = dense(128, 256, 512)
    ranking_type = type(tvm_dsm.plan(func))

    def fails(self, rank=0):
        raise ScheduleError("a primitive refused")

    monkeypatch.setattr(ranking_type, "schedule", fails)
    with caplog.at_level(logging.WARNING, logger="tvm_dsm.driver"):
        lib = tvm_dsm.build(func)
    assert "failed (a tvm-dsm bug)" in caplog.text
    assert "__global__" in lib.mod.imports[0].inspect_source()


@pytest.mark.gpu
def test_a_product_written_to_two_outputs_is_correct_on_the_gpu():
    rng = np.random.default_rng()
    x = rng.standard_normal((128, 1024)).astype("float16")
    w = (rng.standard_normal((4096, 1024)) / 32).astype("float16")
    lib = tvm_dsm.build(_product_to_two_outputs())
    dev = tvm.cuda(0)
    outs = [tvm.runtime.tensor(np.full((128, 4096), np.nan, "float16"), dev) for _ in range(2)]
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), *outs)
    y = x.astype(np.float64) @ w.astype(np.float64).T
    for out, ref in zip(outs, (y, np.maximum(y, 0))):
        got = out.numpy().astype(np.float64)
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_dlight_runs_on_a_shallow_stack_under_the_callers_target(monkeypatch):
    """stock_rules applies dlight from a fresh thread (the tensor intrinsics its matmul rule
    imports parse ~40x faster there than from a Relax pass's stack with torch imported), under
    the target current in the caller's thread: a 16-bit matmul gets its tensor-core schedule."""
    import threading

    from tvm.s_tir import dlight as dl

    from tvm_dsm.stock import stock_rules, stock_target
    from tvm_dsm.workloads.dense import dense

    threads = []
    apply = dl.gpu.Matmul.apply
    monkeypatch.setattr(dl.gpu.Matmul, "apply", lambda self, *a, **k: threads.append(threading.current_thread())
                        or apply(self, *a, **k))
    with stock_target():
        scheduled = stock_rules()(tvm.IRModule({"main": dense(128, 256, 256)}))
    assert threads and threading.main_thread() not in threads
    assert "mma" in scheduled.script()


def test_the_line_logged_for_a_lowering_error_says_why_not_where():
    """TVM prints the IR after its reason, a line of carets under the offending statement last."""
    from tvm_dsm.errors import last_line

    printed = ("ScheduleError: An error occurred in the schedule primitive 'compute_inline'.\n"
               "Error message: The block violates condition #3\nThe IR with diagnostic is:\n"
               "    with T.sblock(\"ln\"):\n        ^^^^^^^^^^^^^^^^^^^^^\n")
    assert last_line(printed) == "Error message: The block violates condition #3"
    assert last_line("first\n  second  \n^^^^\n") == "second"
    assert last_line(ValueError()) == "ValueError"


def _gemm_with_weight(offset: int, row_stride: int):
    """``c = a @ w^T`` with ``w`` [256, 512] declared ``offset`` elements into its data, rows
    ``row_stride`` elements apart."""
    @T.prim_func(s_tir=True)
    def gemm(a: T.Buffer((128, 512), "float16"), wh: T.handle, c: T.Buffer((128, 256), "float32")):
        w = T.match_buffer(wh, (256, 512), "float16", elem_offset=offset, strides=(row_stride, 1))
        for i, j, k in T.grid(128, 256, 512):
            with T.sblock("mm"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    c[vi, vj] = T.float32(0)
                c[vi, vj] = c[vi, vj] + T.Cast("float32", a[vi, vk]) * T.Cast("float32", w[vj, vk])
    return gemm


def test_a_parameter_at_an_element_offset_goes_to_the_stock_schedule():
    """The split-K GEMM addressed its operands' shared-memory tiles with the tensor's element
    offset added (and its TMA maps started at the data pointer): a weight declared 64 elements
    in was read wrong. The family refuses such an operand by name, and the build is TVM's stock
    schedule, which indexes past the offset."""
    with pytest.raises(ClusterError, match=r"w \(elem_offset 64\): the GEMM families' tensor-core operands"):
        tvm_dsm.plan(_gemm_with_weight(64, 512))
    source = tvm_dsm.build(_gemm_with_weight(64, 512)).mod.imports[0].inspect_source()
    assert "__global__" in source and "bulk_tensor" not in source


def test_an_extent_that_is_an_expression_of_variables_builds_with_the_stock_schedule():
    """``a[n * m]``: the families take symbolic extents that are variables; TVM's stock schedule
    takes this one, and the build falls back to it rather than refusing."""
    n, m = tirx.Var("n", "int32"), tirx.Var("m", "int32")
    a = te.placeholder((n * m,), "float32", name="a")
    func = te.create_prim_func([a, te.compute((n * m,), lambda i: te.exp(a[i]), name="c"), n, m])
    assert "__global__" in tvm_dsm.build(func).mod.imports[0].inspect_source()


def test_a_sum_over_an_empty_axis_builds_with_the_stock_schedule():
    """``c[i] = sum over a[i, 0:0]`` is zeros, which TVM's stock schedule computes: no family
    plans it, the build falls back rather than refusing."""
    a = te.placeholder((64, 0), "float32", name="a")
    k = te.reduce_axis((0, 0), "k")
    func = te.create_prim_func([a, te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="c")])
    with pytest.raises(ClusterError, match=r"an extent of 0"):
        tvm_dsm.plan(func)
    assert "__global__" in tvm_dsm.build(func).mod.imports[0].inspect_source()


def test_a_reduction_without_an_init_is_refused_by_name():
    """``c += a @ b`` adds to what c held: a family's kernel, which starts each sum from zero,
    would drop it (the GEMM families' rfactor refused it only later, as a schedule error)."""
    with pytest.raises(ClusterError, match="update: a reduction without an init adds to what its output held"):
        tvm_dsm.plan(_update_without_init)


def test_a_strided_weight_is_refused_by_the_gemm_family_and_built_by_the_stock_schedule():
    """Rows 1024 elements apart in a [256, 512] weight: the split-K GEMM's copies read tensors laid
    out by their shape, so it refuses the function by name (it ranked configurations none of
    which lowered)."""
    from tvm_dsm.rules.split_k_gemm import find_gemm

    with pytest.raises(ClusterError, match="w declares strides"):
        find_gemm(s_tir.Schedule(_gemm_with_weight(0, 1024)))
    assert "__global__" in tvm_dsm.build(_gemm_with_weight(0, 1024)).mod.imports[0].inspect_source()


def test_a_tensor_map_starts_at_the_tensors_first_element():
    """A source declared at an element offset (``nn.llm``'s kernels declare every parameter so,
    its value bound when called) is mapped from its data pointer plus that offset's bytes; one at
    offset 0 from the pointer itself."""
    from tvm_dsm.transform.tma_pipeline import encode_tensor_map

    offset = tirx.Var("q_elem_offset", "int32")
    shifted = tirx.decl_buffer((4096, 128), "float16", name="q", elem_offset=offset)
    plain = tirx.decl_buffer((4096, 128), "float16", name="k")
    tensor_map = tirx.Var("q_tensormap", "handle")
    assert ("handle_add_byte_offset(q.data, T.Cast(\"int64\", q.elem_offset) * T.int64(2))"
            in str(encode_tensor_map(tensor_map, shifted, 64, 64, 0)))
    assert "handle_add_byte_offset" not in str(encode_tensor_map(tensor_map, plain, 64, 64, 0))
