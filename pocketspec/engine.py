"""The speculative decoding loop: draft, verify in one target pass, accept, roll back.

The target's KV cache always holds the context except its last token (the
pending one); each step verifies [pending, *draft] and keeps what was accepted.
With no draft the same loop is plain autoregressive decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from memplanner.measured_costs import MeasuredCosts
from pocketspec.backends.exact_width import wider_exact_advice
from pocketspec.controller import Choice, GammaController
from pocketspec.costs import CostTable
from pocketspec.draft_limits import DraftLimits, requested_draft_limits
from pocketspec.drafters.base import Draft
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.model import ModelDrafter
from pocketspec.drafters.ngram import NgramDrafter, Proposal
from pocketspec.drafters.unused import UnusedProposal
from pocketspec.errors import UserError
from pocketspec.prefix import common_prefix_length
from pocketspec.sampling import choose_token
from pocketspec.settings import DRAFTERS, SamplingSettings, SpeculationSettings
from pocketspec.stats import GenerationStats, peak_rss_bytes


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
    ):
        """target_costs / draft_costs: this machine's calibrated forward costs (pocketspec/calibrate.py);
        clock: seconds for every timing the controller learns from (a replay of recorded outputs,
        benchmarks/replay_drafting.py, passes a virtual one)."""
        if speculation.drafter not in DRAFTERS:
            raise UserError(f"unknown drafter {speculation.drafter!r}: use one of {', '.join(DRAFTERS)}")
        self.target = target
        self.clock = clock
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)
        uses_ngram = speculation.drafter in ("auto", "ngram")
        uses_model = speculation.drafter in ("auto", "model") and draft_backend is not None
        self.ngram = NgramDrafter(speculation.ngram_min, speculation.ngram_max) if uses_ngram else None
        self.model = ModelDrafter(draft_backend, sampling, self.rng) if uses_model else None
        self.notes: list[str] = []
        requested = requested_draft_limits(speculation, drafts=self.ngram is not None or self.model is not None)
        self.limits = requested.within(self._widest_draft(speculation, requested))
        if requested.fixed is not None and self.limits.fixed < requested.fixed:
            why = ("with --exact-verify, only verify batches that round exactly like one-token decoding on this "
                   "backend are used" if speculation.exact_verify else
                   f"the target verifies at most {self.target.max_logits_rows} rows (the memory plan's logits rows)")
            self.notes.append(f"--gamma {requested.fixed} lowered to {self.limits.fixed}: {why}")
        self.controller = GammaController(
            self.limits.model, fixed_gamma=self.limits.fixed, max_draftless_gamma=self.limits.draftless,
            target_costs=CostTable(target_costs), draft_costs=CostTable(draft_costs))
        self._unused = UnusedProposal()  # the last n-gram proposal a step did not draft, scored later

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def reset(self, seed: int | None = None) -> None:
        """Start the next generation from empty KV caches (target and draft model), as a fresh engine
        would; `seed` restarts the random stream too. The n-gram corpus of past outputs is kept."""
        self.target.rollback(0)
        if self.model is not None:
            self.model.reset()
        if seed is not None:
            self.reseed(seed)

    def share_corpus(self, corpus: OutputCorpus) -> None:
        """Draft from (and add to) earlier outputs shared with other engines: a server's sequences."""
        if self.ngram is not None:
            self.ngram.corpus = corpus

    def allocator_peaks(self) -> dict[str, int]:
        """torch's allocator peaks by GPU on devices this process does not see itself (a row split's
        other ranks); {} on llama.cpp and the CPU."""
        return getattr(self.target, "allocator_peaks", dict)()

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
        self.target.close()

    def use_sampling(self, sampling: SamplingSettings) -> None:
        """Sample the next generations with these settings and a random stream seeded by sampling.seed
        (a server's requests each bring their own)."""
        self.sampling = sampling
        if self.model is not None:
            self.model.sampling, self.model.has_probs = sampling, not sampling.is_greedy
        self.reseed(sampling.seed)

    def reseed(self, seed: int) -> None:
        """Restart the random stream shared by sampling, verification and the draft model."""
        self.rng = np.random.default_rng(seed)
        if self.model is not None:
            self.model.rng = self.rng

    def _widest_draft(self, speculation: SpeculationSettings, requested: DraftLimits) -> int:
        """The longest draft the target can verify: its logits rows allow it, and with --exact-verify its
        verify pass (γ + 1 rows) reproduces one-token logits exactly."""
        max_width = min(requested.verify_width, self.target.max_logits_rows)
        if not speculation.exact_verify or requested.widest == 0:
            return max_width - 1
        exact_width = self.target.exact_verify_width(max_width)
        settings = getattr(self.target, "settings", None)
        advice = None if settings is None else wider_exact_advice(settings, exact_width)
        if exact_width == 1:
            self.notes.append("--exact-verify: no verify batch rounds exactly like one-token decoding on this "
                              "backend, so decoding is plain; --fast-verify drafts" + (f"; {advice}" if advice else ""))
        elif advice is not None:
            self.notes.append(f"--exact-verify: verify batches of up to {exact_width} rows round like one-token "
                              f"decoding here; {advice}")
        return exact_width - 1

    def _pick(self, logits: np.ndarray) -> int:
        return choose_token(logits, self.sampling, self.rng)

    def _prefill(self, prompt: Sequence[int], stats: GenerationStats, should_stop=None) -> int | None:
        room = self.target.max_context
        if len(prompt) >= room:
            raise UserError(
                f"the prompt has {len(prompt)} tokens but the context holds {room}: "
                "shorten the prompt or raise --max-context"
            )
        kept = min(common_prefix_length(self.target.cached_tokens, prompt), len(prompt) - 1)
        self.target.rollback(kept)
        started = self.clock()
        logits = self.target.prefill(prompt[kept:], should_stop)
        stats.prefill_seconds = self.clock() - started
        stats.num_prompt_tokens, stats.num_reused_tokens = len(prompt), kept
        if logits is None:
            return None
        if self.ngram is not None:
            self.ngram.reset()
        self._unused.clear()
        return self._pick(logits)

    def _draft(self, choice: Choice, context: list[int], proposal: Proposal) -> Draft:
        if choice.drafter == "ngram":
            return Draft(tokens=proposal.tokens[: choice.gamma])
        if choice.drafter == "model":
            draft = self.model.propose(context, choice.gamma)
            for width, seconds in draft.forward_timings:
                self.controller.draft_costs.observe(width, seconds, self.model.backend.num_cached)
            return draft
        return Draft(tokens=[])

    def _step(self, context: list[int], max_gamma: int, stats: GenerationStats) -> list[int]:
        """One draft + verify step; returns the tokens it adds to the context."""
        step_started = self.clock()
        max_gamma = min(max_gamma, self.controller.widest_gamma)
        num_cached = self.target.num_cached
        proposal = Proposal()
        controller = self.controller
        rows_beside = self.target.rows_beside
        if self.ngram is not None:
            proposal = self.ngram.propose_scored(
                context, min(max_gamma, controller.max_draftless_gamma), controller.match_acceptance.probability,
                min_first=controller.min_first_acceptance(num_cached, rows_beside),
                min_survival=controller.min_proposal_survival)
        model_lag = None
        if self.model is not None and self.model.fits(context, max_gamma):
            model_lag = self.model.lag(context)
        choice = controller.choose(ngram_probs=proposal.probabilities, model_lag=model_lag, max_gamma=max_gamma,
                                   depth=num_cached, rows_beside=rows_beside)
        if choice.drafter != "ngram":
            self._unused.hold(len(context), proposal)
        draft = self._draft(choice, context, proposal)

        rows = [context[-1], *draft.tokens]
        verify_started = self.clock()
        verdict = self.target.verify(rows, draft.probs, self.sampling, self.rng)
        verify_seconds = self.clock() - verify_started
        self.target.rollback(num_cached + 1 + verdict.num_accepted)

        shared_decode = self.target.last_round  # with other sequences: the decode's own width and time
        if shared_decode is None:
            self.controller.target_costs.observe(len(rows), verify_seconds, num_cached)
        else:
            self.controller.target_costs.observe(shared_decode.width, shared_decode.seconds, num_cached)
        self.controller.observe_step(drafter=choice.drafter, num_drafted=len(draft), num_accepted=verdict.num_accepted,
                                     evidence=proposal.evidence if choice.drafter == "ngram" else None)
        step_seconds = self.clock() - step_started
        self.controller.observe_overhead(step_seconds - verify_seconds - draft.seconds)
        stats.record_step(choice.drafter, len(draft), verdict.num_accepted, step_seconds,
                          verify_seconds + draft.seconds)
        return verdict.emitted(draft.tokens)

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
        new_tokens = [first_token] if first_token is not None else []
        if max_new_tokens > 0 and first_token is None:
            stop_reason = "interrupted"
        context = list(prompt)
        while new_tokens:
            context.extend(new_tokens)
            self._unused.score(context, self.controller)
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
            new_tokens = self._step(context, max_gamma, stats)
        if self.ngram is not None:
            self.ngram.remember(emitted)
        stats.num_tokens = len(emitted)
        stats.seconds = self.clock() - started
        stats.peak_rss_bytes = peak_rss_bytes()
        return GenerationResult(emitted, stop_reason, stats)
