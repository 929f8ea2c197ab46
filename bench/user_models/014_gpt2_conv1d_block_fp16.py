"""GPT-2 block (torch, fp16) with HF's Conv1D (weight [in, out], torch.addmm(bias, x, W)):
LayerNorm, c_attn -> split q/k/v, eager attention with causal tril buffer and torch.where with
finfo.min, scale 1/sqrt(d), softmax, c_proj, MLP gelu_new (tanh). batch 2, seq 128, d 768."""
import math, torch, torch.nn as nn

class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__(); self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02); self.bias = nn.Parameter(torch.zeros(nf))
    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

class Block(nn.Module):
    def __init__(self, d=768, h=12, seq=128):
        super().__init__()
        self.h, self.dh = h, d // h
        self.ln_1 = nn.LayerNorm(d); self.ln_2 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d); self.c_proj = Conv1D(d, d)
        self.c_fc = Conv1D(4 * d, d); self.mlp_proj = Conv1D(d, 4 * d)
        self.register_buffer("bias", torch.tril(torch.ones((seq, seq), dtype=torch.bool)).view(1, 1, seq, seq), persistent=False)
    def heads(self, t):
        B, S, _ = t.shape
        return t.view(B, S, self.h, self.dh).permute(0, 2, 1, 3)
    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        causal = self.bias[:, :, :S, :S]
        w = torch.where(causal, w.to(q.dtype), torch.full([], torch.finfo(q.dtype).min, dtype=q.dtype))
        w = nn.functional.softmax(w, dim=-1).type(v.dtype)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(B, S, D)
        x = x + self.c_proj(a)
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))

def make():
    return Block().half(), (torch.randn(2, 128, 768, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B2 S128 D768, Conv1D addmm [in,out] weights, eager causal where(finfo.min), gelu_new"
