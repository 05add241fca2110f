"""Pure verification rules: draft tokens and distributions in, accepted count and next token out.

Vocabulary follows vLLM's rejection sampler: *accepted* draft tokens, the
*recovered* token resampled after a rejection, and the *bonus* token sampled from
the target when every draft token was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pocketspec.speculation.sampling import distribution, sample
from pocketspec.settings import SamplingSettings


@dataclass(frozen=True)
class Verdict:
    num_accepted: int
    next_token: int  # recovered (after a rejection) or bonus (all accepted)

    def emitted(self, draft_tokens: Sequence[int]) -> list[int]:
        """Tokens this step adds to the sequence: accepted drafts, then the next token."""
        return [*draft_tokens[: self.num_accepted], self.next_token]


class RowDistributions:
    """The target's distribution for each verified row, computed when the rule first reads it: a
    rejection at row i never pays for the rows after it (each is a float64 softmax, top-k and top-p
    over the whole vocabulary: on a CPU a wide verify's rows would cost more than its forward)."""

    def __init__(self, logits: np.ndarray, sampling: SamplingSettings):
        self.logits, self.sampling = logits, sampling  # [rows, vocab]
        self._rows: dict[int, np.ndarray] = {}

    def __getitem__(self, index: int) -> np.ndarray:
        row = self._rows.get(index)
        if row is None:
            row = self._rows[index] = distribution(self.logits[index], self.sampling)
        return row


def verify_greedy(draft_tokens: Sequence[int], target_choices: Sequence[int]) -> Verdict:
    """Temperature 0: accept while the draft equals the target's argmax.

    target_choices has len(draft_tokens) + 1 entries: the target's argmax after
    each prefix, so the last one is the bonus token.
    """
    num_accepted = 0
    for drafted, chosen in zip(draft_tokens, target_choices):
        if drafted != chosen:
            break
        num_accepted += 1
    return Verdict(num_accepted, int(target_choices[num_accepted]))


def verify_sampled(
    draft_tokens: Sequence[int],
    draft_probs,  # [num_draft, vocab]: q, the distribution each draft was drawn from (an array or a list of rows)
    target_probs,  # [num_draft + 1, vocab]: p, an array or RowDistributions
    rng: np.random.Generator,
) -> Verdict:
    """Lossless speculative sampling: accept x with min(1, p(x)/q(x)), else draw from norm(max(0, p - q))."""
    for index, drafted in enumerate(draft_tokens):
        target_row = target_probs[index]
        p = target_row[drafted]
        q = draft_probs[index][drafted]
        if q > 0 and rng.random() * q < p:
            continue
        residual = np.maximum(target_row - draft_probs[index], 0.0)
        if residual.sum() <= 0:  # p == q up to rounding: any draw from p is exact
            residual = target_row
        return Verdict(index, sample(residual, rng))
    num_draft = len(draft_tokens)
    return Verdict(num_draft, sample(target_probs[num_draft], rng))


def verify_deterministic(
    draft_tokens: Sequence[int], target_probs: np.ndarray, rng: np.random.Generator
) -> Verdict:
    """A drafter without probabilities (n-gram) proposes a point mass q = 1 at its token.

    Then min(1, p/q) = p(x), and norm(max(0, p - q)) is p with x removed: both are what a draw y
    from p gives when x is accepted iff y = x, and y is the recovered token otherwise. So each
    emitted token costs one draw, as in plain sampling, and a seeded run emits the same tokens
    whatever γ each step drafted (given the same logits).
    """
    for index, drafted in enumerate(draft_tokens):
        chosen = sample(target_probs[index], rng)
        if chosen != drafted:
            return Verdict(index, chosen)
    num_draft = len(draft_tokens)
    return Verdict(num_draft, sample(target_probs[num_draft], rng))


def verify_logits(draft_tokens: Sequence[int], draft_probs, logits: np.ndarray,
                  sampling: SamplingSettings, rng: np.random.Generator) -> Verdict:
    """One step's rule from the target's logits [num_draft + 1, vocab]: greedy, a point-mass draft
    (no probabilities, e.g. n-gram) or a sampled draft with its probabilities."""
    if sampling.is_greedy:
        return verify_greedy(draft_tokens, np.argmax(logits, axis=-1))
    target_probs = RowDistributions(logits, sampling)
    if draft_probs is None:
        return verify_deterministic(draft_tokens, target_probs, rng)
    return verify_sampled(draft_tokens, draft_probs, target_probs, rng)
