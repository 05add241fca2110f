"""The llama.cpp backend: one model, one context, one sequence (pocketspec/backends/llama_context.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from pocketspec.backends.base import CachedTokens
from pocketspec.backends.llama_context import LlamaModelContext, SequenceForward
from pocketspec.settings import ModelSettings

SEQUENCE = 0


class LlamaCppBackend(CachedTokens):
    def __init__(self, model_path: Path | str, settings: ModelSettings = ModelSettings()):
        super().__init__()
        self.settings = settings
        self.native = LlamaModelContext(model_path, settings)
        self.n_batch = self.native.n_batch
        self.tokenizer = self.native.tokenizer
        self.vocab_size = self.native.vocab_size
        self.model_path = self.native.model_path

    @property
    def max_context(self) -> int:
        return self.native.max_context

    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Logits [len(logits_rows), vocab], a view valid until the next call on this backend."""
        self.check_forward(tokens, logits_rows)
        logits, = self.native.decode([SequenceForward(SEQUENCE, len(self._cached), tokens, logits_rows)], copy=False)
        self._cached.extend(tokens)
        return logits

    def rollback(self, num_kept: int) -> None:
        if num_kept >= len(self._cached):
            return
        self.native.remove(SEQUENCE, num_kept)
        del self._cached[num_kept:]

    @property
    def can_shift(self) -> bool:
        return self.native.can_shift

    def shift_out(self, start: int, count: int) -> None:
        self.native.shift_out(SEQUENCE, start, count)
        del self._cached[start:start + count]

    def exact_verify_width(self, max_width: int) -> int:
        from pocketspec.backends.exact_width import exact_width

        return exact_width(self, max_width)

    def memory_report(self) -> dict[str, int]:
        return self.native.memory_report()

    def close(self) -> None:
        self.native.close()
