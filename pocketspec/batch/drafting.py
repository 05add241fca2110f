"""A draft model for a batch: its rows mirror the target's, and it drafts γ tokens for every row at once.

Like ModelDrafter, each row's draft cache follows its context through a DraftWindow
(pocketspec/drafters/draft_window.py): before drafting it keeps its longest common prefix
with the context and catches up in the first pass, which is ragged (one or two tokens per
row after a step); where the draft holds a shorter context than the target's (a llama.cpp
plan's draft model, or torch's --draft self-sparse window), a row slides a window of sinks
and recent tokens, or, with --self-draft-keys attended, holds the keys the target's row attended
to most beside its recent tokens (pocketspec/drafters/attended_window.py), copied from the
target's pool. Each row draws with its own sequence's draws. A
draft needs no batch invariance: verification keeps the output exact whatever it proposes,
so it runs the fast kernels.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from pocketspec.batch.sequence import SequenceState
from pocketspec.drafters.attended_window import AttendedWindow
from pocketspec.drafters.base import Draft
from pocketspec.drafters.draft_window import DraftWindow
from pocketspec.speculation.sampling import choose_token

if TYPE_CHECKING:  # a batch on llama.cpp loads no torch
    from pocketspec.batch.batched_model import BatchedModel


class _RowCache:
    """One row of a batch's model: a DraftWindow's cache, or an AttendedWindow's draft (over the same row of
    `source`, the target's pool) and target."""

    def __init__(self, model: BatchedModel, row: int, source: BatchedModel | None = None):
        self.model, self.row, self.source = model, row, source

    @property
    def cached_tokens(self) -> list[int]:
        return self.model.cached[self.row]

    @property
    def max_context(self) -> int:
        return self.model.max_context

    def rollback(self, num_kept: int) -> None:
        self.model.rollback(self.row, num_kept)

    def shift_out(self, start: int, count: int) -> None:
        self.model.shift_out(self.row, start, count)

    def hold_attended_view(self, selection: Sequence[int], num_observed: int, recent_start: int,
                           recent_end: int) -> None:
        self.model.hold_attended_view(self.row, self.source, selection, num_observed, recent_start, recent_end)


class BatchModelDrafter:
    def __init__(self, draft: BatchedModel, clock: Callable[[], float] = time.perf_counter,
                 attended_source: BatchedModel | None = None):
        """attended_source: the target's pool, when each row's window keeps the keys it attended to most."""
        self.draft, self.clock = draft, clock
        self.keeps_attended = attended_source is not None
        self.windows = [AttendedWindow(_RowCache(draft, row, attended_source), _RowCache(attended_source, row))
                        if self.keeps_attended else DraftWindow(_RowCache(draft, row)) for row in range(draft.num_rows)]

    def admit(self, row: int, prompt: Sequence[int]) -> None:
        """Prefill a new request's prompt, keeping what the row holds of it from an earlier request; a
        prompt the draft's context cannot hold, or a row whose window had slid, prefills the window anew.
        A window of attended keys starts over; a prompt it cannot hold is left to the first proposal,
        which chooses the keys from the target's row (prefilled by then)."""
        window = self.windows[row]
        if self.keeps_attended:
            window.reset()
            if len(prompt) < self.draft.max_context:
                self.draft.prefill(row, prompt)
            return
        if window.num_dropped or len(prompt) >= self.draft.max_context:
            window.reset()
            self.draft.prefill(row, window.feed(prompt, 0))
            return
        num_reused = self.draft.reusable_prefix(row, prompt)
        self.draft.rollback(row, num_reused)
        self.draft.prefill(row, prompt[num_reused:])

    def lag(self, sequences: Sequence[SequenceState]) -> int:
        """Tokens the draft must feed before its first proposal, the most over `sequences`."""
        return max(self.windows[sequence.row].lag(sequence.context) for sequence in sequences)

    def fits(self, sequences: Sequence[SequenceState], gamma: int) -> bool:
        return all(self.windows[sequence.row].fits(sequence.context, gamma) for sequence in sequences)

    def num_cached(self, sequences: Sequence[SequenceState]) -> int:
        """The deepest of the sequences' draft rows (its forward timings are observed at that depth)."""
        return max(self.draft.num_cached(sequence.row) for sequence in sequences)

    def _timed_forward(self, rows, tokens, timings: list[tuple[int, float]]) -> list[np.ndarray]:
        started = self.clock()
        logits = self.draft.forward(rows, tokens, [1] * len(rows))
        timings.append((max(len(row_tokens) for row_tokens in tokens), self.clock() - started))
        return logits

    def propose(self, sequences: Sequence[SequenceState], gamma: int) -> list[Draft]:
        """γ draft tokens for each sequence, each its draw for that position when sampling."""
        rows = [sequence.row for sequence in sequences]
        feeds = [self.windows[sequence.row].feed(sequence.context, gamma) for sequence in sequences]
        timings: list[tuple[int, float]] = []
        logits = self._timed_forward(rows, feeds, timings)
        tokens: list[list[int]] = [[] for _ in sequences]
        for index in range(gamma):
            for row_tokens, row_logits, sequence in zip(tokens, logits, sequences):
                row_tokens.append(choose_token(row_logits[0], sequence.sampling, sequence.draws.ahead(index)))
            if index + 1 < gamma:
                logits = self._timed_forward(rows, [[row_tokens[-1]] for row_tokens in tokens], timings)
        return [Draft(tokens=row_tokens, forward_timings=timings) for row_tokens in tokens]
