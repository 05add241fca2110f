"""A draft model proposes a chain of γ tokens; when sampling, each is its draw for that position with the
draws the target verifies with (pocketspec/speculation/draws.py).

Its KV cache follows the context lazily, and slides a window of attention sinks and recent tokens
when the plan gives it a context shorter than the target's (pocketspec/drafters/draft_window.py);
a self-sparse draft with --self-draft-keys attended keeps the target's most attended keys instead
(pocketspec/drafters/attended_window.py).
"""

from __future__ import annotations

import time
from typing import Sequence

from pocketspec.drafters.attended_window import AttendedWindow
from pocketspec.drafters.base import Draft
from pocketspec.drafters.draft_window import DraftWindow
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import SeededDraws


class ModelDrafter:
    name = "model"

    def __init__(self, backend, sampling: SamplingSettings):
        self.backend = backend
        self.sampling = sampling
        attended_source = getattr(backend, "attended_source", None)  # a self-draft that keeps attended keys
        self.window = DraftWindow(backend) if attended_source is None else AttendedWindow(backend, attended_source)

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model."""
        return self.window.lag(context)

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        return self.window.fits(context, max_tokens)

    def propose(self, context: Sequence[int], max_tokens: int, draws: SeededDraws) -> Draft:
        """max_tokens tokens after context, the first drawn at draws' position (the context's length)."""
        next_input = self.window.feed(context, max_tokens)
        tokens: list[int] = []
        timings = []
        for index in range(max_tokens):
            started = time.perf_counter()
            token = self.backend.choose(next_input, self.sampling, draws.ahead(index))
            timings.append((len(next_input), time.perf_counter() - started))
            tokens.append(token)
            next_input = [token]
        return Draft(tokens=tokens, forward_timings=timings)

    def reset(self) -> None:
        self.window.reset()

    def close(self) -> None:
        self.backend.close()
