"""An incremental n-gram index over one token stream: every n-gram of the stream, with the tokens
that followed it (how often, and where last). The suffix drafter (pocketspec/drafters/ngram.py)
keeps one over its context; the shared corpus of earlier outputs (corpus.py) another."""

from __future__ import annotations

from array import array
from typing import Sequence

MAX_MATCH_LENGTH = 32  # backward extension stops here: longer matches are scored alike

# A sighting packs how often a token followed an n-gram and where it last did into one int:
# (latest end << COUNT_BITS) | count. An n-gram followed by one token only holds
# (sighting << TOKEN_BITS) | token.
COUNT_BITS = 32
COUNT_MASK = (1 << COUNT_BITS) - 1
TOKEN_BITS = 24  # every vocabulary is smaller than 16.7 M tokens
TOKEN_MASK = (1 << TOKEN_BITS) - 1
ONE_MORE = 1 << TOKEN_BITS  # a single follower's count + 1
TOKEN_TYPECODE = "i"  # a stream's tokens as 4-byte ints; a corpus separator (-1) packs apart from every token
TOKEN_BYTES = array(TOKEN_TYPECODE).itemsize


def token_array(tokens: Sequence[int] = ()) -> array:
    """Tokens in the index's packing: a slice of it is an n-gram's key at one C call (ngram_key)."""
    return array(TOKEN_TYPECODE, tokens)


def ngram_key(tokens: Sequence[int]) -> bytes:
    """The index's key of an n-gram: its tokens' bytes (a token_array's slice answers .tobytes() itself)."""
    return (tokens if isinstance(tokens, array) else token_array(tokens)).tobytes()


def sighting(count: int, end: int) -> int:
    return (end << COUNT_BITS) | count


def count_of(seen: int) -> int:
    return seen & COUNT_MASK


class SuffixIndex:
    """n-gram -> {next token: sighting} over one token stream (a sighting: count and latest end).

    The index holds bytes, ints and dicts of ints only, so the cyclic garbage collector tracks none of its
    keys and entries (only the dict itself, once an n-gram has several followers): with a list per entry
    every collection of the old generation walked each of them (a quarter of the speculative loop's host
    time in the replay of the recorded traces), and with tuples for keys each new key was walked once
    before it was untracked. Most n-grams of ordinary text are followed by one token only; such an
    n-gram holds one int, not a dict of one entry.
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: array = token_array()
        # ngram_key -> (sighting << TOKEN_BITS) | token while one token followed the n-gram, then {token: sighting}
        self._continuations: dict[bytes, int | dict[int, int]] = {}

    def followers(self, key: bytes) -> dict[int, int] | None:
        """{next token: sighting} after the n-gram `key`, for reading only; None when it was never followed."""
        entry = self._continuations.get(key)
        if entry is None or type(entry) is dict:
            return entry
        return {entry & TOKEN_MASK: entry >> TOKEN_BITS}

    def knows(self, key: bytes) -> bool:
        """Whether any token ever followed the n-gram `key`."""
        return key in self._continuations

    def only_followed_by(self, key: bytes, token: int) -> bool:
        """Whether every token that followed the n-gram `key` is `token` (so too when none did)."""
        entry = self._continuations.get(key)
        return entry is None or (type(entry) is int and entry & TOKEN_MASK == token)

    def sole_token(self, key: bytes) -> int | None:
        """The token that followed the n-gram `key`, where exactly one ever did, else None."""
        entry = self._continuations.get(key)
        return entry & TOKEN_MASK if type(entry) is int else None

    def sole_follower(self, key: bytes) -> tuple[int, int] | None:
        """(token, latest end) when exactly one token ever followed the n-gram `key`, else None (most n-grams
        of a copy: read without building a dict)."""
        entry = self._continuations.get(key)
        if type(entry) is not int:
            return None
        return entry & TOKEN_MASK, entry >> (TOKEN_BITS + COUNT_BITS)

    def counts(self, key: bytes) -> dict[int, int] | None:
        """{next token: how often it followed the n-gram `key`}, a new dict; None when it was never followed."""
        entry = self._continuations.get(key)
        if entry is None:
            return None
        if type(entry) is int:
            return {entry & TOKEN_MASK: (entry >> TOKEN_BITS) & COUNT_MASK}
        return {token: seen & COUNT_MASK for token, seen in entry.items()}

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Index new_tokens: each position adds up to one key an n."""
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        tokens, continuations, min_n, max_n = self.tokens, self._continuations, self.min_n, self.max_n
        # An n-gram ending at `end` continues with tokens[end]; the stream's own suffix has no
        # continuation yet, so a lookup never finds itself. The host indexes every prompt token
        # between a prompt's prefill and its first verify, and the accepted tokens every step, so
        # this loop is kept lean: the new tokens' bytes (and the max_n before them) are packed once,
        # and each key is one slice of them, shortest first.
        first_end = max(start, 1)
        base = max(0, first_end - max_n)
        packed = tokens[base:].tobytes()
        shortest = min_n * TOKEN_BYTES
        for end in range(first_end, len(tokens)):
            following = tokens[end]
            if following < 0:  # a corpus separator is never proposed
                continue
            first = ((end << COUNT_BITS) | 1) << TOKEN_BITS | following
            stop = (end - base) * TOKEN_BYTES
            for key_start in range(stop - shortest, max(0, stop - max_n * TOKEN_BYTES) - 1, -TOKEN_BYTES):
                key = packed[key_start:stop]
                entry = continuations.get(key)
                if entry is None:
                    continuations[key] = first
                elif type(entry) is int:
                    if entry & TOKEN_MASK == following:
                        continuations[key] = first + ((entry >> TOKEN_BITS) & COUNT_MASK) * ONE_MORE
                    else:
                        continuations[key] = {entry & TOKEN_MASK: entry >> TOKEN_BITS,
                                              following: (end << COUNT_BITS) | 1}
                else:
                    seen = entry.get(following)
                    entry[following] = (end << COUNT_BITS) | (1 if seen is None else (seen & COUNT_MASK) + 1)

    def backward_match(self, suffix: array, source_end: int, matched: int) -> int:
        """How far `suffix` (a token_array, already matched for `matched` tokens) agrees with tokens before
        source_end."""
        tokens = self.tokens
        limit = min(MAX_MATCH_LENGTH, len(suffix), source_end)
        if limit > matched and tokens[source_end - limit:source_end - matched] == suffix[len(suffix) - limit:
                                                                                        len(suffix) - matched]:
            return limit  # a verbatim copy, compared at once
        length = matched
        while length < limit and tokens[source_end - length - 1] == suffix[-length - 1]:
            length += 1
        return length
