"""The draftless prompt-lookup drafter."""

import random

from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.drafters.suffix_index import MAX_MATCH_LENGTH


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
    assert kept._context is indexed and kept._context.tokens.tolist() == turn_two
    rewritten = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 8] + turn_two[15:]
    restarted = NgramDrafter(min_n=1, max_n=3)
    restarted.lookup(turn_one, 4)
    first_index = restarted._context
    restarted.begin(rewritten)
    assert restarted._context is not first_index and restarted._context.tokens.tolist() == rewritten
    for drafter, prompt in ((kept, turn_two), (restarted, rewritten)):
        for end in range(len(turn_one) + 1, len(prompt) + 1):
            assert drafter.lookup(prompt[:end], 4) == NgramDrafter(min_n=1, max_n=3).lookup(prompt[:end], 4)


def _reference_walk(context, documents, min_n, max_n, num_tokens):
    """What propose_scored must find, by scanning every sighting: each token follows the longest suffix (at most
    max_n) seen before, in the remembered documents or the context; the most seen follower, then the latest in
    the context; its share of the followers; and its match length, extended backwards along its latest
    sighting (at most MAX_MATCH_LENGTH) where the suffix was max_n long."""
    walked, proposed = list(context[-MAX_MATCH_LENGTH - 1:]), []
    for _ in range(num_tokens):
        for n in range(min(max_n, len(walked)), min_n - 1, -1):
            counts, latest = {}, {}
            for stream, in_context in [*((document, False) for document in documents), (context, True)]:
                for end in range(n, len(stream)):
                    if stream[end - n:end] == walked[-n:]:
                        counts[stream[end]] = counts.get(stream[end], 0) + 1
                        if in_context:
                            latest[stream[end]] = end
            if counts:
                break
        else:
            return proposed
        token = max(counts, key=lambda candidate: (counts[candidate], latest.get(candidate, -1)))
        length = n
        if n == max_n and token in latest:
            end, limit = latest[token], min(MAX_MATCH_LENGTH, len(walked), latest[token])
            while length < limit and context[end - length - 1] == walked[-length - 1]:
                length += 1
        proposed.append((token, length, counts[token] / sum(counts.values())))
        walked.append(token)
    return proposed


def test_a_walk_finds_what_a_scan_of_every_sighting_finds():
    """The walk bounds each lookup by the last one and extends a copy's match without comparing (ngram.py:
    _next); a scan of every sighting, over text that copies, repeats itself and forks, must find the same
    tokens and the same evidence."""
    generator = random.Random(11)
    for min_n, max_n in ((1, 8), (2, 4)):
        for _ in range(3):
            text = [generator.randrange(5) for _ in range(40)]
            while len(text) < 150:  # copies of earlier spans, some of them changed in one token
                start = generator.randrange(len(text) - 20)
                span = text[start:start + generator.randrange(5, 40)]
                if generator.random() < 0.5:
                    span[generator.randrange(len(span))] = generator.randrange(5)
                text += span
            documents = [text[10:60], [generator.randrange(5) for _ in range(30)]]
            drafter = NgramDrafter(min_n=min_n, max_n=max_n)
            for document in documents:
                drafter.remember(document)
            for end in [*range(2, 60, 5), *range(60, len(text), 9)]:
                proposal = drafter.propose_scored(text[:end], 24)
                assert [(token, evidence.match_length, evidence.share) for token, evidence
                        in zip(proposal.tokens, proposal.evidence)] == \
                    _reference_walk(text[:end], documents, min_n, max_n, 24), (min_n, max_n, end)
