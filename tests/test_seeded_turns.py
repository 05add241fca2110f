"""A chat's turns run one after another on one engine: every turn must sample plain sampling's tokens, also
after a step accepted drafted tokens past an end token (which the reply drops; the draws once kept a count
that such a step moved too far, and the next turn sampled otherwise). The draws now stand at the context's
length, which the dropped tokens never reach."""

from __future__ import annotations

import numpy as np
import pytest

from test_step_loop import VOCAB, OneSequenceModel, VirtualClock
from pocketspec.settings import SamplingSettings, SpeculationSettings
from pocketspec.speculation.engine import SpeculativeEngine

END = VOCAB - 1
PATTERN = [5, 9, 2, 17, 30, 41, END]  # a chat template's turn: the n-gram drafter proposes its end and beyond


class EndingTokenizer:
    @staticmethod
    def is_end_of_generation(token: int) -> bool:
        return token == END


class PatternModel(OneSequenceModel):
    """Nearly sure of the token PATTERN's period back, with a little entropy to sample from."""

    tokenizer = EndingTokenizer()

    def forward(self, tokens, logits_rows) -> np.ndarray:
        start = len(self._cached)
        self._cached.extend(tokens)
        rows = []
        for row in logits_rows:
            context = self._cached[:start + row + 1]
            logits = np.zeros(VOCAB, dtype=np.float32)
            logits[context[-len(PATTERN)] if len(context) >= len(PATTERN) else 1] = 8.0
            rows.append(logits)
        return np.stack(rows) if rows else np.zeros((0, VOCAB), dtype=np.float32)


def _turns(speculation: SpeculationSettings, seed: int) -> tuple[list[list[int]], list[int]]:
    clock = VirtualClock()
    engine = SpeculativeEngine(PatternModel([], clock, 16), speculation=speculation, clock=clock,
                               sampling=SamplingSettings(temperature=1.0, seed=seed))
    prompt, replies, accepted = PATTERN * 4 + [5, 9], [], []
    for _ in range(4):
        result = engine.generate(prompt, 30)
        replies.append(result.tokens)
        accepted.append(result.stats.num_accepted)
        prompt = prompt + result.tokens + [END, 7, 8, 9]  # the next user turn
    return replies, accepted


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_every_turn_samples_what_plain_sampling_samples(seed):
    plain, _ = _turns(SpeculationSettings(drafter="none"), seed)
    speculative, accepted = _turns(SpeculationSettings(drafter="ngram", gamma=6), seed)
    assert sum(accepted) > 0
    assert speculative == plain


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_the_nth_token_is_the_draw_for_position_n(drafter):
    """Against the draws themselves, not another run of the same code: token n of a reply is the draw at its
    place in the sequence, SeededDraws(seed, len(prompt) + n).token(p_n), p_n the model's distribution after
    the tokens before it."""
    from pocketspec.speculation.draws import SeededDraws
    from pocketspec.speculation.sampling import distribution

    sampling = SamplingSettings(temperature=1.0, seed=11)
    clock = VirtualClock()
    model = PatternModel([], clock, 16)
    engine = SpeculativeEngine(model, speculation=SpeculationSettings(drafter=drafter, gamma=4), clock=clock,
                               sampling=sampling)
    prompt = PATTERN * 4 + [5, 9]
    tokens = engine.generate(prompt, 24).tokens
    reference = PatternModel([], VirtualClock(), 16)
    expected = []
    for position in range(len(tokens)):
        new = (prompt + tokens[:position])[reference.num_cached:]
        logits = reference.forward(new, [len(new) - 1])[0]
        expected.append(SeededDraws(sampling.seed, len(prompt) + position).token(distribution(logits, sampling)))
    assert tokens == expected
