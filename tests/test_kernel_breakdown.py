"""The per-kernel breakdown of a model step (tvm_dsm.gpu.kernel_breakdown): folding profiler
records into per-function rows (CPU), and the profiler itself on a TVM kernel (GPU)."""

from __future__ import annotations

import pytest

from tvm_dsm.gpu.kernel_breakdown import critical_path, idle_before, kernel_name, summarize


def test_a_functions_kernels_are_one_row():
    assert kernel_name("fused_NT_matmul_cast_kernel") == "fused_NT_matmul_cast"
    assert kernel_name("rms_norm_kernel_1") == "rms_norm"
    assert kernel_name("ampere_fp16_s16816gemm") == "ampere_fp16_s16816gemm"


def test_rows_per_step_largest_first_with_the_rest_summed():
    records = [("a_kernel", 10.0), ("a_kernel_1", 2.0), ("b_kernel", 3.0), ("c_kernel", 1.0), ("d_kernel", 0.5)] * 2
    out = summarize(records, steps=2, step_us=20.0, top=2)
    assert [r["function"] for r in out["rows"]] == ["a", "b", "other (2 functions)"]
    assert out["rows"][0] == {"function": "a", "launches_per_step": 2.0, "us_per_step": 12.0, "share": 12.0 / 16.5}
    assert out["rows"][2]["us_per_step"] == 1.5 and out["rows"][2]["launches_per_step"] == 2.0
    assert out["kernels_per_step"] == 5.0 and out["kernel_us_per_step"] == 16.5
    assert out["idle_us_per_step"] == 20.0 - 16.5
    assert abs(sum(r["share"] for r in out["rows"]) - 1.0) < 1e-12


def test_idle_time_is_placed_before_the_work_it_delayed():
    """Two steps: a copy overlapping kernel a (no gap), a 6 us gap before b, a 1 us gap before
    a's second kernel, and an 8 us gap between the steps, before a."""
    step = [("a_kernel", 0.0, 10.0), ("Memcpy HtoD", 2.0, 4.0), ("b_kernel", 16.0, 20.0), ("a_kernel_1", 21.0, 22.0)]
    timeline = step + [(name, start + 30.0, end + 30.0) for name, start, end in step]
    out = idle_before(reversed(timeline), steps=2)
    assert out == [{"function": "b", "idle_us_per_step": 6.0, "gaps_per_step": 1.0},
                   {"function": "a", "idle_us_per_step": 5.0, "gaps_per_step": 1.5}]


def test_a_programmatic_launchs_wait_is_billed_to_the_kernel_it_waits_for():
    """b starts at 2 and waits for a (ends at 10), then runs to 14; c runs inside b's time; a copy
    from 20 to 21 counts for no function; d after an idle gap counts from its own start."""
    timeline = [("b_kernel", 2.0, 14.0), ("a_kernel", 0.0, 10.0), ("c_kernel", 11.0, 13.0),
                ("Memcpy HtoD", 20.0, 21.0), ("d_kernel", 25.0, 30.0)]
    critical = critical_path(timeline)
    assert critical == {"a": 10.0, "b": 4.0, "c": 0.0, "d": 5.0}
    out = summarize([(n, e - s) for n, s, e in timeline if not n.startswith("Memcpy")], steps=1,
                    critical=critical, top=2)
    assert [(r["function"], r["critical_us_per_step"]) for r in out["rows"]] == [
        ("b", 4.0), ("a", 10.0), ("other (2 functions)", 5.0)]


@pytest.mark.gpu
def test_the_profiler_sees_a_tvm_kernel():
    import numpy as np
    import tvm
    from tvm import te

    from tvm_dsm.gpu.kernel_breakdown import profile_kernels

    x = te.placeholder((1 << 20,), "float32", name="x")
    y = te.compute(x.shape, lambda i: x[i] * 2.0, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    i, = sch.get_loops(sch.get_sblock("y"))
    bx, tx = sch.split(i, [None, 256])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    lib = tvm.compile(sch.mod, target="cuda")
    dev = tvm.cuda(0)
    a = tvm.runtime.tensor(np.ones(1 << 20, "float32"), dev)
    b = tvm.runtime.tensor(np.zeros(1 << 20, "float32"), dev)
    out = profile_kernels(lambda: lib(a, b), steps=3)
    assert out["kernels_per_step"] == 1.0 and out["rows"][0]["function"] == "main"
    assert out["kernel_us_per_step"] > 0 and out["idle_before"][0]["function"] == "main"
