"""Convolutions whose windows tile the image without overlap (a patch embedding) as GEMMs.

A vision transformer embeds its image with ``nn.Conv2D(c, d, p, stride=p)``: each output pixel
is one ``p x p`` patch times the weight, and no two patches share an input pixel. TVM schedules a
``conv2d`` with dlight's fallback (no tensor cores), and no tvm-dsm family takes it. As a product
it is a GEMM of ``N * (H / p) * (W / p)`` rows by ``C * p * p``: :data:`PatchesAsMatrices` rewrites
such an ``R.nn.conv2d`` (NCHW, OIHW, no padding, no dilation, one group, strides equal to the
kernel, the image a whole number of patches) into the image's patches as a matrix (a reshape and
a transpose), a matmul accumulated in fp32 (the split-K GEMM family's form, as
:mod:`tvm_dsm.relax_matmuls` makes a linear layer), a cast to the convolution's type (none where
it asks for fp32, as TVM's torch importer makes every convolution) and the result back in NCHW.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_matmuls import SIXTEEN_BIT, constant_ints, is_op_call, rewrite_functions


def _patch_size(call: relax.Call) -> tuple[int, int] | None:
    """``(p_h, p_w)`` where ``call`` is a conv2d over non-overlapping patches of a static image
    (see the module docstring), else None."""
    a = call.attrs
    x, w = call.args
    image = constant_ints(x.ty.shape.values) if x.ty.shape is not None else None
    kernel = constant_ints(w.ty.shape.values) if w.ty.shape is not None else None
    if image is None or kernel is None or len(image) != 4:
        return None
    if ((str(a.data_layout), str(a.kernel_layout)) != ("NCHW", "OIHW") or str(a.out_layout) not in ("NCHW", "")
            or int(a.groups) != 1):
        return None
    strides, padding, dilation = constant_ints(a.strides), constant_ints(a.padding), constant_ints(a.dilation)
    ph, pw = kernel[2:]
    if strides != [ph, pw] or any(padding) or dilation != [1, 1] or image[2] % ph or image[3] % pw:
        return None
    return ph, pw


@mutator
class _Rewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not (is_op_call(call, "relax.nn.conv2d") and call.args[0].ty.dtype in SIXTEEN_BIT
                and call.ty.dtype in (call.args[0].ty.dtype, "float32")):
            return call
        patch = _patch_size(call)
        if patch is None:
            return call
        (ph, pw), (x, w) = patch, call.args
        n, c, h, wd = (int(v) for v in x.ty.shape.values)
        o = int(w.ty.shape.values[0])
        rows, depth = n * (h // ph) * (wd // pw), c * ph * pw
        emit = self.builder_.emit
        patches = emit(relax.op.reshape(x, relax.ShapeExpr([n, c, h // ph, ph, wd // pw, pw])))
        patches = emit(relax.op.permute_dims(patches, [0, 2, 4, 1, 3, 5]))
        patches = emit(relax.op.reshape(patches, relax.ShapeExpr([rows, depth])))
        weight = emit(relax.op.reshape(w, relax.ShapeExpr([o, depth])))
        product = emit(relax.op.matmul(patches, emit(relax.op.permute_dims(weight)), out_dtype="float32"))
        result = product if call.ty.dtype == "float32" else emit(relax.op.astype(product, call.ty.dtype))
        pixels = emit(relax.op.reshape(result, relax.ShapeExpr([n, h // ph, wd // pw, o])))
        return relax.op.permute_dims(pixels, [0, 3, 1, 2])


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.PatchesAsMatrices")
def PatchesAsMatrices(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's patch-embedding convolutions as GEMMs (see the module docstring)."""
    return rewrite_functions(mod, _Rewriter(mod))
