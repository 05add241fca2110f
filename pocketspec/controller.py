"""Adaptive draft length: before each step, choose the drafter and γ with the most expected tokens per second.

Expected tokens per step with per-token acceptance α and γ drafted tokens is
(1 − α^(γ+1)) / (1 − α). Costs come from this machine's own measurements
(pocketspec/costs.py). γ = 0 (plain decoding) is always an option, so
speculation never makes generation meaningfully slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from memplanner.defaults import ACCEPTANCE_PRIORS, MAX_GAMMA
from pocketspec.costs import CostTable


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


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


@dataclass(frozen=True)
class Choice:
    drafter: str  # "none", "ngram" or "model"
    gamma: int
    predicted_tokens_per_second: float


class GammaController:
    """Picks (drafter, γ) per step from acceptance estimates and measured costs."""

    def __init__(self, max_gamma: int = MAX_GAMMA, fixed_gamma: int | None = None, model_probe_interval: int = 32):
        self.max_gamma = max_gamma
        self.fixed_gamma = fixed_gamma
        self.model_probe_interval = model_probe_interval
        self.target_costs = CostTable()
        self.draft_costs = CostTable()
        self.step_overhead_seconds = 0.0
        self.acceptance = {name: AcceptanceEstimate(ACCEPTANCE_PRIORS[name]) for name in ("ngram", "model")}
        self._steps_since_model = 0

    def _rate(self, tokens: float, seconds: float) -> float:
        return tokens / (seconds + self.step_overhead_seconds)

    def _model_seconds(self, gamma: int, draft_lag: int) -> float:
        return self.draft_costs.seconds(draft_lag + 1) + (gamma - 1) * self.draft_costs.seconds(1)

    def options(self, *, ngram_available: int, model_lag: int | None, max_gamma: int) -> list[Choice]:
        """Every (drafter, γ) this step could run, with its predicted tokens per second.

        ngram_available: tokens the n-gram drafter can propose now; model_lag: tokens the
        draft model must catch up on first (None when there is no draft model).
        """
        choices = [Choice("none", 0, self._rate(1.0, self.target_costs.seconds(1)))]
        gammas = [min(self.fixed_gamma, max_gamma)] if self.fixed_gamma is not None else range(1, max_gamma + 1)
        alpha_ngram = self.acceptance["ngram"].rate
        for gamma in gammas:
            if 1 <= gamma <= min(ngram_available, max_gamma):
                tokens = expected_tokens_per_step(alpha_ngram, gamma)
                choices.append(Choice("ngram", gamma, self._rate(tokens, self.target_costs.seconds(gamma + 1))))
        if model_lag is not None:
            alpha_model = self.acceptance["model"].rate
            for gamma in gammas:
                if 1 <= gamma <= max_gamma:
                    seconds = self._model_seconds(gamma, model_lag) + self.target_costs.seconds(gamma + 1)
                    tokens = expected_tokens_per_step(alpha_model, gamma)
                    choices.append(Choice("model", gamma, self._rate(tokens, seconds)))
        return choices

    def choose(self, *, ngram_available: int, model_lag: int | None, max_gamma: int | None = None) -> Choice:
        limit = self.max_gamma if max_gamma is None else min(max_gamma, self.max_gamma)
        choices = self.options(ngram_available=ngram_available, model_lag=model_lag, max_gamma=limit)
        if self.fixed_gamma is not None:
            drafted = [choice for choice in choices if choice.gamma > 0]
            # with a fixed γ, a model draft beats an n-gram one only when there is no n-gram match
            drafted.sort(key=lambda choice: choice.drafter != "ngram")
            return drafted[0] if drafted else choices[0]
        best = max(choices, key=lambda choice: choice.predicted_tokens_per_second)
        model_choices = [choice for choice in choices if choice.drafter == "model"]
        if model_choices and best.drafter != "model":
            self._steps_since_model += 1
            if self._steps_since_model >= self.model_probe_interval:
                # An unused estimate never improves: now and then, try the draft model again.
                probe = max(model_choices, key=lambda choice: choice.predicted_tokens_per_second)
                if probe.predicted_tokens_per_second >= 0.8 * best.predicted_tokens_per_second:
                    best = probe
        if best.drafter == "model":
            self._steps_since_model = 0
        return best

    def observe_step(self, *, drafter: str, num_drafted: int, num_accepted: int) -> None:
        if drafter in self.acceptance and num_drafted > 0:
            self.acceptance[drafter].observe(num_accepted, num_drafted)

    def observe_overhead(self, seconds: float, smoothing: float = 0.1) -> None:
        self.step_overhead_seconds += smoothing * (max(seconds, 0.0) - self.step_overhead_seconds)
