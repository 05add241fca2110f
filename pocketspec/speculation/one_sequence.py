"""A single request as a step's group of one (pocketspec/speculation/step.py): its sequence, its Backend as the
step's target, and its ModelDrafter as the step's draft model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pocketspec.drafters.base import Draft
from pocketspec.drafters.model import ModelDrafter
from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.drafters.unused import UnusedProposal
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import SeededDraws
from pocketspec.speculation.verify import Verdict


@dataclass
class OneSequence:
    context: list[int]  # ends with the pending token
    ngram: NgramDrafter | None
    unused: UnusedProposal
    sampling: SamplingSettings
    num_generated: int  # the tokens this generation has emitted so far

    @property
    def draws(self) -> SeededDraws:
        """The draws for the token after the context, keyed by sampling.seed."""
        return SeededDraws.after(self.sampling.seed, self.context)


class BackendTarget:
    """A Backend (one KV cache) verifying its one sequence."""

    def __init__(self, backend):
        self.backend = backend

    def num_cached(self, sequence: OneSequence) -> int:
        return self.backend.num_cached

    def verify(self, group: Sequence[OneSequence], feeds: list[list[int]], drafts: list[Draft]) -> list[Verdict]:
        (sequence,), (feed,) = group, feeds
        return [self.backend.verify(feed, sequence.sampling, sequence.draws)]

    def rollback(self, sequence: OneSequence, num_kept: int) -> None:
        self.backend.rollback(num_kept)


class OneDraftModel:
    """ModelDrafter drafting for a group of one."""

    def __init__(self, model: ModelDrafter):
        self.model = model

    def fits(self, group: Sequence[OneSequence], max_gamma: int) -> bool:
        return self.model.fits(group[0].context, max_gamma)

    def lag(self, group: Sequence[OneSequence]) -> int:
        return self.model.lag(group[0].context)

    def propose(self, group: Sequence[OneSequence], gamma: int) -> list[Draft]:
        return [self.model.propose(group[0].context, gamma, group[0].draws)]

    def num_cached(self, group: Sequence[OneSequence]) -> int:
        return self.model.backend.num_cached
