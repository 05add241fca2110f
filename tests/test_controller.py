"""The γ controller picks the drafter and draft length with the most expected tokens per second."""

import random

import pytest

from memplanner.acceptance import expected_tokens_per_step
from pocketspec.speculation.controller import CATCH_UP_HORIZON_TOKENS, AcceptanceEstimate, GammaController
from pocketspec.speculation.costs import EXPLORATION, EXPLORE_AFTER_PASSES, MIN_WIDTH_OBSERVATIONS, CostTable
from pocketspec.settings import SpeculationSettings


def test_expected_tokens_per_step_formula():
    assert expected_tokens_per_step(0.5, 0) == 1.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_per_step(1.0, 4) == 5.0


def _controller(verify_seconds: dict[int, float], draft_seconds: float, alpha_ngram: float, alpha_model: float):
    """A controller that knows these costs: every width timed often enough that no optimism is left to explore."""
    controller = GammaController(max_gamma=8)
    for _ in range(200):
        for width, seconds in verify_seconds.items():
            controller.target_costs.observe(width, seconds)
    controller.draft_costs.observe(1, draft_seconds)
    controller.draft_costs.observe(2, draft_seconds * 1.1)
    for name, alpha in (("ngram", alpha_ngram), ("model", alpha_model)):
        estimate = controller.acceptance[name]
        estimate.prior_rate, estimate.prior_weight = alpha, 1e9  # pin the estimate
    return controller


# This CPU: a forward pass over w tokens costs far more than one token.
EXPENSIVE_VERIFY = {w: 0.030 * r for w, r in {1: 1, 2: 1.9, 3: 2.3, 4: 2.8, 5: 3.4, 7: 4.5, 9: 5.0}.items()}
# A GPU: verifying 9 tokens costs about one.
CHEAP_VERIFY = {w: 0.020 * (1 + 0.02 * (w - 1)) for w in range(1, 10)}


def test_picks_plain_decoding_when_drafts_cannot_pay():
    controller = _controller(EXPENSIVE_VERIFY, draft_seconds=0.016, alpha_ngram=0.3, alpha_model=0.7)
    choice = controller.choose(ngram_available=8, model_lag=0)
    assert (choice.drafter, choice.gamma) == ("none", 0)


def test_picks_long_ngram_draft_when_copies_are_accepted():
    controller = _controller(EXPENSIVE_VERIFY, draft_seconds=0.016, alpha_ngram=0.98, alpha_model=0.7)
    choice = controller.choose(ngram_available=8, model_lag=0)
    assert choice.drafter == "ngram" and choice.gamma >= 6


def test_ngram_gamma_is_capped_by_what_it_can_propose():
    controller = _controller(EXPENSIVE_VERIFY, draft_seconds=0.016, alpha_ngram=0.98, alpha_model=0.2)
    assert controller.choose(ngram_available=3, model_lag=0).gamma <= 3


def test_picks_model_draft_when_verification_is_cheap():
    controller = _controller(CHEAP_VERIFY, draft_seconds=0.004, alpha_ngram=0.2, alpha_model=0.8)
    choice = controller.choose(ngram_available=0, model_lag=0)
    assert choice.drafter == "model" and 3 <= choice.gamma <= 8


def test_a_catch_up_too_long_for_the_tokens_left_makes_the_model_draft_lose():
    controller = _controller(CHEAP_VERIFY, draft_seconds=0.004, alpha_ngram=0.2, alpha_model=0.8)
    controller.draft_costs.observe(200, 2.0)
    assert controller.choose(ngram_available=0, model_lag=199).drafter == "none"
    assert controller.choose(ngram_available=0, model_lag=199, remaining_tokens=20).drafter == "none"


