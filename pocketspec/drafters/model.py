"""A draft model proposes a chain of γ tokens, with its distributions when sampling.

Its KV cache follows the context lazily: before drafting it keeps the longest
common prefix with the context, rolls back the rest and catches up in one pass.
When the plan gives the draft a context shorter than the target's, the draft
sees a sliding window: the first ATTENTION_SINK_TOKENS tokens plus the most recent ones
(StreamingLLM attention sinks, as MagicDec drafts with), shifted in its cache.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from memplanner.defaults import ATTENTION_SINK_TOKENS, SLIDE_SLACK_TOKENS
from pocketspec.drafters.base import Draft
from pocketspec.speculation.prefix import common_prefix_length
from pocketspec.settings import SamplingSettings



class ModelDrafter:
    name = "model"

    def __init__(self, backend, sampling: SamplingSettings, rng: np.random.Generator):
        self.backend = backend
        self.sampling = sampling
        self.rng = rng
        self.has_probs = not sampling.is_greedy
        self._num_dropped = 0  # context tokens after the sinks that the window no longer holds

    def _window(self, context: Sequence[int]) -> list[int]:
        """What the draft model sees of `context`: sinks, then everything after the dropped span."""
        context = list(context)
        cached_sinks = self.backend.cached_tokens[:ATTENTION_SINK_TOKENS]
        if self._num_dropped and (len(context) < ATTENTION_SINK_TOKENS + self._num_dropped
                                  or (len(cached_sinks) == ATTENTION_SINK_TOKENS and context[:ATTENTION_SINK_TOKENS] != cached_sinks)):
            self._num_dropped = 0  # a different conversation: start the window over
            self.backend.rollback(0)
        return context[:ATTENTION_SINK_TOKENS] + context[ATTENTION_SINK_TOKENS + self._num_dropped:]

    def _num_kept(self, window: list[int]) -> int:
        return min(common_prefix_length(self.backend.cached_tokens, window), len(window) - 1)

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model."""
        window = self._window(context)
        return len(window) - self._num_kept(window) - 1

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        return ATTENTION_SINK_TOKENS + SLIDE_SLACK_TOKENS + max_tokens + 1 < self.backend.max_context

    def _slide(self, window: list[int], num_kept: int, max_tokens: int, context: Sequence[int]) -> tuple[list[int], int]:
        overflow = len(window) + max_tokens - self.backend.max_context
        if overflow <= 0:
            return window, num_kept
        num_dropping = overflow + SLIDE_SLACK_TOKENS
        if num_kept - ATTENTION_SINK_TOKENS >= num_dropping:
            self.backend.shift_out(ATTENTION_SINK_TOKENS, num_dropping)
            num_kept -= num_dropping
        else:
            self.backend.rollback(min(num_kept, ATTENTION_SINK_TOKENS))
            num_kept = min(num_kept, ATTENTION_SINK_TOKENS)
        self._num_dropped += num_dropping
        return self._window(context), num_kept

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        window = self._window(context)
        num_kept = self._num_kept(window)
        self.backend.rollback(num_kept)
        window, num_kept = self._slide(window, num_kept, max_tokens, context)
        next_input = window[num_kept:]
        tokens: list[int] = []
        probs = []  # each [vocab], on the host or on the draft's device
        timings = []
        for _ in range(max_tokens):
            started = time.perf_counter()
            token, token_probs = self.backend.choose(next_input, self.sampling, self.rng)
            timings.append((len(next_input), time.perf_counter() - started))
            tokens.append(token)
            if token_probs is not None:
                probs.append(token_probs)
            next_input = [token]
        return Draft(tokens=tokens, probs=probs or None, forward_timings=timings)

    def reset(self) -> None:
        self._num_dropped = 0
        self.backend.rollback(0)

    def close(self) -> None:
        self.backend.close()
