"""Modules built by ``tvm_dsm.build`` called with bad arguments raise an error that names the
problem, before any kernel runs: never a wrong answer, a crashed process or a hang.

One kernel of each kind: a split-K GEMM (TMA + wgmma), a fused GEMM chain (FFN, DSM), cluster
cascades (softmax statistics, decode attention), the TMA attention kernel and top-k rows (MoE
routing). TVM's packed API checks the argument count, type, rank, dtype, device, shape, compact
strides and a zero ``byte_offset``; tvm-dsm checks the shape before the strides (a contiguous
tensor of another shape is reported as a wrong shape, not as non-compact strides) and the data's
16-byte alignment, which a view starting one element into a tensor's storage breaks
(:mod:`tvm_dsm.transform.argument_checks`). The CPU tests call the host function with tensors that describe host
memory as CUDA memory (every check runs on the host before the launch); the GPU tests call it
with PyTorch tensors through DLPack, as users do.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import tvm
import tvm_ffi

import tvm_dsm
from tvm_dsm.transform.argument_checks import ARGUMENT_ALIGNMENT
from tvm_dsm.workloads.cascades import attention, decode_attention, moe_routing, softmax_stats
from tvm_dsm.workloads.chains import gemm_chain
from tvm_dsm.workloads.dense import dense

#: One function per kind of kernel and the type of the configuration the planner must pick.
KINDS = {
    "split_k_gemm": (lambda: dense(128, 256, 512), "SplitKGemmConfig"),
    "fused_ffn": (lambda: gemm_chain(16, 256, 128, 128, "relu"), "FusedChainConfig"),
    "softmax_stats": (lambda: softmax_stats(64, 8192), "CascadeSplit"),
    "decode_attention": (lambda: decode_attention(8, 2048, 64), "CascadeSplit"),
    "attention": (lambda: attention(8, 256, 512, 64), "AttentionConfig"),
    "top_k_rows": (lambda: moe_routing(256, 1024, 4), "TopKRowsConfig"),
}

#: What each bad argument must raise, as a pattern over the error's message (``{name}``: the
#: argument's name).
EXPECTED = {
    "wrong_shape": (ValueError, r"Invalid {name}\.shape\[\d\]"),
    "too_small": (ValueError, r"Invalid {name}\.shape\[0\]"),
    "wrong_dtype": (TypeError, r"Mismatched {name}\.dtype .*expected \w+"),
    "cpu_tensor": (ValueError, r"Mismatched {name}\.device_type .*expected cuda"),
    "non_contiguous": (ValueError, r"Mismatched {name}\.strides .*compact"),
    "offset_view": (ValueError, r"Misaligned {name}\.data .*multiple of 16 bytes"),
    "byte_offset": (ValueError, r"Invalid {name}\.byte_offset|Misaligned {name}\.data"),
}


@pytest.fixture(scope="module")
def built() -> dict:
    """Each kind's function and its module from ``tvm_dsm.build``, built on first use."""
    cache: dict = {}

    def get(kind: str):
        if kind not in cache:
            make, config = KINDS[kind]
            func = make()
            assert type(tvm_dsm.plan(func).best.config).__name__ == config
            cache[kind] = func, tvm_dsm.build(func)["main"]
        return cache[kind]

    return get


def _params(func) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of each tensor parameter of ``func``."""
    return [(str(p.name), tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)) for p in func.params]


def _other_dtype(dtype: str) -> str:
    return "float32" if dtype != "float32" else "float16"


def _check_message(err: pytest.ExceptionInfo, case: str, name: str) -> None:
    kind, pattern = EXPECTED[case]
    assert err.type is kind, err.value
    assert re.search(pattern.format(name=re.escape(name)), str(err.value), re.S), str(err.value)


# -- CPU: the host function's checks, with host memory described as CUDA memory ---------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_KDL_CPU, _KDL_CUDA = 1, 2
_TYPE_CODES = {"i": 0, "u": 1, "f": 2}


class DescribedTensor:
    """A DLPack producer describing ``shape`` elements of ``dtype`` at element ``offset`` of a
    host buffer as a tensor on ``device_type`` (CUDA by default), with ``strides`` and
    ``byte_offset`` as given: what PyTorch exports for a CUDA tensor or view, without a GPU.
    TVM's argument checks read only this description."""

    def __init__(self, shape, dtype: str, *, offset: int = 0, strides=None, byte_offset: int = 0,
                 device_type: int = _KDL_CUDA):
        dt = np.dtype(dtype)
        self.storage = np.zeros(int(np.prod(shape)) + 64, dt)  # room for offsets
        start = (-self.storage.ctypes.data % ARGUMENT_ALIGNMENT) // dt.itemsize + offset
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.managed = _DLManagedTensor()
        tensor = self.managed.dl_tensor
        tensor.data = self.storage.ctypes.data + start * dt.itemsize
        tensor.device = _DLDevice(device_type, 0)
        tensor.ndim = len(shape)
        tensor.dtype = _DLDataType(_TYPE_CODES[dt.kind], dt.itemsize * 8, 1)
        tensor.shape = self.shape
        tensor.strides = self.strides
        tensor.byte_offset = byte_offset
        self.device_type = device_type

    def narrowed(self, shape) -> DescribedTensor:
        """The same storage and strides described with ``shape``."""
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed.dl_tensor.shape = self.shape
        return self

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, **_):
        return _capsule(ctypes.addressof(self.managed), b"dltensor", None)


