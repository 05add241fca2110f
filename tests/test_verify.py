"""Verification rules on synthetic distributions: exact greedy match and lossless sampling."""

import numpy as np
import pytest
from scipy.stats import chisquare

from pocketspec.speculation.sampling import sample
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.verify import Verdict, verify_deterministic, verify_greedy, verify_logits, verify_sampled

NUM_DRAWS = 40_000


def test_greedy_accepts_matching_prefix_then_takes_target_choice():
    verdict = verify_greedy([5, 7, 9], [5, 7, 3, 8])
    assert (verdict.num_accepted, verdict.next_token) == (2, 3)
    assert verdict.emitted([5, 7, 9]) == [5, 7, 3]


def test_greedy_all_accepted_gives_bonus_token():
    verdict = verify_greedy([1, 2], [1, 2, 6])
    assert (verdict.num_accepted, verdict.next_token) == (2, 6)


def test_greedy_without_draft_is_plain_decoding():
    assert verify_greedy([], [4]).emitted([]) == [4]


def _first_token_histogram(draw, vocab_size):
    counts = np.zeros(vocab_size)
    for _ in range(NUM_DRAWS):
        counts[draw()] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_sampling_keeps_target_distribution(seed):
    rng = np.random.default_rng(seed)
    vocab_size = 6
    target = rng.dirichlet(np.ones(vocab_size))  # p, for position 0
    draft = rng.dirichlet(np.ones(vocab_size))  # q, deliberately different
    bonus = rng.dirichlet(np.ones(vocab_size))

    def first_emitted_token():
        drafted = int(rng.choice(vocab_size, p=draft))
        verdict = verify_sampled([drafted], draft[None, :], np.stack([target, bonus]), rng)
        return verdict.emitted([drafted])[0]

    counts = _first_token_histogram(first_emitted_token, vocab_size)
    assert chisquare(counts, target * NUM_DRAWS).pvalue > 1e-3


def test_speculative_sampling_second_position_keeps_target_distribution():
    """The token after an accepted draft must follow p at that position too."""
    rng = np.random.default_rng(7)
    vocab_size = 5
    target = rng.dirichlet(np.ones(vocab_size), size=3)
    draft = rng.dirichlet(np.ones(vocab_size), size=2)
    counts = np.zeros(vocab_size)
    num_second = 0
    for _ in range(NUM_DRAWS):
        drafted = [int(rng.choice(vocab_size, p=draft[i])) for i in range(2)]
        verdict = verify_sampled(drafted, draft, target, rng)
        emitted = verdict.emitted(drafted)
        if len(emitted) >= 2 and emitted[0] == drafted[0] and drafted[0] == 0:
            counts[emitted[1]] += 1
            num_second += 1
    assert num_second > 500
    assert chisquare(counts, target[1] * num_second).pvalue > 1e-3


def test_deterministic_draft_rule_keeps_target_distribution():
    rng = np.random.default_rng(3)
    vocab_size = 6
    target = rng.dirichlet(np.ones(vocab_size))
    bonus = rng.dirichlet(np.ones(vocab_size))

    def first_emitted_token():
        verdict = verify_deterministic([2], np.stack([target, bonus]), rng)
        return verdict.emitted([2])[0]

    counts = _first_token_histogram(first_emitted_token, vocab_size)
    assert chisquare(counts, target * NUM_DRAWS).pvalue > 1e-3


def test_a_point_mass_draft_emits_what_plain_sampling_with_the_same_seed_emits():
    """One draw per emitted token, as plain sampling: whatever γ each step drafts and whether its
    drafts are right, the seeded stream of tokens is the same."""
    rng = np.random.default_rng(8)
    rows = rng.dirichlet(np.ones(5) * 0.3, size=60)  # the target's distribution at each position
    plain_rng = np.random.default_rng(42)
    plain = [sample(row, plain_rng) for row in rows]
    spec_rng, emitted = np.random.default_rng(42), []
    while len(emitted) < 40:
        gamma = int(rng.integers(0, 6))
        position = len(emitted)
        # drafts that copy plain's tokens (as a good n-gram match would) or guess
        drafts = [plain[position + i] if rng.random() < 0.7 else int(rng.integers(0, 5)) for i in range(gamma)]
        emitted += verify_deterministic(drafts, rows[position:], spec_rng).emitted(drafts)
    assert emitted[:40] == plain[:40]


def test_sampling_chi_square_detects_a_wrong_rule():
    """The test has power: accepting every draft (a lossy rule) fails it."""
    rng = np.random.default_rng(0)
    target = np.array([0.7, 0.2, 0.1])
    draft = np.array([0.1, 0.2, 0.7])
    counts = np.zeros(3)
    for _ in range(5000):
        counts[int(rng.choice(3, p=draft))] += 1
    assert chisquare(counts, target * 5000).pvalue < 1e-6


def test_verify_logits_picks_the_rule_for_the_sampling_and_the_draft():
    logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]))
    greedy = verify_logits([1], None, logits, SamplingSettings(), np.random.default_rng(0))
    assert greedy == Verdict(1, 0)
    sampling = SamplingSettings(temperature=1.0)
    point_mass = verify_logits([1], None, logits, sampling, np.random.default_rng(0))
    assert point_mass == verify_deterministic([1], np.exp(logits), np.random.default_rng(0))
    draft_probs = np.array([[0.2, 0.5, 0.3]])
    sampled = verify_logits([1], draft_probs, logits, sampling, np.random.default_rng(3))
    assert sampled == verify_sampled([1], draft_probs, np.exp(logits), np.random.default_rng(3))


def test_a_rejection_at_the_first_row_never_computes_the_rows_after_it(monkeypatch):
    import pocketspec.speculation.verify as verify

    computed = []
    real = verify.distribution
    monkeypatch.setattr(verify, "distribution", lambda logits, sampling: computed.append(1) or real(logits, sampling))
    logits = np.zeros((32, 50), dtype=np.float32)
    logits[:, 7] = 30.0  # the target is sure of token 7 at every row
    sampling = SamplingSettings(temperature=1.0)
    verdict = verify_logits([3] * 31, None, logits, sampling, np.random.default_rng(0))
    assert verdict == Verdict(0, 7) and len(computed) == 1
