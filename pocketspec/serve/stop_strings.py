"""Text cut before the first stop string, as it streams in pieces.

The first stop string is the one that *completes* first as the text grows, as OpenAI-compatible
servers stop generating there (of two that complete at the same character, the one that starts
earlier, the longer one). The text ends where that one starts. The rule is about characters, not
pieces, so a streamed and a whole answer are cut alike whatever the split: a stop string may span
pieces (tokens), and the tail of what arrived that could still become the start of one is held
back until the next piece decides. The text handed on never contains a stop string.
"""

from __future__ import annotations

from typing import Sequence


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the stop string that completes first in `text` begins, if any.

    'baa' with stops ['a', 'baa'] stops at 1: generation ends when 'ba' has 'a' complete, before
    'baa' could."""
    found = [(start + len(stop), start) for stop in stops if (start := text.find(stop)) >= 0]
    return min(found)[1] if found else None


def held_length(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` are a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


class StopText:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.is_stopped = False  # a stop string was seen: nothing more is handed on
        self._held = ""

    def push(self, text: str) -> str:
        """The part of what came so far that is safe to hand on now."""
        if self.is_stopped or not text:
            return ""
        text = self._held + text
        stop_at = first_stop(text, self.stops)
        if stop_at is not None:
            self.is_stopped, self._held = True, ""
            return text[:stop_at]
        num_held = held_length(text, self.stops)
        self._held = text[len(text) - num_held:]
        return text[:len(text) - num_held]

    def finish(self) -> str:
        """What was held back, now that no more text comes."""
        held, self._held = self._held, ""
        return "" if self.is_stopped else held
