"""Adaptive draft length: before each step, choose the drafter and γ with the most expected tokens per second.

A draft model's tokens are accepted with one per-token rate α, so a step of γ drafted tokens
yields (1 − α^(γ+1)) / (1 − α) tokens. A draftless proposal is scored token by token from its
match evidence (pocketspec/drafters/ngram.py): with p_i the probability that token i is
accepted, a step verifying its first γ tokens yields 1 + Σ_{i≤γ} Π_{j≤i} p_j. Costs are this
machine's calibrated forward costs at the current depth (pocketspec/speculation/costs.py), so a width on a
flat step of the cost curve loses to the widest width of that step. γ = 0 (plain decoding) is
always an option, so speculation never makes generation meaningfully slower. A batch's group of
rows verified in one decode has a controller of its own, whose costs are that decode's
(pocketspec/batch/engine.py): every row's rejected draft is time taken from the other rows.
"""

from __future__ import annotations

import bisect
from operator import itemgetter
from typing import NamedTuple, Sequence

from memplanner.acceptance import expected_tokens_per_step
from memplanner.defaults import ACCEPTANCE_PRIORS, MAX_GAMMA
from pocketspec.speculation.costs import CostTable
from pocketspec.drafters.ngram import MatchEvidence

# A proposed token reached with a smaller chance than this adds too little to be worth walking to
MIN_PROPOSAL_SURVIVAL = 0.05
# A draft model's cache follows the context lazily (pocketspec/drafters/draft_window.py): after a prompt,
# or after steps another drafter took, it first catches up in one pass. That pass serves every model step
# after it, so a step prices it spread over the tokens still to come, at most this many (a reply may end
# sooner, and another drafter may take over again). Priced whole into one step, a prompt's catch-up made
# the draft model lose every step, and each step's lag grew by the tokens it emitted: it was never used.
CATCH_UP_HORIZON_TOKENS = 128
# A probe of the draft model (an estimate it has not refreshed lately) pays its catch-up whole, in one step, for
# what it may teach: at most this many of the target's one-token passes. Past that it waits for a step that
# chooses the model on its price. On a 2-core Xeon a probe 32 steps into a 56-token second turn caught a 0.5B draft
# up on the whole conversation in one 1.7 s step, a third of the reply's time, and drafted once.
PROBE_MAX_CATCH_UP_PASSES = 4
# What a model step leaves the next one to feed: the pending token, after the last drafted one when every
# drafted token was accepted
STEADY_MODEL_LAG = 1


def catch_up_horizon(remaining_tokens: int | None, generated_tokens: int | None) -> int:
    """The tokens a draft model's catch-up is spread over: those still to come, as far as they can be
    counted on (None: not known).

    How long a reply is can only be guessed from how long it has run: so the horizon is at most the tokens
    emitted so far, and a catch-up is bought by ski rental's deterministic rule (in the textbook problem it never
    pays more than twice what knowing the reply's length would): once the reply has paid its price in what the
    draft model would have saved over the best other choice. On a 2-core Xeon, Spec-Bench's second turns and
    extractions (answers of 13-56 tokens after prompts of 130-250) ran at 0.45-0.8x plain decoding: their model
    steps, the first catching a 0.5B draft up on the whole prompt, averaged 200-590 ms against plain's 66-77 ms,
    the catch-up priced over 128 tokens that never came. Priced over the tokens emitted so far plus 16,
    translation's 16-token answer still bought its 0.27 s catch-up at the start and ran at 0.81x plain decoding
    (n-grams alone: 1.04x in the same run); priced over those emitted, 1.09x (n-grams alone: 1.06x).
    """
    horizon = CATCH_UP_HORIZON_TOKENS
    if remaining_tokens is not None:
        horizon = min(horizon, remaining_tokens)
    if generated_tokens is not None:
        horizon = min(horizon, generated_tokens)
    return max(horizon, 1)


def expected_tokens_by_gamma(probabilities: Sequence[float]) -> list[float]:
    """[E(0), E(1), ...]: tokens a step yields when it verifies the first γ tokens of a proposal."""
    expected, survive = [1.0], 1.0
    for probability in probabilities:
        survive *= probability
        expected.append(expected[-1] + survive)
    return expected


