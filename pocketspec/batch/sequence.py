"""One request in the pool: its tokens, its own draws and n-gram index, its stats and how it ended.

Each request samples and verifies with its own draws (pocketspec/speculation/draws.py), keyed by its
seed and its positions, so what it emits depends neither on which other requests share its steps nor
on what drafted its tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.drafters.unused import UnusedProposal
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import SeededDraws
from pocketspec.stats import GenerationStats


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    seed: int = 0
    sampling: SamplingSettings | None = None  # None: the engine's; a server's requests bring their own


@dataclass
class BatchResult:
    index: int  # the request's place in the input
    tokens: list[int]
    stop_reason: str  # end_of_generation | max_tokens | context_full | interrupted
    stats: GenerationStats  # seconds: from joining the pool to the last token
    latency_seconds: float  # from submission (the start of the run) to the last token


class SequenceState:
    def __init__(self, index: int, request: Request, row: int, *, ngram: NgramDrafter | None, submitted_at: float,
                 sampling: SamplingSettings = SamplingSettings()):
        self.index, self.request, self.row, self.ngram = index, request, row, ngram
        self.unused = UnusedProposal()  # the last n-gram proposal a step did not draft, scored later
        self.sampling = request.sampling or sampling
        self.context = list(request.prompt)  # once decoding, it ends with the pending token (not yet in the cache)
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self.stats = GenerationStats(num_prompt_tokens=len(request.prompt))
        self.submitted_at = submitted_at
        self.started_at = time.perf_counter()
        self.last_step = -1  # the engine step this sequence last ran in (for the scheduler's fairness)

    @property
    def draws(self) -> SeededDraws:
        """The draws for the token after the context (its prompt, then every token it emitted)."""
        return SeededDraws.after(self.request.seed, self.context)

    @property
    def num_generated(self) -> int:
        return len(self.tokens)

    @property
    def is_finished(self) -> bool:
        return self.stop_reason is not None

    def max_gamma(self, max_context: int, num_cached: int) -> int:
        """Most draft tokens this sequence can use now: its remaining tokens and its cache room."""
        return min(self.request.max_new_tokens - len(self.tokens) - 1, max_context - num_cached - 1)

    def accept(self, new_tokens: Sequence[int], is_end: Callable[[int], bool]) -> None:
        """Add a step's tokens; stop at an end-of-generation token or at max_new_tokens."""
        self.context.extend(new_tokens)
        for token in new_tokens:
            if is_end(token):
                self.stop_reason = "end_of_generation"
                return
            self.tokens.append(token)
            if len(self.tokens) >= self.request.max_new_tokens:
                self.stop_reason = "max_tokens"
                return

    def record_step(self, step: int, drafter: str, num_drafted: int, num_accepted: int, seconds: float) -> None:
        self.stats.record_step(drafter, num_drafted, num_accepted, seconds)
        self.last_step = step

    def finish(self) -> BatchResult:
        """The result; a sequence stopped before its end (or never admitted) counts as interrupted."""
        finished_at = time.perf_counter()
        self.stats.num_tokens = len(self.tokens)
        self.stats.is_ended_by_end_token = self.stop_reason == "end_of_generation"
        self.stats.seconds = finished_at - self.started_at
        return BatchResult(self.index, list(self.tokens), self.stop_reason or "interrupted", self.stats,
                           finished_at - self.submitted_at)
