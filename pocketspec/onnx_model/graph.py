"""The one step the ONNX graph computes: the torch model's forward with its KV cache as inputs and outputs.

Inputs: `tokens` [1, T]; `logits_rows` [R]; and per layer `past_key.i` / `past_value.i` [P, kv_heads,
head_dim], the P cached positions (the shape says where the new tokens start). Outputs: `logits`
[R, vocab] float32 and `new_key.i` / `new_value.i` [T, kv_heads, head_dim], this step's keys
(after RoPE) and values. The cache is position-major, so the P cached positions of a
fixed-capacity buffer are one contiguous block and the T new ones the block right after it:
the backend binds the inputs and outputs to those two blocks of its own buffers by address
(I/O binding), and a step neither copies the cache in nor out, on any execution provider.
(Binding a whole-capacity cache as input and output instead, with ScatterND writing the new
positions, made ONNX Runtime 1.32's CPU provider copy the buffer every step: 28 ms a token at
256 positions, 96 ms at 4096, SmolLM2 on 2 EPYC cores.)

Every linear layer becomes a MatMul on a weight stored transposed, the head included: the int4
quantizer (MatMulNBits) only rewrites a MatMul whose weight is an initializer, and ONNX Runtime
would fold a Transpose in front into a second copy of the weight at load anyway. A tied model
embeds its tokens from the head's columns, so the matrix is stored once.
"""

from __future__ import annotations

import torch
from torch import nn

from pocketspec.torch_model.model import Transformer, rope_angles


class MatMulLinear(nn.Module):
    """y = x @ weight_t (+ bias): nn.Linear with its weight stored [in, out]."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


def _swap_linears(module: nn.Module) -> None:
    """Replace every nn.Linear below `module` by a MatMulLinear, one at a time (one weight copied at once)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, MatMulLinear(child))
        else:
            _swap_linears(child)


class CacheStep(nn.Module):
    """The exported step over `model`, whose linear layers it rewrites in place (the model is the export's)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.is_tied = model.output is None
        head = model.tok_embeddings.weight if self.is_tied else model.output.weight
        self.head_t = nn.Parameter(head.detach().t().contiguous(), requires_grad=False)  # [dim, vocab]
        model.output = None
        if self.is_tied:  # tokens are embedded from the head's columns: one copy of the matrix, not two
            model.tok_embeddings = None
        _swap_linears(model.layers)
        self.model = model

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[1, T, dim], float32 for fp16 weights (Transformer.embed says why)."""
        if not self.is_tied:
            return self.model.embed(tokens)
        x = self.head_t.index_select(1, tokens[0]).t()[None]
        return x.float() if x.dtype == torch.float16 else x

    def forward(self, tokens: torch.Tensor, logits_rows: torch.Tensor,
                pasts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        model, config = self.model, self.model.config
        num_cached, num_tokens = pasts[0].shape[0], tokens.shape[1]
        key_positions = torch.arange(num_cached + num_tokens, device=tokens.device)  # [S]
        positions = key_positions[num_cached:]  # [T]
        cos, sin = rope_angles(positions, model.inv_freq)
        mask = key_positions[None, :] <= positions[:, None]  # [T, S]
        group = config.num_heads // config.num_kv_heads
        x = self.embed(tokens)
        news = []
        for layer, block in enumerate(model.layers):
            q, k, v = block.project(x, cos, sin)  # k, v [1, kv_heads, T, head_dim]
            past_keys, past_values = pasts[2 * layer], pasts[2 * layer + 1]  # [P, kv_heads, head_dim]
            new_keys, new_values = k[0].transpose(0, 1).to(past_keys.dtype), v[0].transpose(0, 1).to(past_values.dtype)
            news += [new_keys, new_values]
            keys = torch.cat([past_keys, new_keys]).transpose(0, 1)[None].to(q.dtype)  # [1, kv_heads, S, head_dim]
            values = torch.cat([past_values, new_values]).transpose(0, 1)[None].to(q.dtype)
            if group > 1:
                keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            scores = (q @ keys.transpose(-1, -2)).float() * config.head_dim ** -0.5  # [1, heads, T, S]
            weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            x = block.finish(x, weights.to(values.dtype) @ values)
        logits = (model.norm(x[:, logits_rows]) @ self.head_t).float()[0]  # [R, vocab]
        return (logits, *news)
