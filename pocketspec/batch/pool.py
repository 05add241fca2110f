"""The continuous-batching loop one step at a time, so that requests can join while others run
(a server) as well as all at once (`generate --batch`): waiting requests take free rows, the
scheduler picks who steps together, finished sequences leave and free their rows.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import Callable

from pocketspec.batch.scheduler import Candidate, pick
from pocketspec.batch.sequence import BatchResult, Request, SequenceState


class BatchPool:
    def __init__(self, engine):
        self.engine = engine  # pocketspec.batch.engine.BatchEngine
        self.waiting: deque[tuple[int, Request, float]] = deque()  # (index, request, submitted at)
        self.free_rows = list(range(engine.target.num_rows))
        self.active: dict[int, SequenceState] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    @property
    def num_rows_in_use(self) -> int:
        """Rows taken: the running sequences', and from the start of its prefill the one being admitted."""
        return self.engine.target.num_rows - len(self.free_rows)

    def add(self, index: int, request: Request, submitted_at: float | None = None) -> None:
        self.waiting.append((index, request, time.perf_counter() if submitted_at is None else submitted_at))

    def step(self, should_stop: Callable[[int], bool] | None = None) -> list[BatchResult]:
        """Admit what fits, run one draft + verify step for the scheduler's group; the results that ended.
        should_stop(index), asked between the chunks of a prompt's prefill, ends that request there; asked before
        a waiting request's prefill starts, it ends the admissions of this step (the request stays waiting for
        stop or stop_all: a server shutting down prefilled every queued prompt first, past its grace period)."""
        finished = []
        while self.waiting and self.free_rows:
            if should_stop is not None and should_stop(self.waiting[0][0]):
                break
            index, request, submitted_at = self.waiting.popleft()
            row = self.engine.best_row(request.prompt, self.free_rows)
            self.free_rows.remove(row)
            stops_prefill = None if should_stop is None else functools.partial(should_stop, index)
            try:
                sequence = self.engine.admit(index, request, row, submitted_at, stops_prefill)
            except BaseException:  # a prefill that failed gives its row back: it would stay taken for good
                self.free_rows.append(row)
                raise
            self.active[index] = sequence
            if sequence.is_finished:
                finished.append(self._finish(sequence))
        if not self.active:
            return finished
        group = self._pick_group()
        self.engine.step(group)
        for sequence in group:
            if not sequence.is_finished and sequence.max_gamma(self.engine.target.max_context,
                                                               self.engine.target.num_cached(sequence.row)) < 0:
                sequence.stop_reason = "context_full"
            if sequence.is_finished:
                finished.append(self._finish(sequence))
        return finished

    def stop(self, index: int, stop_reason: str = "interrupted") -> BatchResult | None:
        """End one request now, running or waiting (a client gone); None when it is not here."""
        if index in self.active:
            sequence = self.active[index]
            sequence.stop_reason = sequence.stop_reason or stop_reason
            return self._finish(sequence)
        for waiting in list(self.waiting):
            if waiting[0] == index:
                self.waiting.remove(waiting)
                return self._never_admitted(*waiting, stop_reason)
        return None

    def stop_all(self, stop_reason: str = "interrupted") -> list[BatchResult]:
        """End everything: the running sequences in input order, then those never admitted."""
        results = [self.stop(index, stop_reason) for index in sorted(self.active)]
        results += [self._never_admitted(*waiting, stop_reason) for waiting in self.waiting]
        self.waiting.clear()
        return results

    def _pick_group(self) -> list[SequenceState]:
        started = time.perf_counter()
        candidates = [Candidate(index, len(sequence.context), sequence.last_step)
                      for index, sequence in self.active.items()]
        chosen = pick(candidates, max_batch=self.engine.max_batch, policy=self.engine.batch.scheduler,
                      step=self.engine.num_steps, length_bucket=self.engine.target.decode_shape.key_block)
        self.engine.seconds["scheduling"] += time.perf_counter() - started
        return sorted((self.active[index] for index in chosen), key=lambda sequence: sequence.row)

    def _finish(self, sequence: SequenceState) -> BatchResult:
        self.free_rows.append(sequence.row)
        self.active.pop(sequence.index, None)
        return self.engine.release(sequence)

    @staticmethod
    def _never_admitted(index: int, request: Request, submitted_at: float, stop_reason: str) -> BatchResult:
        sequence = SequenceState(index, request, -1, ngram=None, submitted_at=submitted_at)
        sequence.stop_reason = stop_reason
        return sequence.finish()
