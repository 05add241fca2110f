"""Every slot a row of the torch backend's continuous-batching pool: requests join free rows
while others run, step together in one verify forward, and leave when done.

With the batch-invariant kernels (on by default on a CPU) a request's greedy tokens are
bit-identical to the same request alone; each request samples and verifies with its own
settings and its own seeded draws (pocketspec/speculation/draws.py), so a seeded request samples what
it samples alone too. --memory-budget sizes the rows (the batch plan);
asking for more concurrent requests than fit is refused before anything loads.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable

from pocketspec.batch.pool import BatchPool
from pocketspec.batch.sequence import BatchResult, Request
from pocketspec.errors import UserError
from pocketspec.serve.generation import GenerationOutcome, GenerationRequest, PendingGeneration, Slots
from pocketspec.session_settings import SessionSettings
from pocketspec.settings import BatchSettings

IDLE_WAIT_SECONDS = 0.5  # how long the pool's thread sleeps when nothing runs (it wakes on a new request)


class BatchSlots(Slots):
    def __init__(self, session):
        super().__init__()
        self.session = session  # pocketspec.batch_session.BatchSession
        self.tokenizer = session.tokenizer
        self.template = session.template
        self.max_context = session.max_context
        self.num_slots = session.engine.target.num_rows
        self._pool = BatchPool(session.engine)
        self._pending: dict[int, PendingGeneration] = {}
        self._num_emitted: dict[int, int] = {}
        self._started_at: dict[int, float] = {}
        self._indexes = itertools.count()
        self._thread = threading.Thread(target=self._serve, name="pocketspec-batch", daemon=True)
        self._thread.start()

    def _refusal(self, request: GenerationRequest) -> Exception | None:
        if len(request.prompt_tokens) >= self.max_context:
            return UserError(f"the prompt has {len(request.prompt_tokens)} tokens but a slot's context holds "
                             f"{self.max_context}")
        return None

    def _serve(self) -> None:
        while not self._is_closing.is_set():
            self._take_incoming(block=not self._pool.has_work)
            self._stop_cancelled()
            if not self._pool.has_work:
                continue
            try:
                finished = self._pool.step(self._stops_prefill)
            except BaseException as error:  # fail what runs; the server goes on with new requests
                self._fail_all(error)
                continue
            self._stream_new_tokens()
            for result in finished:
                self._complete(result)
        for result in self._pool.stop_all("cancelled"):
            self._complete(result)
        self._take_incoming(block=False)
        for result in self._pool.stop_all("cancelled"):
            self._complete(result)

    def _take_incoming(self, *, block: bool) -> None:
        try:
            pending = self._incoming.get(timeout=IDLE_WAIT_SECONDS) if block else self._incoming.get_nowait()
        except queue.Empty:
            return
        while True:
            if pending.future.set_running_or_notify_cancel():
                index = next(self._indexes)
                self._pending[index] = pending
                self._num_emitted[index] = 0
                request = pending.request
                self._pool.add(index, Request(request.prompt_tokens, request.max_new_tokens, request.sampling.seed,
                                              request.sampling), pending.submitted_at)
            try:
                pending = self._incoming.get_nowait()
            except queue.Empty:
                break

    def _stops_prefill(self, index: int) -> bool:
        """A long prompt's prefill ends at its next chunk when the server shuts down or its client leaves."""
        return self._is_closing.is_set() or self._pending[index].is_cancelled()

    def _stop_cancelled(self) -> None:
        for index, pending in list(self._pending.items()):
            if pending.is_cancelled():
                result = self._pool.stop(index, "cancelled")
                if result is not None:
                    self._complete(result)

    def _stream_new_tokens(self) -> None:
        for index, sequence in self._pool.active.items():
            self._emit(index, sequence.tokens)

    def _emit(self, index: int, tokens: list[int]) -> None:
        num_emitted = self._num_emitted[index]
        if len(tokens) > num_emitted:
            self._num_emitted[index] = len(tokens)
            self._pending[index].on_tokens(list(tokens[num_emitted:]))

    def _complete(self, result: BatchResult) -> None:
        pending = self._pending.get(result.index)
        if pending is None:
            return
        try:
            self._emit(result.index, result.tokens)
        except BaseException as error:  # a failing listener fails its own request only
            pending.future.set_exception(error)
        else:
            stats = result.stats
            stop_reason = "cancelled" if result.stop_reason == "interrupted" else result.stop_reason
            pending.future.set_result(GenerationOutcome(
                result.tokens, stop_reason, len(pending.request.prompt_tokens), stats.num_drafted,
                stats.num_accepted, stats.num_reused_tokens, stats.seconds,
                max(0.0, result.latency_seconds - stats.seconds)))
        del self._pending[result.index], self._num_emitted[result.index]

    def _fail_all(self, error: BaseException) -> None:
        for result in self._pool.stop_all("cancelled"):
            pending = self._pending.pop(result.index, None)
            self._num_emitted.pop(result.index, None)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(error)

    def in_use(self) -> int:
        """Read live from the pool (lengths of lists the slots' thread changes): a prompt being prefilled
        holds its row, so a long prefill shows as a slot in use, not as a request still queued."""
        return self._pool.num_rows_in_use

    def queued(self) -> int:
        return len(self._pool.waiting) + self._incoming.qsize()

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Cancel what runs and what waits (within one step), then free the models."""
        self._is_closing.set()
        self._thread.join(timeout_seconds)
        self._cancel_incoming()
        if not self._thread.is_alive():
            self.session.close()


def open_batch_slots(settings: SessionSettings, max_concurrency: int, *,
                     on_note: Callable[[str], None] | None = None,
                     on_progress: Callable[[str], None] | None = None) -> BatchSlots:
    """A pool of `max_concurrency` rows; with --memory-budget, refused when fewer fit."""
    from pocketspec.batch_session import open_batch_session

    batch = BatchSettings(max_batch=max_concurrency, num_rows=max_concurrency)
    session = open_batch_session(settings, batch, on_note=on_note, on_progress=on_progress,
                                 min_rows=max_concurrency)
    return BatchSlots(session)
