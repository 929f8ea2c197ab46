"""T5-style encoder layer (torch, fp32): T5LayerNorm (RMS, no mean, no bias), attention without
scaling plus a relative position bias (bucketed, computed from arange, embedding gather) added to
scores, ReLU FFN (DenseReluDense). batch 2, seq 64, d_model 512, 8 heads, d_ff 2048."""
import math, torch, torch.nn as nn, torch.nn.functional as F

class T5LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x

def bucket(rel, num_buckets=32, max_distance=128):
    num_buckets //= 2
    ret = (rel > 0).to(torch.long) * num_buckets
    n = torch.abs(rel)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return ret + torch.where(is_small, n, large)

class Layer(nn.Module):
    def __init__(self, d=512, h=8, dff=2048):
        super().__init__()
        self.h, self.dk = h, d // h
        self.q = nn.Linear(d, d, bias=False); self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False); self.o = nn.Linear(d, d, bias=False)
        self.rel = nn.Embedding(32, h)
        self.ln1, self.ln2 = T5LayerNorm(d), T5LayerNorm(d)
        self.wi = nn.Linear(d, dff, bias=False); self.wo = nn.Linear(dff, d, bias=False)
    def position_bias(self, S):
        ctx = torch.arange(S)[:, None]; mem = torch.arange(S)[None, :]
        b = bucket(mem - ctx)
        return self.rel(b).permute(2, 0, 1).unsqueeze(0)    # [1, H, S, S]
    def forward(self, x):
        B, S, D = x.shape
        n = self.ln1(x)
        q = self.q(n).view(B, S, self.h, self.dk).transpose(1, 2)
        k = self.k(n).view(B, S, self.h, self.dk).transpose(1, 2)
        v = self.v(n).view(B, S, self.h, self.dk).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(3, 2)) + self.position_bias(S)
        p = F.softmax(scores.float(), dim=-1).type_as(scores)
        a = torch.matmul(p, v).transpose(1, 2).contiguous().view(B, S, D)
        x = x + self.o(a)
        return x + self.wo(F.relu(self.wi(self.ln2(x))))

def make():
    return Layer(), (torch.randn(2, 64, 512),)


WRITTEN_AS = "torch.export, fp32, B2 S64 D512, relative position bias from arange+embedding, ReLU FFN"
