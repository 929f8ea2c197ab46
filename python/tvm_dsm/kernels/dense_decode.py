"""Decode attention as users write it (one query a head over K and V held whole: ``[B, H, S,
D]``, ``[B, S, H, D]``, ``[H, S, D]``, grouped- or multi-query) on the cluster decode kernel of
:mod:`tvm_dsm.kernels.decode_attention`.

The function is read by :func:`~tvm_dsm.kernels.attention_pattern.find_decode_attention`, which
proves which query heads read the same K and V rows; a CTA holds such a group (up to 8 heads of
fp16) and reads each row once for all of them, where a kernel per query head reads it once per
head. The kernel loads through the function's own index expressions, so any layout whose head
dim is innermost works unchanged.

A key length that is a variable (the past of a KV cache, known when called) is read at run time:
the function is matched at :data:`MATCHED_KEYS` keys, then its own parameters, of that length,
take the matched ones' place; a CTA of a cluster whose share of the keys is empty merges nothing.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import tirx
from tvm.script import tirx as T
from tvm.tirx.script.builder import ir as B

from ..errors import ClusterError, passes
from ..hardware import Hardware
from ..ir import extent_variables, specialized, substitute, uses
from .attention_pattern import DecodeShape, find_decode_attention
from .decode_attention import (HELD_FLOATS, LOG2E, WARPS, DecodeConfig, DecodeOperands, decode_kernel,
                               prefers_tensor_cores, shared_bytes, tokens_per_step, wave_ctas, with_depth)
from .decode_attention import check_config as check_config_limits
from .template import KernelTemplate

_RANKS = (1, 2, 4, 8)
#: The key length a function of a symbolic one is matched at: above every head dim and head
#: count, whose extents an equal length would make ambiguous to the matcher.
MATCHED_KEYS = 328


class DenseOperands(DecodeOperands):
    """A user's q, k, v and out read through their index expressions; a pair is one value of
    every head variable, the group's variable stepping by the group."""

    def __init__(self, shape: DecodeShape):
        self.shape = shape
        self.head_dim, self.dtype = shape.dim, shape.dtype
        # a group larger than the registers hold is taken in parts (each reading the rows)
        self.group = max(g for g in range(1, shape.group + 1) if shape.group % g == 0 and g * self.vector <= HELD_FLOATS)
        extents = list(shape.head_extents)
        extents[shape.group_var] //= self.group
        self.pair_extents = extents

    def pairs(self):
        return math.prod(self.pair_extents)

    def begin(self, pair) -> None:
        values, rest = [], pair
        for extent in reversed(self.pair_extents[1:]):
            values.append(rest % extent)
            rest = rest // extent
        self.values = [rest, *values[::-1]]  # the outermost needs no modulo: pairs() bounds the pair

    def _heads(self, h) -> list:
        """(head variable, value) of the group's ``h``-th head."""
        values = list(self.values)
        values[self.shape.group_var] = values[self.shape.group_var] * self.group + h
        return [(var, T.Cast(var.ty.dtype, value)) for var, value in zip(self.shape.heads, values)]

    def _indices(self, operand: int, h, column, token=None) -> list:
        s = self.shape
        at = self._heads(h) + [(s.column, T.Cast(s.column.ty.dtype, column))]
        if token is not None:
            at.append((s.key, T.Cast(s.key.ty.dtype, token)))
        return [substitute(i, at) for i in s.indices[operand]]

    def length(self):
        kv_len = self.shape.kv_len
        return tirx.const(kv_len, "int32") if isinstance(kv_len, int) else T.Cast("int32", kv_len)

    def query(self, h, column):
        return self.shape.operands[0][tuple(self._indices(0, h, column))]

    def scale(self):
        return self.shape.scale

    @property
    def has_terms(self) -> bool:
        return self.shape.terms is not None

    def exponent(self, h, token, score):
        terms = self.shape.terms
        if terms is None:
            return score
        heads = [value for _, value in self._heads(h)]
        natural = terms.at(score * tirx.const(1 / LOG2E, "float32"), tirx.const(0, "int32"), token, heads)
        return natural * tirx.const(LOG2E, "float32")

    def row_pointer(self, slot: int, kv: int, token, column):
        buffer = self.shape.operands[1 + kv]
        (flat,) = buffer.offset_of(self._indices(1 + kv, 0, column, token))
        return buffer.access_ptr("r", offset=flat)

    def write(self, h: int, column, value, lse) -> None:
        out = self.shape.operands[3]
        B.buffer_store(out, T.Cast(self.dtype, value), self._indices(3, h, column))


def find_dense_decode(func: tirx.PrimFunc) -> DenseOperands:
    """``func``'s decode attention and where its operands live; ClusterError naming what does not
    match or which limit the kernel has."""
    operands = DenseOperands(_decode_shape(func))
    for ok, limit in operands.limits():
        if not ok:
            raise ClusterError(f"decode attention: needs {limit}")
    for buffer in operands.shape.operands:
        if buffer.strides or not isinstance(buffer.elem_offset, tirx.IntImm) or int(buffer.elem_offset) % operands.vector:
            raise ClusterError(f"decode attention: {buffer.name} must be compact, 16-byte aligned (loads of 16 bytes)")
    return operands


