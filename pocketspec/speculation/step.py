"""One draft + verify step for a group of sequences; a single request is a group of one.

Both engines run their steps here: SpeculativeEngine (pocketspec/speculation/engine.py, one sequence on a
Backend) and BatchEngine (pocketspec/batch/engine.py, several rows of a BatchedModel in one
forward). A step, for every sequence of the group:

1. scores the n-gram proposal an earlier step did not draft, and proposes again, token by token
   from its match evidence;
2. asks the controller for one drafter and one γ for the whole group, from the pooled proposals,
   the draft model's lag and the cost of the group's verify at its cached depth;
3. drafts (the n-gram proposal's first γ tokens, or γ draft-model tokens), within each
   sequence's own room;
4. verifies [pending, *draft] of every sequence in one target forward, and rolls each back to
   what it accepted;
5. tells the controller the forward's cost (at the group's depth), each sequence's acceptance
   and the host's own overhead.

Where the engines differ, they differ behind StepTarget and StepDrafter: how a forward is run
and verified, and how a draft model follows its sequences. Every time is read from one clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol, Sequence

from pocketspec.speculation.controller import Choice, GammaController, pooled_acceptance
from pocketspec.drafters.base import Draft
from pocketspec.drafters.ngram import NgramDrafter, Proposal
from pocketspec.drafters.unused import UnusedProposal
from pocketspec.speculation.verify import Verdict


class StepSequence(Protocol):
    """What a step reads and updates of one sequence."""

    context: list[int]  # ends with the pending token, not yet in the target's cache
    num_generated: int  # the tokens this generation has emitted so far
    ngram: NgramDrafter | None
    unused: UnusedProposal


class StepTarget(Protocol):
    """The target as a step uses it: cached depths, one verify forward for the group, rollback."""

    def num_cached(self, sequence) -> int: ...

    def verify(self, group: Sequence, feeds: list[list[int]], drafts: list[Draft]) -> list[Verdict]:
        """Append feeds[i] = [pending, *draft] to sequence i's cache in one forward; the verdict on each."""

    def rollback(self, sequence, num_kept: int) -> None: ...


class StepDrafter(Protocol):
    """A draft model following the group's sequences."""

    def fits(self, group: Sequence, max_gamma: int) -> bool: ...

    def lag(self, group: Sequence) -> int:
        """Tokens the draft model must feed before its first proposal (the most over the group)."""

    def propose(self, group: Sequence, gamma: int) -> list[Draft]: ...

    def num_cached(self, group: Sequence) -> int:
        """The draft's cached depth, at which its forward timings are observed."""


@dataclass
class StepResult:
    choice: Choice
    drafts: list[Draft]
    num_accepted: list[int]
    emitted: list[list[int]]  # each sequence's new tokens: its accepted draft and the target's own next token
    seconds: float  # the whole step
    draft_seconds: float
    verify_seconds: float  # the target's forward, with the verdicts


def _proposals(group: Sequence[StepSequence], caps: Sequence[int], controller: GammaController,
               depth: int) -> list[Proposal]:
    """Each sequence's n-gram proposal; a walk stops where its rest cannot pay (pocketspec/drafters/ngram.py),
    so a step that drafts nothing costs lookups only."""
    for sequence in group:
        sequence.unused.score(sequence.context, controller)
    if all(sequence.ngram is None for sequence in group):
        return [Proposal() for _ in group]
    first_pays = partial(controller.first_token_pays, depth=depth)
    return [Proposal() if sequence.ngram is None else sequence.ngram.propose_scored(
        sequence.context, min(cap, controller.max_draftless_gamma), controller.match_acceptance.probability,
        first_pays=first_pays, min_survival=controller.min_proposal_survival) for sequence, cap in zip(group, caps)]


def _drafts(choice: Choice, group: Sequence, proposals: list[Proposal], caps: Sequence[int],
            drafter: StepDrafter | None) -> list[Draft]:
    if choice.drafter == "ngram":
        return [Draft(tokens=proposal.tokens[:min(choice.gamma, cap)]) for proposal, cap in zip(proposals, caps)]
    if choice.drafter != "model":
        return [Draft(tokens=[]) for _ in group]
    drafts = drafter.propose(group, choice.gamma)
    return [Draft(draft.tokens[:cap], draft.forward_timings)
            for draft, cap in zip(drafts, caps)]


def run_step(group: Sequence[StepSequence], caps: Sequence[int], *, controller: GammaController,
             target: StepTarget, drafter: StepDrafter | None = None,
             clock: Callable[[], float]) -> StepResult:
    """One step for `group`; caps[i]: the most draft tokens sequence i can use now (its remaining
    tokens and its cache room)."""
    started = clock()
    max_gamma = min(max(caps), controller.widest_gamma)
    num_cached = [target.num_cached(sequence) for sequence in group]
    depth = max(num_cached)
    proposals = _proposals(group, caps, controller, depth)
    model_lag = drafter.lag(group) if drafter is not None and drafter.fits(group, max_gamma) else None
    choice = controller.choose(ngram_probs=pooled_acceptance([proposal.probabilities for proposal in proposals]),
                               model_lag=model_lag, max_gamma=max_gamma, depth=depth, remaining_tokens=max(caps) + 1,
                               generated_tokens=max(sequence.num_generated for sequence in group))
    if choice.drafter != "ngram":
        for sequence, proposal in zip(group, proposals):
            sequence.unused.hold(len(sequence.context), proposal)

    draft_started = clock()
    drafts = _drafts(choice, group, proposals, caps, drafter)
    draft_seconds = clock() - draft_started
    if choice.drafter == "model":  # one set of draft passes for the whole group
        draft_depth = drafter.num_cached(group)
        for width, seconds in drafts[0].forward_timings:
            controller.draft_costs.observe(width, seconds, draft_depth)

    feeds = [[sequence.context[-1], *draft.tokens] for sequence, draft in zip(group, drafts)]
    verify_started = clock()
    verdicts = target.verify(group, feeds, drafts)
    verify_seconds = clock() - verify_started
    for sequence, verdict, kept in zip(group, verdicts, num_cached):
        target.rollback(sequence, kept + 1 + verdict.num_accepted)

    controller.target_costs.observe(max(map(len, feeds)), verify_seconds, depth)
    for draft, proposal, verdict in zip(drafts, proposals, verdicts):
        controller.observe_step(drafter=choice.drafter, num_drafted=len(draft), num_accepted=verdict.num_accepted,
                                evidence=proposal.evidence if choice.drafter == "ngram" else None)
    seconds = clock() - started
    controller.observe_overhead(seconds - verify_seconds - draft_seconds)
    return StepResult(choice, drafts, [verdict.num_accepted for verdict in verdicts],
                      [verdict.emitted(draft.tokens) for verdict, draft in zip(verdicts, drafts)],
                      seconds, draft_seconds, verify_seconds)
