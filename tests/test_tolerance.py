"""The correctness bound of a result covers the least precise dtype it passes through."""

import ml_dtypes
import numpy as np

from tvm_dsm.bench.tolerance import tolerance
from tvm_dsm.workloads.generated import REFERENCES


def test_bound_is_the_least_precise_dtype():
    assert tolerance(["float32", "float32"]) == 1e-5
    assert tolerance(["float16", "float32"]) == 2e-3
    assert tolerance(["float32", "float8_e4m3fn", "float32"]) == 2e-3
    assert tolerance(["float16", "int32"]) == 2e-3  # integer outputs must match exactly instead


def test_fp8_output_of_fp32_arithmetic_needs_the_fp8_bound():
    """RMSNorm + fp8 quantization computed in fp32 (as a kernel does) against float64: rows whose
    fp32 value sits by an fp8 rounding boundary round the other way, which fp32's bound rejects
    though nothing is wrong; the fp8 bound holds."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((512, 3000)), rng.standard_normal(3000)
    want, _ = REFERENCES["rms_norm_fp8"](x, w, eps=1e-5)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    y = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + np.float32(1e-5)) * w32
    scaled = y * (np.float32(448) / np.abs(y).max(-1, keepdims=True))
    got = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 1e-5 < err < tolerance(["float32", "float8_e4m3fn"]), err
