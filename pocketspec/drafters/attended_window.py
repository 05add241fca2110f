"""A self-sparse draft window that keeps the keys the target attended to most (--self-draft-keys attended).

StreamingLLM's window (draft_window.py) keeps the first tokens and the recent ones. This one keeps,
per layer and KV head, the positions the target's latest queries attended to most (SnapKV-style,
pocketspec/torch_model/attended_keys.py), then the recent tokens. Its cache, of capacity C:

    [ SELECTED_SHARE · C chosen keys | recent tokens ... room to draft ]

Both parts are copied from the target's own cache, so the draft starts from the keys and values of
full attention rather than its own approximations. While the context fits the cache, the window is
the whole context, as StreamingLLM's is. When a draft would not fit, the window is chosen again:
from the target's latest RECENT_SHARE · C cached tokens back, the target's last OBSERVED_TOKENS queries
rank the older positions. So a new choice is made every (1 − SELECTED_SHARE − RECENT_SHARE) · C
accepted tokens: every 64 with the default 256 positions.

The chosen keys differ by head, so the draft's token list holds stand-ins for them, negative
numbers no context has, new for each choice: a context that still continues the chosen past keeps
them, and any other context starts the window over.
"""

from __future__ import annotations

from typing import Sequence

from pocketspec.speculation.prefix import common_prefix_length

SELECTED_SHARE = 0.25  # of the window's positions, the keys chosen by attention
RECENT_SHARE = 0.5  # of the window's positions, the recent tokens copied with them; the rest is room to draft
OBSERVED_TOKENS = 16  # the target's latest cached tokens whose queries rank the older keys (SnapKV's window)


class AttendedWindow:
    def __init__(self, draft, target):
        """draft: a self-draft TorchBackend whose hold_attended_view copies from `target`, the target's backend."""
        self.draft = draft
        self.target = target
        self.selection: list[int] = []  # the draft cache's stand-ins for the chosen keys
        self.recent_start = 0  # the context position of the first recent token after them
        self.chosen_from: list[int] = []  # the context before recent_start, when they were chosen
        self.num_choices = 0

    @property
    def capacity(self) -> int:
        return self.draft.max_context

    def window(self, context: Sequence[int]) -> list[int]:
        """What the draft model sees of `context`: the chosen keys' stand-ins, then the recent tokens."""
        context = list(context)
        if self.selection and context[:self.recent_start] != self.chosen_from:
            self.reset()  # a different conversation: start the window over
        return self.selection + context[self.recent_start:]

    def _num_kept(self, window: list[int]) -> int:
        return min(common_prefix_length(self.draft.cached_tokens, window), len(window) - 1)

    def _holds_selection(self, window: list[int]) -> bool:
        """Whether the draft's cache still holds the chosen keys (a rollback below them drops them)."""
        return common_prefix_length(self.draft.cached_tokens, window) >= len(self.selection)

    def _needs_new_choice(self, context: Sequence[int], max_tokens: int) -> bool:
        window = self.window(context)
        return len(window) + max_tokens > self.capacity or not self._holds_selection(window)

    def _next_recent(self, context: Sequence[int]) -> tuple[int, int]:
        """Where a new choice would put the recent tokens: (recent_start, recent_end) in the target's cache."""
        recent_end = min(common_prefix_length(self.target.cached_tokens, context), len(context) - 1)
        return max(0, recent_end - int(RECENT_SHARE * self.capacity)), recent_end

    def _size_after_choice(self, context: Sequence[int]) -> int:
        recent_start, _ = self._next_recent(context)
        return min(int(SELECTED_SHARE * self.capacity), recent_start) + len(context) - recent_start

    def lag(self, context: Sequence[int]) -> int:
        """Tokens of `context` that a proposal would first have to feed to the draft model: after a new choice
        where even a one-token draft needs one (a context the draft never saw, longer than its cache, costs the
        few tokens past the target's cache, not the whole context)."""
        if self._needs_new_choice(context, 1):
            return len(context) - self._next_recent(context)[1] - 1
        window = self.window(context)
        return len(window) - self._num_kept(window) - 1

    def fits(self, context: Sequence[int], max_tokens: int) -> bool:
        return (len(self.window(context)) + max_tokens <= self.capacity
                or self._size_after_choice(context) + max_tokens <= self.capacity)

    def feed(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Make room for a draft of max_tokens after `context` (choose the keys again when it would not fit, or
        when the draft's cache lost them); the tokens the draft model must feed before its first proposal."""
        if self._needs_new_choice(context, max_tokens):
            self._choose(context)
        window = self.window(context)
        num_kept = self._num_kept(window)
        self.draft.rollback(num_kept)
        return window[num_kept:]

    def _choose(self, context: Sequence[int]) -> None:
        recent_start, recent_end = self._next_recent(context)
        num_selected = min(int(SELECTED_SHARE * self.capacity), recent_start)
        if num_selected == 0:  # the target holds too little of this context to choose from: the whole context
            self.reset()
            return
        self.num_choices += 1
        first = -self.num_choices * self.capacity  # stand-ins no token id or earlier choice uses
        self.selection = list(range(first, first - num_selected, -1))
        self.recent_start = recent_start
        self.chosen_from = list(context[:recent_start])
        num_observed = min(OBSERVED_TOKENS, recent_end)
        self.draft.hold_attended_view(self.selection, num_observed, recent_start, recent_end)

    def reset(self) -> None:
        self.selection, self.recent_start, self.chosen_from = [], 0, []
        self.draft.rollback(0)
