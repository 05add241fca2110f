"""The cached keys the target attends to most, and a draft cache that holds only those (SnapKV-style).

SnapKV (Li et al., 2024) keeps, per layer and KV head, the cached positions that the last few
queries (its observation window) weigh most, pooled along the positions so that a kept token keeps
its neighbours. PocketSpec's self-sparse draft can keep them in place of StreamingLLM's sinks
(--self-draft-keys attended, pocketspec/drafters/attended_window.py):

- attention_mass: the observed tokens' queries, through the target's own blocks, over the target's
  cache; per layer, the attention each cached position received, summed over the observed queries
  and over each KV head's query heads. It only reads the target's cache: the target's numerics are
  untouched, and any rounding here moves only which keys the draft keeps.
- attended_positions: the top positions of each KV head after max-pooling, in ascending order.
- copy_view: the draft cache's first slots take those keys and values, then the recent ones; each
  key is rotated from its position in the target's cache to its slot (keys are stored after RoPE,
  and rotations compose), so the draft attends over a compact cache, as StreamingLLM's window does.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import Transformer, apply_rope, rope_angles

POOL_SIZE = 7  # SnapKV's pooling kernel: a kept position keeps the three on each side when they score close


@torch.inference_mode()
def attention_mass(model: Transformer, cache: StaticKVCache, observed: Sequence[int], num_cached: int,
                   num_candidates: int, num_layers: int, row: int = 0) -> list[torch.Tensor]:
    """Per layer [kv_heads, num_candidates] float32: the attention that cached positions 0 .. num_candidates - 1
    received from the queries of `observed`, the tokens at positions num_cached - len(observed) .. num_cached - 1
    of the cache's `row` (which already holds their keys and values)."""
    start = num_cached - len(observed)
    device = model.tok_embeddings.weight.device
    x = model.embed(torch.tensor([list(observed)], dtype=torch.long, device=device))
    cos, sin = rope_angles(torch.arange(start, num_cached, device=device), model.inv_freq.to(device))
    query_positions = torch.arange(start, num_cached, device=device)[:, None]
    masses = []
    for layer, block in enumerate(model.layers[:num_layers]):
        layer_device = next(block.parameters()).device  # a layer split moves the hidden state along
        x, cos, sin = x.to(layer_device), cos.to(layer_device), sin.to(layer_device)
        q, _, _ = block.project(x, cos, sin)  # [1, heads, observed, head_dim]
        keys, values = cache.read_rows(layer, slice(row, row + 1), num_cached, q.dtype)  # [1, kv_heads, n, head_dim]
        num_kv_heads, head_dim = keys.shape[1], keys.shape[3]
        group = q.shape[1] // num_kv_heads  # query head h reads KV head h // group
        grouped = q.reshape(num_kv_heads, group * len(observed), head_dim)
        visible = (torch.arange(num_cached, device=layer_device)[None, :]
                   <= query_positions.to(layer_device)).repeat(group, 1)  # [group · observed, num_cached]
        attended, mass = [], []
        for head in range(num_kv_heads):  # one KV head's scores at a time: a fraction of a prompt chunk's working set
            scores = (grouped[head] @ keys[0, head].T).to(torch.float32) * head_dim ** -0.5
            probs = torch.softmax(scores.masked_fill_(~visible, float("-inf")), dim=-1)
            attended.append(probs.to(values.dtype) @ values[0, head])
            mass.append(probs[:, :num_candidates].sum(dim=0))
        if layer + 1 < num_layers:
            x = block.finish(x, torch.stack(attended).reshape(1, q.shape[1], len(observed), head_dim))
        masses.append(torch.stack(mass))
    return masses


def attended_positions(mass: torch.Tensor, budget: int, pool_size: int = POOL_SIZE) -> torch.Tensor:
    """[kv_heads, budget] long: each head's `budget` positions of highest max-pooled mass [kv_heads, n], ascending."""
    if budget >= mass.shape[1]:
        return torch.arange(mass.shape[1], device=mass.device).expand(mass.shape[0], -1)
    pooled = F.max_pool1d(mass[None], kernel_size=pool_size, stride=1, padding=pool_size // 2)[0]
    # within a pooled plateau, the position attended to most itself goes first
    chosen = torch.topk(pooled + mass * 1e-3, budget, dim=-1).indices
    return chosen.sort(dim=-1).values


@torch.inference_mode()
def copy_view(source: StaticKVCache, draft: StaticKVCache, layer: int, positions: torch.Tensor,
              inv_freq: torch.Tensor, row: int = 0) -> None:
    """Write the source's keys and values at positions [kv_heads, n] (each head its own) to the draft's slots
    0 .. n - 1 of `layer`, each key rotated from its position to its slot; `row` of both caches."""
    keys, values = source.gather(layer, positions.to(source.keys[layer].device), row)
    device = draft.keys[layer].device
    keys, values, positions = keys.to(device), values.to(device), positions.to(device)
    num_kv_heads, num_slots = positions.shape
    shifts = torch.arange(num_slots, device=device)[None, :] - positions  # [kv_heads, n]
    cos, sin = rope_angles(shifts.reshape(-1), inv_freq.to(device))
    rotated = apply_rope(keys, cos.view(num_kv_heads, num_slots, -1), sin.view(num_kv_heads, num_slots, -1))
    draft.write(layer, 0, rotated, values, row)


def hold_attended_view(model: Transformer, source: StaticKVCache, draft: StaticKVCache, observed: Sequence[int], *,
                       num_selected: int, recent_start: int, recent_end: int, num_layers: int, row: int = 0) -> None:
    """Fill `row` of the draft's cache from the same row of the source's: per layer and KV head, the num_selected
    positions before recent_start that `observed` (the source's tokens up to recent_end) attended to most, then
    positions recent_start .. recent_end - 1."""
    masses = attention_mass(model, source, observed, recent_end, recent_start, num_layers, row)
    for layer, mass in enumerate(masses):
        device = draft.keys[layer].device
        chosen = attended_positions(mass, num_selected).to(device)
        recent = torch.arange(recent_start, recent_end, device=device)
        positions = torch.cat([chosen, recent.expand(chosen.shape[0], -1)], dim=1)
        copy_view(source, draft, layer, positions, model.inv_freq, row)