def test_a_prompts_catch_up_is_paid_by_the_model_steps_after_it():
    """The draft model's cache follows the context lazily, so the first step after a prompt must feed it the
    whole prompt. Priced whole into that step, the catch-up lost to plain decoding; the next step's lag was one
    token longer, and the draft model was never used. Spread over the tokens to come, it is paid where the
    model pays, and only where enough tokens remain."""
    controller = _controller(CHEAP_VERIFY, draft_seconds=0.004, alpha_ngram=0.2, alpha_model=0.8)
    controller.draft_costs.observe(200, 0.1)  # a batched catch-up pass: 0.5 ms a token
    plain_rate = 1 / CHEAP_VERIFY[1]
    steady = max(choice.predicted_tokens_per_second for choice in controller.options(model_lag=0, max_gamma=8)
                 if choice.drafter == "model")
    assert steady > 1.5 * plain_rate
    first = controller.choose(ngram_available=0, model_lag=199, remaining_tokens=160)
    assert first.drafter == "model" and first.predicted_tokens_per_second < steady
    assert controller.choose(ngram_available=0, model_lag=199, remaining_tokens=3).drafter == "none"
    # what is left to generate past the horizon does not make a catch-up cheaper still
    far = controller.choose(ngram_available=0, model_lag=199, remaining_tokens=100_000)
    capped = controller.choose(ngram_available=0, model_lag=199, remaining_tokens=CATCH_UP_HORIZON_TOKENS)
    assert far == capped


# A 2-core Xeon's verify costs by width (2 rows cost less than one there)
XEON_VERIFY = {1: 0.074, 2: 0.070, 3: 0.080, 4: 0.090, 5: 0.100, 7: 0.120, 9: 0.140}


def test_a_reply_buys_a_long_catch_up_only_once_it_has_run_long_enough_to_pay_it_back():
    """Spec-Bench's extractions and second turns on that Xeon: answers of 13-56 tokens after prompts of 130-250,
    whose first model step caught the draft up on the whole prompt, priced over 128 tokens that never came (their
    model steps averaged 200-590 ms against plain's 66-77 ms; 0.45-0.8x plain decoding). A reply's length is
    guessed from how long it has run, so the catch-up is bought as in ski rental: not at the reply's start, but
    once it has run long enough."""
    controller = _controller(XEON_VERIFY, draft_seconds=0.025, alpha_ngram=0.2, alpha_model=0.8)
    controller.draft_costs.observe(500, 1.4)

    def drafter_after(generated_tokens):
        return controller.choose(ngram_available=0, model_lag=499, remaining_tokens=160,
                                 generated_tokens=generated_tokens).drafter

    assert [drafter_after(generated) for generated in (0, 16, 32)] == ["none"] * 3
    assert drafter_after(128) == "model"
    assert drafter_after(None) == "model"  # a reply of unknown progress: the tokens left alone bound the horizon
    assert controller.choose(ngram_available=0, model_lag=0, generated_tokens=0).drafter == "model"  # no catch-up


def test_a_short_reply_leaves_a_catch_up_it_cannot_pay_back_unbought():
    """Spec-Bench's translation on that Xeon: a 16-token answer after a 56-token prompt, the draft model's catch-up
    0.27 s (about four of plain's steps). Priced over the tokens emitted so far plus 16, it was bought at the
    reply's start, and the reply ran at 0.81x plain decoding, against 1.04x with n-grams alone in the same run. Priced
    over the tokens emitted so far, it is bought once the reply has paid its price in what the model would have
    saved: here once 14 tokens are out."""
    controller = _controller(XEON_VERIFY, draft_seconds=0.025, alpha_ngram=0.2, alpha_model=0.75)
    controller.draft_costs.observe(57, 0.27)

    def drafter_after(generated_tokens):
        return controller.choose(ngram_available=0, model_lag=56, remaining_tokens=160 - generated_tokens,
                                 generated_tokens=generated_tokens).drafter

    assert [drafter_after(generated) for generated in range(14)] == ["none"] * 14
    assert [drafter_after(generated) for generated in (16, 24, 48)] == ["model"] * 3


def test_a_probe_of_the_draft_model_never_pays_a_long_catch_up():
    """Now and then the controller tries a draft model it stopped choosing, so that its acceptance estimate can
    improve; that try pays the model's catch-up whole. On the Xeon, a probe in a short second turn caught a 0.5B draft
    up on the whole conversation in one 1.7 s step. A short catch-up is still probed."""
    def drafters(alpha_model, model_lag):
        controller = _controller(XEON_VERIFY, draft_seconds=0.025, alpha_ngram=0.2, alpha_model=alpha_model)
        controller.model_probe_interval = 4
        controller.draft_costs.observe(500, 1.4)
        controller.draft_costs.observe(9, 0.06)
        return [controller.choose(ngram_available=0, model_lag=model_lag, remaining_tokens=160,
                                  generated_tokens=32).drafter for _ in range(8)]

    # priced at 0.84x plain decoding's rate, a probe's bar, with the catch-up spread over the horizon
    assert drafters(alpha_model=0.65, model_lag=499) == ["none"] * 8
    assert drafters(alpha_model=0.3, model_lag=8) == ["none"] * 3 + ["model"] + ["none"] * 3 + ["model"]


