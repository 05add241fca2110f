"""Continuous batching: requests join free rows, step together in one verify forward, and leave when done.

Each step the scheduler picks the sequences that run; the adaptive controller picks
one drafter and one γ for them all (one controller per group size, since a forward's
cost depends on how many rows it holds; acceptance is shared). Every row is then
verified on its own by the pure rules of pocketspec/verify.py with its own generator,
and rolled back on its own. A finished sequence frees its row for the next request; a new
request takes the free row that has the longest exact prefix of its prompt cached
(BatchedModel.reusable_prefix), in the target and in the draft. Every row's n-gram drafter
also drafts from the outputs of the requests that finished before (one shared corpus).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.pool import BatchPool
from pocketspec.batch.sequence import BatchResult, Request, SequenceState
from pocketspec.controller import Choice, GammaController, pooled_acceptance
from pocketspec.draft_limits import requested_draft_limits
from pocketspec.drafters.base import Draft
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.ngram import NgramDrafter, Proposal
from pocketspec.errors import UserError
from pocketspec.sampling import choose_token
from pocketspec.settings import BatchSettings, SamplingSettings, SpeculationSettings
from pocketspec.stats import peak_rss_bytes
from pocketspec.verify import verify_logits

TIMED_PARTS = ("prefill", "draft", "target_forward", "verification", "scheduling")


class BatchEngine:
    def __init__(self, target: BatchedModel, *, is_end: Callable[[int], bool], draft: BatchModelDrafter | None = None,
                 sampling: SamplingSettings = SamplingSettings(),
                 speculation: SpeculationSettings = SpeculationSettings(), batch: BatchSettings = BatchSettings()):
        self.target, self.draft, self.is_end = target, draft, is_end
        self.sampling, self.speculation, self.batch = sampling, speculation, batch
        self.uses_ngram = speculation.drafter in ("auto", "ngram")
        self.uses_model = draft is not None and speculation.drafter in ("auto", "model")
        # every row's verify rows are planned for --max-gamma drafts (budget/batch_plan.py; a fixed --gamma raises it)
        self.limits = requested_draft_limits(speculation, drafts=self.uses_ngram or self.uses_model).within(
            speculation.max_gamma)
        self.max_batch = min(batch.max_batch, target.num_rows)
        self.corpus = OutputCorpus(speculation.ngram_min, speculation.ngram_max)  # every finished output, for all rows
        self._controllers: dict[int, GammaController] = {}
        first = self.controller_for(1)
        self.acceptance, self.match_acceptance = first.acceptance, first.match_acceptance
        self.seconds = dict.fromkeys(TIMED_PARTS, 0.0)
        self.num_steps = 0
        self.rows_per_step: list[int] = []

    def controller_for(self, group_size: int) -> GammaController:
        """The controller for forwards of `group_size` rows; all of them share one acceptance estimate."""
        if group_size not in self._controllers:
            controller = GammaController(self.limits.model, fixed_gamma=self.limits.fixed,
                                         max_draftless_gamma=self.limits.draftless)
            if self._controllers:
                controller.acceptance, controller.match_acceptance = self.acceptance, self.match_acceptance
            self._controllers[group_size] = controller
        return self._controllers[group_size]

    def admit(self, index: int, request: Request, row: int, submitted_at: float, should_stop) -> SequenceState:
        if len(request.prompt) >= self.target.max_context:
            raise UserError(f"prompt {index + 1} has {len(request.prompt)} tokens but the context holds "
                            f"{self.target.max_context}: shorten it or raise --max-context")
        ngram = NgramDrafter(self.speculation.ngram_min, self.speculation.ngram_max, self.corpus) \
            if self.uses_ngram else None
        sequence = SequenceState(index, request, row, ngram=ngram, submitted_at=submitted_at, sampling=self.sampling)
        sequence.last_step = self.num_steps
        if request.max_new_tokens <= 0:
            sequence.stop_reason = "max_tokens"
            return sequence
        started = time.perf_counter()
        num_reused = self.target.reusable_prefix(row, request.prompt)
        self.target.rollback(row, num_reused)
        logits = self.target.prefill(row, request.prompt[num_reused:], should_stop)
        sequence.stats.num_reused_tokens = num_reused
        if self.uses_model and logits is not None:
            self.draft.admit(row, request.prompt)
        sequence.stats.prefill_seconds = time.perf_counter() - started
        self.seconds["prefill"] += sequence.stats.prefill_seconds
        if logits is None:
            sequence.stop_reason = "interrupted"
        else:
            sequence.accept([choose_token(logits, sequence.sampling, sequence.rng)], self.is_end)
        return sequence

    def _proposals(self, controller: GammaController, group: Sequence[SequenceState],
                   caps: list[int]) -> list[Proposal]:
        """Each row's n-gram proposal, scored token by token from its match evidence; a walk stops where
        its rest cannot pay (pocketspec/drafters/ngram.py), so a step that drafts nothing costs lookups."""
        if not self.uses_ngram:
            return [Proposal() for _ in group]
        min_first = controller.min_first_acceptance()
        proposals = []
        for sequence, cap in zip(group, caps):
            sequence.unused.score(sequence.context, controller)
            proposals.append(sequence.ngram.propose_scored(
                sequence.context, min(cap, controller.max_draftless_gamma), controller.match_acceptance.probability,
                min_first=min_first, min_survival=controller.min_proposal_survival))
        return proposals

    def _drafts(self, choice: Choice, group: Sequence[SequenceState], proposals: list[Proposal],
                caps: list[int]) -> list[Draft]:
        if choice.drafter == "ngram":
            return [Draft(tokens=proposal.tokens[:min(choice.gamma, cap)]) for proposal, cap in zip(proposals, caps)]
        if choice.drafter != "model":
            return [Draft(tokens=[]) for _ in group]
        drafts = self.draft.propose(group, choice.gamma)
        return [Draft(draft.tokens[:cap], None if draft.probs is None else draft.probs[:cap], draft.forward_timings)
                for draft, cap in zip(drafts, caps)]

    def step(self, group: list[SequenceState]) -> None:
        """One draft + verify step for `group`, every row in one target forward."""
        step_started = time.perf_counter()
        controller = self.controller_for(len(group))
        caps = [max(0, sequence.max_gamma(self.target.max_context, self.target.num_cached(sequence.row)))
                for sequence in group]
        max_gamma = min(max(caps), controller.max_gamma)
        proposals = self._proposals(controller, group, caps)
        model_lag = None
        if self.uses_model and all(self.draft.fits(sequence, max_gamma) for sequence in group):
            model_lag = max(self.draft.lag(sequence) for sequence in group)
        choice = controller.choose(ngram_probs=pooled_acceptance([proposal.probabilities for proposal in proposals]),
                                   model_lag=model_lag, max_gamma=max_gamma)
        draft_started = time.perf_counter()
        drafts = self._drafts(choice, group, proposals, caps)
        draft_seconds = time.perf_counter() - draft_started
        for width, seconds in (drafts[0].forward_timings if choice.drafter == "model" else []):
            controller.draft_costs.observe(width, seconds)

        num_cached = [self.target.num_cached(sequence.row) for sequence in group]
        feeds = [[sequence.context[-1], *draft.tokens] for sequence, draft in zip(group, drafts)]
        forward_started = time.perf_counter()
        logits = self.target.forward([sequence.row for sequence in group], feeds, [len(feed) for feed in feeds])
        verify_started = time.perf_counter()
        num_accepted = []
        for sequence, draft, proposal, row_logits, kept in zip(group, drafts, proposals, logits, num_cached):
            verdict = verify_logits(draft.tokens, draft.probs, row_logits, sequence.sampling, sequence.rng)
            self.target.rollback(sequence.row, kept + 1 + verdict.num_accepted)
            if choice.drafter != "ngram":
                sequence.unused.hold(len(sequence.context), proposal)
            sequence.accept(verdict.emitted(draft.tokens), self.is_end)
            controller.observe_step(drafter=choice.drafter, num_drafted=len(draft), num_accepted=verdict.num_accepted,
                                    evidence=proposal.evidence if choice.drafter == "ngram" else None)
            num_accepted.append(verdict.num_accepted)
        verified = time.perf_counter()
        for sequence, draft, accepted in zip(group, drafts, num_accepted):
            sequence.record_step(self.num_steps, choice.drafter, len(draft), accepted, verified - step_started)
        self.seconds["draft"] += draft_seconds
        self.seconds["target_forward"] += verify_started - forward_started
        self.seconds["verification"] += verified - verify_started
        controller.target_costs.observe(max(map(len, feeds)), verified - forward_started)
        controller.observe_overhead(verified - step_started - (verified - forward_started) - draft_seconds)
        self.num_steps += 1
        self.rows_per_step.append(len(group))

    def best_row(self, prompt: Sequence[int], free_rows: Sequence[int]) -> int:
        """The free row whose cache holds the longest reusable prefix of `prompt`; on a tie the first
        of `free_rows` (max keeps the first; the pool lists them least recently released first)."""
        return max(free_rows, key=lambda row: self.target.reusable_prefix(row, prompt))

    def release(self, sequence: SequenceState) -> BatchResult:
        """The sequence's result; its row keeps its cache for a later prompt with the same prefix."""
        result = sequence.finish()
        self.corpus.remember(result.tokens)
        result.stats.peak_rss_bytes = peak_rss_bytes()
        return result

    def run(self, requests: Sequence[Request], *, on_finished: Callable[[BatchResult], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> list[BatchResult]:
        """Decode every request; results in input order. on_finished sees each result as its sequence ends."""
        pool = BatchPool(self)
        submitted_at = time.perf_counter()
        for index, request in enumerate(requests):
            pool.add(index, request, submitted_at)
        results: list[BatchResult] = []
        while pool.has_work:
            if should_stop is not None and should_stop():
                finished = pool.stop_all()
            else:
                finished = pool.step(should_stop)
            for result in finished:
                results.append(result)
                if on_finished is not None:
                    on_finished(result)
        return sorted(results, key=lambda result: result.index)

    @property
    def alignment_seconds(self) -> float:
        """Seconds spent aligning rows (layouts, per-row KV scatter/gather, padding) in target forwards."""
        return self.target.timer.total
