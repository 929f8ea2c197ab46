"""Gemma-2-style layer (torch, bf16): RMSNorm with (1 + weight) in fp32, MQA (1 KV head),
eager attention with query scaled by query_pre_attn_scalar**-0.5, logit soft-capping
tanh(s / 50) * 50, causal mask added (min value), GeGLU MLP with gelu(tanh), post-norms.
batch 1, seq 256, hidden 1024, 8 heads of 128, inter 4096."""
import torch, torch.nn as nn, torch.nn.functional as F

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__(); self.weight = nn.Parameter(torch.zeros(d)); self.eps = eps
    def forward(self, x):
        o = x.float(); o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        return (o * (1.0 + self.weight.float())).type_as(x)

class Layer(nn.Module):
    def __init__(self, d=1024, h=8, dh=128, f=4096, seq=256):
        super().__init__()
        self.h, self.dh = h, dh
        self.q_proj = nn.Linear(d, h * dh, bias=False); self.k_proj = nn.Linear(d, dh, bias=False)
        self.v_proj = nn.Linear(d, dh, bias=False); self.o_proj = nn.Linear(h * dh, d, bias=False)
        self.gate_proj = nn.Linear(d, f, bias=False); self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.n1, self.n2, self.n3, self.n4 = RMSNorm(d), RMSNorm(d), RMSNorm(d), RMSNorm(d)
        m = torch.full((seq, seq), torch.finfo(torch.bfloat16).min).triu(1)
        self.register_buffer("mask", m[None, None].to(torch.bfloat16), persistent=False)
    def forward(self, x):
        B, S, D = x.shape
        y = self.n1(x)
        q = self.q_proj(y).view(B, S, self.h, self.dh).transpose(1, 2) * (256 ** -0.5)
        k = self.k_proj(y).view(B, S, 1, self.dh).transpose(1, 2)
        v = self.v_proj(y).view(B, S, 1, self.dh).transpose(1, 2)
        s = torch.matmul(q, k.transpose(2, 3))
        s = torch.tanh(s / 50.0) * 50.0
        s = s + self.mask[:, :, :S, :S]
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(p, v).transpose(1, 2).reshape(B, S, -1)
        x = x + self.n2(self.o_proj(a))
        y = self.n3(x)
        return x + self.n4(self.down_proj(F.gelu(self.gate_proj(y), approximate="tanh") * self.up_proj(y)))

def make():
    return Layer().to(torch.bfloat16), (torch.randn(1, 256, 1024, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, B1 S256 D1024, MQA eager with soft cap + additive causal mask buffer, GeGLU tanh, 4 norms"
