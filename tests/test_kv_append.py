"""tvm-dsm's KV append (tvm_dsm.kernels.kv_append): which functions it takes, the kernel it
writes, and on the GPU the pages it writes against numpy's scatter, tokens at position -1 left
out."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.nn.llm.kv_cache import _kv_cache_transpose_append

from conftest import TARGET, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.kernels.kv_append import kv_append_kernel


def test_a_token_a_cta_and_a_16_byte_vector_a_thread():
    source = cuda_source(tvm.IRModule({"main": kv_append_kernel(_kv_cache_transpose_append(8, 64, "float16"))}))
    assert "__launch_bounds__(64)" in source  # 8 heads of 8 vectors
    assert source.count("*(uint4*)(pages_ptr") == 2  # the key and the value, 16 bytes each


def test_it_refuses_what_it_cannot_vectorize_or_is_not_the_append():
    with pytest.raises(ClusterError, match="multiple of 8"):
        kv_append_kernel(_kv_cache_transpose_append(8, 36, "float16"))
    with pytest.raises(ClusterError, match="more than a CTA's"):
        kv_append_kernel(_kv_cache_transpose_append(128, 128, "float16"))
    func = _kv_cache_transpose_append(8, 64, "float16")
    pages = func.params[0]
    shifted = tvm.tirx.decl_buffer(pages.ty.shape, pages.ty.dtype, "pages", elem_offset=4)
    with pytest.raises(ClusterError, match="misaligned"):
        kv_append_kernel(func.specialize({pages: shifted}))
    renamed = _kv_cache_transpose_append(8, 64, "float16").with_attr("global_symbol", "other")
    with pytest.raises(ClusterError, match="not nn.llm's KV append"):
        kv_append_kernel(renamed)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, dim, dtype, tokens", [(8, 64, "float16", 1), (8, 64, "float16", 531),
                                                       (4, 128, "bfloat16", 100), (2, 96, "float16", 0)])
def test_it_writes_what_numpy_scatters_on_the_gpu(heads, dim, dtype, tokens):
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    np_dtype = np.dtype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    rng, page, pages_n = np.random.default_rng(tokens), 16, 64
    positions = rng.permutation(pages_n * page)[:tokens].astype(np.int32)
    positions[rng.random(tokens) < 0.2] = -1  # tokens the cache does not keep
    k, v = (rng.standard_normal((tokens, heads, dim)).astype(np_dtype) for _ in range(2))
    pages = np.full((pages_n, 2, heads, page, dim), np.nan, np_dtype)
    want = pages.copy()
    for token, position in enumerate(positions):
        if position >= 0:
            want[position // page, 0, :, position % page] = k[token]
            want[position // page, 1, :, position % page] = v[token]
    lib = tvm.compile(tvm.IRModule({"main": kv_append_kernel(_kv_cache_transpose_append(heads, dim, dtype))}),
                      target=TARGET, tir_pipeline="tvm_dsm")
    dev = tvm.cuda(0)
    got = tvm.runtime.tensor(pages, dev)
    lib(got, *(tvm.runtime.tensor(a, dev) for a in (k, v, positions)))
    np.testing.assert_array_equal(got.numpy().astype(np.float32), want.astype(np.float32))
