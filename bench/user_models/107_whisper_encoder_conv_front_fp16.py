"""Whisper-base encoder front (torch, fp16): Conv1d(80->512, k3, p1) + GELU, Conv1d(512->512, k3,
s2, p1) + GELU, permute, + sinusoidal positions, one encoder layer (pre-LN, non-causal attention
with q/v bias and no k bias, q scaled before the product, SDPA; fc1 GELU fc2), final LayerNorm.
input features [1, 80, 3000] -> 1500 tokens, d 512, 8 heads, ffn 2048."""
import torch, torch.nn as nn, torch.nn.functional as F

def sinusoids(length, channels, max_timescale=10000):
    inc = torch.log(torch.tensor(max_timescale)) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)

class Enc(nn.Module):
    def __init__(self, mels=80, d=512, heads=8, ffn=2048, ctx=1500):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.conv1 = nn.Conv1d(mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.register_buffer("pos", sinusoids(ctx, d))
        self.ln1 = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d); self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d); self.out_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn); self.fc2 = nn.Linear(ffn, d)
        self.ln_post = nn.LayerNorm(d)
    def forward(self, feats):
        x = F.gelu(self.conv1(feats)); x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        x = x + self.pos.to(x.dtype)
        B, S, D = x.shape
        r = x; y = self.ln1(x)
        q = (self.q_proj(y) * self.dh ** -0.5).view(B, S, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(y).view(B, S, self.h, self.dh).transpose(1, 2)
        v = self.v_proj(y).view(B, S, self.h, self.dh).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        x = r + self.out_proj(a.transpose(1, 2).reshape(B, S, D))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.ln_post(x)

def make():
    return Enc().half(), (torch.randn(1, 80, 3000, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, 80x3000 mel -> 2 Conv1d+GELU -> 1500 tokens d512, 1 encoder layer SDPA non-causal, final LN"
