"""Weights prefetched into L2 ahead of the kernels that read them: the kernel before each of the
KV cache's attention calls takes the weights read after it (up to a budget) and its last kernel
prefetches them as its CTAs finish; the program computes what it did without."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from conftest import LLVM, TARGET, cuda_source, kernels
from tvm_dsm.annotations import PREFETCH_AHEAD_KEPT_KEY, PREFETCH_AHEAD_KEY
from tvm_dsm.ir import substitute
from tvm_dsm.relax_pipeline import lower_for_scheduling
from tvm_dsm.relax_prefetch_ahead import _nbytes, default_budget, prefetch_ahead
from tvm_dsm.transform.prefetch_ahead import _share, tail_kernels
from tvm_dsm.transform.prefetch_ahead import prefetch_ahead as issue_prefetches_ahead
from tvm_dsm.workloads.llama import LLAMA_TINY, LlamaSession, export_llama, random_weights

#: The tiny Llama's weights read after a layer's attention call, in order, and their bytes.
_AFTER_ATTENTION = (("self_attn_o_proj_weight", 256 * 256 * 2), ("post_attention_layernorm_weight", 256 * 2),
                    ("mlp_gate_up_proj_weight", 1024 * 256 * 2), ("mlp_down_proj_weight", 256 * 512 * 2))


@pytest.fixture(scope="module")
def tiny_lowered():
    mod, _ = export_llama(LLAMA_TINY, TARGET)
    return lower_for_scheduling(mod, tvm.target.Target(TARGET))


def _calls(func: relax.Function, name: str) -> list[list[str]]:
    """The argument names of each ``call_tir`` of PrimFunc ``name`` in ``func``, in order."""
    return [[a.name for a in b.value.args[1].fields] for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir"
            and b.value.args[0].name_hint == name]


@pytest.mark.parametrize("budget", [300000, 918016])
def test_the_projection_before_attention_takes_the_weights_read_after_it(tiny_lowered, budget):
    """Each layer's QKV projection (the last weight-reading kernel before the attention call)
    passes that layer's later weights in the order they are read, their first bytes in whole
    16-byte pieces up to the budget: the output projection, the norm, the gate/up projection,
    then the down projection where the budget reaches it (the weights of the next layer's norm
    and QKV projection after it)."""
    fetched = prefetch_ahead(tiny_lowered, budget)
    assert relax.analysis.check_well_formed(fetched)
    func = fetched["fused_NT_matmul_cast"]
    wanted = dict(func.attrs[PREFETCH_AHEAD_KEY])
    left, expected = budget, []
    for _, size in _AFTER_ATTENTION:
        expected.append(min(size, left) // 16 * 16)
        left -= expected[-1]
    expected = [n for n in expected if n]
    assert [int(wanted[p.name]) for p in func.params[2:-1]] == expected
    assert sum(expected) <= budget and all(n % 16 == 0 for n in expected)
    for program in ("decode", "prefill"):
        calls = _calls(fetched[program], "fused_NT_matmul_cast")
        assert len(calls) == LLAMA_TINY.num_layers
        for layer, args in enumerate(calls):
            later = [f"layers_{layer}_{name}" for name, _ in _AFTER_ATTENTION][:len(expected)]
            assert [a.rstrip("1") for a in args[1:]] == [f"layers_{layer}_self_attn_qkv_proj_weight", *later]
    assert _calls(fetched["decode"], "fused_NT_matmul1_cast1_add") == _calls(tiny_lowered["decode"],
                                                                               "fused_NT_matmul1_cast1_add")


def test_no_budget_or_no_attention_call_leaves_the_module_alone(tiny_lowered):
    """(Without its family's mark, ``kernel_window``'s ``attend`` is no attention call.)"""
    assert prefetch_ahead(tiny_lowered, 0).same_as(tiny_lowered)
    assert prefetch_ahead(tiny_lowered, 15).same_as(tiny_lowered)
    unmarked = _without_attention_kernels(_program("kernel_window"))
    assert prefetch_ahead(unmarked, 1 << 20).same_as(unmarked)


def test_calls_that_would_fetch_other_weights_get_copies():
    """``proj`` is called before two attention calls, the weights after them of two kinds (one
    64 x 64; a 32 x 64 and a 64 x 64), and once where no attention call follows: each kind gets
    its own copy, the last call keeps ``proj`` as it was."""
    fetched = prefetch_ahead(_program("two_kinds"), 1 << 20)
    assert relax.analysis.check_well_formed(fetched)
    assert _calls(fetched["two_kinds"], "proj_prefetch0") == [["x", "w0", "w1"]]
    assert _calls(fetched["two_kinds"], "proj_prefetch1") == [["b", "w1", "w2", "w3"]]
    assert _calls(fetched["two_kinds"], "proj") == [["d", "w3"]]
    assert len(fetched["proj"].params) == 3
    for name, shape in (("proj_prefetch0", [64, 64]), ("proj_prefetch1", [32, 64])):
        func = fetched[name]
        assert [int(d) for d in func.params[2].ty.shape] == shape and func.attrs["global_symbol"] == name
        assert int(dict(func.attrs[PREFETCH_AHEAD_KEY])[func.params[2].name]) == int(np.prod(shape)) * 2


def test_a_kernel_of_an_attention_family_is_an_attention_call_too():
    """(Attention as a torch model holds it: a ``call_tir`` the decode attention family took.)"""
    fetched = prefetch_ahead(_program("kernel_window"), 1 << 20)
    assert relax.analysis.check_well_formed(fetched)
    assert _calls(fetched["kernel_window"], "proj_prefetch0") == [["x", "w0", "w1"]]


def test_a_weight_bound_after_the_call_is_not_passed_to_it():
    """(It would be read before it is defined.)"""
    fetched = prefetch_ahead(_program("late"), 1 << 20)
    assert relax.analysis.check_well_formed(fetched)
    assert _calls(fetched["late"], "proj_prefetch0") == [["x", "w0", "w2"]]


def test_a_primfunc_named_outside_its_fetching_calls_keeps_its_parameters():
    """Alone, ``single``'s one call of ``proj`` makes ``proj`` itself take the weight (once,
    though bound twice); where ``proj`` is also a packed call's argument, that use keeps it as
    it was and the fetching call gets a copy."""
    alone = prefetch_ahead(_program("single"), 1 << 20)
    assert relax.analysis.check_well_formed(alone)
    assert _calls(alone["single"], "proj") == [["x", "w0", "w1"]] and len(alone["proj"].params) == 4
    named = prefetch_ahead(_program("single", "named"), 1 << 20)
    assert relax.analysis.check_well_formed(named)
    assert _calls(named["single"], "proj_prefetch0") == [["x", "w0", "w1"]] and len(named["proj"].params) == 3


def test_sub_byte_weights_are_not_prefetched():
    """A share is counted in elements: 4-bit weights would split into misaligned shares."""
    assert _nbytes(relax.TensorType([64, 64], "int4")) is None
    assert _nbytes(relax.TensorType([64, 64], "float16")) == 8192
    weight = tirx.decl_buffer((64, 64), "int4", "w")
    func = tirx.PrimFunc([weight], tirx.Evaluate(0)).with_attr(PREFETCH_AHEAD_KEY, {"w": 2048})
    with pytest.raises(ValueError, match="whole-byte elements"):
        issue_prefetches_ahead(func)


def test_tail_kernels_are_the_last_on_every_path():
    """In ``k1; if c: k2``, both end a path; in ``k1; if c: k2 else: k3``, k2 and k3; in
    ``k1; for i < 4: k2``, k2; in ``k1; for i < n: k2``, both (the loop may not run); in
    ``k1; k2``, k2."""
    k1, k2, k3 = (tirx.Evaluate(i) for i in range(3))
    c = tirx.Var("c", "bool")
    cases = [(tirx.SeqStmt([k1, tirx.IfThenElse(c, k2, None)]), [k2, k1]),
             (tirx.SeqStmt([k1, tirx.IfThenElse(c, k2, k3)]), [k2, k3]),
             (tirx.SeqStmt([k1, tirx.For(tirx.Var("i", "int32"), 0, 4, tirx.ForKind.SERIAL, k2)]), [k2]),
             (tirx.SeqStmt([k1, tirx.For(tirx.Var("i", "int32"), 0, tirx.Var("n", "int32"), tirx.ForKind.SERIAL, k2)]),
              [k2, k1]),
             (tirx.SeqStmt([k1, k2]), [k2])]
    for stmt, expected in cases:
        assert [int(k.value) for k in tail_kernels(stmt, [k1, k2, k3])] == [int(k.value) for k in expected]


@pytest.mark.parametrize(("nbytes", "ctas"), [(131072, 64), (84208 * 2, 7), (16, 5), (4096, 1), (512, 33),
                                             (25 << 20, 96)])
def test_the_ctas_shares_cover_the_bytes_once_in_whole_pieces(nbytes, ctas):
    """Each CTA's requests (at most 64 KB each) tile its share; the shares tile the bytes."""
    weight = tirx.decl_buffer((1 << 25,), "float16", "w")
    cta = tirx.Var("cta", "int32")
    stmt = _share(weight, nbytes, cta, tirx.const(ctas, "int32"))
    analyzer = tvm.sym.Analyzer()
    covered = []
    for b in range(ctas):
        at = substitute(stmt, [(cta, tirx.const(b, "int32"))])
        if not bool(analyzer.simplify(at.condition)):
            continue
        loop = at.then_case
        for i in range(int(analyzer.simplify(loop.extent))):
            ptr, size = substitute(loop.body, [(loop.loop_var, tirx.const(i, "int32"))]).value.args[:2]
            start, count = int(analyzer.simplify(ptr.args[2])), int(analyzer.simplify(size)) // 2
            assert start * 2 % 16 == 0 and count * 2 % 16 == 0 and 0 < count * 2 <= 64 * 1024
            covered.append((start, start + count))
    assert sorted(covered) == covered and covered[0][0] == 0 and covered[-1][1] * 2 == nbytes
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


