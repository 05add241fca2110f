"""A compact llama / qwen2 decoder in PyTorch, in the style of gpt-fast.

Pre-norm RMSNorm, rotary embeddings with the model's base (rotate-half layout, as in
Hugging Face checkpoints), grouped-query attention through scaled_dot_product_attention,
a SwiGLU feed-forward, and tied or untied embeddings. qwen2 adds biases on q, k and v.
The KV cache lives outside the model (kv_cache.py); a forward writes the new keys and
values at their positions and attends over everything before them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # llama | qwen2
    num_layers: int
    dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    has_qkv_bias: bool = False
    is_tied: bool = False  # the output head reuses the token embedding


def rope_inv_freq(config: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """Rotation frequencies [head_dim / 2] in float32: base ** (-2i / head_dim)."""
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device) / config.head_dim
    return 1.0 / config.rope_base ** exponents


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [len(positions), head_dim / 2] in float32; positions may be negative (a shift)."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, head_dim] by the angles [T, head_dim / 2]; halves pair up (rotate-half)."""
    half = x.shape[-1] // 2
    x_float = x.to(torch.float32)
    first, second = x_float[..., :half], x_float[..., half:]
    rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return rotated.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_float = x.to(torch.float32)
        normed = x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(self.weight.dtype) * self.weight  # the compute dtype, also from an fp32 residual


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.has_qkv_bias
        self.wq = nn.Linear(config.dim, config.num_heads * config.head_dim, bias=bias)
        self.wk = nn.Linear(config.dim, config.num_kv_heads * config.head_dim, bias=bias)
        self.wv = nn.Linear(config.dim, config.num_kv_heads * config.head_dim, bias=bias)
        self.wo = nn.Linear(config.num_heads * config.head_dim, config.dim, bias=False)
        self.wqkv = None  # wq, wk and wv as one matmul, where fused (fused_projections.py)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [batch, heads, T, head_dim], k and v [batch, kv_heads, T, head_dim], q and k rotated."""
        batch, num_tokens, _ = x.shape
        q, k, v = self.wqkv(x) if self.wqkv is not None else (self.wq(x), self.wk(x), self.wv(x))
        q = q.view(batch, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, num_tokens, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, num_tokens, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int, start: int,
               layout=None) -> torch.Tensor:
        """Write k and v to the cache and attend; [batch, heads, T, head_dim]."""
        if layout is not None:  # tokens of several sequences packed into one row (pocketspec/batch/layout.py)
            return layout.attend(q, k, v, cache, layer)
        cache.write(layer, start, k, v)
        keys, values = cache.read(layer, start + q.shape[2], dtype=q.dtype)  # [batch, kv_heads, end, head_dim]
        return causal_attention(q, keys, values, start, expand_groups=q.device.type != "cpu")

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        batch, _, num_tokens, _ = attended.shape
        return self.wo(attended.transpose(1, 2).reshape(batch, num_tokens, -1))


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, *,
                     expand_groups: bool) -> torch.Tensor:
    """q [batch, heads, T, head_dim] at positions start .. start + T - 1 over keys and values
    [batch, kv_heads, start + T, head_dim]; query i sees keys 0 .. start + i.

    One query sees every key: no mask, so SDPA may pick its flash kernel, which takes grouped
    queries (enable_gqa) but no mask. Several queries (a prompt chunk, a verify pass of γ + 1
    rows) need the causal mask; on a GPU the kernel that takes a mask (memory-efficient) does
    not take grouped queries, and SDPA would fall back to the math kernel and its full score
    matrix, so expand_groups repeats keys and values to every query head first. The CPU's
    fused kernel takes both.
    """
    num_tokens = q.shape[2]
    if num_tokens == 1:
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=q.shape[1] != keys.shape[1])
    query_positions = torch.arange(start, start + num_tokens, device=q.device)[:, None]
    key_positions = torch.arange(keys.shape[2], device=q.device)[None, :]
    mask = key_positions <= query_positions  # [num_tokens, end]
    return masked_attention(q, keys, values, mask, expand_groups=expand_groups)


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *,
                     expand_groups: bool) -> torch.Tensor:
    """SDPA with a boolean mask; expand_groups repeats grouped keys and values to every query head
    (causal_attention says why a GPU needs it)."""
    is_grouped = q.shape[1] != keys.shape[1]
    if is_grouped and expand_groups:
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=is_grouped and not expand_groups)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w_up = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.w_gate_up = None  # w_gate and w_up as one matmul, where fused (fused_projections.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x) if self.w_gate_up is not None else (self.w_gate(x), self.w_up(x))
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin, cache, layer: int, start: int, layout=None) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.finish(x, self.attention.attend(q, k, v, cache, layer, start, layout))

    # The two halves around attention touch no cache: the static step compiles them once for every
    # block (torch_model/static_step.py), while writing the cache stays outside.
    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.attention.project(self.attention_norm(x), cos, sin)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual after attention, then the feed-forward's."""
        x = x + self.attention.output(attended)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # an explicit weight skips nn.init.normal_, which on the meta device imports torch._dynamo
        # and sympy: 77 MiB of RSS for nothing (torch 2.13.0)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim,
                                           _weight=torch.empty(config.vocab_size, config.dim))
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = None if config.is_tied else nn.Linear(config.dim, config.vocab_size, bias=False)
        # computed on the CPU even when built on meta (meta arange imports sympy); the loader
        # recomputes it on the model's device
        self.register_buffer("inv_freq", rope_inv_freq(config, torch.device("cpu")), persistent=False)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        if x.dtype == torch.float16:
            # the residual stream stays float32: Qwen2's outgrows fp16's 65504 and turns to inf
            # (bf16 has fp32's range); each block still computes in fp16 from its fp16 norm
            x = x.float()
        return x

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(hidden)
        if self.output is None:
            return F.linear(hidden, self.tok_embeddings.weight)
        return self.output(hidden)

    def forward(self, tokens: torch.Tensor, start: int, cache, logits_rows: torch.Tensor,
                num_layers: int | None = None, layout=None) -> torch.Tensor:
        """tokens [batch, T] at positions start .. start + T - 1; logits [batch, len(logits_rows), vocab].

        num_layers < config.num_layers runs only the first layers before the head (a layer-skip draft).
        With a `layout` (pocketspec/batch/layout.py), tokens [1, N] are the new tokens of several
        sequences packed together: the layout gives each its position (`start` is unused) and
        attends per sequence.
        """
        x = self.embed(tokens)
        if layout is not None:
            cos, sin = layout.cos, layout.sin
        else:
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
            cos, sin = rope_angles(positions, self.inv_freq)
        for layer, block in enumerate(self.layers[:num_layers]):
            x = block(x, cos, sin, cache, layer, start, layout)
        if logits_rows.numel() == 0:
            return x.new_empty((tokens.shape[0], 0, self.config.vocab_size), dtype=torch.float32)
        return self.head(x[:, logits_rows]).float()
