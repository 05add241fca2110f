"""What the HTTP layer asks of the slots that generate, whichever backend runs them.

A request is prompt tokens, a token limit and its own sampling settings. `submit` returns a
Future at once; the generation streams its tokens through on_tokens (called on the slots'
own thread, in order) and stops early when is_cancelled() turns true (a client gone, a stop
string seen, the server shutting down). Output is always the target's own: a request's
tokens do not depend on which other requests run beside it (see each implementation).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from pocketspec.settings import SamplingSettings

OnTokens = Callable[[list[int]], None]
IsCancelled = Callable[[], bool]


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    max_new_tokens: int
    sampling: SamplingSettings = SamplingSettings()


@dataclass
class GenerationOutcome:
    tokens: list[int]
    stop_reason: str  # end_of_generation | max_tokens | context_full | cancelled
    num_prompt_tokens: int
    num_drafted: int = 0
    num_accepted: int = 0
    num_reused_tokens: int = 0  # prompt tokens found already cached (prefix reuse)
    seconds: float = 0.0  # from joining a slot to the last token
    queued_seconds: float = 0.0  # from submission to joining a slot

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0


@dataclass
class PendingGeneration:
    """A submitted request, as the slots keep it until it finishes."""

    request: GenerationRequest
    on_tokens: OnTokens
    is_cancelled: IsCancelled
    future: Future = field(default_factory=Future)
    submitted_at: float = 0.0


class Slots:
    """The interface: tokenizer, template, max_context, num_slots; submit, in_use, queued, close."""

    tokenizer = None
    template = None
    max_context: int = 0
    num_slots: int = 1

    def __init__(self):
        self._lock = threading.Lock()
        self._num_in_use = 0
        self._num_queued = 0

    def submit(self, request: GenerationRequest, on_tokens: OnTokens, is_cancelled: IsCancelled) -> Future:
        raise NotImplementedError

    def in_use(self) -> int:
        """Requests generating now."""
        with self._lock:
            return self._num_in_use

    def queued(self) -> int:
        """Requests waiting for a slot."""
        with self._lock:
            return self._num_queued

    def close(self) -> None:
        raise NotImplementedError
