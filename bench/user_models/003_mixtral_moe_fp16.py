"""Mixtral-style sparse MoE block (torch, fp16): router Linear, softmax in fp32, top-2 of 8,
renormalize, per-token expert weights gathered by index (w[idx]) and SwiGLU computed with einsum.
tokens 64 (batch 2 x seq 32), hidden 512, expert inter 1024."""
import torch, torch.nn as nn, torch.nn.functional as F

class MoE(nn.Module):
    def __init__(self, hidden=512, inter=1024, experts=8, top_k=2):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, inter, hidden) * 0.02)   # gate
        self.w3 = nn.Parameter(torch.randn(experts, inter, hidden) * 0.02)   # up
        self.w2 = nn.Parameter(torch.randn(experts, hidden, inter) * 0.02)   # down
    def forward(self, x):
        B, S, Hd = x.shape
        t = x.view(-1, Hd)
        logits = self.gate(t)
        probs = F.softmax(logits, dim=1, dtype=torch.float)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
        g = self.w1[idx]; u = self.w3[idx]; d = self.w2[idx]          # [T, k, I, H], [T, k, H, I]
        h = F.silu(torch.einsum("th,tkih->tki", t, g)) * torch.einsum("th,tkih->tki", t, u)
        y = torch.einsum("tki,tkhi->tkh", h, d)
        out = (y * w.unsqueeze(-1)).sum(dim=1)
        return out.view(B, S, Hd), logits

def make():
    return MoE().half(), (torch.randn(2, 32, 512, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, 64 tokens H512 I1024, top-2 of 8, experts gathered by index + einsum"