def pooled_acceptance(probability_lists: Sequence[Sequence[float]]) -> list[float]:
    """Per-token acceptance of a group's proposals verified together with one γ: the chances whose
    expected_tokens_by_gamma is the rows' mean. A row's tokens past its proposal survive with 0."""
    num_rows = len(probability_lists)
    if num_rows <= 1:  # one row's own chances (the pooled ones would equal them up to rounding)
        return list(probability_lists[0]) if num_rows else []
    totals: list[float] = []  # totals[i]: over the rows, the chance that token i + 1 is accepted with all before it
    for probabilities in probability_lists:
        survival = 1.0
        for index, probability in enumerate(probabilities):
            survival *= probability
            if index == len(totals):
                totals.append(0.0)
            totals[index] += survival
    pooled, previous = [], 1.0
    for total in totals:
        survival = total / num_rows
        if previous <= 0.0:
            break
        pooled.append(survival / previous)
        previous = survival
    return pooled


class AcceptanceEstimate:
    """Per-token acceptance rate: decayed counts of accepted vs tried draft tokens, plus a prior."""

    def __init__(self, prior_rate: float, prior_weight: float = 4.0, decay: float = 0.97):
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        self.decay = decay
        self.num_accepted = 0.0
        self.num_tried = 0.0

    def observe(self, num_accepted: int, num_drafted: int) -> None:
        # Drafted tokens after the first rejection were never tested.
        num_tried = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.num_accepted = self.decay * self.num_accepted + num_accepted
        self.num_tried = self.decay * self.num_tried + num_tried

    @property
    def rate(self) -> float:
        weight = self.prior_weight
        return (self.num_accepted + weight * self.prior_rate) / (self.num_tried + weight)


LENGTH_EDGES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)  # lower edges of the match-length buckets
SHARE_EDGES = (0.0, 0.5, 0.8, 0.999)  # lower edges of the continuation-share buckets


def evidence_bucket(evidence: MatchEvidence) -> tuple[int, int]:
    return (bisect.bisect_right(LENGTH_EDGES, evidence.match_length) - 1,
            bisect.bisect_right(SHARE_EDGES, evidence.share) - 1)


def prior_acceptance(evidence: MatchEvidence) -> float:
    """Before any verify: longer and less ambiguous matches are likelier copies."""
    return min(0.9, 0.15 + 0.04 * evidence.match_length) * (0.5 + 0.5 * evidence.share)


class MatchAcceptance:
    """P(a proposed token is accepted | its match evidence), learned online per evidence bucket."""

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.98):
        self.prior_weight = prior_weight
        self.decay = decay
        self._counts: dict[tuple[int, int], list[float]] = {}  # bucket -> [accepted, tried]
        # each evidence's probability since the last observe: a walk along a copy asks for the same one
        # token after token
        self._probabilities: dict[tuple[int, float], float] = {}

    def probability(self, evidence: MatchEvidence) -> float:
        key = (evidence.match_length, evidence.share)
        found = self._probabilities.get(key)
        if found is None:
            accepted, tried = self._counts.get(evidence_bucket(evidence), (0.0, 0.0))
            found = (accepted + self.prior_weight * prior_acceptance(evidence)) / (tried + self.prior_weight)
            self._probabilities[key] = found
        return found

    def observe(self, evidence: Sequence[MatchEvidence], num_accepted: int) -> None:
        """The first num_accepted tokens were accepted; the next one (if any) was the first rejected."""
        self._probabilities.clear()
        for index, item in enumerate(evidence[:num_accepted + 1]):
            counts = self._counts.setdefault(evidence_bucket(item), [0.0, 0.0])
            counts[0] = self.decay * counts[0] + (1.0 if index < num_accepted else 0.0)
            counts[1] = self.decay * counts[1] + 1.0


class Choice(NamedTuple):  # a tuple: the controller builds one for every γ of every step
    drafter: str  # "none", "ngram" or "model"
    gamma: int
    predicted_tokens_per_second: float


