"""pocketspec/drafters/suffix_index.py: what the index answers, and the memory the planner counts for it."""

from __future__ import annotations

import gc
import random
import tracemalloc

from memplanner.terms import NGRAM_INDEX_BYTES_PER_TOKEN
from pocketspec.drafters.suffix_index import SuffixIndex, count_of, ngram_key, sighting


def _followers_by_counting(tokens: list[int], key: tuple[int, ...]) -> dict[int, int]:
    """{next token: sighting(count, latest end)} by scanning the stream, the index's definition."""
    found: dict[int, list[int]] = {}
    for end in range(len(key), len(tokens)):
        if tuple(tokens[end - len(key):end]) == key and tokens[end] >= 0:
            seen = found.setdefault(tokens[end], [0, end])
            seen[0] += 1
            seen[1] = end
    return {token: sighting(*seen) for token, seen in found.items()}


def test_every_ngram_answers_its_followers_as_counted_one_and_several_alike():
    generator = random.Random(3)
    tokens = [generator.randrange(6) for _ in range(400)] + [-1] + [generator.randrange(6) for _ in range(50)]
    index = SuffixIndex(1, 4)
    for start in range(0, len(tokens), 37):  # extended in pieces, as a context grows
        index.extend(tokens[start:start + 37])
    keys = {tuple(tokens[end - n:end]) for n in range(1, 5) for end in range(n, len(tokens))}
    num_single = 0
    for key in keys:
        expected = _followers_by_counting(tokens, key)
        assert (index.followers(ngram_key(key)) or {}) == expected, key
        assert index.counts(ngram_key(key)) == {token: count_of(seen) for token, seen in expected.items()}, key
        num_single += len(expected) == 1
    assert num_single > 100 and len(keys) - num_single > 100  # both layouts were checked
    assert index.followers(ngram_key([7])) is None and index.counts(ngram_key([7])) is None


def test_the_planners_bytes_a_token_bound_the_index_of_text_where_every_ngram_is_new():
    generator = random.Random(0)
    tokens = [generator.randrange(150_000) for _ in range(8192)]  # random tokens: every n-gram new
    gc.collect()
    tracemalloc.start()
    try:
        index = SuffixIndex(1, 8)
        index.extend(tokens)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index.tokens) == len(tokens)
    assert 650 * len(tokens) < held <= NGRAM_INDEX_BYTES_PER_TOKEN * len(tokens)
