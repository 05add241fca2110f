"""One slot that is a speculative engine, for what the batching pool cannot run: a torch target split
over --devices, and ONNX Runtime (pocketspec/serve/open.py).

Requests run one at a time, in the order they came, on the slot's own thread. The engine keeps
the whole 512-token prefill chunks of its target's KV cache that the next prompt shares (those a
fresh prefill computes alike, as the batching pool's rows do), so a conversation sent turn by turn
prefills only what follows them. Each request samples with its own settings and draws keyed by its
own seed, so its output is what it would be alone.
"""

from __future__ import annotations

import threading
import time

from pocketspec.serve.generation import GenerationOutcome, PendingGeneration, Slots

_STOP = object()


class EngineSlots(Slots):
    def __init__(self, session):
        super().__init__()
        self.session = session  # pocketspec.session.Session: owns the engine
        session.engine.reuses_whole_chunks_only = True
        self.tokenizer = session.tokenizer
        self.template = session.template
        self.max_context = session.engine.max_context
        self.num_slots = 1
        self._is_generating = False
        self._peak_memory_bytes = session.peak_memory_bytes()  # measured on the slot's thread after each request
        self._thread = threading.Thread(target=self._serve, name="pocketspec-engine", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            pending = self._incoming.get()
            if pending is _STOP:
                return
            self._is_generating = True
            try:
                if pending.future.set_running_or_notify_cancel():
                    pending.future.set_result(self._generate(pending))
            except BaseException as error:  # the request fails, the server goes on
                pending.future.set_exception(error)
            finally:
                self._is_generating = False
            self._measure_peak_memory()

    def _measure_peak_memory(self) -> None:
        """Session.peak_memory_bytes asks a row split's other ranks for theirs, which only this thread, between
        forwards, may do. A failure keeps the last figure: a rank found gone is the next request's to report, and
        nothing here may end the thread every request waits on."""
        try:
            self._peak_memory_bytes = self.session.peak_memory_bytes()
        except Exception:  # noqa: BLE001 (a metric, never worth the server)
            pass

    def _generate(self, pending: PendingGeneration) -> GenerationOutcome:
        started = time.perf_counter()
        request = pending.request
        engine = self.session.engine
        engine.use_sampling(request.sampling)

        def should_stop() -> bool:
            self._answer_those_gone()
            return self._is_closing.is_set() or pending.is_cancelled()

        if should_stop():
            return _cancelled(pending, started)
        result = engine.generate(request.prompt_tokens, request.max_new_tokens, on_tokens=pending.on_tokens,
                                 should_stop=should_stop)
        stats = result.stats
        return GenerationOutcome(
            result.tokens, "cancelled" if result.stop_reason == "interrupted" else result.stop_reason,
            len(request.prompt_tokens), stats.num_drafted, stats.num_accepted, stats.num_reused_tokens,
            time.perf_counter() - started, started - pending.submitted_at)

    def _answer_those_gone(self) -> None:
        """Take the waiting requests whose clients left out of the queue and answer them as cancelled, between the
        running one's steps, so that their places are free at once (a batching pool takes requests in as they come)."""
        with self._incoming.mutex:
            waiting = [pending for pending in self._incoming.queue if pending is not _STOP]
        gone = [pending for pending in waiting if pending.is_cancelled()]  # the clients' checks, outside the lock
        with self._incoming.mutex:  # taken out under the queue's lock: close() may be taking what waits too
            still_waiting = self._incoming.queue
            gone = [pending for pending in gone if any(pending is other for other in still_waiting)]
            kept = [pending for pending in still_waiting if not any(pending is other for other in gone)]
            still_waiting.clear()
            still_waiting.extend(kept)
        for pending in gone:
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_result(_cancelled(pending, time.perf_counter()))

    def in_use(self) -> int:
        return int(self._is_generating)

    def queued(self) -> int:
        return self._incoming.qsize()

    def peak_memory_bytes(self) -> int:
        return self._peak_memory_bytes

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Cancel what runs and what waits (the running request stops within one step), then close the engine."""
        self._is_closing.set()
        self._incoming.put(_STOP)
        self._thread.join(timeout_seconds)
        self._cancel_incoming()
        if not self._thread.is_alive():
            self.session.close()


def _cancelled(pending: PendingGeneration, started: float) -> GenerationOutcome:
    """The outcome of a request stopped before it generated anything."""
    return GenerationOutcome([], "cancelled", len(pending.request.prompt_tokens),
                             queued_seconds=started - pending.submitted_at)
