"""memplanner.planner: refusal below the minimum, monotone in budget, the degradation order,
the lower bounds, and the naive-allocation comparison. Shapes are written out, no files."""

import pytest

from memplanner import costs
from memplanner.planner import (Workload, generation_bytes, min_budget_any, min_budget_keep,
                                naive_generation_bytes, plan)
from memplanner.shapes import ModelShape

GIB = 2**30
TARGET = ModelShape("qwen2.5-coder-1.5b", "qwen2", 28, 1536, 12, 2, 128, 151936, 1_111_370_240,
                    1_117_320_768, 32768, 8960, 625_508_352)
DRAFT = ModelShape("qwen2.5-coder-0.5b", "qwen2", 24, 896, 14, 2, 64, 151936, 485_452_288,
                   491_400_064, 32768, 4864, 29_417_472)
WORKLOAD = Workload(max_context=4096)
GOOD_DRAFT = {"model": 0.95, "ngram": 0.55}  # speculation pays: every degradation step is reachable


def budgets(low, high, steps=120):
    return [int(low + (high - low) * i / steps) for i in range(steps + 1)]


def test_refuses_below_the_minimum_and_names_the_biggest_term():
    minimum = min_budget_any(TARGET, WORKLOAD)
    refused = plan(minimum - 1, TARGET, DRAFT, WORKLOAD)
    assert not refused.feasible and refused.settings is None
    assert refused.reason.startswith("budget ") and "is below the minimum" in refused.reason
    assert "biggest term: target weights 1.04 GiB" in refused.reason
    accepted = plan(minimum, TARGET, DRAFT, WORKLOAD)
    assert accepted.feasible and accepted.predicted_peak_bytes <= minimum
    assert accepted.settings.drafter == "none" and accepted.settings.target_kv_type == "f16"


def test_minimum_is_plain_decoding_at_f16_with_the_smallest_ubatch():
    plain = plan(min_budget_any(TARGET, WORKLOAD), TARGET, None, WORKLOAD)
    assert plain.settings.n_ubatch == 64 and plain.settings.target_n_ctx == 4096
    assert min_budget_any(TARGET, Workload(8192)) > min_budget_any(TARGET, WORKLOAD)


@pytest.mark.parametrize("alpha", [None, GOOD_DRAFT])
def test_more_budget_never_gives_a_slower_plan(alpha):
    previous = 0.0
    for budget in budgets(min_budget_any(TARGET, WORKLOAD), 3 * GIB):
        result = plan(budget, TARGET, DRAFT, WORKLOAD, alpha=alpha)
        assert result.feasible and result.predicted_peak_bytes <= budget
        assert result.predicted_peak_bytes == sum(result.terms.values())
        assert result.predicted_tokens_per_second >= previous - 1e-12
        previous = result.predicted_tokens_per_second


@pytest.mark.parametrize("repack", [(True,), (False,)])
def test_degradation_order_as_the_budget_shrinks(repack):
    """For one weight layout; not repacking then repeats the order from the top (next test)."""
    order = ["n_ubatch", "draft KV window", "quantized", "max draft length", "n-gram", "plain decoding"]
    first_seen = {}
    low, high = min_budget_any(TARGET, WORKLOAD, repack=repack), 3 * GIB
    for index, budget in enumerate(reversed(budgets(low, high, steps=400))):
        for sentence in plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT, repack=repack).degradations:
            for step in order:
                if step in sentence:
                    first_seen.setdefault(step, index)
    seen = sorted(first_seen, key=first_seen.get)
    assert seen == [step for step in order if step in first_seen]
    assert {"n_ubatch", "draft KV window", "quantized", "n-gram"} <= set(seen)


