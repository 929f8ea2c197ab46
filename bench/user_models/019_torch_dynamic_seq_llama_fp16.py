"""Llama layer (torch, fp16) exported with a dynamic sequence length (torch.export.Dim "seq",
16..256), batch 1: RMSNorm, q/k/v/o without bias, no RoPE, SDPA is_causal with enable_gqa=True
(32 q heads / 8 kv heads), SwiGLU MLP. hidden 1024, inter 2816."""
import torch, torch.nn as nn, torch.nn.functional as F

class Layer(nn.Module):
    def __init__(self, d=1024, h=16, kv=4, f=2816):
        super().__init__()
        self.h, self.kv, self.dh = h, kv, d // h
        self.n1 = nn.RMSNorm(d, eps=1e-5); self.n2 = nn.RMSNorm(d, eps=1e-5)
        self.q = nn.Linear(d, d, bias=False); self.k = nn.Linear(d, kv * self.dh, bias=False)
        self.v = nn.Linear(d, kv * self.dh, bias=False); self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, f, bias=False); self.up = nn.Linear(d, f, bias=False); self.down = nn.Linear(f, d, bias=False)
    def forward(self, x):
        B, S, D = x.shape
        y = self.n1(x)
        q = self.q(y).view(B, S, self.h, self.dh).transpose(1, 2)
        k = self.k(y).view(B, S, self.kv, self.dh).transpose(1, 2)
        v = self.v(y).view(B, S, self.kv, self.dh).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, S, D))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))

def make():
    return Layer().half(), (torch.randn(1, 64, 1024, dtype=torch.float16),)


WRITTEN_AS = "torch.export dynamic seq (Dim 16..256), fp16, B1 D1024, SDPA causal enable_gqa, SwiGLU"
