"""Read a chain of two convolutions from a PrimFunc's blocks, by what they compute.

The chain ``Out = round(conv2(round(act(conv1(X, W1))), W2))`` is recognized however it was
written (TOPI, TE in any style, TVMScript): each convolution is a reduction block with an init of
0 whose update adds the product of two loads (each maybe cast to float32), one of the data and
one of the weight. The access patterns give its meaning:

* the block writes ``[n, y, x, o]`` (its four spatial iterators, NHWC);
* the weight is read at ``[o, r, s, c]`` (OHWI: its kernel-window iterators ``r``, ``s``, or 0
  where the window is 1 wide, and the channel ``c``);
* the data is read at ``[n, y + r, x + s, c]``: stride 1, dilation 1, from the source itself or
  from a padding block ``P[n, h, w, c] = (p <= h < H + p and p <= w < W + p) ? S[n, h - p, w - p, c]
  : 0`` (a plain copy where p = 0);
* between the two, single-input elementwise blocks compose into the activation, which must be
  one of :data:`tvm_dsm.workloads.dense.ACTIVATIONS` applied to the float32 sum and rounded to
  the chain's dtype (relu may round first: it commutes with rounding); after the second, the sum
  is rounded into ``Out``.

Anything else is refused with a ClusterError naming the block and what does not match.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import te, tirx
from tvm.s_tir import SBlock
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import block_analyzer, find_all, is_zero, loads, substitute
from ..workloads.dense import ACTIVATIONS


@dataclass(frozen=True)
class Convolution:
    """One stride-1 "same" convolution: NHWC data ``[batch, size, size, in_channels]``, OHWI
    weight ``[out_channels, kernel, kernel, in_channels]``."""

    batch: int
    size: int
    in_channels: int
    out_channels: int
    kernel: int


@dataclass(frozen=True)
class ConvChainPattern:
    first: Convolution
    second: Convolution
    activation: str
    dtype: str


def read_conv_chain(func: tirx.PrimFunc) -> ConvChainPattern:
    """The two convolutions of ``func`` (parameters ``X, W1, W2, Out``), their activation and
    dtype; ClusterError names what does not match (see the module docstring)."""
    return _Reader(func).read()


def _shape(buffer) -> list[int]:
    return [int(d) for d in buffer.ty.shape]


def _strip_cast(expr, dtype: str):
    """``expr`` without a cast to ``dtype`` around it."""
    return expr.value if isinstance(expr, tirx.Cast) and str(expr.ty.dtype) == dtype else expr


def _rounded(expr, dtype: str):
    return expr if str(expr.ty.dtype) == dtype else tirx.Cast(dtype, expr)


def _rounding_last(expr):
    """``expr`` with a relu of a rounded value written as the rounded relu (max with 0 commutes
    with rounding)."""
    if isinstance(expr, tirx.Max) and isinstance(expr.a, tirx.Cast) and is_zero(expr.b):
        inner = expr.a.value
        return tirx.Cast(str(expr.a.ty.dtype), tirx.Max(inner, tirx.const(0, str(inner.ty.dtype))))
    return expr


def _conjuncts(cond) -> list:
    return _conjuncts(cond.a) + _conjuncts(cond.b) if isinstance(cond, tirx.And) else [cond]


def _guarded(value):
    """(condition, then, else) of ``cond ? a : b`` written as ``if_then_else`` or ``Select``."""
    if isinstance(value, tirx.Select):
        return value.condition, value.true_value, value.false_value
    if isinstance(value, tvm.ir.Call) and value.op.name.endswith(".if_then_else"):
        return tuple(value.args)
    return None


class _Reader:
    def __init__(self, func: tirx.PrimFunc):
        self.func = func
        self.blocks = [b for b in find_all(func.body, SBlock) if isinstance(b.body, tirx.BufferStore)]
        self.visited: list = []
        self.dtype = str(func.params[0].ty.dtype)
        self.acc = tirx.Var("sum", "float32")  # a convolution's sum, in the blocks composed after it

    def _writer(self, buffer) -> SBlock | None:
        """The block writing ``buffer``, None for a parameter."""
        return next((b for b in self.blocks if b.body.buffer.same_as(buffer)), None)

    def read(self) -> ConvChainPattern:
        if len(self.func.params) != 4:
            raise ClusterError("a convolution chain takes four parameters: X, W1, W2, Out")
        x, w1, w2, out = self.func.params
        for param in (w1, w2, out):
            if str(param.ty.dtype) != self.dtype:
                raise ClusterError(f"{param.name} is {param.ty.dtype}, X {self.dtype}: a convolution "
                                   "chain has one dtype")
        rounding, second_block = self._elementwise(out)
        if not tvm_ffi.structural_equal(rounding, _rounded(self.acc, self.dtype)):
            raise ClusterError(f"{out.name} is {rounding} of the second convolution's {self.acc}: the "
                               f"chain rounds that sum to {self.dtype}")
        second, h = self._convolution(second_block, w2)
        act, first_block = self._elementwise(h)
        activation = self._activation(act)
        first, source = self._convolution(first_block, w1)
        if not source.same_as(x):
            raise ClusterError(f"the first convolution reads {source.name}, not the parameter {x.name}")
        stray = [b.name_hint for b in self.blocks if not any(b.same_as(v) for v in self.visited)]
        if stray:
            raise ClusterError(f"block {stray[0]} is not part of the convolution chain")
        if second.in_channels != first.out_channels or (second.batch, second.size) != (first.batch, first.size):
            raise ClusterError(f"the second convolution reads {second} of the first's {first}")
        return ConvChainPattern(first, second, activation, self.dtype)

    def _elementwise(self, buffer) -> tuple:
        """The composition of the elementwise blocks writing ``buffer``, back to a reduction
        block (whose value is ``self.acc`` in it), and that block."""
        block = self._writer(buffer)
        if block is None:
            raise ClusterError(f"{buffer.name} is read before any block writes it: it is no "
                               "convolution's result")
        self.visited.append(block)
        if block.init is not None:
            return self.acc, block
        store = block.body
        spatial = [iv.var for iv in block.iter_vars]
        if len(spatial) != len(store.indices) or not all(a.same_as(b) for a, b in zip(store.indices, spatial)):
            raise ClusterError(f"block {block.name_hint} is neither a convolution nor elementwise")
        inputs = loads(store.value)
        if not inputs or not all(ld.source.same_as(inputs[0].source) and len(ld.indices) == len(spatial)
                                 and all(a.same_as(b) for a, b in zip(ld.indices, spatial)) for ld in inputs):
            raise ClusterError(f"block {block.name_hint} is neither a convolution nor a function of one "
                               "value at the element it writes")
        inner, last = self._elementwise(inputs[0].source)
        return tvm_ffi.structural_map(store.value, [(tvm.ir.TensorLoad, lambda _: inner)]), last

    def _activation(self, expr) -> str:
        """The name of the activation ``expr`` (of ``self.acc``) applies before the rounding."""
        # ACTIVATIONS are written for TE elements: they are applied to one standing for the sum.
        element = te.placeholder((1,), "float32", name="sum")
        on_element = substitute(_rounding_last(expr), [(self.acc, element(0))])
        for name, act in ACTIVATIONS.items():
            applied = act(element[0])
            applied = applied.asobject() if isinstance(applied, te.TensorSlice) else applied
            if tvm_ffi.structural_equal(on_element, _rounded(applied, self.dtype)):
                return name
        raise ClusterError(f"the first convolution's {self.acc} becomes {expr} before the second: "
                           f"not one of the activations {sorted(ACTIVATIONS)} on the float32 sum, "
                           f"rounded to {self.dtype}")

    def _convolution(self, block: SBlock, weight) -> tuple[Convolution, tirx.Var]:
        """The convolution ``block`` computes with ``weight``, and the buffer it convolves."""
        name = block.name_hint
        d_load, w_load = self._product(block, weight)
        reduce = [iv.var for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.CommReduce]
        spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.DataPar]
        result = list(block.body.indices)
        distinct = all(not a.same_as(b) for k, a in enumerate(result) for b in result[k + 1:])
        if len(spatial) != 4 or len(result) != 4 or not distinct \
                or not all(any(i.same_as(v) for v in spatial) for i in result):
            raise ClusterError(f"convolution {name} writes {block.body.buffer.name}{result}: the chain's "
                               "kernels take NHWC results, written at [n, y, x, o] by its own iterators")
        n, y, x, o = result
        channel = self._channel(name, d_load, reduce)
        window = self._window(name, w_load, o, channel, reduce)
        source, pad = self._padding(d_load.source)
        self._check_taps(block, d_load, (n, y, x), window)
        kernel = _shape(w_load.source)[1]
        s_shape, out_shape = _shape(source), _shape(block.body.buffer)
        if pad != kernel // 2 or s_shape[1:3] != out_shape[1:3]:
            raise ClusterError(f"convolution {name} pads {source.name} by {pad} for a {kernel}x{kernel} "
                               f"kernel, {s_shape[1]}x{s_shape[2]} -> {out_shape[1]}x{out_shape[2]}: the "
                               f"chain takes 'same' zero padding ({kernel // 2})")
        if s_shape[1] != s_shape[2]:
            raise ClusterError(f"convolution {name} reads a {s_shape[1]}x{s_shape[2]} image: the chain's "
                               "gather takes square images")
        return Convolution(out_shape[0], out_shape[1], s_shape[3], out_shape[3], kernel), source

    @staticmethod
    def _product(block: SBlock, weight) -> tuple:
        """The data and weight loads whose product ``block`` sums from 0 in float32."""
        name, store, init = block.name_hint, block.body, block.init
        if str(store.buffer.ty.dtype) != "float32":
            raise ClusterError(f"convolution {name} accumulates in {store.buffer.ty.dtype}: the chain's "
                               "kernels accumulate in float32")
        if not (isinstance(init, tirx.BufferStore) and is_zero(init.value)):
            raise ClusterError(f"reduction {name} does not start from 0")
        terms = [store.value.a, store.value.b] if isinstance(store.value, tirx.Add) else []
        own = [t for t in terms if isinstance(t, tvm.ir.TensorLoad) and t.source.same_as(store.buffer)]
        products = [t for t in terms if isinstance(t, tirx.Mul)]
        if len(own) != 1 or len(products) != 1:
            raise ClusterError(f"reduction {name} is not a sum of products")
        operands = [_strip_cast(products[0].a, "float32"), _strip_cast(products[0].b, "float32")]
        if not all(isinstance(o, tvm.ir.TensorLoad) for o in operands):
            raise ClusterError(f"reduction {name} multiplies {operands[0]} by {operands[1]}: not two loads")
        weights = [o for o in operands if o.source.same_as(weight)]
        if len(weights) != 1:
            raise ClusterError(f"convolution {name} does not multiply by {weight.name} (once)")
        data = operands[1] if operands[0] is weights[0] else operands[0]
        return data, weights[0]

    @staticmethod
    def _channel(name: str, d_load, reduce: list) -> tirx.Var:
        """The reduction iterator that is an index of the data on its own: the input channel."""
        alone = [(axis, var) for axis, index in enumerate(d_load.indices) for var in reduce
                 if index.same_as(var)]
        if len(alone) != 1:
            raise ClusterError(f"convolution {name} reads {d_load.source.name}{list(d_load.indices)}: "
                               "no single channel axis")
        axis, channel = alone[0]
        if axis != 3:
            layout = " (NCHW)" if axis == 1 else ""
            raise ClusterError(f"convolution {name} reads {d_load.source.name} with its channels on axis "
                               f"{axis}{layout}: the chain's kernels take NHWC data")
        return channel

    @staticmethod
    def _window(name: str, w_load, out_channel, channel, reduce: list) -> list:
        """The window iterators (kh, kw) of an OHWI weight read at ``[o, r, s, c]``; a constant 0
        where the window is 1 wide. Every reduction iterator must be the channel or one of them."""
        index, shape = list(w_load.indices), _shape(w_load.source)
        if not (len(index) == 4 and index[0].same_as(out_channel) and index[3].same_as(channel)):
            raise ClusterError(f"convolution {name} reads {w_load.source.name}{index}: the chain's "
                               "kernels take OHWI weights, read at [o, r, s, c]")
        window = [index[1], index[2]]
        for axis, tap in zip((1, 2), window):
            if not (any(tap.same_as(v) for v in reduce) or (is_zero(tap) and shape[axis] == 1)):
                raise ClusterError(f"convolution {name} reads {w_load.source.name}{index}: axis {axis} "
                                   "is not a window iterator")
        taps = [channel, *window]
        if any(not any(v.same_as(t) for t in taps) for v in reduce) or window[0].same_as(window[1]):
            raise ClusterError(f"convolution {name} reduces over other iterators than its window and "
                               "channels")
        if shape[1] != shape[2] or shape[1] % 2 == 0:
            raise ClusterError(f"convolution {name} has a {shape[1]}x{shape[2]} kernel: the chain takes "
                               "square kernels of odd size")
        return window

    @staticmethod
    def _check_taps(block: SBlock, d_load, pixel: tuple, window: list) -> None:
        """The data is read at ``[n, y + r, x + s, c]``: the result's batch, stride 1, dilation 1."""
        name, index = block.name_hint, list(d_load.indices)
        n, y, x = pixel
        where = f"convolution {name} reads {d_load.source.name}{index}"
        if not index[0].same_as(n):
            raise ClusterError(f"{where}: the batch index is not the result's")
        analyzer = block_analyzer(block)
        for axis, out_var, tap in ((1, y, window[0]), (2, x, window[1])):
            stride = analyzer.simplify(substitute(index[axis], [(out_var, out_var + 1)]) - index[axis])
            if not analyzer.can_prove_equal(stride, 1):
                raise ClusterError(f"{where}: stride {stride} along axis {axis}; the chain takes stride 1")
            if not analyzer.can_prove_equal(index[axis] - out_var - tap, 0):
                raise ClusterError(f"{where}: axis {axis} is not read at {out_var} + {tap} (dilation 1)")

    def _padding(self, buffer) -> tuple[tirx.Var, int]:
        """The buffer a convolution's data ``buffer`` pads, and by how much on each side: 0 and
        ``buffer`` itself unless a block copies another buffer into it, zero outside the image."""
        block = self._writer(buffer)
        if block is None or block.init is not None:
            return buffer, 0
        store = block.body
        guarded = _guarded(store.value)
        cond, inner, other = guarded if guarded else (None, store.value, None)
        if not isinstance(inner, tvm.ir.TensorLoad):
            return buffer, 0  # not a copy: the convolution reads this buffer
        self.visited.append(block)
        spatial = [iv.var for iv in block.iter_vars]
        src = inner.source
        if len(spatial) != 4 or len(inner.indices) != 4 or not all(
                i.same_as(v) for i, v in zip(store.indices, spatial)):
            raise ClusterError(f"padding block {block.name_hint} is not a 4-D elementwise copy")
        analyzer = block_analyzer(block)
        offsets = [analyzer.simplify(v - i) for v, i in zip(spatial, inner.indices)]
        if not all(isinstance(off, tirx.IntImm) for off in offsets) or int(offsets[0]) or int(offsets[3]) \
                or int(offsets[1]) != int(offsets[2]):
            raise ClusterError(f"padding block {block.name_hint} reads {src.name}{list(inner.indices)}: "
                               "not the same pixel shifted equally along H and W")
        pad = int(offsets[1])
        shape, s_shape = _shape(buffer), _shape(src)
        if shape[1:3] != [s_shape[1] + 2 * pad, s_shape[2] + 2 * pad] or shape[::3] != s_shape[::3]:
            raise ClusterError(f"padding block {block.name_hint} pads {src.name} {s_shape} to {shape}: "
                               f"not {pad} on every side")
        if cond is None:
            if pad:
                raise ClusterError(f"padding block {block.name_hint} shifts {src.name} by {pad} without "
                                   "zero outside the image")
            return src, 0
        if not is_zero(other):
            raise ClusterError(f"padding block {block.name_hint} pads {src.name} with {other}, not 0")
        h, w = spatial[1], spatial[2]
        image = [pad <= h, h < s_shape[1] + pad, pad <= w, w < s_shape[2] + pad]
        exact = all(_implies(analyzer, _conjuncts(cond), atom) for atom in image) and all(
            _implies(analyzer, image, atom) for atom in _conjuncts(cond))
        if not exact:
            raise ClusterError(f"padding block {block.name_hint} keeps {src.name} where {cond}: not the "
                               f"image ({pad} <= h < {s_shape[1] + pad}, {pad} <= w < {s_shape[2] + pad})")
        return src, pad



def _implies(analyzer: Analyzer, facts: list, claim) -> bool:
    """Whether ``analyzer`` proves ``claim`` where all ``facts`` hold."""
    with analyzer.constraint_scope(functools.reduce(tirx.And, facts)):
        return analyzer.can_prove(claim)
