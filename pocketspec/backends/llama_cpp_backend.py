"""The llama.cpp backend: one sequence of a llama.cpp context (pocketspec/backends/llama_context.py).

LlamaCppBackend owns a context of one sequence. A LlamaSequence of a context of several (a batch's,
pocketspec/batch/llama_rows.py) stands for one of its rows alone, to measure it before any request;
that context's owner closes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pocketspec.backends.base import CachedTokens
from pocketspec.backends.llama_context import LlamaModelContext, SequenceForward
from pocketspec.settings import ModelSettings


class LlamaSequence(CachedTokens):
    """Sequence `sequence_id` of a context, as the Backend protocol describes one backend."""

    def __init__(self, native: LlamaModelContext, sequence_id: int = 0):
        super().__init__()
        self.native = native
        self.sequence_id = sequence_id
        self.settings = native.settings
        self.n_batch = native.n_batch
        self.tokenizer = native.tokenizer
        self.vocab_size = native.vocab_size
        self.model_path = native.model_path

    @property
    def max_context(self) -> int:
        return self.native.max_context

    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Logits [len(logits_rows), vocab]: a view valid until the next call on this backend."""
        self.check_forward(tokens, logits_rows)
        forward = SequenceForward(self.sequence_id, len(self._cached), tokens, logits_rows)
        logits, = self.native.decode([forward], copy=False)
        self._cached.extend(tokens)
        return logits

    def rollback(self, num_kept: int) -> None:
        if num_kept >= len(self._cached):
            return
        self.native.remove(self.sequence_id, num_kept)
        del self._cached[num_kept:]

    @property
    def can_shift(self) -> bool:
        return self.native.can_shift

    def shift_out(self, start: int, count: int) -> None:
        self.native.shift_out(self.sequence_id, start, count)
        del self._cached[start:start + count]

    def exact_verify_width(self, max_width: int, on_measure=None) -> int:
        from pocketspec.backends.exact_width import exact_width

        return exact_width(self, max_width, on_measure)

    def memory_report(self) -> dict[str, int]:
        """The whole context's bytes (every sequence's)."""
        return self.native.memory_report()

    def close(self) -> None:
        """A shared context outlives its sequences: its owner closes it."""


class LlamaCppBackend(LlamaSequence):
    """One model, one context of one sequence, owned and closed by this backend."""

    def __init__(self, model_path: Path | str, settings: ModelSettings = ModelSettings()):
        super().__init__(LlamaModelContext(model_path, settings))

    def close(self) -> None:
        self.native.close()
