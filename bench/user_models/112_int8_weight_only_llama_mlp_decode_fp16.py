"""Int8 weight-only quantized Llama-7B MLP and o_proj (torch, fp16) as hand-written W8A16 code
does it: int8 weights stored as buffers, dequantized in forward (w.to(fp16) * scale) then
F.linear. gate/up per-output-channel scales [N]; down_proj group-wise scales (group 128) with
weight viewed [N, K/128, 128] * scale[N, K/128, 1]; o_proj per-channel with an int8 zero point
((w - zp) * scale). RMSNorm first. Decode shape: batch 1, one token, hidden 4096, inter 11008."""
import torch, torch.nn as nn, torch.nn.functional as F

class W8Linear(nn.Module):
    def __init__(self, k, n, group=None, zero_point=False):
        super().__init__()
        self.k, self.n, self.group = k, n, group
        self.register_buffer("qweight", torch.randint(-127, 127, (n, k), dtype=torch.int8))
        sshape = (n, k // group) if group else (n,)
        self.register_buffer("scale", torch.rand(sshape) * 0.01)
        self.register_buffer("zp", torch.randint(-4, 4, (n,), dtype=torch.int8) if zero_point else None)
    def forward(self, x):
        w = self.qweight
        if self.zp is not None:
            w = (w.to(x.dtype) - self.zp.to(x.dtype)[:, None]) * self.scale.to(x.dtype)[:, None]
        elif self.group:
            w = (w.view(self.n, self.k // self.group, self.group).to(x.dtype)
                 * self.scale.to(x.dtype)[..., None]).view(self.n, self.k)
        else:
            w = w.to(x.dtype) * self.scale.to(x.dtype)[:, None]
        return F.linear(x, w)

class Block(nn.Module):
    def __init__(self, d=4096, f=11008):
        super().__init__()
        self.o_proj = W8Linear(d, d, zero_point=True)
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.gate_proj = W8Linear(d, f); self.up_proj = W8Linear(d, f)
        self.down_proj = W8Linear(f, d, group=128)
    def forward(self, attn_out, resid):
        x = resid + self.o_proj(attn_out)
        h = self.norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

def make():
    m = Block().half()
    return m, (torch.randn(1, 1, 4096, dtype=torch.float16), torch.randn(1, 1, 4096, dtype=torch.float16))


WRITTEN_AS = "torch.export, fp16 activations, int8 weight buffers dequantized in forward (per-channel, zero-point, group-128), decode B1 H4096 I11008"
