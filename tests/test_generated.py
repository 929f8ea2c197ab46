"""Generated functions (tvm_dsm.workloads.generated): each builds for CUDA through tvm_dsm.build
or is refused naming a hardware limit, and the generator's float64 references agree with TVM's
llvm build of the unscheduled functions (the GPU suite checks its kernels against the same
definitions)."""

from __future__ import annotations

import collections
import logging
import re

import ml_dtypes
import numpy as np
import pytest
import tvm

import tvm_dsm
from tvm_dsm.bench.tolerance import tolerance
from tvm_dsm.errors import ClusterError
from tvm_dsm.workloads.generated import CLASSES, DTYPES, generate

from conftest import LLVM, TARGET

#: What a refusal must name: a resource of the GPU.
HARDWARE_LIMIT = re.compile(r"shared memory|register|threads|cluster size|bytes", re.IGNORECASE)


@pytest.mark.parametrize("case", generate(0, 40), ids=lambda c: c.name)
def test_builds_for_cuda(case, caplog):
    """Built by the path planned for it: a tvm-dsm kernel that does not lower is a tvm-dsm bug,
    even where ``build`` then falls back to a schedule that does."""
    caplog.set_level(logging.WARNING, logger="tvm_dsm")
    try:
        executable = tvm_dsm.build(case.func, TARGET)
    except ClusterError as err:
        assert HARDWARE_LIMIT.search(str(err)), str(err)
        return
    imports = executable.mod.imports
    assert imports and "__global__" in imports[0].inspect_source(), "no CUDA kernel"
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _numpy_dtype(dtype: str):
    return getattr(ml_dtypes, dtype) if dtype in ("bfloat16", "float8_e4m3fn") else np.dtype(dtype)


def _relative_error(out: np.ndarray, want: np.ndarray) -> float:
    if out.dtype.kind in "iu":
        return 0.0 if np.array_equal(out, want) else np.inf
    out = out.astype(np.float64)
    return float(np.linalg.norm(out - want) / max(np.linalg.norm(want), 1e-300))


#: Small cases TVM's llvm build can run: not bf16 (TVM 0.27 legalizes bf16 storage for llvm
#: only after MakePackedAPI, which the unscheduled function fails).
SMALL = [c for c in generate(1, 80, small=True) if all(a["dtype"] != "bfloat16" for a in c.args)]


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_reference_matches_llvm(case):
    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal(a["shape"]) * a.get("scale", 1.0)).astype(_numpy_dtype(a["dtype"]))
              for a in case.inputs]
    outputs = [tvm.runtime.tensor(np.full(a["shape"], 0, _numpy_dtype(a["dtype"]))) for a in case.outputs]
    tvm.compile(case.func, target=LLVM)(*[tvm.runtime.tensor(x) for x in inputs], *outputs)
    errors = [_relative_error(out.numpy(), want) for out, want in zip(outputs, case.reference(*inputs))]
    # a function that rounds its scores to 16 bits stays within a few times its tolerance
    bound = tolerance(a["dtype"] for a in case.args) * (1 if case.within_tolerance else 4)
    assert max(errors) < bound, errors


def _thread_axes_bound_twice(stmt, bound: dict, found: list) -> None:
    """Append to ``found`` each loop bound to a thread axis inside a loop bound to the same axis
    with another extent (one of them then covers the other's threads with the wrong count)."""
    if isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.THREAD_BINDING:
        tag, extent = stmt.thread_binding.thread_tag, str(stmt.extent)
        if tag.startswith("threadIdx") and bound.get(tag, extent) != extent:
            found.append((tag, bound[tag], extent))
        bound = {**bound, tag: extent}
    if isinstance(stmt, tvm.tirx.SeqStmt):
        inner = list(stmt.seq)
    elif isinstance(stmt, tvm.tirx.IfThenElse):
        inner = [stmt.then_case, stmt.else_case]
    else:
        inner = [getattr(stmt, name, None) for name in ("block", "body", "init")]
    for child in inner:
        if isinstance(child, tvm.tirx.Stmt):
            _thread_axes_bound_twice(child, bound, found)


def test_no_schedule_binds_a_thread_axis_inside_itself_with_another_extent():
    """A row GEMV of one lane a row (K = 16 at one row) bound its rows to threadIdx.x inside the
    lane's threadIdx.x of extent 1, and each CTA computed its first row alone: every small case's
    schedule is checked for such nested bindings."""
    found = {}
    for case in generate(1, 80, small=True):
        try:
            sch = tvm_dsm.driver.schedule(case.func, TARGET)
        except ClusterError:
            continue
        nested: list = []
        _thread_axes_bound_twice(sch.mod["main"].body, {}, nested)
        if nested:
            found[case.name] = nested
    assert not found, found


def test_generator_is_seeded_and_covers_the_space():
    cases = generate(0, 300)
    assert [c.name for c in cases[:40]] == [c.name for c in generate(0, 40)]
    assert len({c.name for c in cases}) == 300
    styles = collections.defaultdict(set)
    for c in cases:
        styles[c.op_class].add(c.style)
    assert set(styles) == set(CLASSES)
    assert all({"te", "topi"} <= s for k, s in styles.items() if k != "decode_attention"), styles
    assert {c.inputs[0]["dtype"] for c in cases} == set(DTYPES)
    assert {c.params.get("layout") for c in cases} >= {"nk", "kn", "bhsd", "bshd", "hsd"}
    assert sum(c.symbolic for c in cases) >= 20
    assert {a["shape"][0] for c in cases if c.op_class == "dense" for a in c.inputs[:1]} & {1, 7, 13, 257}


def test_a_relax_dense_with_int64_indices_takes_the_split_k_family_and_assembles(assemble):
    """Relax's legalized dense indexes in int64: the DSM reduction's vector accesses run over
    int64 loop variables, which the lowering bounds in their own type."""
    cases = [c for c in generate(0, 600) if c.op_class == "dense" and c.style == "relax" and not c.symbolic
             and c.params["layout"] == "nk" and c.inputs[0]["dtype"] != "float32"
             and all(d % 8 == 0 for d in c.inputs[1]["shape"])]
    # the first whose pick reduces over a cluster (a tall K over few rows)
    case, ranking = next((c, r) for c in cases if (r := tvm_dsm.plan(c.func, target=TARGET)).family.name == "split_k_gemm"
                         and r.plans[0].config.cluster_size > 1)
    source = tvm.compile(ranking.schedule().mod, target=TARGET).mod.imports[0].inspect_source()
    assert "ld_vec_shared__cluster_v4_f32" in source  # the partials are read from peers as vectors
    assemble(source, case.name)


def test_a_bf16_masked_cascade_writes_its_nan_as_bits_nvcc_accepts(assemble):
    """A fused row whose final divisor is 0 ends NaN (as the unfused 0 / 0 does); in bf16 the
    NaN is written by its bits: TVM prints a bf16 NaN constant as ``nanf``, which nvcc rejects."""
    case = next(c for c in generate(0, 300) if c.op_class == "decode_attention" and c.style == "relax"
                and c.inputs[0]["dtype"] == "bfloat16")
    source = tvm_dsm.build(case.func, target=TARGET).mod.imports[0].inspect_source()
    assert "nanf/*nan*/" not in source
    assemble(source, case.name)