@pytest.mark.parametrize("kept", [False, True])
def test_the_last_kernel_of_each_path_prefetches_as_its_ctas_finish(assemble, kept):
    """A function of two kernels in sequence: the second prefetches (after its own work, one
    thread a CTA), the first does not; kept, with the evict-last cache policy."""
    func = TwoKernels.with_attr(PREFETCH_AHEAD_KEY, {"w": 4096})
    if kept:
        func = func.with_attr(PREFETCH_AHEAD_KEPT_KEY, True)
    source = cuda_source(tvm.IRModule({"main": func}))
    first, second = kernels(source).values()
    assert "prefetch_L2_global" not in first
    body = second[second.index("{"):]
    assert body.index("out_ptr[") < body.index("prefetch_L2_global")
    assert ("L2::cache_hint" in source) == kept and (str(0x14F0000000000000) in source) == kept  # evict_last
    assemble(source, f"prefetch_ahead_kept{kept}")


def test_the_default_budget_is_half_of_l2():
    assert default_budget(50 * 1024 * 1024) == 25 * 1024 * 1024
    assert default_budget(1000) % 16 == 0


def test_the_tiny_llama_decodes_the_same_with_its_weights_prefetched_ahead_on_cpu(tiny_lowered):
    """The call convention holds: the weights passed after each call's inputs, before its
    output (here on the CPU, where the program keeps the new parameters unused): prefill and a
    decode step give the logits of the program without them, bit for bit."""
    mod, names = export_llama(LLAMA_TINY, {"kind": "llvm"})
    with tvm.target.Target(LLVM):
        fused = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    fetched = prefetch_ahead(fused, 300000)
    assert any(PREFETCH_AHEAD_KEY in (f.attrs or {}) for f in fetched.functions.values()
               if isinstance(f, tirx.PrimFunc))
    weights = random_weights(LLAMA_TINY)
    rng = np.random.default_rng(3)
    prompts, following = rng.integers(0, LLAMA_TINY.vocab_size, (2, 7)), rng.integers(0, LLAMA_TINY.vocab_size, (2, 1))
    logits = []
    for program in (fused, fetched):
        session = LlamaSession(tvm.compile(program, LLVM, tir_pipeline="s_tir_stock"), tvm.cpu(), weights, names,
                               LLAMA_TINY, max_batch_size=2, max_total_seq_len=32, prefill_chunk_size=16)
        logits.append((session.prefill(prompts).numpy(),
                       session.decode(tvm.runtime.tensor(following.astype(np.int32), tvm.cpu())).numpy()))
    for got, want in zip(*logits):
        np.testing.assert_array_equal(got, want)


