"""A BatchedModel as a step's target (pocketspec/speculation/step.py): the group's rows in one forward, then each
row verified on its own by the pure rules of pocketspec/speculation/verify.py with its own draws."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from pocketspec.batch.sequence import SequenceState
from pocketspec.drafters.base import Draft
from pocketspec.speculation.verify import Verdict, verify_logits

if TYPE_CHECKING:  # a batch on llama.cpp loads no torch
    from pocketspec.batch.batched_model import BatchedModel


class RowsTarget:
    def __init__(self, model: BatchedModel, seconds: dict[str, float], clock: Callable[[], float]):
        """seconds: the engine's time by part, to which the forwards ("target_forward") and the verdicts
        ("verification") are added."""
        self.model, self.seconds, self.clock = model, seconds, clock

    def num_cached(self, sequence: SequenceState) -> int:
        return self.model.num_cached(sequence.row)

    def verify(self, group: Sequence[SequenceState], feeds: list[list[int]], drafts: list[Draft]) -> list[Verdict]:
        started = self.clock()
        logits = self.model.forward([sequence.row for sequence in group], feeds, [len(feed) for feed in feeds])
        forwarded = self.clock()
        verdicts = [verify_logits(draft.tokens, row_logits, sequence.sampling, sequence.draws)
                    for sequence, draft, row_logits in zip(group, drafts, logits)]
        self.seconds["target_forward"] += forwarded - started
        self.seconds["verification"] += self.clock() - forwarded
        return verdicts

    def rollback(self, sequence: SequenceState, num_kept: int) -> None:
        self.model.rollback(sequence.row, num_kept)
