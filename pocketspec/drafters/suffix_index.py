"""An incremental n-gram index over one token stream: every n-gram of the stream, with the tokens
that followed it (how often, and where last). The suffix drafter (pocketspec/drafters/ngram.py)
keeps one over its context; the shared corpus of earlier outputs (corpus.py) another."""

from __future__ import annotations

import gc
from typing import Sequence

MAX_MATCH_LENGTH = 32  # backward extension stops here: longer matches are scored alike


class SuffixIndex:
    """n-gram -> {next token: [count, latest end]} over one token stream.

    Most n-grams of ordinary text are followed by one token only. Such an n-gram holds a flat
    [next token, count, latest end] instead of a dict of one entry: a dict costs 224 bytes more
    (CPython 3.11), and a context's index held 2.5-3.3 KB a token before (tracemalloc, n = 1..8, on
    the recorded traces' most varied text and on random tokens), about half of it after.
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # a flat [next token, count, latest end] while one token followed the n-gram, then a dict
        self._continuations: dict[tuple[int, ...], list[int] | dict[int, list[int]]] = {}

    def followers(self, key: tuple[int, ...]) -> dict[int, list[int]] | None:
        """{next token: [count, latest end]} after the n-gram `key`, for reading only; None when it was
        never followed."""
        entry = self._continuations.get(key)
        if entry is None or type(entry) is dict:
            return entry
        return {entry[0]: entry[1:]}

    def extend(self, new_tokens: Sequence[int]) -> None:
        was_collecting = gc.isenabled()
        gc.disable()  # see _extend
        try:
            self._extend(new_tokens)
        finally:
            if was_collecting:
                gc.enable()

    def _extend(self, new_tokens: Sequence[int]) -> None:
        """Index new_tokens. Each position adds up to one small container an n, and the cyclic garbage
        collector, counting them, would walk the young objects every 700 of them: indexing a prompt ran
        at 3-5 µs a token with it and 2.3 without (this EPYC). Nothing here forms a cycle, so the
        collection is put off until the index is extended, not skipped."""
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        tokens, continuations, min_n, max_n = self.tokens, self._continuations, self.min_n, self.max_n
        # An n-gram ending at `end` continues with tokens[end]; the stream's own suffix has no
        # continuation yet, so a lookup never finds itself. The host indexes every prompt token
        # between a prompt's prefill and its first verify, so this loop is kept lean: one window
        # per position, its n-grams sliced from it.
        for end in range(max(start, 1), len(tokens)):
            following = tokens[end]
            if following < 0:  # a corpus separator is never proposed
                continue
            window = tuple(tokens[max(0, end - max_n):end])
            size = len(window)
            for n in range(min_n, size + 1):
                key = window[size - n:]
                entry = continuations.get(key)
                if entry is None:
                    continuations[key] = [following, 1, end]
                    continue
                if type(entry) is list:
                    if entry[0] == following:
                        entry[1] += 1
                        entry[2] = end
                    else:
                        continuations[key] = {entry[0]: entry[1:], following: [1, end]}
                    continue
                seen = entry.get(following)
                if seen is None:
                    entry[following] = [1, end]
                else:
                    seen[0] += 1
                    seen[1] = end

    def backward_match(self, suffix: Sequence[int], source_end: int, matched: int) -> int:
        """How far `suffix` (already matched for `matched` tokens) agrees with tokens before source_end."""
        tokens = self.tokens
        length = matched
        while (length < MAX_MATCH_LENGTH and length < len(suffix) and source_end - length - 1 >= 0
               and tokens[source_end - length - 1] == suffix[-length - 1]):
            length += 1
        return length
