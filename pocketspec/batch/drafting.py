"""A draft model for a batch: its rows mirror the target's, and it drafts γ tokens for every row at once.

Like ModelDrafter, a row's draft cache follows the context lazily: before drafting it
keeps its longest common prefix with the context and catches up in the first pass,
which is ragged (one or two tokens per row after a step). Each row draws from its own
sequence's generator. A draft needs no batch invariance: verification keeps the output
exact whatever it proposes, so it runs the fast kernels.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.sequence import SequenceState
from pocketspec.drafters.base import Draft
from pocketspec.speculation.prefix import common_prefix_length
from pocketspec.speculation.sampling import choose_with_probs


class BatchModelDrafter:
    def __init__(self, draft: BatchedModel, clock: Callable[[], float] = time.perf_counter):
        self.draft, self.clock = draft, clock

    def admit(self, row: int, prompt: Sequence[int]) -> None:
        """Prefill a new request's prompt, keeping what the row holds of it from an earlier request."""
        num_reused = self.draft.reusable_prefix(row, prompt)
        self.draft.rollback(row, num_reused)
        self.draft.prefill(row, prompt[num_reused:])

    def _num_kept(self, sequence: SequenceState) -> int:
        cached = self.draft.cached[sequence.row]
        return min(common_prefix_length(cached, sequence.context), len(sequence.context) - 1)

    def lag(self, sequences: Sequence[SequenceState]) -> int:
        """Tokens the draft must feed before its first proposal, the most over `sequences`."""
        return max(len(sequence.context) - self._num_kept(sequence) - 1 for sequence in sequences)

    def fits(self, sequences: Sequence[SequenceState], gamma: int) -> bool:
        return all(len(sequence.context) + gamma <= self.draft.max_context for sequence in sequences)

    def num_cached(self, sequences: Sequence[SequenceState]) -> int:
        """The deepest of the sequences' draft rows (its forward timings are observed at that depth)."""
        return max(self.draft.num_cached(sequence.row) for sequence in sequences)

    def _timed_forward(self, rows, tokens, timings: list[tuple[int, float]]) -> list[np.ndarray]:
        started = self.clock()
        logits = self.draft.forward(rows, tokens, [1] * len(rows))
        timings.append((max(len(row_tokens) for row_tokens in tokens), self.clock() - started))
        return logits

    def propose(self, sequences: Sequence[SequenceState], gamma: int) -> list[Draft]:
        """γ draft tokens for each sequence, with their distributions when sampling."""
        rows = [sequence.row for sequence in sequences]
        feeds = []
        for sequence in sequences:
            num_kept = self._num_kept(sequence)
            self.draft.rollback(sequence.row, num_kept)
            feeds.append(sequence.context[num_kept:])
        timings: list[tuple[int, float]] = []
        logits = self._timed_forward(rows, feeds, timings)
        tokens: list[list[int]] = [[] for _ in sequences]
        probs: list[list[np.ndarray]] = [[] for _ in sequences]
        for index in range(gamma):
            for row_tokens, row_probs, row_logits, sequence in zip(tokens, probs, logits, sequences):
                token, token_probs = choose_with_probs(row_logits[0], sequence.sampling, sequence.rng)
                row_tokens.append(token)
                if token_probs is not None:
                    row_probs.append(token_probs)
            if index + 1 < gamma:
                logits = self._timed_forward(rows, [[row_tokens[-1]] for row_tokens in tokens], timings)
        return [Draft(tokens=row_tokens, probs=np.stack(row_probs) if row_probs else None, forward_timings=timings)
                for row_tokens, row_probs in zip(tokens, probs)]
