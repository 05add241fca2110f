"""Tokens a speculative step yields when each drafted token is accepted with one rate α: the formula the
planner's predictions, the draft-model check and the runtime's controller all use."""

from __future__ import annotations


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """E = (1 − α^(γ+1)) / (1 − α): the accepted drafts plus the target's own token; 1 without drafts."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
