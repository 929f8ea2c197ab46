"""A Llama decoder layer written as a torch user writes it: ``nn.Linear`` projections, an RMSNorm
module, SDPA with causal masking and the KV heads repeated for grouped-query attention, SwiGLU.
Imported into Relax with ``torch.export`` and ``from_exported_program``
(:func:`exported_decoder_layer`), it is the model a torch user hands TVM."""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_norm, self.post_norm = RMSNorm(hidden), RMSNorm(hidden)
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q, self.k, self.v = linear(hidden, heads * head_dim), linear(hidden, kv_heads * head_dim), \
            linear(hidden, kv_heads * head_dim)
        self.o = linear(heads * head_dim, hidden)
        self.gate, self.up, self.down = linear(hidden, intermediate), linear(hidden, intermediate), \
            linear(intermediate, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        a = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def exported_decoder_layer(layer: DecoderLayer, example: torch.Tensor, importer):
    """``layer`` (in ``example``'s dtype) as a Relax module whose ``main`` takes the input then
    the parameters, and those parameters (torch tensors, in order), imported by ``importer``:
    tvm-dsm's (:func:`tvm_dsm.relax_torch.from_exported_program`) or TVM's own
    ``from_exported_program``."""
    from tvm.relax.frontend import detach_params

    program = torch.export.export(layer, (example,))
    mod, params = detach_params(importer(program, keep_params_as_input=True))
    return mod, params["main"]
