"""How every bench runner counts its decode tokens: one rule, pocketspec.stats.decode_token_count."""

from pocketspec.stats import GenerationStats, decode_token_count


def test_the_prefills_token_is_not_a_decode_token():
    assert decode_token_count(13, is_ended_by_end_token=False) == 12


def test_an_end_token_counts_as_the_decode_step_that_produced_it():
    # 12 decode steps gave tokens 2..13, a 13th gave the end token: 13 steps, 13 tokens
    assert decode_token_count(13, is_ended_by_end_token=True) == 13


def test_an_end_token_from_the_prefill_leaves_no_decode_token():
    assert decode_token_count(0, is_ended_by_end_token=True) == 0
    assert decode_token_count(0, is_ended_by_end_token=False) == 0


def test_a_first_chunk_of_several_tokens_is_all_prefill():
    assert decode_token_count(10, is_ended_by_end_token=True, num_first_tokens=3) == 8


def test_the_decode_rate_divides_those_tokens_by_the_decode_seconds():
    stats = GenerationStats(num_tokens=13, is_ended_by_end_token=True, seconds=1.5, prefill_seconds=0.2)
    assert stats.num_decode_tokens == 13
    assert abs(stats.decode_tokens_per_second - 13 / 1.3) < 1e-9
    assert GenerationStats(num_tokens=1, seconds=1.0, prefill_seconds=1.0).decode_tokens_per_second == 0.0