@I.ir_module
class Programs:
    """Relax functions over 64-wide projections, tested one (with the PrimFuncs) at a time
    (:func:`_program`): ``two_kinds`` calls ``proj`` before two attention calls, the weights after
    them of two kinds (one 64 x 64; a 32 x 64 and a 64 x 64), and once where none follows;
    ``late`` binds ``w1`` after its attention call; ``single`` calls ``proj`` once, before one,
    and binds ``w1`` twice; ``named`` passes ``proj`` to a packed call; ``kernel_window``'s
    attention is a kernel of the decode attention family."""

    @T.prim_func(private=True, s_tir=True)
    def proj(x: T.Buffer((1, 64), "float16"), w: T.Buffer((64, 64), "float16"), y: T.Buffer((1, 64), "float16")):
        for i, j, k in T.grid(1, 64, 64):
            with T.sblock("y"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    y[vi, vj] = T.float16(0)
                y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vj, vk]

    @T.prim_func(private=True, s_tir=True)
    def narrow(x: T.Buffer((1, 64), "float16"), w: T.Buffer((32, 64), "float16"), y: T.Buffer((1, 32), "float16")):
        for i, j, k in T.grid(1, 32, 64):
            with T.sblock("y"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    y[vi, vj] = T.float16(0)
                y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vj, vk]

    @R.function
    def two_kinds(x: R.Tensor((1, 64), "float16"),
                  params: R.Tuple(R.Tensor((64, 64), "float16"), R.Tensor((64, 64), "float16"),
                                  R.Tensor((32, 64), "float16"), R.Tensor((64, 64), "float16"))):
        R.func_attr({"num_input": 1})
        cls = Programs
        with R.dataflow():
            w0 = params[0]
            w1 = params[1]
            w2 = params[2]
            w3 = params[3]
            a = R.call_tir(cls.proj, (x, w0), out_ty=R.Tensor((1, 64), "float16"))
            b = R.call_dps_packed("vm.builtin.attention_kv_cache_attention_with_fused_qkv", (a,),
                                  out_ty=R.Tensor((1, 64), "float16"))
            c = R.call_tir(cls.proj, (b, w1), out_ty=R.Tensor((1, 64), "float16"))
            d = R.call_dps_packed("vm.builtin.attention_kv_cache_attention_with_fused_qkv", (c,),
                                  out_ty=R.Tensor((1, 64), "float16"))
            e = R.call_tir(cls.narrow, (d, w2), out_ty=R.Tensor((1, 32), "float16"))
            f = R.call_tir(cls.proj, (d, w3), out_ty=R.Tensor((1, 64), "float16"))
            R.output(e, f)
        return e, f

    @R.function
    def late(x: R.Tensor((1, 64), "float16"),
             params: R.Tuple(R.Tensor((64, 64), "float16"), R.Tensor((64, 64), "float16"),
                             R.Tensor((64, 64), "float16"))):
        R.func_attr({"num_input": 1})
        cls = Programs
        with R.dataflow():
            w0 = params[0]
            w2 = params[2]
            a = R.call_tir(cls.proj, (x, w0), out_ty=R.Tensor((1, 64), "float16"))
            b = R.call_dps_packed("vm.builtin.attention_kv_cache_attention_with_fused_qkv", (a,),
                                  out_ty=R.Tensor((1, 64), "float16"))
            w1 = params[1]
            c = R.call_tir(cls.proj, (b, w1), out_ty=R.Tensor((1, 64), "float16"))
            d = R.call_tir(cls.proj, (c, w2), out_ty=R.Tensor((1, 64), "float16"))
            R.output(d)
        return d

    @R.function
    def single(x: R.Tensor((1, 64), "float16"),
               params: R.Tuple(R.Tensor((64, 64), "float16"), R.Tensor((32, 64), "float16"))):
        R.func_attr({"num_input": 1})
        cls = Programs
        with R.dataflow():
            w0 = params[0]
            w1 = params[1]
            w1b = params[1]
            a = R.call_tir(cls.proj, (x, w0), out_ty=R.Tensor((1, 64), "float16"))
            b = R.call_dps_packed("vm.builtin.attention_kv_cache_attention_with_fused_qkv", (a,),
                                  out_ty=R.Tensor((1, 64), "float16"))
            c = R.call_tir(cls.narrow, (b, w1), out_ty=R.Tensor((1, 32), "float16"))
            d = R.call_tir(cls.narrow, (b, w1b), out_ty=R.Tensor((1, 32), "float16"))
            R.output(c, d)
        return c, d

    @T.prim_func(private=True, s_tir=True)
    def attend(x: T.Buffer((1, 64), "float16"), y: T.Buffer((1, 64), "float16")):
        T.func_attr({"tvm_dsm.family": "decode_attention"})
        for i, j in T.grid(1, 64):
            with T.sblock("y"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = x[vi, vj]

    @R.function
    def kernel_window(x: R.Tensor((1, 64), "float16"),
                      params: R.Tuple(R.Tensor((64, 64), "float16"), R.Tensor((64, 64), "float16"))):
        R.func_attr({"num_input": 1})
        cls = Programs
        with R.dataflow():
            w0 = params[0]
            w1 = params[1]
            a = R.call_tir(cls.proj, (x, w0), out_ty=R.Tensor((1, 64), "float16"))
            b = R.call_tir(cls.attend, (a,), out_ty=R.Tensor((1, 64), "float16"))
            c = R.call_tir(cls.proj, (b, w1), out_ty=R.Tensor((1, 64), "float16"))
            R.output(c)
        return c

    @R.function
    def named(x: R.Tensor((1, 64), "float16")):
        cls = Programs
        out = R.call_pure_packed("tvm_dsm.test.apply", cls.proj, x, ty_args=R.Tensor((1, 64), "float16"))
        return out


def _without_attention_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with no PrimFunc marked as an attention family's (``attend`` a plain copy)."""
    return tvm.IRModule({gv: f.without_attr("tvm_dsm.family") if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()})


def _program(*names: str) -> tvm.IRModule:
    """The Relax functions ``names`` of :class:`Programs` with its PrimFuncs."""
    return tvm.IRModule({gv: f for gv, f in Programs.functions.items()
                         if gv.name_hint in (*names, "proj", "narrow", "attend")})


@T.prim_func(s_tir=True)
def TwoKernels(w: T.Buffer((64, 64), "float16"), x: T.Buffer((64,), "float16"), out: T.Buffer((64,), "float16")):
    mid = T.sblock_alloc_buffer((64,), "float16")
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("first"):
                i = T.axis.spatial(64, bx * 32 + tx)
                mid[i] = x[i] * w[i, i]
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(16, thread="threadIdx.x"):
            with T.sblock("second"):
                i = T.axis.spatial(64, bx * 16 + tx)
                out[i] = mid[i] + x[i]


@pytest.mark.gpu
def test_tiny_llama_on_the_gpu_decodes_the_same_with_its_weights_prefetched_ahead(tmp_path):
    """The tiny Llama compiled with and without the prefetches (the benchmark's
    ``tvm_dsm_step_graphs`` configurations): 24 teacher-forced steps from CUDA graphs give the same
    logits bit for bit, and the QKV projection's kernels issue the prefetches."""
    import json

    from tvm_dsm.gpu.llm import compile_config

    logits = []
    for config in ("tvm_dsm_step_graphs", "tvm_dsm_step_graphs_prefetch_ahead"):
        compile_config(config, LLAMA_TINY, tmp_path / f"{config}.so", tmp_path / f"{config}.json")
        executable = tvm.runtime.load_module(str(tmp_path / f"{config}.so"))
        names = json.loads((tmp_path / f"{config}.json").read_text())["names"]
        dev = tvm.cuda(0)
        rng = np.random.default_rng(5)
        session = LlamaSession(executable, dev, random_weights(LLAMA_TINY), names, LLAMA_TINY, max_batch_size=2,
                               max_total_seq_len=128, prefill_chunk_size=32, step_graphs=True)
        session.prefill(rng.integers(0, LLAMA_TINY.vocab_size, (2, 11)))
        forced = rng.integers(0, LLAMA_TINY.vocab_size, (2, 24)).astype(np.int32)
        logits.append(np.stack([session.decode(tvm.runtime.tensor(forced[:, s:s + 1], dev)).numpy()
                                for s in range(forced.shape[1])]))
        session.close()
    assert np.isfinite(logits[0]).all()
    np.testing.assert_array_equal(logits[1], logits[0])
