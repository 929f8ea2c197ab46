"""BERT encoder layer (torch, fp16): separate q/k/v Linear with bias, scores/sqrt(d) + additive
padding mask [B,1,1,S] input, softmax, dropout-free, post-LayerNorm, GELU (erf) FFN.
batch 4, seq 128, hidden 768, 12 heads."""
import math, torch, torch.nn as nn, torch.nn.functional as F

class Layer(nn.Module):
    def __init__(self, d=768, h=12, dff=3072):
        super().__init__()
        self.h, self.dh = h, d // h
        self.query = nn.Linear(d, d); self.key = nn.Linear(d, d); self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d); self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.inter = nn.Linear(d, dff); self.output = nn.Linear(dff, d); self.ln2 = nn.LayerNorm(d, eps=1e-12)
    def split(self, x):
        B, S, _ = x.shape
        return x.view(B, S, self.h, self.dh).permute(0, 2, 1, 3)
    def forward(self, x, mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh) + mask
        p = F.softmax(s, dim=-1)
        c = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        c = c.view(x.shape)
        x = self.ln1(self.out(c) + x)
        return self.ln2(self.output(F.gelu(self.inter(x))) + x)

def make():
    m = Layer().half()
    mask = torch.zeros(4, 1, 1, 128, dtype=torch.float16); mask[..., 100:] = -10000.0
    return m, (torch.randn(4, 128, 768, dtype=torch.float16), mask)


WRITTEN_AS = "torch.export, fp16, B4 S128 H768, additive padding mask input, post-LN, GELU"
