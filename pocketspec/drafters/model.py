"""A draft model proposes a chain of γ tokens, with its distributions when sampling.

Its KV cache follows the context lazily, and slides a window of attention sinks and recent tokens
when the plan gives it a context shorter than the target's (pocketspec/drafters/draft_window.py);
a self-sparse draft with --self-draft-keys attended keeps the target's most attended keys instead
(pocketspec/drafters/attended_window.py).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from pocketspec.drafters.attended_window import AttendedWindow
from pocketspec.drafters.base import Draft
from pocketspec.drafters.draft_window import DraftWindow
from pocketspec.settings import SamplingSettings


class ModelDrafter:
    name = "model"

    def __init__(self, backend, sampling: SamplingSettings, rng: np.random.Generator):
        self.backend = backend
        self.sampling = sampling
        self.rng = rng
        self.has_probs = not sampling.is_greedy
        attended_source = getattr(backend, "attended_source", None)  # a self-draft that keeps attended keys
        self.window = DraftWindow(backend) if attended_source is None else AttendedWindow(backend, attended_source)

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model."""
        return self.window.lag(context)

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        return self.window.fits(context, max_tokens)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        next_input = self.window.feed(context, max_tokens)
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
        self.window.reset()

    def close(self) -> None:
        self.backend.close()
