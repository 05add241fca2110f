"""A bounded corpus of earlier outputs for the suffix drafter, shared by a session's engines.

A server's requests and `generate --batch` prompts often repeat one another (the same code
rewritten, the same boilerplate). Every finished output is indexed here; each engine's
drafter (pocketspec/drafters/ngram.py) consults it beside its own context. A server runs its
engines on threads of their own, so lookups and additions take a lock (the single-entry reads
excepted); a lookup returns a copy. Past NGRAM_CORPUS_MAX_TOKENS (the memory planner counts the
full corpus) the oldest outputs are dropped, down to half the bound.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Sequence

from memplanner.terms import NGRAM_CORPUS_MAX_TOKENS
from pocketspec.drafters.suffix_index import SuffixIndex


class OutputCorpus:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._lock = threading.Lock()
        self._index = SuffixIndex(min_n, max_n)
        self._documents: deque[list[int]] = deque()
        self._num_tokens = 0  # a running count: summing the documents on every output would cost more

    def counts(self, key: bytes) -> dict[int, int] | None:
        """How often each token followed the n-gram `key` (suffix_index.ngram_key) in the remembered outputs (a
        copy: other engines may add to the corpus meanwhile); None when none did."""
        with self._lock:
            return self._index.counts(key)

    # Read without the lock (the walk asks for most tokens of a copy): each is one lookup in one dict,
    # atomic (the GIL; a free-threaded build locks the dict itself). While remember() rebuilds the index
    # they may answer from the part rebuilt so far: a draft may differ then, never the output.

    def only_followed_by(self, key: bytes, token: int) -> bool:
        """Whether every remembered output that continued the n-gram `key` continued it with `token` (so too
        when none did): counts() without building the counts."""
        return self._index.only_followed_by(key, token)

    def sole_token(self, key: bytes) -> int | None:
        """The one token the remembered outputs continued the n-gram `key` with, else None."""
        return self._index.sole_token(key)

    @property
    def num_tokens(self) -> int:
        """Tokens of the outputs remembered now."""
        return self._num_tokens

    def remember(self, tokens: Sequence[int]) -> None:
        if len(tokens) <= self.min_n:
            return
        with self._lock:
            self._documents.append(list(tokens))
            self._num_tokens += len(tokens)
            if self._num_tokens <= NGRAM_CORPUS_MAX_TOKENS:
                self._add(tokens)
                return
            while self._num_tokens > NGRAM_CORPUS_MAX_TOKENS // 2:
                self._num_tokens -= len(self._documents.popleft())
            self._index = SuffixIndex(self.min_n, self.max_n)
            for document in self._documents:
                self._add(document)

    def _add(self, tokens: Sequence[int]) -> None:
        self._index.extend(tokens)
        self._index.tokens.append(-1)  # a separator no n-gram crosses
