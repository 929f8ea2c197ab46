"""Llama MLP at decode (torch, fp16): one token, batch 1, hidden 2048, inter 8192: RMSNorm
(HF style: fp32 variance), gate/up Linear, silu(gate)*up, down Linear, residual. Row GEMVs."""
import torch, torch.nn as nn, torch.nn.functional as F

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        dt = x.dtype; x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)

class MLP(nn.Module):
    def __init__(self, d=2048, f=8192):
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, f, bias=False); self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
    def forward(self, x):
        h = self.norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

def make():
    return MLP().half(), (torch.randn(1, 1, 2048, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, decode 1 token H2048 I8192 SwiGLU"
