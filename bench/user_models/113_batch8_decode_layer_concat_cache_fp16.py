"""Llama-3-8B decoder layer decode step at batch 8 (torch, fp16) with an HF DynamicCache-style KV
cache: past k/v [8, 8, 511, 128] passed in and the new token concatenated (torch.cat), RoPE from
cos/sin passed in for the position, GQA 32/8 via repeat_kv, eager attention (matmul, / sqrt(d),
softmax fp32, matmul), no mask (all sequences at the same length), SwiGLU, returns new caches.
hidden 4096, inter 14336."""
import math
import torch, torch.nn as nn, torch.nn.functional as F

def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Layer(nn.Module):
    def __init__(self, d=4096, h=32, kv=8, f=14336):
        super().__init__()
        self.h, self.kv, self.dh = h, kv, d // h
        self.q_proj = nn.Linear(d, d, bias=False); self.k_proj = nn.Linear(d, kv * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv * self.dh, bias=False); self.o_proj = nn.Linear(d, d, bias=False)
        self.gate_proj = nn.Linear(d, f, bias=False); self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.input_layernorm = nn.RMSNorm(d, eps=1e-5); self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-5)
    def forward(self, x, past_k, past_v, cos, sin):
        B, S, D = x.shape
        r = x; x = self.input_layernorm(x)
        q = self.q_proj(x).view(B, S, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat([past_k, k], dim=2); v = torch.cat([past_v, v], dim=2)
        keys, vals = repeat_kv(k, self.h // self.kv), repeat_kv(v, self.h // self.kv)
        s = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(self.dh)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(p, vals).transpose(1, 2).reshape(B, S, D)
        x = r + self.o_proj(a)
        r = x; x = self.post_attention_layernorm(x)
        return r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), k, v

def make():
    B = 8
    h = torch.float16
    return Layer().half(), (torch.randn(B, 1, 4096, dtype=h), torch.randn(B, 8, 511, 128, dtype=h),
                            torch.randn(B, 8, 511, 128, dtype=h), torch.randn(B, 1, 128, dtype=h),
                            torch.randn(B, 1, 128, dtype=h))


WRITTEN_AS = "torch.export, fp16, decode B8 H4096 32/8 heads d128 I14336, past KV [8,8,511,128] + torch.cat, eager attention fp32 softmax"
