"""Llama-style decode step with a static KV cache (torch, fp16): x [B,1,H], caches
[B,Hkv,Smax,D] passed in, the new k/v written at `pos` with Tensor.scatter (07 uses index_copy, which TVM imports as a bad index_put), RoPE from
cos/sin gathered at pos, GQA via expand+reshape (HF repeat_kv), eager attention
(q @ k^T * scale + mask from arange <= pos, softmax fp32, @ v), o_proj, returns new caches.
batch 2, hidden 2048, 32 heads / 8 kv heads, Smax 256."""
import math, torch, torch.nn as nn, torch.nn.functional as F

def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Step(nn.Module):
    def __init__(self, hidden=2048, heads=32, kv=8, smax=256):
        super().__init__()
        self.h, self.kv, self.d = heads, kv, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.d, bias=False)
        self.k_proj = nn.Linear(hidden, kv * self.d, bias=False)
        self.v_proj = nn.Linear(hidden, kv * self.d, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        emb = torch.cat([torch.outer(torch.arange(smax).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.smax = smax
    def forward(self, x, k_cache, v_cache, pos):
        B = x.shape[0]
        q = self.q_proj(x).view(B, 1, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, 1, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, 1, self.kv, self.d).transpose(1, 2)
        cos = self.cos[pos].to(x.dtype)[None, None]; sin = self.sin[pos].to(x.dtype)[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        idx = pos.view(1, 1, 1, 1).expand(B, self.kv, 1, self.d)
        k_cache = k_cache.scatter(2, idx, k)
        v_cache = v_cache.scatter(2, idx, v)
        keys = repeat_kv(k_cache, self.h // self.kv); vals = repeat_kv(v_cache, self.h // self.kv)
        s = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(self.d)
        mask = torch.arange(self.smax)[None, None, None, :] <= pos[:, None, None, None].view(1, 1, 1, 1)
        s = s.masked_fill(~mask, float("-inf"))
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(p, vals).transpose(1, 2).reshape(B, 1, -1)
        return self.o_proj(o), k_cache, v_cache

def make():
    m = Step().half()
    kc = torch.randn(2, 8, 256, 64, dtype=torch.float16); vc = torch.randn(2, 8, 256, 64, dtype=torch.float16)
    return m, (torch.randn(2, 1, 2048, dtype=torch.float16), kc, vc, torch.tensor([100]))


WRITTEN_AS = "torch.export, fp16, decode B2 H2048 32/8 heads, static KV cache scatter, eager attention over Smax 256 with arange<=pos mask"
