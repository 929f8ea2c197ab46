"""Convolution chains (FlashFuser's C1-C8) as GEMM chains over pixels.

``Out = conv_k2(act(conv_k1(X, W1)), W2)`` in NHWC with OHWI weights, stride 1 and "same" zero
padding (as :func:`tvm_dsm.workloads.chains.conv_chain` writes it, or TOPI, or any function that
computes it: :mod:`tvm_dsm.rules.conv_pattern` reads it from the blocks) is a GEMM chain: its
rows are the pixels (batch x height x width); a 1x1 convolution reduces over input channels, a
kxk one over the (kh, kw, channel) window, and an OHWI weight already stores each output
channel's window as one row, the ``[out, in]`` layout of a Linear weight. So the chain family plans and schedules
it (fused through DSM, or two split-K GEMMs, whichever its model predicts faster) on the pixel
matrix, and its kernels run on views of the caller's tensors:

* a 1x1 first convolution whose pixels and channels already fit the GEMM tiles copies nothing:
  NHWC ``X`` is the row-major ``[pixels, IC]`` matrix and ``Out`` the ``[pixels, OC2]`` one;
* otherwise one gather kernel writes the chain's input (the kxk windows with "same" zero
  padding, i.e. im2col; rows and columns past the real ones zero, up to the sizes the tiles
  need), W1 is copied with zero columns where the depth grew, and where rows were added a last
  kernel copies the real rows out. Zero rows and columns add nothing to any real output.

The second convolution must be 1x1 (as in every FlashFuser chain): a kxk one would need the
windows of the intermediate, which the chain keeps on chip.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx
from tvm.s_tir import SBlockRealize
from tvm.script import tirx as T

from ..errors import ClusterError
from ..ir import with_block_body
from ..workloads.chains import gemm_chain
from .conv_pattern import read_conv_chain
from .fused_chain import FusedChainConfig
from .unfused_chain import UnfusedChainConfig

_VECTOR_BYTES = 16  # one gather thread moves 16 bytes
_THREADS = 256


@dataclass(frozen=True)
class ConvChainShape:
    batch: int
    hw: int
    ic: int
    oc1: int
    oc2: int
    k1: int
    activation: str
    dtype: str

    @property
    def pixels(self) -> int:
        return self.batch * self.hw * self.hw

    @property
    def depth(self) -> int:
        """The first convolution's reduction: the (kh, kw, channel) window."""
        return self.k1 * self.k1 * self.ic


@dataclass(frozen=True)
class ConvChainConfig:
    """The GEMM chain's configuration and the ``rows x depth`` input matrix it was planned on
    (the pixels and the window, padded up to what its tiles need)."""

    chain: FusedChainConfig | UnfusedChainConfig
    rows: int
    depth: int


def find_conv_chain(func: tirx.PrimFunc) -> ConvChainShape:
    """The shape of ``func`` if it computes a convolution chain the kernels take (read from its
    blocks by :func:`tvm_dsm.rules.conv_pattern.read_conv_chain`); ClusterError says what does
    not match."""
    shapes = [getattr(p.ty, "shape", None) for p in func.params]
    if len(shapes) != 4 or [len(s) if s is not None else 0 for s in shapes] != [4] * 4:
        raise ClusterError("a convolution chain takes X [N, H, W, C], W1 and W2 [O, kh, kw, I], Out [N, H, W, O]")
    chain = read_conv_chain(func)
    first, second = chain.first, chain.second
    if second.kernel != 1:
        raise ClusterError(f"the second convolution is {second.kernel}x{second.kernel}: only 1x1 (its input "
                           "stays on chip)")
    lanes = _VECTOR_BYTES // tvm.DataType(chain.dtype).bits * 8
    if first.in_channels % lanes or second.out_channels % lanes:
        raise ClusterError(f"channels {first.in_channels} -> {second.out_channels}: the gather moves "
                           f"{lanes}-channel vectors")
    return ConvChainShape(first.batch, first.size, first.in_channels, first.out_channels, second.out_channels,
                          first.kernel, chain.activation, chain.dtype)


def gemm_view(shape: ConvChainShape, rows: int, depth: int) -> tirx.PrimFunc:
    """The GEMM chain the kernels compute: ``rows x depth`` input, N = OC1, L = OC2."""
    return gemm_chain(rows, shape.oc1, depth, shape.oc2, shape.activation, shape.dtype)