def _decode_shape(func: tirx.PrimFunc) -> DecodeShape:
    """:func:`find_decode_attention`'s shape, over a symbolic key length or a symbolic head axis
    (a batch of sequences) where the function has one (see the module docstring): K and V
    indexed by the key alone along their axis of that length, or every operand by one head
    variable alone along its axis of that extent, so that no other index depends on it."""
    lengths = extent_variables(func)
    if not lengths:
        return find_decode_attention(func)
    if len(lengths) > 1:
        raise ClusterError(f"decode attention takes one symbolic extent, the keys' or the batch's; got "
                           f"{[v.name for v in lengths]}")
    (extent,) = lengths
    shape = find_decode_attention(specialized(func, extent, MATCHED_KEYS))
    positions = [next(n for n, p in enumerate(shape.func.params) if p.same_as(op)) for op in shape.operands]
    operands = tuple(func.params[n] for n in positions)
    axes = [[a for a, size in enumerate(param.ty.shape) if isinstance(size, tirx.Var)] for param in operands]
    if shape.terms is not None:
        raise ClusterError(f"decode attention over a symbolic {extent.name} takes the scaled score alone (score terms "
                           "are read at one extent)")
    heads = [n for n, var in enumerate(shape.heads) if axes == _axes_indexed_by(shape.indices, var)]
    if heads and shape.head_extents[heads[0]] == MATCHED_KEYS and (heads[0] != shape.group_var or shape.group == 1):
        extents = tuple(extent if n == heads[0] else e for n, e in enumerate(shape.head_extents))
        return dataclasses.replace(shape, func=func, operands=operands, head_extents=extents)
    if axes != [[], *_axes_indexed_by(shape.indices[1:3], shape.key), []]:
        raise ClusterError(f"decode attention over a symbolic {extent.name}: it must be the key length of k and v "
                           f"alone, each indexed by the key alone along it, or one head axis of every operand, "
                           f"indexed by its head variable alone; the operands have it at axes {axes}, indexed "
                           f"{[[str(i) for i in indices] for indices in shape.indices]}")
    return dataclasses.replace(shape, func=func, operands=operands, kv_len=extent)


def _axes_indexed_by(operand_indices, var) -> list[list[int]]:
    """For each operand's indices, the axes that ``var`` indexes, each where it is ``var`` alone
    (else the operand's list also names an axis that mentions it otherwise, as -1)."""
    found = []
    for indices in operand_indices:
        axes = [a if isinstance(i, tirx.Var) and i.same_as(var) else -1 for a, i in enumerate(indices) if uses(i, var)]
        found.append(axes)
    return found


def check_config(found: DenseOperands, config: DecodeConfig) -> None:
    check_config_limits(found, config)
    step = tokens_per_step(found, config)
    if config.ranks > 1 and isinstance(found.shape.kv_len, int) and found.shape.kv_len < config.ranks * step:
        raise ClusterError(f"decode attention: {found.shape.kv_len} keys leave a cluster of {config.ranks} CTAs "
                           f"less than one step of {step} keys a CTA")


def default_config(found: DenseOperands, hw: Hardware) -> DecodeConfig:
    """Tensor cores where a CTA holds several query heads of a group (CUDA cores would do that
    many multiply-adds per byte read); the largest cluster that keeps the grid within
    :func:`~tvm_dsm.kernels.decode_attention.wave_ctas`; the warps and register files
    :func:`~tvm_dsm.kernels.decode_attention.with_depth` gives that grid."""
    tensor_cores = prefers_tensor_cores(found)
    fits = [r for r in _RANKS if found.pairs() * r <= wave_ctas(found, hw, r, tensor_cores)
            and _fits(found, DecodeConfig(r, tensor_cores))]
    return with_depth(found, DecodeConfig(max(fits, default=1), tensor_cores), found.pairs(), hw, found.shape.kv_len)


def _fits(found: DenseOperands, config: DecodeConfig) -> bool:
    return passes(check_config, found, config)


class DenseDecodeTemplate(KernelTemplate):
    """The cluster decode kernel over a user's function, in every cluster size that fits."""

    def find(self, func: tirx.PrimFunc) -> DenseOperands:
        return find_dense_decode(func)

    def configs(self, found: DenseOperands) -> list[DecodeConfig]:
        configs = [c for tensor_cores in (False, True) for warps in WARPS for r in _RANKS
                   if _fits(found, c := DecodeConfig(r, tensor_cores, warps))]
        if not configs:
            raise ClusterError(f"decode attention: no cluster fits ({shared_bytes(found, DecodeConfig(1))} B of shared "
                               "memory a CTA)")
        return configs

    def default_config(self, found: DenseOperands, hw: Hardware) -> DecodeConfig:
        return default_config(found, hw)

    def check(self, found: DenseOperands, config: DecodeConfig) -> None:
        check_config(found, config)

    def kernel(self, found: DenseOperands, config: DecodeConfig) -> tirx.PrimFunc:
        kernel = decode_kernel(found, config, "main")
        return tirx.PrimFunc(found.shape.func.params, kernel.body, attrs=kernel.attrs)


TEMPLATE = DenseDecodeTemplate()
