"""The backend interface every engine step goes through; rollback is explicit.

A backend owns one model and one KV cache for one sequence. The engine never
knows whether rollback moves a position (torch) or calls llama_memory_seq_rm
(llama.cpp).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np


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

    def rollback(self, num_kept: int) -> None:
        """Drop every cached token at position >= num_kept."""

    def shift_out(self, start: int, count: int) -> None:
        """Drop `count` cached tokens from `start` and move the later ones down (a sliding window)."""

    def exact_verify_width(self, max_width: int) -> int:
        """Widest forward (<= max_width) whose logits equal one-token forwards bit for bit."""

    def memory_report(self) -> dict[str, int]:
        """Bytes held by this backend, by term (weights, kv_cache, compute, logits)."""

    def close(self) -> None:
        """Free native resources; safe to call twice."""
