"""Odd sizes (torch, fp16): hidden 1000, seq 127, batch 1: pre-LN block with q/k/v Linear,
10 heads of 100, SDPA causal, o_proj, LayerNorm, ReLU FFN 1000 -> 4000 -> 1000."""
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, d=1000, h=10, f=4000):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d); self.ln2 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d); self.k = nn.Linear(d, d); self.v = nn.Linear(d, d); self.o = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, f); self.fc2 = nn.Linear(f, d)
    def forward(self, x):
        B, S, D = x.shape
        y = self.ln1(x)
        q = self.q(y).view(B, S, self.h, -1).transpose(1, 2)
        k = self.k(y).view(B, S, self.h, -1).transpose(1, 2)
        v = self.v(y).view(B, S, self.h, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        x = x + self.o(a)
        return x + self.fc2(F.relu(self.fc1(self.ln2(x))))

def make():
    return Block().half(), (torch.randn(1, 127, 1000, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B1 S127 D1000, 10 heads of 100, SDPA causal, ReLU FFN 4000"
