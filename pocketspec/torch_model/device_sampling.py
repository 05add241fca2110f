"""Choosing and verifying tokens on the model's device: the rules of pocketspec/speculation/sampling.py
and verify.py over torch tensors.

The logits never leave the device. A verify step returns one small tensor, [number accepted,
next token], that the caller reads in one transfer; nothing here branches on a device value
(no `.item()`, no data-dependent shapes), so a GPU never waits in the middle. The uniform draws
come in as a tensor: the engine draws them from its numpy generator, so one seed still drives a
whole generation and the device needs no generator of its own. Distributions are float32, as a
GPU computes them fast; the host rules use float64, and tests/test_device_sampling.py checks that
the two agree and that both keep the target distribution (χ²).
"""

from __future__ import annotations

import torch

from pocketspec.settings import SamplingSettings


def distributions(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """Probabilities [rows, vocab] (float32) after temperature, top-k and top-p, for logits [rows, vocab]."""
    scores = logits.float() / sampling.temperature
    vocab_size = scores.shape[-1]
    if 0 < sampling.top_k < vocab_size:
        kth_best = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]  # [rows, 1]
        scores = scores.masked_fill(scores < kth_best, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p >= 1.0:
        return probs
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(ordered, dim=-1) - ordered  # [rows, vocab]: mass of the better tokens
    # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
    is_kept = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before < sampling.top_p)
    kept = torch.where(is_kept, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A token id (0-dim) from unnormalised weights [vocab] by inverse CDF with one uniform in [0, 1)."""
    return draw_rows(weights[None], uniform.reshape(1))[0]


def draw_rows(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token id per row of unnormalised weights [rows, vocab], each by inverse CDF with its own
    uniform of uniforms [rows]."""
    cumulative = torch.cumsum(weights.double(), dim=-1)
    targets = (uniforms.double() * cumulative[:, -1])[:, None]
    return torch.searchsorted(cumulative, targets, right=True)[:, 0].clamp(max=weights.shape[-1] - 1)


def choose(logits: torch.Tensor, sampling: SamplingSettings,
           uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next token (0-dim) from logits [vocab]: the argmax at temperature 0, else a draw; and the
    distribution it was drawn from [vocab] (None at temperature 0), which a draft keeps."""
    if sampling.is_greedy:
        return torch.argmax(logits), None
    probs = distributions(logits[None], sampling)[0]
    return draw(probs, uniform), probs


def _verdict(num_accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    return torch.stack([num_accepted, next_token]).long()  # [2]: read once by the caller


def _num_accepted(is_accepted: torch.Tensor) -> torch.Tensor:
    """How many leading entries of is_accepted [γ] are true (0-dim)."""
    return torch.cumprod(is_accepted.long(), dim=0).sum()


def verify_greedy(draft_tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Temperature 0: accept while the draft [γ] equals the argmax of logits [γ + 1, vocab];
    the next token is the argmax after the last accepted one."""
    choices = torch.argmax(logits, dim=-1)  # [γ + 1]
    num_accepted = _num_accepted(draft_tokens == choices[:-1])
    return _verdict(num_accepted, choices.gather(0, num_accepted.reshape(1))[0])


def _finish(num_accepted: torch.Tensor, residuals: torch.Tensor, target_probs: torch.Tensor,
            uniform: torch.Tensor) -> torch.Tensor:
    """Draw the recovered token from residuals[num_accepted], or the bonus token from its last row
    (which is the target's own); a residual with no mass left (p == q up to rounding) falls back to p."""
    is_empty = residuals.sum(dim=-1, keepdim=True) <= 0
    residuals = torch.where(is_empty, target_probs, residuals)  # [γ + 1, vocab]
    row = residuals.index_select(0, num_accepted.reshape(1))[0]
    return _verdict(num_accepted, draw(row, uniform))


def verify_point_mass(draft_tokens: torch.Tensor, target_probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """A drafter without probabilities (n-gram): q is a point mass at each draft token. Every row draws
    its own token y from p with its own uniform; x is accepted while y = x, and the first other y (or
    the last row's, the bonus) is emitted: verify.verify_deterministic's rule, so the tokens are the
    draws plain sampling makes with the same uniforms, whatever γ was drafted.

    draft_tokens [γ], target_probs [γ + 1, vocab], uniforms [γ + 1] (one per row; a caller that keeps a
    seeded stream consumes only the first num_accepted + 1, as plain sampling would)."""
    draws = draw_rows(target_probs, uniforms)  # [γ + 1]
    num_accepted = _num_accepted(draws[:draft_tokens.shape[0]] == draft_tokens)
    return _verdict(num_accepted, draws.gather(0, num_accepted.reshape(1))[0])


def verify_sampled(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   uniforms: torch.Tensor) -> torch.Tensor:
    """Lossless speculative sampling (verify.verify_sampled): accept x with min(1, p(x)/q(x)), else draw
    from norm(max(0, p - q)). draft_probs [γ, vocab] is q, the distribution each draft was drawn from."""
    num_draft = draft_tokens.shape[0]
    rows = torch.arange(num_draft, device=draft_tokens.device)
    p, q = target_probs[rows, draft_tokens], draft_probs[rows, draft_tokens]
    is_accepted = (q > 0) & (uniforms[:num_draft] * q < p)
    residuals = torch.cat([(target_probs[:num_draft] - draft_probs).clamp(min=0.0), target_probs[num_draft:]])
    return _finish(_num_accepted(is_accepted), residuals, target_probs, uniforms[num_draft])


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, logits: torch.Tensor,
           sampling: SamplingSettings, uniforms: torch.Tensor) -> torch.Tensor:
    """One step's rule from the target's logits [γ + 1, vocab] (verify.verify_logits on the device):
    [number accepted, next token] as a tensor [2]."""
    if sampling.is_greedy:
        return verify_greedy(draft_tokens, logits)
    target_probs = distributions(logits, sampling)
    if draft_probs is None:
        return verify_point_mass(draft_tokens, target_probs, uniforms)
    return verify_sampled(draft_tokens, draft_probs.to(target_probs.dtype), target_probs, uniforms)
