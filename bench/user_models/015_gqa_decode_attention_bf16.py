"""Decode attention alone (torch, bf16), eager, as a user writes it for grouped-query heads:
q [B, 32, 1, 128], cached K/V [B, 8, 512, 128] repeated with repeat_interleave, scores =
q @ k^T * scale, softmax in fp32 cast back, @ v. batch 4."""
import torch, torch.nn as nn

class DecodeAttn(nn.Module):
    def forward(self, q, k, v):
        n = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(n, dim=1); v = v.repeat_interleave(n, dim=1)
        s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return p @ v

def make():
    dt = torch.bfloat16
    return DecodeAttn(), (torch.randn(4, 32, 1, 128, dtype=dt), torch.randn(4, 8, 512, 128, dtype=dt),
                          torch.randn(4, 8, 512, 128, dtype=dt))


WRITTEN_AS = "torch.export, bf16, decode B4 32q/8kv heads D128 over 512 keys, repeat_interleave, eager"
