"""memplanner.planner: refusal below the minimum, monotone in budget, the degradation order,
the lower bounds, lossless plans, and the naive-allocation comparison. Shapes are written out, no files."""

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from memplanner import costs, terms
from memplanner.acceptance import expected_tokens_per_step
from memplanner.options import candidate_settings, draftless_gammas, settings_terms
from memplanner.planner import (REPACK_EITHER, Workload, generation_bytes, min_budget_any, min_budget_keep,
                                naive_generation_bytes, plan)
from memplanner.shapes import ModelShape

GIB = 2**30
TARGET = ModelShape("qwen2.5-coder-1.5b", "qwen2", 28, 1536, 12, 2, 128, 151936, 1_111_370_240,
                    1_117_320_768, 32768, 8960, 625_508_352)
DRAFT = ModelShape("qwen2.5-coder-0.5b", "qwen2", 24, 896, 14, 2, 64, 151936, 485_452_288,
                   491_400_064, 32768, 4864, 29_417_472)
SMOLLM2 = ModelShape("smollm2-135m", "llama", 30, 576, 9, 3, 64, 49152, 96_573_030, 97_000_000, 8192, 1536)
WORKLOAD = Workload(max_context=4096)
GOOD_DRAFT = {"model": 0.95, "ngram": 0.55}  # speculation pays: every degradation step is reachable


def budgets(low, high, steps=120):
    return [int(low + (high - low) * i / steps) for i in range(steps + 1)]


def test_refuses_below_the_minimum_and_names_the_biggest_term():
    minimum = min_budget_any(TARGET, WORKLOAD)
    refused = plan(minimum - 1, TARGET, DRAFT, WORKLOAD)
    assert not refused.feasible and refused.settings is None
    assert refused.reason.startswith("budget ") and "is below the minimum" in refused.reason
    assert "biggest term: target repacked weights 596.53 MiB" in refused.reason
    accepted = plan(minimum, TARGET, DRAFT, WORKLOAD)
    assert accepted.feasible and accepted.predicted_peak_bytes <= minimum
    assert accepted.settings.drafter == "none" and accepted.settings.target_kv_type == "f16"


def test_a_budget_that_fits_only_a_quantized_target_kv_names_the_flag():
    workload = Workload(max_context=32768)
    needed = {kv: min_budget_any(TARGET, replace(workload, target_kv_type=kv)) for kv in ("f16", "q8_0", "q4_0")}
    assert needed["q4_0"] < needed["q8_0"] < needed["f16"]
    refused = plan(needed["q8_0"], TARGET, DRAFT, workload)
    assert not refused.feasible and "--kv-type q8_0 would fit" in refused.reason
    assert "the output can differ from f16" in refused.reason
    only_q4 = plan(needed["q4_0"], TARGET, DRAFT, workload)
    assert not only_q4.feasible and "--kv-type q4_0 would fit" in only_q4.reason
    assert "--kv-type" not in plan(needed["q4_0"] - 1, TARGET, DRAFT, workload).reason
    chosen = plan(needed["q8_0"], TARGET, DRAFT, replace(workload, target_kv_type="q8_0"))
    assert chosen.feasible and chosen.settings.target_kv_type == "q8_0"


@pytest.mark.parametrize("shape", [TARGET, SMOLLM2])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("max_context", [512, 4096])
def test_min_budget_any_is_exactly_the_least_budget_plan_accepts(shape, kv_type, max_context):
    """The issue's SmolLM2 example: `plan` refused 200 MiB as below 217.77 MiB, yet at 217.77 MiB
    it picked a plan predicted at 199.31 MiB (n-gram drafting with a q4_0 target KV cache)."""
    workload = Workload(max_context, target_kv_type=kv_type)
    minimum = min_budget_any(shape, workload)
    at_minimum = plan(minimum, shape, None, workload)
    assert at_minimum.feasible and at_minimum.predicted_peak_bytes == minimum == at_minimum.min_budget_any_bytes
    assert not plan(minimum - 1, shape, None, workload).feasible


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
    order = ["n_ubatch", "draft KV cache quantized", "draft KV window", "max draft length", "n-gram",
             "plain decoding"]
    first_seen = {}
    low, high = min_budget_any(TARGET, WORKLOAD, repack=repack), 3 * GIB
    for index, budget in enumerate(reversed(budgets(low, high, steps=400))):
        for sentence in plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT, repack=repack).degradations:
            for step in order:
                if step in sentence:
                    first_seen.setdefault(step, index)
    seen = sorted(first_seen, key=first_seen.get)
    assert seen == [step for step in order if step in first_seen]
    assert {"n_ubatch", "draft KV window", "draft KV cache quantized", "n-gram"} <= set(seen)


