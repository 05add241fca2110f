"""The stand-in target benchmarks/replay_drafting.py runs the real engine against: its logits pick the
recorded next token, and each forward takes the cost table's time for its width and depth on a
virtual clock.

Its verdict on a verify is reached as one of two backends reaches it: on the host from vocabulary-wide
logits rows (llama.cpp, and torch's dynamic step: up to 33 rows of 152k floats, 20 MB a step, which
also evict the engine's own data from the host's caches), or as a torch static step reaches it on the
device (verdict_on_device), where the host reads back two integers and never sees the logits. The
engine's host time on a GPU is measured with the second."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from memplanner.measured_costs import MeasuredCosts
from pocketspec.backends.base import CachedTokens
from pocketspec.speculation.prefix import common_prefix_length
from pocketspec.speculation.verify import verify_greedy


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ReplayTokenizer:
    def is_end_of_generation(self, token: int) -> bool:
        return False


class ReplayTarget(CachedTokens):
    """A target whose every logits row picks the recorded continuation, at the table's cost."""

    n_batch = 512

    def __init__(self, costs: MeasuredCosts, clock: VirtualClock, vocab_size: int, max_context: int = 1 << 16,
                 max_logits_rows: int = 32, exact_width: int | None = None, exact_until: int | None = None,
                 verdict_on_device: bool = False):
        super().__init__()
        self.verdict_on_device = verdict_on_device
        self.exact_width, self.exact_until = exact_width, exact_until
        self.stayed_exact = True
        self.costs, self.clock = costs, clock
        self.vocab_size = vocab_size
        self.tokenizer = ReplayTokenizer()
        self._max_context = max_context
        self._max_logits_rows = max_logits_rows
        self.truth: list[int] = []
        self.widths: Counter = Counter()
        self.past_match_seconds = 0.0
        self.stand_in_wall_seconds = 0.0  # the wall time this stand-in took: its logits and the host verdicts
        self.process_time = None  # clock_noise.ProcessTime: the process's wandering speed (None: the table's)
        self.process_started = 0.0  # the virtual time the process started at

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def max_logits_rows(self) -> int:
        return self._max_logits_rows

    def follow(self, tokens: list[int]) -> None:
        self.truth = list(tokens)

    def _next_after(self, position: int) -> int:
        following = position + 1
        return self.truth[following] if following < len(self.truth) else self.vocab_size - 1

    def _logits(self, positions) -> np.ndarray:
        logits = np.zeros((len(positions), self.vocab_size), dtype=np.float32)  # [rows, vocab]
        for row, position in enumerate(positions):
            logits[row, self._next_after(position)] = 1.0
        return logits

    def rounds_like_one_token(self, start: int, width: int) -> bool:
        if width == 1 or self.exact_width is None:
            return True
        return width <= self.exact_width and (self.exact_until is None or start + width <= self.exact_until)

    def forward(self, tokens, logits_rows) -> np.ndarray:
        start = self._advance(tokens)
        return self._logits([start + row for row in logits_rows])

    def _advance(self, tokens) -> int:
        """A forward of `tokens` on the virtual clock, with the replay's reports (its width, its time past the
        match, whether it rounds like one-token forwards); the cached depth it started from."""
        start = len(self._cached)
        self.stayed_exact = self.stayed_exact and self.rounds_like_one_token(start, len(tokens))
        seconds = self.costs.forward_seconds(len(tokens), start)
        num_matched = common_prefix_length(list(tokens[1:]), self.truth[start + 1:])
        # the cheapest verify that still holds the accepted drafts (a wider one may cost less)
        needed = min(self.costs.forward_seconds(width, start) for width in range(num_matched + 1, len(tokens) + 1))
        if self.process_time is not None:
            factor = self.process_time.factor(self.clock.now - self.process_started)
            seconds, needed = seconds * factor, needed * factor
        self.past_match_seconds += seconds - needed
        self.clock.now += seconds
        self.widths[len(tokens)] += 1
        self._cached.extend(tokens)
        return start

    def prefill(self, tokens, should_stop=None) -> np.ndarray:
        started = time.perf_counter()
        self._cached.extend(tokens)
        logits = self._logits([len(self._cached) - 1])[0]
        self.stand_in_wall_seconds += time.perf_counter() - started
        return logits

    def verify(self, tokens, sampling, draws):
        """The forward and its verdict: from logits on the host, or from the recorded tokens alone where the
        verdict is on the device (greedy only: the recorded run was)."""
        started = time.perf_counter()
        if self.verdict_on_device:
            if not sampling.is_greedy:
                raise ValueError("a verdict on the device is replayed at temperature 0 only")
            start = self._advance(tokens)
            verdict = verify_greedy(tokens[1:], [self._next_after(start + row) for row in range(len(tokens))])
        else:
            verdict = super().verify(tokens, sampling, draws)
        self.stand_in_wall_seconds += time.perf_counter() - started
        return verdict

    def rollback(self, num_kept: int) -> None:
        del self._cached[num_kept:]

    def exact_verify_width(self, max_width: int, on_measure=None) -> int:
        """As pocketspec/backends/exact_width.py probes it: the width exact both early and deep."""
        if self.exact_width is None:
            return max_width
        return min(max_width, 1 if self.exact_until is not None else self.exact_width)

    def close(self) -> None:
        pass