def _described(case: str, shape: tuple[int, ...], dtype: str) -> DescribedTensor:
    """The bad argument ``case`` in place of a tensor of ``shape`` and ``dtype``."""
    if case == "wrong_shape":
        return DescribedTensor((*shape[:-1], shape[-1] + 8), dtype)
    if case == "too_small":
        return DescribedTensor((shape[0] - 1, *shape[1:]), dtype)
    if case == "wrong_dtype":
        return DescribedTensor(shape, _other_dtype(dtype))
    if case == "cpu_tensor":
        return DescribedTensor(shape, dtype, device_type=_KDL_CPU)
    if case == "non_contiguous":  # every other element of the last axis of a wider tensor
        wide = (*shape[:-1], 2 * shape[-1])
        strides = [int(np.prod(wide[axis + 1:])) for axis in range(len(shape) - 1)] + [2]
        return DescribedTensor(wide, dtype, strides=strides).narrowed(shape)
    if case == "offset_view":
        return DescribedTensor(shape, dtype, offset=1)
    if case == "byte_offset":
        return DescribedTensor(shape, dtype, byte_offset=ARGUMENT_ALIGNMENT)
    raise ValueError(case)


def _described_arguments(func, case: str, position: int) -> tuple[list, str]:
    """Well-formed CUDA-described arguments of ``func``, the one at ``position`` replaced by
    the bad argument ``case``; with that argument's name."""
    params = _params(func)
    args = [DescribedTensor(shape, dtype) for _, shape, dtype in params]
    name, shape, dtype = params[position]
    args[position] = _described(case, shape, dtype)
    return args, name


@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_first_input_raises_naming_the_problem(built, kind, case):
    func, module = built(kind)
    args, name = _described_arguments(func, case, 0)
    with pytest.raises(Exception) as err:
        module(*args)
    _check_message(err, case, name)