def _drafter_and_gamma(choice) -> tuple[str, int]:
    return choice.drafter, choice.gamma


def test_fixed_gamma_is_used_as_given():
    controller = GammaController(max_gamma=8, fixed_gamma=3)
    assert _drafter_and_gamma(controller.choose(ngram_available=5, model_lag=None)) == ("ngram", 3)
    # an n-gram match drafts before the draft model; without one the draft model drafts
    assert _drafter_and_gamma(controller.choose(ngram_available=5, model_lag=0)) == ("ngram", 3)
    assert _drafter_and_gamma(controller.choose(ngram_available=0, model_lag=0)) == ("model", 3)
    # a step with room for fewer tokens drafts fewer; with no drafter able to draft γ, plain decoding
    assert _drafter_and_gamma(controller.choose(ngram_available=0, model_lag=0, max_gamma=2)) == ("model", 2)
    assert _drafter_and_gamma(controller.choose(ngram_available=2, model_lag=None)) == ("none", 0)


def test_a_fixed_gamma_does_not_depend_on_measured_costs():
    """Costs that make every draft lose under adaptive γ leave a fixed γ's choice unchanged."""
    adaptive = _controller(EXPENSIVE_VERIFY, draft_seconds=0.016, alpha_ngram=0.3, alpha_model=0.7)
    assert adaptive.choose(ngram_available=0, model_lag=0).drafter == "none"
    fixed = GammaController(max_gamma=8, fixed_gamma=3)
    for width, seconds in EXPENSIVE_VERIFY.items():
        fixed.target_costs.observe(width, seconds)
    fixed.draft_costs.observe(1, 0.016)
    assert _drafter_and_gamma(fixed.choose(ngram_available=0, model_lag=0)) == ("model", 3)


def test_the_acceptance_priors_are_the_planners():
    """The controller starts from the planner's acceptance priors (memplanner.defaults), so a plan
    and the runtime it configures predict with the same rates."""
    from memplanner.defaults import ACCEPTANCE_PRIORS

    controller = GammaController()
    assert controller.max_gamma == SpeculationSettings().max_gamma
    assert {name: estimate.rate for name, estimate in controller.acceptance.items()} == {
        name: ACCEPTANCE_PRIORS[name] for name in ("ngram", "model")}


def test_acceptance_estimate_learns_from_truncated_runs():
    estimate = AcceptanceEstimate(prior_rate=0.5, prior_weight=1.0, decay=1.0)
    for _ in range(200):
        estimate.observe(num_accepted=3, num_drafted=4)  # 3 of 4 tried accepted
    assert estimate.rate == pytest.approx(0.75, abs=0.01)


def test_cost_table_predicts_unseen_widths_from_measured_scale():
    table = CostTable(prior_ratio={1: 1.0, 5: 2.0})
    table.observe(1, 0.05)
    assert table.seconds(5) == pytest.approx(0.10)
    assert table.seconds(3) == pytest.approx(0.075)


def _table(first_inflated: int, factor: float) -> CostTable:
    from memplanner.measured_costs import MeasuredCosts

    seconds = {width: 0.03 * (1 + 0.4 * (width - 1)) * (factor if width >= first_inflated else 1.0)
               for width in range(1, 33)}
    return CostTable(MeasuredCosts("test", {0: seconds}))


def test_no_width_looks_cheaper_than_predicted_before_enough_passes_were_timed():
    """A short first answer is not spent exploring: the optimism waits for EXPLORE_AFTER_PASSES passes."""
    table = _table(first_inflated=9, factor=1.0)
    for _ in range(EXPLORE_AFTER_PASSES - 1):
        table.observe(1, table.seconds(1))
    assert table.optimistic_seconds(12) == table.seconds(12)
    table.observe(1, table.seconds(1))
    assert table.optimistic_seconds(12) == pytest.approx(table.seconds(12) * (1 - EXPLORATION))


