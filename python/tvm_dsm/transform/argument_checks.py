"""Host-side checks of a kernel's tensor arguments beyond those of TVM's packed API.

TVM's packed API (MakePackedAPI) checks a tensor argument's type, rank, dtype, device, compact
strides, shape and a zero ``byte_offset``, in that order, but not where its data starts:

* A view that starts inside another tensor's storage (``flat[1:1 + n].view(m, k)`` in PyTorch,
  whose DLPack export folds the offset into the data pointer) passes every check. tvm-dsm's
  kernels read and write global memory with 16-byte vector accesses (``float4``, ``uint4``,
  16-byte ``cp.async``) and TMA tensor maps, whose global address must be a multiple of 16
  bytes: the kernel would fault on a misaligned address (which leaves the CUDA context
  unusable) or the tensor map's encoding fail with CUDA's bare "invalid argument".
* A contiguous tensor of another shape (``[128, 520]`` for ``[128, 512]``) fails the strides
  check first, reported as "expected to be compact array", which does not say what is wrong.

So each packed host function that launches a GPU kernel checks every tensor argument's shape
and then its alignment before TVM's strides check, raising ValueError naming the argument.
The checks read the DLTensor and sit just before the packed API's ``storage_alignment``
annotation of that argument: LLVM turns the annotation into an alignment assumption (64
bytes) about the data pointer, which would fold an alignment check placed after it to true.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..ir import find_all

#: Bytes a tensor argument's data address must be a multiple of: a 16-byte vector access and
#: a TMA tensor map's global address both need it.
ARGUMENT_ALIGNMENT = 16

#: ``tvm_struct_get`` fields (TVM's ``builtin::TVMStructFieldKind``): a DLTensor's data and
#: shape pointers, and an element of an int64 array.
_ARR_DATA, _ARR_SHAPE, _INT64_ARRAY_ELEM = 1, 2, 17
#: ``calling_conv`` of a function with the packed (tvm-ffi) calling convention.
_PACKED_CALLING_CONV = 1


@dataclass(frozen=True)
class _Argument:
    """A tensor argument: the buffer MakePackedAPI declares on it, its DLTensor handle, the
    variable bound to its shape pointer, and its declared shape."""

    buffer: tirx.Var
    handle: tirx.Var
    dims: tirx.Var
    shape: list


def _arguments(func: tirx.PrimFunc) -> list[_Argument]:
    """Each tensor argument, from the ``Bind(shape_var, tvm_struct_get(handle, 0, kArrShape))``
    and ``decl_buffer(shape, data=reinterpret(tvm_struct_get(handle, 0, kArrData)))``
    MakePackedAPI writes. Matched by identity, not by name: two arguments may share a name (TOPI
    names each ``dense`` output ``T_matmul_NT``)."""

    def field_of(value, field):
        """The handle whose DLTensor ``field`` ``value`` reads, if it reads one."""
        if (isinstance(value, tvm.ir.Call) and value.op.name == "tirx.tvm_struct_get"
                and int(value.args[2]) == field):
            return value.args[0]
        return None

    shape_vars = [(field_of(bind.value, _ARR_SHAPE), bind.var) for bind in find_all(func.body, tirx.Bind)]
    found = []
    for decl in find_all(func.body, tirx.DeclBuffer):
        data = decl.data
        reinterpreted = isinstance(data, tvm.ir.Call) and data.op.name == "tirx.reinterpret"
        handle = field_of(data.args[0], _ARR_DATA) if reinterpreted else None
        dims = next((var for h, var in shape_vars if h is not None and handle is not None and h.same_as(handle)), None)
        if dims is not None:
            found.append(_Argument(decl.buffer, handle, dims, list(decl.buffer.shape)))
    return found


def _value_error(condition, message: str) -> tirx.AssertStmt:
    """``assert condition`` raising ValueError. (TVM 0.27's Python AssertStmt names its first
    parameters ``kind, condition`` but hands them on in that order to a constructor taking
    ``condition, kind``: passed here in the constructor's order.)"""
    return tirx.AssertStmt(condition, tvm.ir.StringImm("ValueError"), [message])


def shape_checks(name: str, dims: tirx.Var, shape: list, function: str) -> list[tirx.AssertStmt]:
    """One ``assert`` per static dimension of argument ``name`` of ``function`` (its rank
    already checked, ``dims`` its shape pointer): its extent is ``shape``'s."""
    checks = []
    for axis, extent in enumerate(shape):
        if not isinstance(extent, tirx.IntImm):
            continue
        got = tirx.call_intrin("int64", "tirx.tvm_struct_get", dims, axis, _INT64_ARRAY_ELEM)
        checks.append(_value_error(got == tirx.const(int(extent), "int64"),
                                   f"Invalid {name}.shape[{axis}] when calling `{function}`: expected "
                                   f"{int(extent)} (shape {[str(d) for d in shape]})"))
    return checks


def alignment_check(name: str, handle: tirx.Var, function: str) -> tirx.AssertStmt:
    """``assert`` that the data pointer of the DLTensor ``handle`` (argument ``name`` of
    ``function``) is a multiple of ARGUMENT_ALIGNMENT."""
    data = tirx.call_intrin("handle", "tirx.tvm_struct_get", handle, 0, _ARR_DATA)
    low_bits = tirx.call_llvm_pure_intrin("handle", "llvm.ptrmask", data,
                                          tirx.const(ARGUMENT_ALIGNMENT - 1, "int64"))
    return _value_error(
        tirx.call_intrin("bool", "tirx.isnullptr", low_bits),
        f"Misaligned {name}.data when calling `{function}`: its address must be a multiple of "
        f"{ARGUMENT_ALIGNMENT} bytes (the kernels' 16-byte vector accesses and TMA tensor maps "
        "need it); a view that starts inside another tensor's storage is not, a copy of it is")


def check_arguments(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a packed host function) with :func:`shape_checks` and :func:`alignment_check`
    of each tensor argument before the alignment annotation of that argument."""
    arguments = _arguments(func)
    function = str(func.attrs["global_symbol"]).removeprefix("__tvm_ffi_")

    def check_first(attr):
        if attr.attr_key != "storage_alignment" or not isinstance(attr.node, tirx.Var):
            return attr
        argument = next((a for a in arguments if a.buffer.same_as(attr.node)), None)
        if argument is None:
            return attr
        name = str(argument.buffer.name)
        checks = [*shape_checks(name, argument.dims, argument.shape, function),
                  alignment_check(name, argument.handle, function)]
        return tirx.SeqStmt([*checks, attr])

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, check_first)]))


def _launches_kernel(call: tvm.ir.Call) -> bool:
    return getattr(call.op, "name", None) == "tirx.call_ffi_kernel"


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.CheckArguments")
def CheckArguments(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every packed host function of ``mod`` that launches a GPU kernel with its tensor
    arguments checked (:func:`check_arguments`); a CPU function is left as TVM builds it.
    Runs after MakePackedAPI."""
    packed = [(gvar, func) for gvar, func in mod.functions.items()
              if isinstance(func, tirx.PrimFunc) and func.attrs is not None
              and int(func.attrs.get("calling_conv", 0)) == _PACKED_CALLING_CONV
              and find_all(func.body, tvm.ir.Call, _launches_kernel)]
    for gvar, func in packed:
        mod[gvar] = check_arguments(func)
    return mod