def test_repacked_weights_are_held_once_so_repacking_is_never_given_up():
    """Read without mmap, the repacked tensors are not also resident as file pages (issue 14)."""
    repacked_minimum = min_budget_any(TARGET, WORKLOAD, repack=(True,))
    unrepacked_minimum = min_budget_any(TARGET, WORKLOAD, repack=(False,))
    assert unrepacked_minimum - repacked_minimum == TARGET.file_bytes - TARGET.weight_bytes  # the mapped header
    assert min_budget_any(TARGET, WORKLOAD) == repacked_minimum
    for budget in budgets(repacked_minimum, 3 * GIB, steps=60):
        chosen = plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
        assert chosen.settings.repack_weights
        assert chosen.terms["target_weights"] + chosen.terms["target_repacked_weights"] == TARGET.weight_bytes
        if chosen.settings.drafter == "model":
            assert chosen.terms["draft_weights"] + chosen.terms["draft_repacked_weights"] == DRAFT.weight_bytes
    unrepacked = plan(3 * GIB, TARGET, DRAFT, WORKLOAD, repack=(False,))
    assert unrepacked.terms["target_weights"] == TARGET.file_bytes and "target_repacked_weights" not in unrepacked.terms


def test_plain_decoding_is_the_last_step():
    # with n-gram drafting at its default acceptance (0.3) slower than plain decoding
    at_minimum = plan(min_budget_any(TARGET, WORKLOAD), TARGET, DRAFT, WORKLOAD, alpha=0.95)
    assert at_minimum.settings.drafter == "none"
    assert at_minimum.degradations[-1] == "plain decoding: no speculative configuration fits the budget"


def test_unconstrained_plan_has_no_degradations_and_prefers_f16():
    best = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
    assert best.degradations == [] and best.settings.target_kv_type == best.settings.draft_kv_type == "f16"
    assert best.settings.drafter == "model" and best.settings.draft_kv_window == 4096
    # beside the draft model the runtime verifies n-gram proposals too, up to their own ceiling
    assert best.settings.logits_rows == max(best.settings.max_gamma, WORKLOAD.max_draftless_gamma) + 1


def test_an_ngram_plan_verifies_up_to_the_draftless_ceiling_when_it_fits():
    roomy = plan(64 * GIB, TARGET, None, WORKLOAD)
    assert roomy.settings.drafter == "ngram" and roomy.settings.max_gamma == WORKLOAD.max_draftless_gamma
    assert roomy.settings.logits_rows == WORKLOAD.max_draftless_gamma + 1
    # n_ubatch goes first; where the widest verify's buffers fit at no n_ubatch, the next tile width does
    assert plan(roomy.predicted_peak_bytes - 1, TARGET, None, WORKLOAD).settings.max_gamma == 31
    widest = [settings_terms(s, TARGET, None, WORKLOAD) for s in candidate_settings(TARGET, None, WORKLOAD)
              if s.drafter == "ngram" and s.max_gamma == 31]
    tight = plan(min(sum(found.values()) for found in widest) - 1, TARGET, None, WORKLOAD)
    assert tight.settings.drafter == "ngram" and tight.settings.max_gamma == 15


def test_an_ngram_plan_counts_the_corpus_of_earlier_outputs_once_whatever_the_batch():
    for batch_size in (1, 4):
        workload = replace(WORKLOAD, batch_size=batch_size)
        by_drafter = {s.drafter: settings_terms(s, TARGET, None, workload)
                      for s in candidate_settings(TARGET, None, workload)}
        assert by_drafter["ngram"]["ngram_corpus"] == terms.ngram_corpus_bytes()
        assert by_drafter["ngram"]["ngram_index"] == batch_size * terms.ngram_index_bytes(WORKLOAD.max_context)
        assert "ngram_corpus" not in by_drafter["none"]


def test_on_this_cpu_the_default_draft_does_not_pay():
    # CPU_REFERENCES: a width-2 target pass costs 1.5x a single token, the draft 0.5x; at alpha 0.8 plain wins
    best = plan(64 * GIB, TARGET, DRAFT, WORKLOAD)
    # the adaptive n-gram drafter stays on: its controller falls back to plain decoding by itself
    assert best.settings.drafter == "ngram" and "does not pay" in best.reason


def test_a_draft_model_the_workload_keeps_is_in_every_plan_and_in_the_minimum():
    """The user named the draft (Workload.keeps_draft_model): every budget from the least that loads it plans it,
    though on the reference costs it does not pay; below that least the plan is refused, saying so."""
    keeping = replace(WORKLOAD, keeps_draft_model=True)
    least = min_budget_any(TARGET, keeping, draft=DRAFT)
    assert least > min_budget_any(TARGET, WORKLOAD)  # the draft's weights and KV cache on top
    for budget in budgets(least, 3 * GIB, steps=12):
        kept = plan(budget, TARGET, DRAFT, keeping)
        assert kept.feasible and kept.settings.drafter == "model" and kept.min_budget_loads_draft and not kept.reason
    refused = plan(least - 1, TARGET, DRAFT, keeping)
    assert not refused.feasible and "with the draft model loaded" in refused.reason
    assert plan(least - 1, TARGET, DRAFT, WORKLOAD).feasible  # without the draft it fits
    assert min_budget_keep(TARGET, DRAFT, keeping) >= least


