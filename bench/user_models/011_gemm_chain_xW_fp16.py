"""FFN with weights stored [in, out] as plain Parameters (x @ W + b), GELU between, fp16.
64 rows (batch 4 x seq 16), 1024 -> 4096 -> 1024."""
import torch, torch.nn as nn, torch.nn.functional as F

class FFN(nn.Module):
    def __init__(self, d=1024, f=4096):
        super().__init__()
        self.W1 = nn.Parameter(torch.randn(d, f) * 0.02); self.b1 = nn.Parameter(torch.zeros(f))
        self.W2 = nn.Parameter(torch.randn(f, d) * 0.02); self.b2 = nn.Parameter(torch.zeros(d))
    def forward(self, x):
        return F.gelu(x @ self.W1 + self.b1) @ self.W2 + self.b2

def make():
    return FFN().half(), (torch.randn(4, 16, 1024, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, [in,out] weights x@W+b, 64 rows 1024->4096->1024 GELU"
