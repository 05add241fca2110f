"""Match-aware drafting: evidence per proposed token, acceptance learned per evidence, widths from the cost curve."""

import random

from memplanner.measured_costs import MeasuredCosts
from pocketspec.speculation.controller import (GammaController, MatchAcceptance, expected_tokens_by_gamma,
                                               pooled_acceptance)
from pocketspec.speculation.costs import CostTable
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.ngram import MatchEvidence, NgramDrafter

STEPPED = {1: 0.037, 2: 0.059, 3: 0.080, 4: 0.097, **{w: 0.222 for w in range(5, 9)},
           **{w: 0.226 for w in range(9, 17)}, **{w: 0.45 for w in range(17, 33)}}


def _controller() -> GammaController:
    return GammaController(max_gamma=8, max_draftless_gamma=31,
                           target_costs=CostTable(MeasuredCosts("test", {0: dict(STEPPED)})))


def test_a_long_verbatim_copy_has_long_match_evidence():
    code = list(range(100, 160))
    context = [1, 2, 3] + code + [7, 8] + code[:20]
    proposal = NgramDrafter(min_n=2, max_n=6).propose_scored(context, 10)
    assert proposal.tokens == code[20:30]
    assert all(evidence.match_length >= 20 for evidence in proposal.evidence)
    assert all(evidence.share == 1.0 for evidence in proposal.evidence)


def test_an_ambiguous_suffix_has_a_split_share():
    context = [5, 6, 1, 5, 6, 2, 5, 6, 1, 9, 5, 6]
    proposal = NgramDrafter(min_n=2, max_n=2).propose_scored(context, 1)
    assert proposal.tokens == [1]
    assert proposal.evidence[0].share == 2 / 3


def test_earlier_outputs_are_proposed_for_a_new_request():
    drafter = NgramDrafter(min_n=2, max_n=4)
    drafter.remember([40, 41, 42, 43, 44, 45])
    drafter.reset()  # a new request: the context index is cleared, the corpus stays
    assert drafter.lookup([9, 40, 41], 3) == [42, 43, 44]


def test_the_corpus_forgets_its_oldest_outputs_past_its_bound(monkeypatch):
    import pocketspec.drafters.corpus as corpus

    monkeypatch.setattr(corpus, "NGRAM_CORPUS_MAX_TOKENS", 20)
    drafter = NgramDrafter(min_n=2, max_n=2)
    drafter.remember([70, 71, 72])
    for start in range(0, 30, 5):
        drafter.remember(list(range(1000 + start, 1005 + start)))
    assert drafter.lookup([9, 70, 71], 1) == []
    assert drafter.lookup([9, 1025, 1026], 2) == [1027, 1028]


def test_drafters_sharing_a_corpus_draft_from_each_others_outputs():
    shared = OutputCorpus(2, 4)
    first, second = NgramDrafter(2, 4, corpus=shared), NgramDrafter(2, 4, corpus=shared)
    first.remember([40, 41, 42, 43, 44, 45])
    assert second.lookup([9, 40, 41], 3) == [42, 43, 44]
    assert NgramDrafter(2, 4).lookup([9, 40, 41], 3) == []  # a drafter of its own starts empty


