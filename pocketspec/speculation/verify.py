"""Pure verification rules: draft tokens and the target's logits in, accepted count and next token out.

Vocabulary follows vLLM's rejection sampler: *accepted* draft tokens, the
*recovered* token the target draws where it rejects one, and the *bonus* token it
draws when every draft token was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pocketspec.speculation.draws import SeededDraws
from pocketspec.speculation.sampling import distribution
from pocketspec.settings import SamplingSettings


@dataclass(frozen=True)
class Verdict:
    num_accepted: int
    next_token: int  # recovered (after a rejection) or bonus (all accepted)

    def emitted(self, draft_tokens: Sequence[int]) -> list[int]:
        """Tokens this step adds to the sequence: accepted drafts, then the next token."""
        return [*draft_tokens[: self.num_accepted], self.next_token]


class RowDistributions:
    """The target's distribution for each verified row, computed when the rule reads it and not kept: a
    rejection at row i never pays for the rows after it (each is a float64 softmax, top-k and top-p
    over the whole vocabulary: on a CPU a wide verify's rows would cost more than its forward), and one
    row's float64 vocabulary lives at a time."""

    def __init__(self, logits: np.ndarray, sampling: SamplingSettings):
        self.logits, self.sampling = logits, sampling  # [rows, vocab]

    def __getitem__(self, index: int) -> np.ndarray:
        return distribution(self.logits[index], self.sampling)


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


def verify_sampled(draft_tokens: Sequence[int], target_probs, draws: SeededDraws) -> Verdict:
    """Sampling: row i draws the target's token for its position from p (an array [num_draft + 1, vocab] or
    RowDistributions) with the draws a drafter shares (pocketspec/speculation/draws.py); a draft token is
    accepted while it is that draw, and the first other draw (or the last row's, the bonus) is emitted.

    Whatever the drafter (a draft model that drew from its own q with the same uniforms, or an n-gram
    match, a point mass), every emitted token is the draw plain sampling makes for its position: the rule
    keeps p exactly, and a seeded run emits the same tokens whatever was drafted. Pure: draws stand at the
    position of row 0's token (the context's length)."""
    for index, drafted in enumerate(draft_tokens):
        chosen = draws.token(target_probs[index], ahead=index)
        if chosen != drafted:
            return Verdict(index, chosen)
    num_draft = len(draft_tokens)
    return Verdict(num_draft, draws.token(target_probs[num_draft], ahead=num_draft))


def verify_logits(draft_tokens: Sequence[int], logits: np.ndarray, sampling: SamplingSettings,
                  draws: SeededDraws) -> Verdict:
    """One step's rule from the target's logits [num_draft + 1, vocab], row 0's token drawn at draws' position."""
    if sampling.is_greedy:
        return verify_greedy(draft_tokens, np.argmax(logits, axis=-1))
    return verify_sampled(draft_tokens, RowDistributions(logits, sampling), draws)