@pytest.mark.parametrize("case", ["too_small", "offset_view", "non_contiguous"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_output_raises_naming_the_problem(built, kind, case):
    func, module = built(kind)
    args, name = _described_arguments(func, case, len(func.params) - 1)
    with pytest.raises(Exception) as err:
        module(*args)
    _check_message(err, case, name)


def _no_gpu() -> bool:
    try:
        return not tvm.cuda(0).exist
    except Exception:  # noqa: BLE001  (no CUDA runtime at all)
        return True


@pytest.mark.skipif(not _no_gpu(), reason="would launch kernels on host memory described as CUDA memory")
@pytest.mark.parametrize("offset", [0, 8, 24])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_aligned_arguments_pass_every_check(built, kind, offset):
    """Views starting a multiple of 16 bytes into their storage pass every argument check (the
    call gets as far as the launch, which needs a GPU); 8 fp16 or fp32 elements are 16 or 32
    bytes, 24 are 48 or 96."""
    func, module = built(kind)
    args = [DescribedTensor(shape, dtype, offset=offset) for _, shape, dtype in _params(func)]
    with pytest.raises(Exception) as err:
        module(*args)
    assert not re.search(r"Mismatched|Invalid|Misaligned", str(err.value)), err.value
    assert "CUDA" in str(err.value), err.value


# -- GPU: PyTorch tensors through DLPack -------------------------------------------------------

def _torch_tensors(func, torch) -> list:
    """Inputs (random, scaled like activations) and poisoned outputs on the GPU, in parameter
    order."""
    outputs = _output_positions(func)
    tensors = []
    for position, (_, shape, dtype) in enumerate(_params(func)):
        random = (torch.randn(shape, device="cuda") / 4).to(getattr(torch, dtype))
        tensors.append(_poisoned_like(random, torch) if position in outputs else random)
    return tensors


def _poisoned_like(tensor, torch):
    """NaN, or the most negative integer (never an index), in ``tensor``'s shape and dtype."""
    poison = float("nan") if tensor.dtype.is_floating_point else torch.iinfo(tensor.dtype).min
    return torch.full_like(tensor, poison)


def _all_poisoned(tensor, torch) -> bool:
    if tensor.dtype.is_floating_point:
        return bool(torch.isnan(tensor).all())
    return bool((tensor == torch.iinfo(tensor.dtype).min).all())


def _output_positions(func) -> set[int]:
    """The positions of ``func``'s outputs: the parameters its body stores to."""
    from tvm_dsm.ir import find_all

    stored = {str(s.buffer.name) for s in find_all(func.body, tvm.tirx.BufferStore)}
    return {i for i, p in enumerate(func.params) if str(p.name) in stored}


def _torch_bad(case: str, good, torch):
    """The bad argument ``case`` in place of the GPU tensor ``good``."""
    shape, dt = tuple(good.shape), good.dtype
    if case == "wrong_shape":
        return torch.zeros((*shape[:-1], shape[-1] + 8), dtype=dt, device="cuda")
    if case == "too_small":
        return torch.zeros((shape[0] - 1, *shape[1:]), dtype=dt, device="cuda")
    if case == "wrong_dtype":
        return good.to(torch.float32 if dt != torch.float32 else torch.float16)
    if case == "cpu_tensor":
        return good.cpu()
    if case == "non_contiguous":  # every other element of the last axis of a wider tensor
        return torch.cat([good, good], dim=-1)[..., ::2]
    if case == "offset_view":  # one element into a fresh storage: PyTorch moves the pointer
        return torch.cat([good.flatten()[:1], good.flatten()])[1:].view(shape)
    if case == "byte_offset":  # a TVM view of a copy, one element into it
        copy = tvm.runtime.tensor(torch.cat([good.flatten()[:1], good.flatten()]).cpu().numpy(), tvm.cuda(0))
        return copy._create_view(shape, str(dt).removeprefix("torch."), good.element_size())
    raise ValueError(case)


def _call(module, tensors):
    module(*[t if isinstance(t, tvm.runtime.Tensor) else tvm_ffi.from_dlpack(t) for t in tensors])


def _expected_outputs(func, module, tensors, torch) -> list:
    """The outputs of a good call on ``tensors``' inputs, into fresh poisoned outputs."""
    outputs = _output_positions(func)
    fresh = [_poisoned_like(t, torch) if i in outputs else t for i, t in enumerate(tensors)]
    _call(module, fresh)
    torch.cuda.synchronize()
    return [fresh[i] for i in sorted(outputs)]


def _assert_same(got: list, want: list, torch) -> None:
    """Equal outputs: indices exactly, values within fp16's rounding (a reduction's order may
    differ between calls)."""
    for g, w in zip(got, want):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=2e-3, atol=1e-5)
        else:
            assert torch.equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(EXPECTED))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gpu_bad_argument_raises_and_launches_nothing(built, kind, case):
    """A bad first input raises naming the problem; the poisoned outputs stay untouched (no
    kernel ran), and a good call afterwards gives the good result (the CUDA context is fine)."""
    torch = pytest.importorskip("torch")
    func, module = built(kind)
    tensors = _torch_tensors(func, torch)
    want = _expected_outputs(func, module, tensors, torch)
    bad = list(tensors)
    bad[0] = _torch_bad(case, tensors[0], torch)
    name = _params(func)[0][0]
    with pytest.raises(Exception) as err:
        _call(module, bad)
    torch.cuda.synchronize()
    _check_message(err, case, name)
    outputs = [tensors[i] for i in sorted(_output_positions(func))]
    assert all(_all_poisoned(o, torch) for o in outputs)
    _call(module, tensors)
    torch.cuda.synchronize()
    _assert_same(outputs, want, torch)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["too_small", "offset_view", "non_contiguous"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gpu_bad_output_raises(built, kind, case):
    torch = pytest.importorskip("torch")
    func, module = built(kind)
    tensors = _torch_tensors(func, torch)
    position = len(tensors) - 1
    tensors[position] = _torch_bad(case, tensors[position], torch)
    with pytest.raises(Exception) as err:
        _call(module, tensors)
    torch.cuda.synchronize()
    _check_message(err, case, _params(func)[position][0])


@pytest.mark.gpu
@pytest.mark.parametrize("elements", [8, 64])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gpu_aligned_views_give_the_same_result(built, kind, elements):
    """Every argument a view starting ``elements`` into a larger storage (16 or 128 bytes for
    fp16, 32 or 256 for fp32): accepted, and bit-equal to the call on fresh tensors (TMA tensor
    maps need only 16-byte-aligned bases)."""
    torch = pytest.importorskip("torch")
    func, module = built(kind)
    tensors = _torch_tensors(func, torch)
    want = _expected_outputs(func, module, tensors, torch)
    views = [torch.cat([t.flatten()[:elements], t.flatten()])[elements:].view(t.shape) for t in tensors]
    assert all(v.data_ptr() % ARGUMENT_ALIGNMENT == 0 and v.data_ptr() != t.data_ptr()
               for v, t in zip(views, tensors))
    _call(module, views)
    torch.cuda.synchronize()
    _assert_same([views[i] for i in sorted(_output_positions(func))], want, torch)


@pytest.mark.gpu
def test_gpu_torch_tensors_passed_directly_are_checked_too(built):
    """PyTorch tensors handed to the module without ``from_dlpack`` go through the same
    checks."""
    torch = pytest.importorskip("torch")
    func, module = built("attention")
    tensors = _torch_tensors(func, torch)
    tensors[0] = _torch_bad("offset_view", tensors[0], torch)
    with pytest.raises(ValueError, match=r"Misaligned q\.data"):
        module(*tensors)
