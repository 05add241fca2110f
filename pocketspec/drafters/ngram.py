"""Draftless prompt-lookup drafting: copy what followed the last occurrence of the current suffix.

An incremental index maps every n-gram (n in [min_n, max_n]) to the position
right after its latest occurrence, so a lookup costs O(max_n) per step.
"""

from __future__ import annotations

from typing import Sequence

from pocketspec.drafters.base import Draft


class NgramDrafter:
    name = "ngram"
    has_probs = False

    def __init__(self, min_n: int = 2, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.reset()

    def reset(self) -> None:
        self._tokens: list[int] = []
        self._continuation_at: dict[tuple[int, ...], int] = {}

    def _index(self, context: Sequence[int]) -> None:
        num_indexed = len(self._tokens)
        recent = max(0, num_indexed - self.max_n)
        if len(context) < num_indexed or list(context[recent:num_indexed]) != self._tokens[recent:]:
            self.reset()  # the context was rewritten, not extended
            num_indexed = 0
        self._tokens.extend(context[num_indexed:])
        # An n-gram ending at `end` continues at `end`; the context's own suffix
        # (end == len) is left out so a lookup never finds itself.
        for end in range(num_indexed, len(self._tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._continuation_at[tuple(self._tokens[end - n:end])] = end

    def lookup(self, context: Sequence[int], max_tokens: int) -> list[int]:
        if max_tokens <= 0 or len(context) < self.min_n:
            return []
        self._index(context)
        for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
            start = self._continuation_at.get(tuple(context[-n:]))
            if start is not None:
                proposal = list(self._tokens[start:start + max_tokens])
                # A match that ends close to the end is a repetition with period len - start:
                # continue it periodically instead of stopping at the end of the context.
                period = len(self._tokens) - start
                while len(proposal) < max_tokens:
                    proposal.append(proposal[len(proposal) - period])
                return proposal
        return []

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(tokens=self.lookup(context, max_tokens))

    def close(self) -> None:
        self.reset()
