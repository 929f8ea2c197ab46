"""DeepSeek-MoE block (torch, bf16), written export-friendly (no data-dependent loops): router
Linear, softmax in fp32, top-6 of 64 experts (no renormalisation, as norm_topk_prob=False), the
weights scattered into a dense [T, 64] routing matrix, every expert's SwiGLU computed by einsum
over stacked weights, combined by the routing matrix; plus 2 shared experts fused into one SwiGLU
MLP. 64 tokens (batch 2 x seq 32), hidden 1024, expert inter 352, shared inter 704."""
import torch, torch.nn as nn, torch.nn.functional as F

class MoE(nn.Module):
    def __init__(self, hidden=1024, inter=352, experts=64, top_k=6, shared=2):
        super().__init__()
        self.top_k, self.E = top_k, experts
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, inter, hidden) * 0.02)
        self.w_up = nn.Parameter(torch.randn(experts, inter, hidden) * 0.02)
        self.w_down = nn.Parameter(torch.randn(experts, hidden, inter) * 0.02)
        self.s_gate = nn.Linear(hidden, shared * inter, bias=False)
        self.s_up = nn.Linear(hidden, shared * inter, bias=False)
        self.s_down = nn.Linear(shared * inter, hidden, bias=False)
    def forward(self, x):
        B, S, H = x.shape
        t = x.view(-1, H)
        scores = F.softmax(self.gate(t), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(scores, self.top_k, dim=-1, sorted=False)
        routing = torch.zeros_like(scores).scatter(1, idx, w).to(x.dtype)      # [T, E]
        g = torch.einsum("th,eih->eti", t, self.w_gate)
        u = torch.einsum("th,eih->eti", t, self.w_up)
        y = torch.einsum("eti,ehi->eth", F.silu(g) * u, self.w_down)              # [E, T, H]
        routed = torch.einsum("te,eth->th", routing, y)
        shared = self.s_down(F.silu(self.s_gate(t)) * self.s_up(t))
        return (routed + shared).view(B, S, H)

def make():
    return MoE().to(torch.bfloat16), (torch.randn(2, 32, 1024, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, 64 tokens H1024, 64 experts top-6 softmax, dense routing matrix + einsum over all experts, 2 shared experts"