class GammaController:
    """Picks (drafter, γ) per step from acceptance estimates and measured costs.

    max_gamma caps a draft model's γ; max_draftless_gamma caps a draftless proposal's (its
    tokens cost nothing to draft, so only the verify's width limits it).
    """

    def __init__(self, max_gamma: int = MAX_GAMMA, fixed_gamma: int | None = None, model_probe_interval: int = 32,
                 *, max_draftless_gamma: int | None = None, target_costs: CostTable | None = None,
                 draft_costs: CostTable | None = None):
        self.max_gamma = max_gamma
        self.max_draftless_gamma = max_gamma if max_draftless_gamma is None else max_draftless_gamma
        self.fixed_gamma = fixed_gamma
        self.model_probe_interval = model_probe_interval
        self.target_costs = target_costs or CostTable()
        self.draft_costs = draft_costs or CostTable()
        self.step_overhead_seconds = 0.0
        self.acceptance = {name: AcceptanceEstimate(ACCEPTANCE_PRIORS[name]) for name in ("ngram", "model")}
        self.match_acceptance = MatchAcceptance()
        self._steps_since_model = 0

    @property
    def widest_gamma(self) -> int:
        return max(self.max_gamma, self.max_draftless_gamma)

    def _rate(self, tokens: float, seconds: float) -> float:
        return tokens / (seconds + self.step_overhead_seconds)

    def _gammas(self, cap: int) -> range | list[int]:
        if self.fixed_gamma is not None:
            return [min(self.fixed_gamma, cap)]
        return range(1, cap + 1)

    def _first_token_bounds(self, depth: int):
        """For each draftless γ, widest first, the first token's acceptance chance at which that γ would
        just match plain decoding if every later token were certain: a step of γ yields at most
        1 + γ·p tokens for what γ + 1 rows cost."""
        verify = self.target_costs.optimistic_seconds
        one = verify(1, depth)
        for gamma in range(self.max_draftless_gamma, 0, -1):
            yield (verify(gamma + 1, depth) / one - 1.0) / gamma

    def min_first_acceptance(self, depth: int = 0) -> float:
        """The first drafted token's acceptance chance below which no draftless γ can beat plain
        decoding, even if every later token were certain. A proposal whose first token falls short
        is not walked further."""
        if self.fixed_gamma is not None:
            return 0.0
        if self.max_draftless_gamma <= 0:
            return 1.0
        return min(self._first_token_bounds(depth))

    def first_token_pays(self, chance: float, depth: int = 0) -> bool:
        """chance >= min_first_acceptance(depth), read from the widest γ down and stopping at the first
        bound it clears: a drafting step mostly prices one or two widths, not every one (on a flat
        cost curve the widest bound is the lowest)."""
        if self.fixed_gamma is not None or self.max_draftless_gamma <= 0:
            return chance >= self.min_first_acceptance(depth)
        return any(chance >= bound for bound in self._first_token_bounds(depth))

    @property
    def min_proposal_survival(self) -> float:
        """A proposal's walk stops at a token reached with a smaller chance (none with a fixed γ: the
        user asked for that many tokens)."""
        return 0.0 if self.fixed_gamma is not None else MIN_PROPOSAL_SURVIVAL

    def options(self, *, ngram_available: int = 0, ngram_probs: Sequence[float] | None = None,
                model_lag: int | None, max_gamma: int, depth: int = 0,
                remaining_tokens: int | None = None, generated_tokens: int | None = None) -> list[Choice]:
        """Every (drafter, γ) this step could run, with its predicted tokens per second (_priced)."""
        return [Choice(*option) for option in self._priced(ngram_available, ngram_probs, model_lag, max_gamma, depth,
                                                           remaining_tokens, generated_tokens)]

    def _priced(self, ngram_available: int, ngram_probs: Sequence[float] | None, model_lag: int | None,
                max_gamma: int, depth: int, remaining_tokens: int | None = None,
                generated_tokens: int | None = None) -> list[tuple[str, int, float]]:
        """Every (drafter, γ, predicted tokens per second) this step could run, as plain tuples: choose() prices
        every γ each step and keeps one.

        ngram_probs: each proposed draftless token's acceptance probability (else ngram_available
        tokens at the n-gram drafter's single rate); model_lag: tokens the draft model must catch
        up on first (None when there is no draft model), a pass priced over the tokens to come
        (remaining_tokens, at most CATCH_UP_HORIZON_TOKENS: None is that many; and at most
        generated_tokens, the reply's tokens so far). A verify of w rows is
        priced as optimistically as the width is little timed (pocketspec/speculation/costs.py: so a width
        the table makes look bad is still tried where it comes near the best).
        """
        if ngram_probs is None:
            alpha = self.acceptance["ngram"].rate
            expected = [expected_tokens_per_step(alpha, gamma) for gamma in range(ngram_available + 1)]
        else:
            expected = expected_tokens_by_gamma(ngram_probs)
        verify = self.target_costs.optimistic_seconds
        choices = [("none", 0, self._rate(1.0, verify(1, depth)))]
        # a fixed γ is lowered by the step's room, never by what the proposal holds
        for gamma in self._gammas(min(max_gamma, self.max_draftless_gamma)):
            if 1 <= gamma < len(expected):
                choices.append(("ngram", gamma, self._rate(expected[gamma], verify(gamma + 1, depth))))
        if model_lag is not None:
            alpha_model = self.acceptance["model"].rate
            # γ draft passes at the target's depth (the draft's cache follows its context): a steady step's first
            # feeds what the last step left, and a longer lag's catch-up beyond that is shared over the horizon
            draft_seconds = self.draft_costs.seconds
            first_pass = draft_seconds(min(model_lag, STEADY_MODEL_LAG) + 1, depth)
            next_pass = draft_seconds(1, depth)
            catch_up = max(draft_seconds(model_lag + 1, depth) - first_pass, 0.0)
            horizon = catch_up_horizon(remaining_tokens, generated_tokens)
            for gamma in self._gammas(min(max_gamma, self.max_gamma)):
                if gamma >= 1:
                    tokens = expected_tokens_per_step(alpha_model, gamma)
                    # the horizon's steps at this γ share the catch-up: each bears its tokens' part of it
                    seconds = (first_pass + (gamma - 1) * next_pass + verify(gamma + 1, depth)
                               + catch_up * min(tokens / horizon, 1.0))
                    choices.append(("model", gamma, self._rate(tokens, seconds)))
        return choices

    def choose(self, *, ngram_available: int = 0, ngram_probs: Sequence[float] | None = None,
               model_lag: int | None, max_gamma: int | None = None, depth: int = 0,
               remaining_tokens: int | None = None, generated_tokens: int | None = None) -> Choice:
        limit = self.widest_gamma if max_gamma is None else min(max_gamma, self.widest_gamma)
        if self.fixed_gamma is not None:
            choices = self.options(ngram_available=ngram_available, ngram_probs=ngram_probs, model_lag=model_lag,
                                   max_gamma=limit, depth=depth, remaining_tokens=remaining_tokens,
                                   generated_tokens=generated_tokens)
            drafted = [choice for choice in choices if choice.gamma > 0]
            # with a fixed γ, a model draft beats an n-gram one only when there is no n-gram match
            drafted.sort(key=lambda choice: choice.drafter != "ngram")
            return drafted[0] if drafted else choices[0]
        priced = self._priced(ngram_available, ngram_probs, model_lag, limit, depth, remaining_tokens,
                              generated_tokens)
        # ties go to the wider draft: on a flat step of the cost curve, more tokens for the same time
        best = Choice(*max(priced, key=itemgetter(2, 1)))  # (tokens per second, γ)
        model_choices = [Choice(*option) for option in priced if option[0] == "model"]
        if model_choices and best.drafter != "model":
            self._steps_since_model += 1
            if self._steps_since_model >= self.model_probe_interval and self._probe_catch_up_is_short(model_lag,
                                                                                                      depth):
                # An unused estimate never improves: now and then, try the draft model again.
                probe = max(model_choices, key=lambda choice: choice.predicted_tokens_per_second)
                if probe.predicted_tokens_per_second >= 0.8 * best.predicted_tokens_per_second:
                    best = probe
        if best.drafter == "model":
            self._steps_since_model = 0
        return best

    def _probe_catch_up_is_short(self, model_lag: int, depth: int) -> bool:
        """Whether the draft model's catch-up costs at most PROBE_MAX_CATCH_UP_PASSES of the target's one-token
        passes."""
        catch_up = self.draft_costs.seconds(model_lag + 1, depth)
        return catch_up <= PROBE_MAX_CATCH_UP_PASSES * self.target_costs.seconds(1, depth)

    def observe_step(self, *, drafter: str, num_drafted: int, num_accepted: int,
                     evidence: Sequence[MatchEvidence] | None = None) -> None:
        if drafter in self.acceptance and num_drafted > 0:
            self.acceptance[drafter].observe(num_accepted, num_drafted)
        if evidence:
            self.match_acceptance.observe(evidence[:num_drafted], num_accepted)

    def observe_overhead(self, seconds: float, smoothing: float = 0.1) -> None:
        self.step_overhead_seconds += smoothing * (max(seconds, 0.0) - self.step_overhead_seconds)
