"""The rows of one llama.cpp context, a sequence each, as the batch engine's target or draft model.

BatchEngine (pocketspec/batch/engine.py) and its scheduler decide which rows step together;
`forward` then carries every row's new tokens in one llama_decode (several only past n_batch
tokens or the context's logits rows), and each row rolls back on its own (llama_memory_seq_rm).
No thread waits inside a forward: the one loop drives the decode. Like a verify on llama.cpp, a
decode of several rows runs the batched kernels, which round differently from one-token decoding,
so a row's greedy tokens can differ from the same prompt alone where the target's two best
logits are within that rounding (tests/test_llama_rows.py checks exactly that).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pocketspec.backends.llama_context import LlamaModelContext, SequenceForward, decode_groups
from pocketspec.batch.forward_shape import AlignmentTimer, AttentionShape
from pocketspec.errors import ContextFullError
from pocketspec.speculation.prefix import common_prefix_length


class LlamaRows:
    decode_shape = AttentionShape(is_blockwise=False)  # the scheduler groups by length in units of its key_block

    def __init__(self, native: LlamaModelContext):
        self.native = native
        self.cached: list[list[int]] = [[] for _ in range(native.num_sequences)]
        self.max_context = native.max_context
        self.n_batch = native.n_batch
        self.timer = AlignmentTimer()  # rows need no aligning on llama.cpp: its total stays 0

    @property
    def num_rows(self) -> int:
        return len(self.cached)

    @property
    def max_logits_rows(self) -> int:
        """Logits rows one row may ask for in a forward (its widest verify)."""
        return self.native.settings.max_logits_rows

    def num_cached(self, row: int) -> int:
        return len(self.cached[row])

    def reusable_prefix(self, row: int, prompt: Sequence[int]) -> int:
        """Leading tokens of `prompt` that `row` holds, leaving at least one to prefill (its logits start decoding)."""
        return min(common_prefix_length(self.cached[row], prompt), len(prompt) - 1)

    def rollback(self, row: int, num_kept: int) -> None:
        if num_kept < len(self.cached[row]):
            self.native.remove(row, num_kept)
            del self.cached[row][num_kept:]

    def shift_out(self, row: int, start: int, count: int) -> None:
        """Drop `count` cached tokens of `row` from `start` and move the later ones down (a draft's window)."""
        self.native.shift_out(row, start, count)
        del self.cached[row][start:start + count]

    def _decode(self, forwards: list[SequenceForward]) -> list[np.ndarray]:
        for forward in forwards:
            if forward.start + len(forward.tokens) > self.max_context:
                raise ContextFullError(f"row {forward.sequence_id}: {forward.start} + {len(forward.tokens)} tokens "
                                       f"exceed the {self.max_context}-token context")
            if len(forward.logits_rows) > self.max_logits_rows:
                raise ValueError(f"{len(forward.logits_rows)} logits rows exceed max_logits_rows {self.max_logits_rows}")
        results: list[np.ndarray] = [np.empty(0)] * len(forwards)
        for group in decode_groups(forwards, self.n_batch, self.native.max_outputs):
            for index, logits in zip(group, self.native.decode([forwards[index] for index in group], copy=True)):
                results[index] = logits
                self.cached[forwards[index].sequence_id].extend(forwards[index].tokens)
        return results

    def forward(self, rows: Sequence[int], tokens: Sequence[Sequence[int]],
                num_logits: Sequence[int]) -> list[np.ndarray]:
        """Append tokens[i] to row rows[i]; logits [num_logits[i], vocab] for each row's last tokens."""
        return self._decode([SequenceForward(row, self.num_cached(row), list(row_tokens),
                                             range(len(row_tokens) - count, len(row_tokens)))
                             for row, row_tokens, count in zip(rows, tokens, num_logits)])

    def prefill(self, row: int, tokens: Sequence[int],
                should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Append a prompt (or its part after `reusable_prefix`) to `row` alone, in chunks of n_batch;
        logits [vocab] of its last token (None: stopped)."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        for first in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[first:first + self.n_batch])
            is_last = first + self.n_batch >= len(tokens)
            (logits,) = self._decode([SequenceForward(row, self.num_cached(row), chunk,
                                                      [len(chunk) - 1] if is_last else [])])
            if not is_last and should_stop is not None and should_stop():
                return None
        return logits[0]

    def memory_report(self) -> dict[str, int]:
        return self.native.memory_report()

    def close(self) -> None:
        self.native.close()
