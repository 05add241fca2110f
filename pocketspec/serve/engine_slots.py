"""Slots that are speculative engines: one (torch without batching), or on llama.cpp one per
sequence of a shared context, each on a thread of its own, whose forwards decode together
(pocketspec/backends/llama_sequences.py).

A request goes to the free slot whose cached tokens share the longest prefix with its prompt,
and the engine keeps that prefix of its KV caches (target and draft), so a conversation sent
turn by turn prefills only what is new. Each request samples with its own settings and a
random stream seeded by its own seed, so its output is what it would be alone (on llama.cpp
up to the rounding of a wider batch: the same bound as verifying several rows at once).
"""

from __future__ import annotations

import queue
import threading
import time

from pocketspec.speculation.prefix import common_prefix_length
from pocketspec.serve.generation import GenerationOutcome, PendingGeneration, Slots, cancel_waiting

_STOP = object()


class EngineSlots(Slots):
    def __init__(self, session):
        super().__init__()
        self.session = session  # pocketspec.session.Session: owns the engines
        self.tokenizer = session.tokenizer
        self.template = session.template
        self.max_context = session.engine.max_context
        self.num_slots = len(session.engines)
        self._rounds = session.shared_contexts.rounds if session.shared_contexts is not None else None
        self._free = set(range(self.num_slots))
        self._slot_freed = threading.Condition(self._lock)
        self._slot_queues = [queue.Queue() for _ in range(self.num_slots)]
        self._threads = [threading.Thread(target=self._serve, args=(index,), name=f"pocketspec-engine-{index}",
                                          daemon=True) for index in range(self.num_slots)]
        self._threads.append(threading.Thread(target=self._dispatch, name="pocketspec-dispatch", daemon=True))
        for thread in self._threads:
            thread.start()

    def _dispatch(self) -> None:
        """Hand each request, in the order they came, to the best free slot as soon as one is free."""
        while True:
            pending = self._incoming.get()
            if pending is _STOP:
                for slot_queue in self._slot_queues:
                    slot_queue.put(_STOP)
                return
            with self._lock:
                while not self._free:
                    self._slot_freed.wait()
                index = self._best_free_slot(pending.request.prompt_tokens)
                self._free.discard(index)
                self._num_queued -= 1
                self._num_in_use += 1
            self._slot_queues[index].put(pending)

    def _best_free_slot(self, prompt_tokens: list[int]) -> int:
        """The free slot that has the longest prefix of the prompt cached (the lowest index on a tie)."""
        return max(sorted(self._free), key=lambda index: common_prefix_length(
            self.session.engines[index].target.cached_tokens, prompt_tokens))

    def _serve(self, index: int) -> None:
        engine = self.session.engines[index]
        while True:
            pending = self._slot_queues[index].get()
            if pending is _STOP:
                return
            try:
                if pending.future.set_running_or_notify_cancel():
                    pending.future.set_result(self._generate(engine, pending))
            except BaseException as error:  # the request fails, the server goes on
                pending.future.set_exception(error)
            finally:
                with self._lock:
                    self._num_in_use -= 1
                    self._free.add(index)
                    self._slot_freed.notify()

    def _generate(self, engine, pending: PendingGeneration) -> GenerationOutcome:
        started = time.perf_counter()
        request = pending.request
        engine.use_sampling(request.sampling)

        def should_stop() -> bool:
            return self._is_closing.is_set() or pending.is_cancelled()

        if should_stop():
            return GenerationOutcome([], "cancelled", len(request.prompt_tokens),
                                     queued_seconds=started - pending.submitted_at)
        if self._rounds is not None:
            self._rounds.join()
        try:
            result = engine.generate(request.prompt_tokens, request.max_new_tokens, on_tokens=pending.on_tokens,
                                     should_stop=should_stop)
        finally:
            if self._rounds is not None:
                self._rounds.leave()
        stats = result.stats
        return GenerationOutcome(
            result.tokens, "cancelled" if result.stop_reason == "interrupted" else result.stop_reason,
            len(request.prompt_tokens), stats.num_drafted, stats.num_accepted, stats.num_reused_tokens,
            time.perf_counter() - started, started - pending.submitted_at)

    def close(self, timeout_seconds: float = 30.0) -> None:
        """Cancel what runs and what waits (each stops within one step), then close the engines."""
        self._is_closing.set()
        self._incoming.put(_STOP)
        deadline = time.monotonic() + timeout_seconds
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._cancel_incoming()
        for slot_queue in self._slot_queues:
            cancel_waiting(slot_queue)
        if not any(thread.is_alive() for thread in self._threads):
            self.session.close()

