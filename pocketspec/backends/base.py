"""The backend interface every engine step goes through; rollback is explicit.

A backend owns one model and one KV cache for one sequence. The engine never
knows whether rollback moves a position (torch) or calls llama_memory_seq_rm
(llama.cpp). CachedTokens holds what the backends share: the cached tokens, the
checks before a forward, prefill in n_batch chunks and closing on leaving a `with`.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np

from pocketspec.errors import ContextFullError
from pocketspec.speculation.draws import SeededDraws
from pocketspec.speculation.sampling import choose_token
from pocketspec.settings import SamplingSettings
from pocketspec.speculation.verify import Verdict, verify_logits


class Backend(Protocol):
    """One model with one KV cache. Positions count tokens held in the cache."""

    vocab_size: int

    @property
    def num_cached(self) -> int:
        """Number of tokens currently held in the KV cache."""

    @property
    def max_context(self) -> int:
        """Most tokens the KV cache can hold."""

    @property
    def max_logits_rows(self) -> int:
        """Most logits rows one forward may return (the widest verify)."""

    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the cache; return logits at the given row indices only.

        Returns float32 [len(logits_rows), vocab]. Row i is the distribution over
        the token that follows tokens[logits_rows[i]].
        """

    def prefill(self, tokens: Sequence[int], should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Append a (long) prompt in n_batch chunks; return logits of the last token [vocab].

        Returns None when should_stop(), asked between chunks, says to stop.
        """

    def verify(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> Verdict:
        """Append tokens = [pending, *draft] and return the verdict on the draft (pocketspec/speculation/verify.py's
        rule; a torch static step applies it on the device and reads back two integers), row 0's token drawn
        at draws' position."""

    def choose(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> int:
        """Append tokens (any number); the token chosen after them, drawn at draws' position."""

    def rollback(self, num_kept: int) -> None:
        """Drop every cached token at position >= num_kept."""

    def shift_out(self, start: int, count: int) -> None:
        """Drop `count` cached tokens from `start` and move the later ones down (a sliding window)."""

    def exact_verify_width(self, max_width: int, on_measure=None) -> int:
        """Widest forward (<= max_width) whose logits equal one-token forwards bit for bit; on_measure(line):
        told before a probe that takes seconds."""

    def memory_report(self) -> dict[str, int]:
        """Bytes held by this backend, by term (weights, kv_cache, compute, logits)."""

    def close(self) -> None:
        """Free native resources; safe to call twice."""


class CachedTokens:
    """The token bookkeeping both backends share. A subclass sets `settings` (ModelSettings) and
    `n_batch`, and implements max_context, forward, rollback, shift_out and close."""

    settings: object
    n_batch: int

    def __init__(self) -> None:
        self._cached: list[int] = []
        self._exact_widths: dict[int, int] = {}
        self.notes: list[str] = []  # what opening decided that the user should hear (a compile fallback)

    @property
    def cached_tokens(self) -> list[int]:
        return self._cached

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def max_logits_rows(self) -> int:
        return self.settings.max_logits_rows

    def check_forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> None:
        """Refuse a forward this backend cannot run, before it changes anything (llama.cpp aborts
        the whole process with GGML_ASSERT past its n_outputs_max logits rows)."""
        num_tokens = len(tokens)
        if num_tokens > self.n_batch:
            raise ValueError(f"{num_tokens} tokens exceed n_batch {self.n_batch}; use prefill")
        if len(logits_rows) > self.max_logits_rows:
            raise ValueError(f"{len(logits_rows)} logits rows exceed max_logits_rows {self.max_logits_rows}")
        if len(self._cached) + num_tokens > self.max_context:
            raise ContextFullError(f"{len(self._cached)} + {num_tokens} tokens exceed the "
                                   f"{self.max_context}-token context")

    def prefill(self, tokens: Sequence[int], should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Logits after the last token, or None when should_stop() said so between n_batch chunks. The last
        token rides in the last chunk, which returns its logits row: a one-token forward of its own cost
        18 ms more per prompt than its row in the chunk (qwen 1.5B, 2 CPU threads, 83-token prompts)."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        last_start = (len(tokens) - 1) // self.n_batch * self.n_batch
        if last_start and not self.prefill_all_but_last(tokens[:last_start + 1], should_stop):
            return None
        last_chunk = tokens[last_start:]
        return self.forward(last_chunk, [len(last_chunk) - 1])[0]

    def prefill_all_but_last(self, tokens: Sequence[int], should_stop: Callable[[], bool] | None = None) -> bool:
        """Append every token but the last in n_batch chunks, without logits; False when should_stop() said so."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        for chunk_start in range(0, len(tokens) - 1, self.n_batch):
            self.forward(tokens[chunk_start:min(chunk_start + self.n_batch, len(tokens) - 1)], [])
            if should_stop is not None and should_stop():
                return False
        return True

    def verify(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> Verdict:
        """The verdict on tokens = [pending, *draft], from logits brought to the host."""
        logits = self.forward(tokens, range(len(tokens)))  # [γ + 1, vocab]
        return verify_logits(tokens[1:], logits, sampling, draws)

    def choose(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> int:
        """The token after `tokens`, chosen on the host from their last logits."""
        return choose_token(self.prefill(tokens), sampling, draws)

    def exact_verify_width(self, max_width: int, on_measure=None) -> int:
        """Probed once per width on this backend (batched vs one-token logits, bit for bit); llama.cpp's
        caches the probe across runs instead."""
        from pocketspec.backends.exact_width import probe_exact_width

        if max_width not in self._exact_widths:
            self._exact_widths[max_width] = probe_exact_width(self, max_width)
        return self._exact_widths[max_width]

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