def test_a_width_never_timed_looks_cheaper_than_predicted_until_its_group_is_learned():
    """Only a pass of a width timed often enough to have its own shape fades its group's optimism: passes the
    prediction learns nothing from leave a wrongly priced group as cheap-looking as before."""
    table = _table(first_inflated=9, factor=1.0)
    for _ in range(EXPLORE_AFTER_PASSES):
        table.observe(1, table.seconds(1))
    assert table.optimistic_seconds(12) == pytest.approx(table.seconds(12) * (1 - EXPLORATION))
    for width in (9, 10, 16):
        table.observe(width, table.seconds(width))
    assert table.optimistic_seconds(12) == pytest.approx(table.seconds(12) * (1 - EXPLORATION))
    for _ in range(MIN_WIDTH_OBSERVATIONS - 1):
        for width in (9, 10, 16):
            table.observe(width, table.seconds(width))
    assert table.optimistic_seconds(12) == pytest.approx(table.seconds(12) * (1 - EXPLORATION / 4))
    assert table.optimistic_seconds(4) == pytest.approx(table.seconds(4) * (1 - EXPLORATION))  # another group


def test_a_width_not_timed_takes_its_timed_neighbours_correction():
    table = _table(first_inflated=5, factor=1.5)  # every width from 5 on measured 1.5x too dear
    truth = _table(first_inflated=5, factor=1.0)
    for _ in range(10):
        for width in (1, 4, 8, 20):
            table.observe(width, truth.seconds(width))
    assert table.seconds(4) == pytest.approx(truth.seconds(4), rel=0.01)
    assert table.seconds(16) == pytest.approx(truth.seconds(16), rel=0.01)  # between 8 and 20, both 1/1.5
    assert table.seconds(32) == pytest.approx(truth.seconds(32), rel=0.01)  # past the widest timed: its correction
    assert truth.seconds(6) < table.seconds(6) < 1.5 * truth.seconds(6)  # between 4 (right) and 8 (1.5x off)


def test_a_slow_spell_timed_on_one_row_slows_every_width():
    """A process that slows down times mostly one-token passes. A width timed only before the spell slows
    with them, so a verify of two rows keeps its true price beside one row (with a correction per width,
    two rows looked 1.25x cheaper here, and single-token drafts that lose were chosen)."""
    truth = _table(first_inflated=33, factor=1.0)
    table = _table(first_inflated=33, factor=1.0)
    for _ in range(10):
        for width in (1, 2):
            table.observe(width, truth.seconds(width))
    for _ in range(30):
        table.observe(1, 1.25 * truth.seconds(1))
    assert table.seconds(1) == pytest.approx(1.25 * truth.seconds(1), rel=0.02)
    assert table.seconds(2) / table.seconds(1) == pytest.approx(truth.seconds(2) / truth.seconds(1), rel=0.02)
    assert table.seconds(8) == pytest.approx(1.25 * truth.seconds(8), rel=0.02)


def test_a_prediction_kept_across_passes_equals_one_made_afresh():
    """The table keeps each prediction until a timed pass moves its correction (costs.py: _moved_widths).
    Asked for every width after every pass, it answers what a table given the same passes and asked
    only then answers, bit for bit: through the shared correction, widths timed into their own,
    neighbours read between them, and the optimism's start."""
    generator = random.Random(5)
    passes: list[tuple[int, float, int]] = []
    asked = _table(first_inflated=5, factor=1.5)
    for _ in range(120):
        width, depth = generator.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32]), generator.choice([0, 40, 500])
        passes.append((width, asked.seconds(width, depth) * generator.uniform(0.6, 1.4), depth))
        asked.observe(*passes[-1])
        fresh = _table(first_inflated=5, factor=1.5)
        for timed in passes:
            fresh.observe(*timed)
        for depth in (0, 100):
            assert [asked.optimistic_seconds(width, depth) for width in range(1, 33)] == \
                [fresh.optimistic_seconds(width, depth) for width in range(1, 33)]
