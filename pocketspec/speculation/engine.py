"""The speculative decoding loop: draft, verify in one target pass, accept, roll back.

The target's KV cache always holds the context except its last token (the
pending one); each step verifies [pending, *draft] and keeps what was accepted.
With no draft the same loop is plain autoregressive decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from memplanner.measured_costs import MeasuredCosts
from pocketspec.speculation.controller import GammaController
from pocketspec.speculation.costs import CostTable
from pocketspec.speculation.draft_limits import requested_draft_limits, widest_verified_draft
from pocketspec.drafters.model import ModelDrafter
from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.drafters.unused import UnusedProposal
from pocketspec.errors import UserError
from pocketspec.speculation.one_sequence import BackendTarget, OneDraftModel, OneSequence
from pocketspec.speculation.prefix import common_prefix_length, exact_after_prefill, reusable_whole_chunks
from pocketspec.speculation.draws import SeededDraws
from pocketspec.speculation.sampling import choose_token
from pocketspec.settings import DRAFTERS, SamplingSettings, SpeculationSettings
from pocketspec.stats import GenerationStats, peak_rss_bytes
from pocketspec.speculation.step import run_step


@dataclass
class GenerationResult:
    tokens: list[int]
    stop_reason: str  # end_of_generation | max_tokens | context_full | interrupted
    stats: GenerationStats


class SpeculativeEngine:
    def __init__(
        self,
        target,
        *,
        draft_backend=None,
        sampling: SamplingSettings = SamplingSettings(),
        speculation: SpeculationSettings = SpeculationSettings(),
        target_costs: MeasuredCosts | None = None,
        draft_costs: MeasuredCosts | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_measure: Callable[[str], None] | None = None,
    ):
        """target_costs / draft_costs: this machine's calibrated forward costs (pocketspec/calibrate.py);
        clock: seconds for every timing the controller learns from (a replay of recorded outputs,
        benchmarks/replay_drafting.py, passes a virtual one); on_measure(line): told before a first-time
        --exact-verify probe."""
        if speculation.drafter not in DRAFTERS:
            raise UserError(f"unknown drafter {speculation.drafter!r}: use one of {', '.join(DRAFTERS)}")
        self.target = target
        self.clock = clock
        self.sampling = sampling
        uses_ngram = speculation.drafter in ("auto", "ngram")
        uses_model = speculation.drafter in ("auto", "model") and draft_backend is not None
        self.ngram = NgramDrafter(speculation.ngram_min, speculation.ngram_max) if uses_ngram else None
        self.model = ModelDrafter(draft_backend, sampling) if uses_model else None
        self.notes: list[str] = []
        self.is_exact_verify = bool(speculation.exact_verify)  # verify batches capped at the probed exact width
        requested = requested_draft_limits(speculation, drafts=self.drafts)
        self.limits = requested.within(widest_verified_draft(self.target, speculation, requested, self.notes,
                                                             on_measure))
        if requested.fixed is not None and self.limits.fixed < requested.fixed:
            why = ("with --exact-verify, only verify batches that round exactly like one-token decoding on this "
                   "backend are used" if speculation.exact_verify else
                   f"the target verifies at most {self.target.max_logits_rows} rows (the memory plan's logits rows)")
            self.notes.append(f"--gamma {requested.fixed} lowered to {self.limits.fixed}: {why}")
        self.controller = GammaController(
            self.limits.model, fixed_gamma=self.limits.fixed, max_draftless_gamma=self.limits.draftless,
            target_costs=CostTable(target_costs), draft_costs=CostTable(draft_costs))
        self._unused = UnusedProposal()  # the last n-gram proposal a step did not draft, scored later
        self._step_target = BackendTarget(target)
        self._step_drafter = None if self.model is None else OneDraftModel(self.model)
        # a server's (EngineSlots): a prompt reuses only whole prefill chunks of an earlier one, those a fresh
        # prefill computes alike, so that a request computes what it would alone; else any shared prefix
        self.reuses_whole_chunks_only = False
        self._num_exact = 0  # leading cached target tokens prefilled in whole n_batch chunks from position 0

    @property
    def drafts(self) -> bool:
        """Whether anything drafts (n-grams or a draft model): with --draft none, every step is plain decoding."""
        return self.ngram is not None or self.model is not None

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def reset(self, seed: int | None = None) -> None:
        """Start the next generation from empty KV caches (target and draft model), as a fresh engine
        would; `seed` keys the draws from then on (sampling.seed). The n-gram corpus of past outputs is kept."""
        self.target.rollback(0)
        if self.model is not None:
            self.model.reset()
        if seed is not None:
            self.reseed(seed)

    def warm_up(self, prompt: Sequence[int], num_tokens: int) -> None:
        """Decode num_tokens greedy tokens after `prompt` on the target and the draft model alone, then drop
        them: the first timed generation finds the weights, caches and buffers touched (no page faults),
        and the engine as a fresh one has it: the controller's costs and acceptance, the n-gram corpus and
        the draws learn nothing from the warm-up (a benchmark's first prompt decides as a user's
        first request does)."""
        if num_tokens <= 0 or not prompt:
            return
        # no more than fits with the warm-up's tokens: a prompt too long for the context is generate's to refuse
        prompt = list(prompt)[:max(self.target.max_context - num_tokens, 1)]
        greedy, draws = SamplingSettings(), SeededDraws(0)
        self.target.rollback(0)
        token = int(np.argmax(self.target.prefill(prompt)))
        for _ in range(num_tokens - 1):
            token = self.target.verify([token], greedy, draws).next_token
        if self.model is not None:  # while the target holds the prompt: a self-draft's window copies from it
            ModelDrafter(self.model.backend, greedy).propose(prompt, num_tokens, draws)
            self.model.reset()
        self.target.rollback(0)

    def allocator_peaks(self) -> dict[str, int]:
        """torch's allocator peaks by GPU on devices this process does not see itself (a row split's
        other ranks); {} on llama.cpp and the CPU."""
        return getattr(self.target, "allocator_peaks", dict)()

    def followers_peak_rss_bytes(self) -> int:
        """The peak resident memory of the processes beside this one that run the target (a row split's other
        ranks, on cpu:N), summed; 0 where there are none."""
        return getattr(self.target, "followers_peak_rss_bytes", int)()

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
        self.target.close()

    def use_sampling(self, sampling: SamplingSettings) -> None:
        """Sample the next generations with these settings and draws keyed by sampling.seed (a server's
        requests each bring their own)."""
        self.sampling = sampling
        if self.model is not None:
            self.model.sampling = sampling

    def reseed(self, seed: int) -> None:
        """Key the draws shared by sampling, verification and the draft model by `seed`."""
        self.use_sampling(replace(self.sampling, seed=seed))

    def _prefill(self, prompt: Sequence[int], stats: GenerationStats, should_stop=None) -> int | None:
        room = self.target.max_context
        if len(prompt) >= room:
            raise UserError(
                f"the prompt has {len(prompt)} tokens but the context holds {room}: "
                "shorten the prompt or raise --max-context"
            )
        cached, n_batch = self.target.cached_tokens, self.target.n_batch
        if self.reuses_whole_chunks_only:
            kept = reusable_whole_chunks(cached, self._num_exact, prompt, n_batch)
        else:
            kept = min(common_prefix_length(cached, prompt), len(prompt) - 1)
        self.target.rollback(kept)
        started = self.clock()
        logits = self.target.prefill(prompt[kept:], should_stop)
        stats.prefill_seconds = self.clock() - started
        self._num_exact = exact_after_prefill(self._num_exact, kept, len(prompt) - kept, n_batch)
        stats.num_prompt_tokens, stats.num_reused_tokens = len(prompt), kept
        if logits is None:
            return None
        self._unused.clear()
        return choose_token(logits, self.sampling, SeededDraws.after(self.sampling.seed, prompt))

    def _keep_what_plain_decoding_keeps(self, num_tokens: int) -> None:
        """Roll the target's cache back to the num_tokens plain decoding holds after the same generation: the
        prompt and every token it fed, which are all it emitted but the last (or, where the end token came, all
        of them: an end token is never fed). A verify that accepted drafts past the end (the end token, what
        followed it) or past max tokens cached more, and a chat's next prompt, which begins with the reply and
        its end token, would reuse those and prefill its rest from a later start: past --exact-verify's width
        stock kernels round a chunk by where it starts, so the next reply could part from plain decoding's."""
        if self.target.num_cached > num_tokens:
            self.target.rollback(num_tokens)
            self._num_exact = min(self._num_exact, num_tokens)

    def _step(self, context: list[int], max_gamma: int, stats: GenerationStats, num_generated: int) -> list[int]:
        """One draft + verify step (pocketspec/speculation/step.py, as a group of one); the tokens it adds to
        the context."""
        sequence = OneSequence(context, self.ngram, self._unused, self.sampling, num_generated)
        step = run_step([sequence], [max_gamma], controller=self.controller, target=self._step_target,
                        drafter=self._step_drafter, clock=self.clock)
        (draft,), (num_accepted,) = step.drafts, step.num_accepted
        stats.record_step(step.choice.drafter, len(draft), num_accepted, step.seconds,
                          step.verify_seconds + draft.seconds)
        return step.emitted[0]

    def generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        on_tokens: Callable[[list[int]], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> GenerationResult:
        """Continue `prompt`, reusing the target KV cache for its longest cached prefix."""
        stats = GenerationStats()
        started = self.clock()
        emitted: list[int] = []
        stop_reason = "max_tokens"
        is_end = self.target.tokenizer.is_end_of_generation
        first_token = self._prefill(list(prompt), stats, should_stop) if max_new_tokens > 0 else None
        if self.ngram is not None and first_token is not None and max_new_tokens > 1:
            self.ngram.begin(prompt)  # indexes the prompt, as a step will follow
        new_tokens = [first_token] if first_token is not None else []
        if max_new_tokens > 0 and first_token is None:
            stop_reason = "interrupted"
        context = list(prompt)
        while new_tokens:
            context.extend(new_tokens)
            num_before = len(emitted)
            for token in new_tokens:
                if is_end(token):
                    stop_reason = "end_of_generation"
                    break
                emitted.append(token)
                if len(emitted) >= max_new_tokens:
                    break
            if on_tokens is not None and len(emitted) > num_before:
                on_tokens(emitted[num_before:])
            if stop_reason != "max_tokens" or len(emitted) >= max_new_tokens:
                break
            if should_stop is not None and should_stop():
                stop_reason = "interrupted"
                break
            room = self.target.max_context - self.target.num_cached - 1
            if room < 0:
                stop_reason = "context_full"
                break
            max_gamma = min(max_new_tokens - len(emitted) - 1, room)
            new_tokens = self._step(context, max_gamma, stats, len(emitted))
        if first_token is not None:
            self._keep_what_plain_decoding_keeps(len(prompt) + len(emitted) - (stop_reason != "end_of_generation"))
        if self.ngram is not None:
            self.ngram.remember(emitted)
        stats.num_tokens = len(emitted)
        stats.is_ended_by_end_token = stop_reason == "end_of_generation"
        stats.seconds = self.clock() - started
        stats.peak_rss_bytes = peak_rss_bytes()
        return GenerationResult(emitted, stop_reason, stats)