def test_weights_stay_repacked_until_no_repacked_plan_fits():
    repacked_minimum = min_budget_any(TARGET, WORKLOAD, repack=(True,))
    unrepacked_minimum = min_budget_any(TARGET, WORKLOAD, repack=(False,))
    assert repacked_minimum - unrepacked_minimum == TARGET.repacked_bytes
    assert min_budget_any(TARGET, WORKLOAD) == unrepacked_minimum
    for budget in budgets(unrepacked_minimum, 3 * GIB, steps=200):
        chosen = plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
        repacked = plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT, repack=(True,))
        if not chosen.settings.repack_weights:
            announced = [step for step in chosen.degradations if step.startswith("weights not repacked")]
            assert len(announced) == 1
            assert not repacked.feasible or repacked.predicted_tokens_per_second < chosen.predicted_tokens_per_second
        elif repacked.feasible:
            assert chosen.settings == repacked.settings and chosen.terms == repacked.terms
    below = plan(unrepacked_minimum, TARGET, DRAFT, WORKLOAD)
    assert below.feasible and not below.settings.repack_weights
    assert "target_repacked_weights" not in below.terms


def test_plain_decoding_is_the_last_step():
    # with n-gram drafting at its default acceptance (0.3) slower than plain decoding
    at_minimum = plan(min_budget_any(TARGET, WORKLOAD), TARGET, DRAFT, WORKLOAD, alpha=0.95)
    assert at_minimum.settings.drafter == "none"
    assert at_minimum.degradations[-1] == "plain decoding: no speculative configuration fits the budget"


def test_unconstrained_plan_has_no_degradations_and_prefers_f16():
    best = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
    assert best.degradations == [] and best.settings.target_kv_type == "f16"
    assert best.settings.drafter == "model" and best.settings.draft_kv_window == 4096
    assert best.settings.logits_rows == best.settings.max_gamma + 1


def test_on_this_cpu_the_default_draft_does_not_pay():
    # CPU_REFERENCES: a width-2 target pass costs 1.5x a single token, the draft 0.5x; at alpha 0.8 plain wins
    best = plan(64 * GIB, TARGET, DRAFT, WORKLOAD)
    # the adaptive n-gram drafter stays on: its controller falls back to plain decoding by itself
    assert best.settings.drafter == "ngram" and "does not pay" in best.reason


@pytest.mark.parametrize("alpha", [None, GOOD_DRAFT])
def test_min_budget_keep_matches_a_bisection(alpha):
    best = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=alpha).predicted_tokens_per_second
    low, high = min_budget_any(TARGET, WORKLOAD), 64 * GIB
    while low < high:
        middle = (low + high) // 2
        if plan(middle, TARGET, DRAFT, WORKLOAD, alpha=alpha).predicted_tokens_per_second >= 0.95 * best:
            high = middle
        else:
            low = middle + 1
    assert min_budget_keep(TARGET, DRAFT, WORKLOAD, alpha=alpha) == low


def test_sampling_adds_probability_buffers():
    greedy = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
    sampled = plan(64 * GIB, TARGET, DRAFT, Workload(4096, temperature=0.7), alpha=GOOD_DRAFT)
    gamma = sampled.settings.max_gamma
    assert "draft_probs" not in greedy.terms
    assert sampled.terms["draft_probs"] == gamma * 151936 * 4
    assert sampled.terms["target_probs"] == (gamma + 1) * 151936 * 4


def test_naive_allocation_costs_more_than_the_lower_bound():
    keep = plan(min_budget_keep(TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT), TARGET, DRAFT, WORKLOAD,
                alpha=GOOD_DRAFT)
    naive = naive_generation_bytes(TARGET, DRAFT, WORKLOAD)
    assert naive > 4096 * 151936 * 4  # logits_all alone is 2.3 GiB
    assert generation_bytes(keep.terms) < naive / 10


def test_cost_model():
    assert costs.expected_tokens_per_step(0.8, 1) == pytest.approx(1.8)
    assert costs.expected_tokens_per_step(1.0, 4) == 5
    assert costs.forward_seconds(TARGET, 4) == pytest.approx(0.1615, rel=1e-3)  # between 3 and 5
    assert costs.forward_seconds(DRAFT, 1) == pytest.approx(0.042)
    plain = costs.tokens_per_second(TARGET, None, "none", 0)
    assert plain == pytest.approx(1 / 0.081, rel=1e-3)
    model = costs.tokens_per_second(TARGET, DRAFT, "model", 1, alpha=0.8)
    assert model == pytest.approx(1.8 / (0.042 + 0.124), rel=1e-3)
