"""One request and a batch of one run the same step (pocketspec/speculation/step.py): driven by the same scripted
model and the same virtual clock, both engines make the same calls to it, in the same order."""

from __future__ import annotations

import numpy as np
import pytest

from pocketspec.backends.base import CachedTokens
from pocketspec.batch.engine import BatchEngine
from pocketspec.batch.sequence import Request
from pocketspec.speculation.engine import SpeculativeEngine
from pocketspec.settings import BatchSettings, SpeculationSettings

VOCAB = 64
PERIOD = 7  # the script repeats the token PERIOD back, so n-gram proposals are often right


def next_token(context: list[int]) -> int:
    """The scripted model's greedy choice: mostly a copy of the token PERIOD back, now and then a new one."""
    if len(context) % 11 == 0 or len(context) < PERIOD:
        return (3 * context[-1] + 1) % VOCAB
    return context[-PERIOD]


def logits_after(context: list[int]) -> np.ndarray:
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[next_token(context)] = 1.0
    return logits


class VirtualClock:
    """Advanced by the model's forwards only: a forward of w tokens takes 10 ms plus 2 ms a token."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def forward(self, width: int) -> None:
        self.now += 0.010 + 0.002 * width


class Tokenizer:
    @staticmethod
    def is_end_of_generation(token: int) -> bool:
        return False


class OneSequenceModel(CachedTokens):
    """The script behind the single engine's Backend interface."""

    n_batch = 512
    vocab_size = VOCAB
    tokenizer = Tokenizer()

    def __init__(self, calls: list, clock: VirtualClock, max_logits_rows: int):
        super().__init__()
        self.calls, self.clock, self._max_logits_rows = calls, clock, max_logits_rows

    @property
    def max_context(self) -> int:
        return 4096

    @property
    def max_logits_rows(self) -> int:
        return self._max_logits_rows

    def forward(self, tokens, logits_rows) -> np.ndarray:
        self.calls.append(("forward", tuple(tokens)))
        self.clock.forward(len(tokens))
        start = len(self._cached)
        self._cached.extend(tokens)
        return np.stack([logits_after(self._cached[:start + row + 1]) for row in logits_rows]) \
            if len(logits_rows) else np.zeros((0, VOCAB), dtype=np.float32)

    def rollback(self, num_kept: int) -> None:
        self.calls.append(("rollback", num_kept))
        del self._cached[num_kept:]

    def exact_verify_width(self, max_width: int, on_measure=None) -> int:
        return max_width

    def close(self) -> None:
        pass


class DecodeShape:
    key_block = 64


class RowsModel:
    """The same script behind the batch engine's BatchedModel interface, one row."""

    decode_shape = DecodeShape()
    max_logits_rows = 512

    def __init__(self, calls: list, clock: VirtualClock):
        self.calls, self.clock = calls, clock
        self.max_context = 4096
        self.cached: list[list[int]] = [[]]

    @property
    def num_rows(self) -> int:
        return len(self.cached)

    def num_cached(self, row: int) -> int:
        return len(self.cached[row])

    def reusable_prefix(self, row: int, prompt) -> int:
        return 0

    def rollback(self, row: int, num_kept: int) -> None:
        self.calls.append(("rollback", num_kept))
        del self.cached[row][num_kept:]

    def prefill(self, row: int, tokens, should_stop=None) -> np.ndarray:
        return self.forward([row], [list(tokens)], [1])[0][0]

    def forward(self, rows, feeds, num_logits) -> list[np.ndarray]:
        (row,), (tokens,), (wanted,) = rows, feeds, num_logits
        self.calls.append(("forward", tuple(tokens)))
        self.clock.forward(len(tokens))
        cached = self.cached[row]
        start = len(cached)
        cached.extend(tokens)
        return [np.stack([logits_after(cached[:start + index + 1])
                          for index in range(len(tokens) - wanted, len(tokens))])]


PROMPT = [5, 9, 2, 17, 30, 41, 8, 5, 9, 2, 17, 30, 41, 8, 5, 9]


def run_single(speculation: SpeculationSettings, max_new_tokens: int) -> tuple[list, list[int]]:
    calls: list = []
    clock = VirtualClock()
    engine = SpeculativeEngine(OneSequenceModel(calls, clock, speculation.max_gamma + 1), speculation=speculation,
                               clock=clock)
    result = engine.generate(PROMPT, max_new_tokens)
    return calls, result.tokens


def run_batch_of_one(speculation: SpeculationSettings, max_new_tokens: int) -> tuple[list, list[int]]:
    calls: list = []
    clock = VirtualClock()
    engine = BatchEngine(RowsModel(calls, clock), is_end=Tokenizer.is_end_of_generation, speculation=speculation,
                         batch=BatchSettings(max_batch=1), clock=clock)
    (result,) = engine.run([Request(PROMPT, max_new_tokens)])
    return calls, result.tokens


def plain_output(max_new_tokens: int) -> list[int]:
    context = list(PROMPT)
    for _ in range(max_new_tokens):
        context.append(next_token(context))
    return context[len(PROMPT):]


@pytest.mark.parametrize("speculation", [
    SpeculationSettings(drafter="ngram", max_gamma=8, max_draftless_gamma=8),
    SpeculationSettings(drafter="ngram", gamma=3, max_gamma=8),
    SpeculationSettings(drafter="none", max_gamma=8),
], ids=["adaptive", "fixed-gamma", "plain"])
def test_one_request_and_a_batch_of_one_make_the_same_calls(speculation):
    single_calls, single_tokens = run_single(speculation, 60)
    batch_calls, batch_tokens = run_batch_of_one(speculation, 60)
    assert single_tokens == batch_tokens == plain_output(60)
    verifies = [call for call in single_calls if call[0] == "forward" and len(call[1]) > 1][1:]  # after the prompt
    if speculation.drafter != "none":
        assert verifies, "the script repeats itself: some steps must draft"
    assert single_calls == batch_calls
