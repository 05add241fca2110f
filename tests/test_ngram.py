"""The draftless prompt-lookup drafter."""

from pocketspec.drafters.ngram import NgramDrafter


def test_copies_what_followed_the_last_occurrence():
    drafter = NgramDrafter(min_n=2, max_n=3)
    context = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert drafter.lookup(context, 3) == [4, 5, 9]


def test_prefers_longest_match_and_latest_occurrence():
    drafter = NgramDrafter(min_n=1, max_n=3)
    context = [7, 8, 1, 9, 6, 8, 1, 4, 6, 8, 1]
    # [6, 8, 1] occurred at 4..6 and was followed by 4
    assert drafter.lookup(context, 2) == [4, 6]


def test_no_match_proposes_nothing():
    drafter = NgramDrafter(min_n=2, max_n=3)
    assert drafter.lookup([1, 2, 3, 4], 4) == []


def test_never_matches_the_suffix_itself():
    drafter = NgramDrafter(min_n=2, max_n=2)
    assert drafter.lookup([5, 6], 3) == []


def test_incremental_index_equals_fresh_index():
    context = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    incremental = NgramDrafter(min_n=1, max_n=3)
    for end in range(2, len(context) + 1):
        fresh = NgramDrafter(min_n=1, max_n=3)
        assert incremental.lookup(context[:end], 4) == fresh.lookup(context[:end], 4)


def test_rewritten_context_rebuilds_the_index():
    drafter = NgramDrafter(min_n=2, max_n=2)
    drafter.lookup([1, 2, 3, 1, 2], 2)
    assert drafter.lookup([4, 5, 6, 4, 5], 2) == [6, 4]


def test_a_short_period_repetition_is_continued_periodically():
    drafter = NgramDrafter(min_n=2, max_n=3)
    assert drafter.lookup([9, 1, 2, 3, 1, 2, 3, 1, 2], 7) == [3, 1, 2, 3, 1, 2, 3]


def test_a_prompt_that_extends_the_indexed_context_keeps_its_index_and_proposes_as_a_fresh_one():
    """A chat's next turn indexes only what it adds; a prompt that rewrites anything starts afresh. Either
    way the proposals are a fresh drafter's."""
    turn_one = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    kept = NgramDrafter(min_n=1, max_n=3)
    kept.lookup(turn_one, 4)
    indexed = kept._context
    turn_two = turn_one + [3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    kept.begin(turn_two)  # indexes the prompt now, with the prefill
    assert kept._context is indexed and kept._context.tokens == turn_two
    rewritten = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 8] + turn_two[15:]
    restarted = NgramDrafter(min_n=1, max_n=3)
    restarted.lookup(turn_one, 4)
    first_index = restarted._context
    restarted.begin(rewritten)
    assert restarted._context is not first_index and restarted._context.tokens == rewritten
    for drafter, prompt in ((kept, turn_two), (restarted, rewritten)):
        for end in range(len(turn_one) + 1, len(prompt) + 1):
            assert drafter.lookup(prompt[:end], 4) == NgramDrafter(min_n=1, max_n=3).lookup(prompt[:end], 4)
