"""Phi-3-mini decoder layer (torch, bf16) as modeling_phi3 writes it: one fused qkv_proj sliced
into q/k/v, one fused gate_up_proj chunked in halves, RMSNorm, RoPE (rotate_half), SDPA causal.
hidden 3072, 32 heads, head_dim 96, inter 8192; batch 1, seq 256."""
import torch, torch.nn as nn, torch.nn.functional as F

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        dt = x.dtype; x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Phi3Layer(nn.Module):
    def __init__(self, hidden=3072, heads=32, inter=8192, seq=256):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.qkv_proj = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden), RMSNorm(hidden)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, H = x.shape
        r = x; x = self.input_layernorm(x)
        qkv = self.qkv_proj(x)
        q = qkv[..., :H].view(B, S, self.h, self.d).transpose(1, 2)
        k = qkv[..., H:2 * H].view(B, S, self.h, self.d).transpose(1, 2)
        v = qkv[..., 2 * H:].view(B, S, self.h, self.d).transpose(1, 2)
        cos = self.cos[:S].to(x.dtype)[None, None]; sin = self.sin[:S].to(x.dtype)[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = r + self.o_proj(a.transpose(1, 2).reshape(B, S, H))
        r = x; x = self.post_attention_layernorm(x)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return r + self.down_proj(up * F.silu(gate))

def make():
    return Phi3Layer().to(torch.bfloat16), (torch.randn(1, 256, 3072, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, B1 S256 H3072 32 heads d96, fused qkv sliced, fused gate_up chunk(2), SDPA causal"
