"""Qwen2-MoE (A2.7B widths) sparse block at decode, batch 8 (torch, bf16): router Linear,
softmax fp32, top-4 of 60 experts (norm_topk_prob=False), expert weights gathered per (token,
slot) with index_select on the flattened index and applied with bmm (gate, up, down), weighted
sum over the 4 slots; shared expert SwiGLU (inter 5632) scaled by sigmoid(shared_expert_gate(x)).
hidden 2048, expert inter 1408; x [8, 1, 2048]."""
import torch, torch.nn as nn, torch.nn.functional as F

class MoE(nn.Module):
    def __init__(self, d=2048, inter=1408, experts=60, top_k=4, shared=5632):
        super().__init__()
        self.k = top_k
        self.gate = nn.Linear(d, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, d, inter) * 0.02)   # [E, K, N] for bmm
        self.w_up = nn.Parameter(torch.randn(experts, d, inter) * 0.02)
        self.w_down = nn.Parameter(torch.randn(experts, inter, d) * 0.02)
        self.shared_gate_proj = nn.Linear(d, shared, bias=False)
        self.shared_up_proj = nn.Linear(d, shared, bias=False)
        self.shared_down_proj = nn.Linear(shared, d, bias=False)
        self.shared_expert_gate = nn.Linear(d, 1, bias=False)
    def forward(self, x):
        B, S, D = x.shape
        t = x.view(-1, D)                                             # [T, D]
        T = t.shape[0]
        probs = F.softmax(self.gate(t), dim=1, dtype=torch.float)
        w, idx = torch.topk(probs, self.k, dim=-1)                    # [T, k]
        flat = idx.reshape(-1)                                        # [T*k]
        tk = t[:, None, :].expand(T, self.k, D).reshape(T * self.k, 1, D)
        g = torch.bmm(tk, self.w_gate.index_select(0, flat))          # [T*k, 1, I]
        u = torch.bmm(tk, self.w_up.index_select(0, flat))
        y = torch.bmm(F.silu(g) * u, self.w_down.index_select(0, flat)).view(T, self.k, D)
        routed = (y * w.to(x.dtype)[..., None]).sum(dim=1)
        sh = self.shared_down_proj(F.silu(self.shared_gate_proj(t)) * self.shared_up_proj(t))
        sh = torch.sigmoid(self.shared_expert_gate(t)) * sh
        return (routed + sh).view(B, S, D)

def make():
    return MoE().to(torch.bfloat16), (torch.randn(8, 1, 2048, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, decode B8 H2048, 60 experts top-4 softmax, experts gathered by index_select + bmm, shared expert with sigmoid gate"