def test_a_lookup_waits_for_an_output_being_added_and_then_sees_all_of_it(monkeypatch):
    """A server's engines look up the shared corpus on their own threads while another adds its output:
    a lookup never reads an index half-updated (a dict changed during iteration would raise). The
    write is held open midway, and the lookup must wait for it, then see the whole output."""
    import threading

    shared = OutputCorpus(2, 3)
    drafter = NgramDrafter(2, 3, corpus=shared)
    midway, finish = threading.Event(), threading.Event()
    corpus_index = shared._index
    extend = corpus_index.extend

    def extend_in_two_halves(tokens):
        extend(tokens[:len(tokens) // 2])
        midway.set()
        assert finish.wait(10)
        extend(tokens[len(tokens) // 2:])

    monkeypatch.setattr(corpus_index, "extend", extend_in_two_halves)  # the corpus's index only, not the drafter's
    writer = threading.Thread(target=shared.remember, args=(list(range(100, 140)),))
    writer.start()
    assert midway.wait(10)
    proposals = []
    reader = threading.Thread(target=lambda: proposals.append(drafter.lookup([130, 131], 4)))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not proposals  # held back while the output is half added
    finish.set()
    writer.join(10)
    reader.join(10)
    assert proposals == [[132, 133, 134, 135]]


def test_proposals_never_contain_the_corpus_separator():
    drafter = NgramDrafter(min_n=1, max_n=3)
    rng = random.Random(0)
    for _ in range(20):
        drafter.remember([rng.randrange(5) for _ in range(8)])
    for _ in range(50):
        context = [rng.randrange(5) for _ in range(rng.randrange(2, 12))]
        assert all(token >= 0 for token in drafter.lookup(context, 10))


def test_acceptance_is_learned_per_evidence_bucket():
    acceptance = MatchAcceptance(prior_weight=1.0, decay=1.0)
    long_copy, guess = MatchEvidence(24, 1.0), MatchEvidence(2, 0.5)
    for _ in range(100):
        acceptance.observe([long_copy] * 10, num_accepted=10)
        acceptance.observe([guess, guess], num_accepted=0)
    assert acceptance.probability(long_copy) > 0.95
    assert acceptance.probability(guess) < 0.05


def test_a_confident_copy_verifies_the_widest_efficient_width():
    controller = _controller()
    choice = controller.choose(ngram_probs=[0.97] * 31, model_lag=None)
    assert choice.drafter == "ngram"
    assert choice.gamma + 1 in (16, 32)  # never 5-15 rows, which cost what 16 do


def test_a_doubtful_proposal_stays_on_the_cheap_widths_or_plain():
    controller = _controller()
    choice = controller.choose(ngram_probs=[0.5] * 31, model_lag=None)
    assert choice.gamma + 1 <= 4


def test_nothing_to_draft_means_plain_decoding():
    assert _controller().choose(ngram_probs=[], model_lag=None).drafter == "none"


def test_expected_tokens_follow_the_survival_products():
    assert expected_tokens_by_gamma([0.5, 0.5, 1.0]) == [1.0, 1.5, 1.75, 2.0]


def test_the_draftless_cap_and_the_model_cap_are_separate():
    controller = _controller()
    assert controller.choose(ngram_probs=[1.0] * 31, model_lag=None, max_gamma=10).gamma <= 10
    assert max(choice.gamma for choice in controller.options(ngram_probs=[], model_lag=0, max_gamma=31)) <= 8


def test_a_width_timed_often_gets_its_own_correction():
    table = CostTable(MeasuredCosts("test", {0: dict(STEPPED)}))
    for _ in range(10):
        table.observe(16, 0.226 * 0.5)  # this width is really twice as fast as calibrated
        table.observe(1, 0.037)
    assert abs(table.seconds(16) - 0.113) < 0.01
    assert abs(table.seconds(1) - 0.037) < 0.003


def test_a_doubtful_first_token_ends_the_walk():
    code = list(range(100, 160))
    context = [1, 2, 3] + code + [7, 8] + code[:20]
    drafter = NgramDrafter(min_n=2, max_n=6)
    assert len(drafter.propose_scored(context, 10, lambda evidence: 0.3,
                                   first_pays=lambda chance: chance >= 0.4).tokens) == 1
    confident = drafter.propose_scored(context, 10, lambda evidence: 0.9, first_pays=lambda chance: chance >= 0.4)
    assert confident.tokens == code[20:30]
    assert confident.probabilities == [0.9] * 10


def test_the_walk_stops_where_the_next_token_is_hardly_ever_reached():
    code = list(range(100, 160))
    context = [1, 2, 3] + code + [7, 8] + code[:20]
    proposal = NgramDrafter(min_n=2, max_n=6).propose_scored(context, 10, lambda evidence: 0.5, min_survival=0.1)
    assert len(proposal.tokens) == 4  # 0.5 ** 4 < 0.1: the fourth token is proposed, the fifth never walked to


def test_a_first_token_below_the_bound_cannot_pay_at_any_width():
    controller = _controller()
    bound = controller.min_first_acceptance()
    # even with every later token certain, no γ beats plain just under the bound; one does just above it
    just_under = [bound * 0.99] + [1.0] * 30
    just_over = [min(bound * 1.05, 1.0)] + [1.0] * 30
    assert controller.choose(ngram_probs=just_under, model_lag=None).drafter == "none"
    assert controller.choose(ngram_probs=just_over, model_lag=None).drafter == "ngram"
    # the walk's check reads the bounds widest first and stops early: the same verdict as the bound
    assert not controller.first_token_pays(bound * 0.99) and controller.first_token_pays(bound)


def test_a_group_verified_together_expects_the_mean_of_its_rows():
    rows = [[0.9, 0.9, 0.9], [0.5], [], [1.0, 0.2]]
    pooled = expected_tokens_by_gamma(pooled_acceptance(rows))
    each = [expected_tokens_by_gamma(row) for row in rows]
    for gamma in range(4):
        mean = sum(expected[min(gamma, len(expected) - 1)] for expected in each) / len(rows)
        assert abs(pooled[gamma] - mean) < 1e-12
    assert pooled_acceptance([[], []]) == [] and pooled_acceptance([]) == []


def test_a_fixed_gamma_walks_as_far_as_it_asks():
    assert _controller().min_proposal_survival > 0
    fixed = GammaController(max_gamma=8, fixed_gamma=4)
    assert fixed.min_proposal_survival == 0.0 and fixed.min_first_acceptance() == 0.0
