"""What a draft model's KV cache holds of a context, for one sequence.

The cache follows the context lazily: before drafting it keeps its longest common prefix with
the context, rolls back the rest and catches up in one pass. When the plan gives the draft a
context shorter than the target's, the draft sees a sliding window: the first
ATTENTION_SINK_TOKENS tokens plus the most recent ones (StreamingLLM attention sinks, as MagicDec
drafts with), shifted in its cache. ModelDrafter keeps one window; a batch's draft model one per row.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from memplanner.defaults import ATTENTION_SINK_TOKENS, SLIDE_SLACK_TOKENS
from pocketspec.speculation.prefix import common_prefix_length


class DraftCache(Protocol):
    """One sequence's draft KV cache (a Backend, or one row of a batch's draft model)."""

    cached_tokens: list[int]
    max_context: int

    def rollback(self, num_kept: int) -> None: ...

    def shift_out(self, start: int, count: int) -> None:
        """Drop `count` cached tokens from `start` and move the later ones down."""


class DraftWindow:
    def __init__(self, cache: DraftCache):
        self.cache = cache
        self.num_dropped = 0  # context tokens after the sinks that the window no longer holds

    def window(self, context: Sequence[int]) -> list[int]:
        """What the draft model sees of `context`: sinks, then everything after the dropped span."""
        context = list(context)
        cached_sinks = self.cache.cached_tokens[:ATTENTION_SINK_TOKENS]
        if self.num_dropped and (len(context) < ATTENTION_SINK_TOKENS + self.num_dropped
                                 or (len(cached_sinks) == ATTENTION_SINK_TOKENS
                                     and context[:ATTENTION_SINK_TOKENS] != cached_sinks)):
            self.reset()  # a different conversation: start the window over
        return context[:ATTENTION_SINK_TOKENS] + context[ATTENTION_SINK_TOKENS + self.num_dropped:]

    def _num_kept(self, window: list[int]) -> int:
        return min(common_prefix_length(self.cache.cached_tokens, window), len(window) - 1)

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model: after the slide even a
        one-token draft needs (a context longer than the draft's cache costs the window, not the whole context)."""
        window = self.window(context)
        num_dropping, num_kept, _ = self._slide(len(window), self._num_kept(window), 1)
        return len(window) - num_dropping - num_kept - 1

    def _slide(self, window_size: int, num_kept: int, max_tokens: int) -> tuple[int, int, bool]:
        """For a draft of max_tokens after a window of window_size tokens of which the cache holds num_kept:
        (tokens to drop after the sinks, cached tokens kept then, whether the kept ones shift down)."""
        overflow = window_size + max_tokens - self.cache.max_context
        if overflow <= 0:
            return 0, num_kept, False
        num_dropping = overflow + SLIDE_SLACK_TOKENS
        if num_kept - ATTENTION_SINK_TOKENS >= num_dropping:
            return num_dropping, num_kept - num_dropping, True
        return num_dropping, min(num_kept, ATTENTION_SINK_TOKENS), False

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        """Whether a draft of max_tokens after `context` fits: in the window as it is, or beside the sinks
        and a slide's slack (checked first: it needs no copy of the window)."""
        return (ATTENTION_SINK_TOKENS + SLIDE_SLACK_TOKENS + max_tokens + 1 < self.cache.max_context
                or len(self.window(context)) + max_tokens <= self.cache.max_context)

    def feed(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Make room for a draft of max_tokens after `context` (roll back what differs, slide the window
        when full); the tokens the draft model must feed before its first proposal."""
        window = self.window(context)
        num_kept = self._num_kept(window)
        self.cache.rollback(num_kept)
        num_dropping, num_kept, shifts = self._slide(len(window), num_kept, max_tokens)
        if num_dropping:
            if shifts:
                self.cache.shift_out(ATTENTION_SINK_TOKENS, num_dropping)
            else:
                self.cache.rollback(num_kept)
            self.num_dropped += num_dropping
            window = self.window(context)
        return window[num_kept:]

    def reset(self) -> None:
        self.num_dropped = 0
        self.cache.rollback(0)
