"""Continuous batching: requests join free rows, step together in one verify forward, and leave when done.

Each step the scheduler picks the sequences that run; the adaptive controller picks
one drafter and one γ for them all (one controller per group size, since a forward's
cost depends on how many rows it holds; acceptance is shared). Every row is then
verified on its own by the pure rules of pocketspec/speculation/verify.py with its own draws,
and rolled back on its own. A finished sequence frees its row for the next request; a new
request takes the free row that has the longest exact prefix of its prompt cached
(BatchedModel.reusable_prefix), in the target and in the draft. Every row's n-gram drafter
also drafts from the outputs of the requests that finished before (one shared corpus).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from memplanner.batch_step_costs import StepCosts
from memplanner.measured_costs import MeasuredCosts
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.pool import BatchPool
from pocketspec.batch.sequence import BatchResult, Request, SequenceState
from pocketspec.batch.rows_target import RowsTarget
from pocketspec.speculation.controller import GammaController
from pocketspec.speculation.costs import CostTable
from pocketspec.speculation.draft_limits import requested_draft_limits
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.errors import UserError
from pocketspec.speculation.sampling import choose_token
from pocketspec.settings import BatchSettings, SamplingSettings, SpeculationSettings
from pocketspec.stats import peak_rss_bytes
from pocketspec.speculation.step import run_step

if TYPE_CHECKING:  # a batch on llama.cpp loads no torch
    from pocketspec.batch.batched_model import BatchedModel

TIMED_PARTS = ("prefill", "draft", "target_forward", "verification", "scheduling")


class BatchEngine:
    def __init__(self, target: BatchedModel, *, is_end: Callable[[int], bool], draft: BatchModelDrafter | None = None,
                 sampling: SamplingSettings = SamplingSettings(),
                 speculation: SpeculationSettings = SpeculationSettings(), batch: BatchSettings = BatchSettings(),
                 target_costs: MeasuredCosts | StepCosts | None = None,
                 draft_costs: MeasuredCosts | StepCosts | None = None,
                 widest_draft: int | None = None, clock: Callable[[], float] = time.perf_counter):
        """target_costs / draft_costs: what a forward of a group of rows costs, by its for_rows: this
        machine's calibrated forward costs of one sequence (llama.cpp, pocketspec/calibrate.py), read as
        decodes of all the rows' tokens in passes of at most its max_pass_tokens, or a torch batch's StepCosts (memplanner/batch_step_costs.py), where
        each row also reads its own cached keys and values;
        widest_draft: a further cap on every draft (--exact-verify's probed width, widest_verified_draft);
        clock: seconds for every timing the controllers learn from and the engine reports."""
        self.target, self.draft, self.is_end, self.clock = target, draft, is_end, clock
        self.sampling, self.speculation, self.batch = sampling, speculation, batch
        self.uses_ngram = speculation.drafter in ("auto", "ngram")
        self.uses_model = draft is not None and speculation.drafter in ("auto", "model")
        # every draft within what a forward of the target returns per row (the logits rows a plan sized)
        widest = target.max_logits_rows - 1 if widest_draft is None else min(target.max_logits_rows - 1, widest_draft)
        self.limits = requested_draft_limits(speculation, drafts=self.uses_ngram or self.uses_model).within(widest)
        self.target_costs, self.draft_costs = target_costs, draft_costs
        self.max_batch = min(batch.max_batch, target.num_rows)
        self.corpus = OutputCorpus(speculation.ngram_min, speculation.ngram_max)  # every finished output, for all rows
        self._controllers: dict[int, GammaController] = {}
        first = self.controller_for(1)
        self.acceptance, self.match_acceptance = first.acceptance, first.match_acceptance
        self.seconds = dict.fromkeys(TIMED_PARTS, 0.0)
        self._step_target = RowsTarget(target, self.seconds, clock)
        self.num_steps = 0
        self.rows_per_step: list[int] = []

    def controller_for(self, group_size: int) -> GammaController:
        """The controller for forwards of `group_size` rows; all of them share one acceptance estimate."""
        if group_size not in self._controllers:
            controller = GammaController(
                self.limits.model, fixed_gamma=self.limits.fixed, max_draftless_gamma=self.limits.draftless,
                target_costs=CostTable(self.target_costs and self.target_costs.for_rows(group_size)),
                draft_costs=CostTable(self.draft_costs and self.draft_costs.for_rows(group_size)))
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
        started = self.clock()
        num_reused = self.target.reusable_prefix(row, request.prompt)
        self.target.rollback(row, num_reused)
        logits = self.target.prefill(row, request.prompt[num_reused:], should_stop)
        sequence.stats.num_reused_tokens = num_reused
        if self.uses_model and logits is not None:
            self.draft.admit(row, request.prompt)
        sequence.stats.prefill_seconds = self.clock() - started
        self.seconds["prefill"] += sequence.stats.prefill_seconds
        if logits is None:
            sequence.stop_reason = "interrupted"
        else:
            sequence.accept([choose_token(logits, sequence.sampling, sequence.draws)], self.is_end)
        return sequence

    def step(self, group: list[SequenceState]) -> None:
        """One draft + verify step for `group` (pocketspec/speculation/step.py), every row in one target forward."""
        caps = [max(0, sequence.max_gamma(self.target.max_context, self.target.num_cached(sequence.row)))
                for sequence in group]
        step = run_step(group, caps, controller=self.controller_for(len(group)), target=self._step_target,
                        drafter=self.draft if self.uses_model else None, clock=self.clock)
        for sequence, draft, num_accepted, emitted in zip(group, step.drafts, step.num_accepted, step.emitted):
            sequence.accept(emitted, self.is_end)
            sequence.record_step(self.num_steps, step.choice.drafter, len(draft), num_accepted, step.seconds)
        self.seconds["draft"] += step.draft_seconds
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
                finished = pool.step(None if should_stop is None else lambda index: should_stop())
            for result in finished:
                results.append(result)
                if on_finished is not None:
                    on_finished(result)
        return sorted(results, key=lambda result: result.index)

    @property
    def alignment_seconds(self) -> float:
        """Seconds spent aligning rows (layouts, per-row KV scatter/gather, padding) in target forwards."""
        return self.target.timer.total
