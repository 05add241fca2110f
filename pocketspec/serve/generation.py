"""What the HTTP layer asks of the slots that generate, whichever backend runs them.

A request is prompt tokens, a token limit and its own sampling settings. `submit` returns a
Future at once; the generation streams its tokens through on_tokens (called on the slots'
own thread, in order) and stops early when is_cancelled() turns true (a client gone, a stop
string seen, the server shutting down). Output is always the target's own: a request's
tokens do not depend on which other requests run beside it (see each implementation).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from pocketspec.settings import SamplingSettings
from pocketspec.stats import budgeted_peak_bytes

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
    """The interface: tokenizer, template, max_context, num_slots; submit, in_use, queued, peak_memory_bytes, close.

    Submitted requests wait in `_incoming` until the implementation's own thread takes them."""

    tokenizer = None
    template = None
    max_context: int = 0
    num_slots: int = 1

    def __init__(self):
        self._incoming: queue.Queue = queue.Queue()
        self._is_closing = threading.Event()

    def submit(self, request: GenerationRequest, on_tokens: OnTokens, is_cancelled: IsCancelled) -> Future:
        pending = PendingGeneration(request, on_tokens, is_cancelled, submitted_at=time.perf_counter())
        refusal = RuntimeError("the server is shutting down") if self._is_closing.is_set() else self._refusal(request)
        if refusal is not None:
            pending.future.set_exception(refusal)
            return pending.future
        self._incoming.put(pending)
        return pending.future

    def _refusal(self, request: GenerationRequest) -> Exception | None:
        """Why a request cannot run at all (checked when it is submitted); None when it can."""
        return None

    def _cancel_incoming(self) -> None:
        """Answer every request still waiting in `_incoming` as cancelled (at shutdown)."""
        cancel_waiting(self._incoming)

    def in_use(self) -> int:
        """Requests generating now (a prompt being prefilled included)."""
        raise NotImplementedError

    def queued(self) -> int:
        """Requests waiting for a slot."""
        raise NotImplementedError

    def peak_memory_bytes(self) -> int:
        """What --memory-budget bounds, as the metrics show it: GPU allocator peaks where torch used a GPU,
        else this process's peak resident memory."""
        return budgeted_peak_bytes()

    def close(self) -> None:
        raise NotImplementedError


def cancel_waiting(waiting: queue.Queue) -> None:
    """Answer every request left in a queue as cancelled (at shutdown); other items are dropped."""
    while True:
        try:
            pending = waiting.get_nowait()
        except queue.Empty:
            return
        if isinstance(pending, PendingGeneration) and pending.future.set_running_or_notify_cancel():
            pending.future.set_result(GenerationOutcome([], "cancelled", len(pending.request.prompt_tokens)))