def copies(shape: ConvChainShape, rows: int, depth: int) -> dict[str, int]:
    """Bytes each gather kernel moves (read + written), by what it writes: ``input`` (the
    windows), ``w1`` (W1 with zero columns), ``output`` (the real rows out); empty: views."""
    elem = tvm.DataType(shape.dtype).bits // 8
    moved = {}
    if shape.k1 > 1 or rows != shape.pixels or depth != shape.depth:
        moved["input"] = (shape.pixels * shape.ic + rows * depth) * elem
    if depth != shape.depth:
        moved["w1"] = shape.oc1 * (shape.depth + depth) * elem
    if rows != shape.pixels:
        moved["output"] = (rows + shape.pixels) * shape.oc2 * elem
    return moved


def windows(batch: int, hw: int, channels: int, k: int, rows: int, cols: int, dtype: str) -> tirx.PrimFunc:
    """The gather kernel: ``dst[p, (r, s, c)] = src[n, y + r - k//2, x + s - k//2, c]`` for pixel
    ``p = (n, y, x)``, zero outside the image and past ``batch*hw*hw`` rows or ``k*k*channels``
    columns; one thread per 16-byte vector of ``dst``. (k = 1 and hw = 1 make it a 2-D copy
    that zero-fills or crops.)"""
    lanes = _VECTOR_BYTES * 8 // tvm.DataType(dtype).bits
    chunks = rows * cols // lanes
    pad, pixels, depth = k // 2, batch * hw * hw, k * k * channels

    @T.prim_func(s_tir=True, check_well_formed=False)
    def gather(src: T.Buffer((batch, hw, hw, channels), dtype), dst: T.Buffer((rows, cols), dtype)):
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding((chunks + _THREADS - 1) // _THREADS, thread="blockIdx.x"):
            for tx in T.thread_binding(_THREADS, thread="threadIdx.x"):
                with T.sblock("gather"):
                    T.reads()
                    T.writes()
                    row = T.meta_var((bx * _THREADS + tx) // (cols // lanes))
                    col = T.meta_var((bx * _THREADS + tx) % (cols // lanes) * lanes)
                    y = T.meta_var(row // hw % hw + col // (k * channels) - pad)
                    x = T.meta_var(row % hw + col // channels % k - pad)
                    if bx * _THREADS + tx < chunks:
                        if row < pixels and col < depth and 0 <= y and y < hw and 0 <= x and x < hw:
                            for v in T.vectorized(lanes):
                                dst[row, col + v] = src[row // (hw * hw), y, x, col % channels + v]
                        else:
                            for v in T.vectorized(lanes):
                                dst[row, col + v] = T.Cast(dtype, 0)

    return gather


def conv_kernels(func: tirx.PrimFunc, shape: ConvChainShape, chain: tirx.PrimFunc, rows: int,
                 depth: int) -> tirx.PrimFunc:
    """``func``'s signature around the scheduled GEMM chain ``chain`` (on ``gemm_view(shape,
    rows, depth)``): every kernel's operands declared up front as views of the caller's tensors
    or of global workspaces, then the chain's root block with the gather kernels around its
    own (see the module docstring)."""
    x, w1, w2, out = func.params
    a, cw1, cw2, cout = chain.params
    moved = copies(shape, rows, depth)
    s, dt = shape, shape.dtype
    decls, data = [], {}
    for name, buf, conv_buf in (("input", a, x), ("w1", cw1, w1), ("output", cout, out)):
        if name in moved:
            space = tirx.decl_buffer(buf.ty.shape, dt, f"{buf.name}_workspace", scope="global")
            decls.append(tirx.AllocBuffer(space))
            data[name] = space.data
        else:
            data[name] = conv_buf.data

    def run(kernel: tirx.PrimFunc, *sources) -> tirx.Stmt:  # the kernel's root block's body
        decls.extend(tirx.DeclBuffer(param, data=source) for param, source in zip(kernel.params, sources))
        return kernel.body.block.body

    kernels = []
    if "input" in moved:
        kernels.append(run(windows(s.batch, s.hw, s.ic, s.k1, rows, depth, dt), x.data, data["input"]))
    if "w1" in moved:
        kernels.append(run(windows(s.oc1, 1, s.depth, 1, s.oc1, depth, dt), w1.data, data["w1"]))
    kernels.append(run(chain, data["input"], data["w1"], w2.data, data["output"]))
    if "output" in moved:
        kernels.append(run(windows(rows, 1, s.oc2, 1, s.pixels, s.oc2, dt), data["output"], out.data))
    root = chain.body
    body = SBlockRealize(root.iter_values, root.predicate, with_block_body(root.block, tirx.SeqStmt(kernels)))
    return func.with_body(tirx.SeqStmt([*decls, body]))