def test_a_fixed_gamma_of_zero_plans_plain_decoding_beside_a_draft_model():
    """--gamma 0 with a pair, or a named draft: nothing can draft, so no candidate loads the draft model (a
    budget's plan used to crash on it)."""
    for keeps_draft_model in (False, True):
        nothing = Workload(4096, max_gamma=0, max_draftless_gamma=0, keeps_draft_model=keeps_draft_model)
        assert plan(3 * GIB, TARGET, DRAFT, nothing).settings.drafter == "none"


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


def test_sampling_adds_the_verified_rows_probability_buffers():
    greedy = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
    sampled = plan(64 * GIB, TARGET, DRAFT, Workload(4096, temperature=0.7), alpha=GOOD_DRAFT)
    assert "target_probs" not in greedy.terms
    assert not any("draft_probs" in terms for terms in (greedy.terms, sampled.terms))  # a draft keeps only its tokens
    assert sampled.terms["target_probs"] == sampled.settings.logits_rows * 151936 * 8  # every verified row


def test_naive_allocation_costs_more_than_the_lower_bound():
    keep = plan(min_budget_keep(TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT), TARGET, DRAFT, WORKLOAD,
                alpha=GOOD_DRAFT)
    naive = naive_generation_bytes(TARGET, DRAFT, WORKLOAD)
    assert naive > 4096 * 151936 * 4  # logits_all alone is 2.3 GiB
    assert generation_bytes(keep.terms) < naive / 10


def test_cost_model():
    assert expected_tokens_per_step(0.8, 1) == pytest.approx(1.8)
    assert expected_tokens_per_step(1.0, 4) == 5
    assert costs.forward_seconds(TARGET, 4) == pytest.approx(0.1615, rel=1e-3)  # between 3 and 5
    assert costs.forward_seconds(DRAFT, 1) == pytest.approx(0.042)
    plain = costs.tokens_per_second(TARGET, None, "none", 0)
    assert plain == pytest.approx(1 / 0.081, rel=1e-3)
    model = costs.tokens_per_second(TARGET, DRAFT, "model", 1, alpha=0.8)
    assert model == pytest.approx(1.8 / (0.042 + 0.124), rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(max_context=st.sampled_from([256, 1000, 4096, 8192]), kv_type=st.sampled_from(["f16", "q8_0", "q4_0"]),
       max_gamma=st.integers(1, 8), temperature=st.sampled_from([0.0, 0.7]), alpha=st.floats(0.0, 1.0),
       repack=st.sampled_from([REPACK_EITHER, (True,), (False,)]), with_draft=st.booleans(),
       budget_share=st.floats(0.0, 1.0))
def test_every_plan_runs_the_target_as_the_user_set_it(max_context, kv_type, max_gamma, temperature, alpha, repack,
                                                       with_draft, budget_share):
    """Lossless by construction: whatever the budget, the target's KV type and weights are the user's;
    only the draft side (its KV type, window, γ) and n_ubatch are traded for memory."""
    workload = Workload(max_context, max_gamma=max_gamma, temperature=temperature, target_kv_type=kv_type)
    draft = DRAFT if with_draft else None
    for candidate in candidate_settings(TARGET, draft, workload, "cpu", repack):
        assert candidate.target_kv_type == kv_type and candidate.repack_weights in repack
    low = min_budget_any(TARGET, workload, repack=repack)
    high = plan(64 * GIB, TARGET, draft, workload, alpha=alpha, repack=repack).predicted_peak_bytes
    chosen = plan(int(low + budget_share * (high - low)), TARGET, draft, workload, alpha=alpha, repack=repack)
    assert chosen.feasible and chosen.settings.target_kv_type == kv_type
    # the user's layout when given; repacking otherwise, which costs no memory read without mmap
    assert chosen.settings.repack_weights == (repack[0] if len(repack) == 1 else True)
    assert chosen.terms["target_kv_cache"] == terms.kv_cache_bytes(TARGET, chosen.settings.target_n_ctx, kv_type)
    assert not any("target KV" in step for step in chosen.degradations)


def test_the_draft_kv_cache_is_quantized_before_its_window_shrinks():
    full = plan(64 * GIB, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT).predicted_peak_bytes
    found_plans = [plan(budget, TARGET, DRAFT, WORKLOAD, alpha=GOOD_DRAFT)
                   for budget in budgets(full - 300 * 2**20, full, 120)]
    quantized = [p for p in found_plans if p.settings.drafter == "model" and p.settings.draft_kv_type != "f16"]
    assert quantized, "some budget quantizes the draft's KV cache"
    assert all(p.settings.draft_kv_window == WORKLOAD.max_context for p in quantized[-3:])
    for found in quantized:
        assert found.settings.target_kv_type == "f16"
        assert found.terms["draft_kv_cache"] == terms.kv_cache_bytes(DRAFT, found.settings.draft_n_ctx,
                                                                      found.settings.draft_kv_type)
        assert any(step.startswith("draft KV cache quantized f16 -> ") for step in found.degradations)


def test_the_draftless_ceilings_planned_are_tile_widths_and_the_one_asked_for():
    assert draftless_gammas(31) == [1, 3, 7, 15, 31]
    assert draftless_gammas(10) == [1, 3, 7, 10]
    assert draftless_gammas(0) == []
