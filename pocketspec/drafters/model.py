"""A draft model proposes a chain of γ tokens, with its distributions when sampling.

Its KV cache follows the context lazily: before drafting it keeps the longest
common prefix with the context, rolls back the rest and catches up in one pass.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from pocketspec.drafters.base import Draft
from pocketspec.prefix import common_prefix_length
from pocketspec.sampling import distribution, sample
from pocketspec.settings import SamplingSettings


class ModelDrafter:
    name = "model"

    def __init__(self, backend, sampling: SamplingSettings, rng: np.random.Generator):
        self.backend = backend
        self.sampling = sampling
        self.rng = rng
        self.has_probs = not sampling.is_greedy

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model."""
        kept = min(common_prefix_length(self.backend.cached_tokens, context), len(context) - 1)
        return len(context) - kept - 1

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        return len(context) + max_tokens <= self.backend.max_context

    def _choose(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if self.sampling.is_greedy:
            return int(np.argmax(logits)), None
        probs = distribution(logits, self.sampling)
        return sample(probs, self.rng), probs

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        kept = min(common_prefix_length(self.backend.cached_tokens, context), len(context) - 1)
        self.backend.rollback(kept)
        started = time.perf_counter()
        logits = self.backend.prefill(context[kept:])
        timings = [(len(context) - kept, time.perf_counter() - started)]
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for index in range(max_tokens):
            token, token_probs = self._choose(logits)
            tokens.append(token)
            if token_probs is not None:
                probs.append(token_probs)
            if index + 1 < max_tokens:
                started = time.perf_counter()
                logits = self.backend.forward([token], [0])[0]
                timings.append((1, time.perf_counter() - started))
        return Draft(tokens=tokens, probs=np.stack(probs) if probs else None, forward_timings=timings)

    def reset(self) -> None:
        self.backend.rollback(0)

    def close(self) -> None:
        self.backend.close()
