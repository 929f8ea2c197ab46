"""Qwen2-style decoder layer (torch, bf16): RMSNorm, q/k/v with bias, RoPE, GQA via
repeat_interleave, SDPA(is_causal=True), SwiGLU MLP. batch 2, seq 128, hidden 1024."""
import torch, torch.nn as nn, torch.nn.functional as F

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        dt = x.dtype; x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dt)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Layer(nn.Module):
    def __init__(self, hidden=1024, heads=16, kv_heads=4, inter=2816, seq=128):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.d, bias=True)
        self.k_proj = nn.Linear(hidden, kv_heads * self.d, bias=True)
        self.v_proj = nn.Linear(hidden, kv_heads * self.d, bias=True)
        self.o_proj = nn.Linear(heads * self.d, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.ln1, self.ln2 = RMSNorm(hidden), RMSNorm(hidden)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        t = torch.arange(seq).float()
        emb = torch.cat([torch.outer(t, inv)] * 2, dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, _ = x.shape
        r = x; x = self.ln1(x)
        q = self.q_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        cos = self.cos[:S].to(x.dtype)[None, None]; sin = self.sin[:S].to(x.dtype)[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(B, S, -1)
        x = r + self.o_proj(a)
        r = x; x = self.ln2(x)
        x = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return r + x

def make():
    m = Layer().to(torch.bfloat16)
    return m, (torch.randn(2, 128, 1024, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, B2 S128 H1024, GQA 16/4 repeat_interleave, SDPA causal"
