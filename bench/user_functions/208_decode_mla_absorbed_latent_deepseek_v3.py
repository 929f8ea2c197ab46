"""DeepSeek MLA decode with absorbed weights: 128 query heads [B,H,576] (512 latent + 64 rope dims) attend one shared latent cache ckv [B,L,576] whose first 512 dims are also the values (out = softmax(q ckv^T * 1/sqrt(192)) @ ckv[:, :, :512]), qk dim 576 != v dim 512, TE explicit fp32 casts, bf16, B=8 H=128 L=4096 (DeepSeek-V3 FlashMLA-style decode)."""
import numpy as np
from tvm import te, topi
B, H, L, DC, DR = 8, 128, 4096, 512, 64
SMALL = dict(B=2, H=4, L=19, DC=24, DR=8)
SCALE = 192 ** -0.5
def make():
    D = DC + DR
    q = te.placeholder((B, H, D), "bfloat16", name="q")
    ckv = te.placeholder((B, L, D), "bfloat16", name="ckv_cache")
    d = te.reduce_axis((0, D), name="d")
    sc = te.compute((B, H, L), lambda b, h, j: te.sum(q[b, h, d].astype("float32") * ckv[b, j, d].astype("float32"), axis=d), name="scores")
    s = te.compute((B, H, L), lambda b, h, j: sc[b, h, j] * SCALE, name="scaled")
    p = topi.nn.softmax(s, axis=-1)
    j = te.reduce_axis((0, L), name="j")
    o = te.compute((B, H, DC), lambda b, h, c: te.sum(p[b, h, j] * ckv[b, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, ckv, topi.cast(o, "bfloat16")])
def inputs(rng):
    D = DC + DR
    return [rng.standard_normal((B, H, D)).astype(np.float32), rng.standard_normal((B, L, D)).astype(np.float32)]
def reference(q, ckv):
    s = np.einsum("bhd,bjd->bhj", q, ckv) * SCALE
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return [np.einsum("bhj,bjc->bhc", p, ckv[:, :, :DC])]
def torch_impl(q, ckv):
    import torch
    s = (q.float() @ ckv.float().transpose(-1, -2)) * SCALE
    return [(torch.softmax(s, -1) @ ckv[:, :, :DC].float()).to(q.dtype)]
