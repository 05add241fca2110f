"""The rows of one llama.cpp context, a sequence each, as the batch engine's target or draft model.

BatchEngine (pocketspec/batch/engine.py) and its scheduler decide which rows step together;
`forward` then carries every row's new tokens in one llama_decode (in passes of at most `exact_width`
tokens where that is set), and each row rolls back on its own (llama_memory_seq_rm). No thread waits inside a forward: the one loop drives the decode.

A target's rows compute what the same prompt computes alone, bit for bit, on the CPU with
PocketSpec's row-exact kernels (native/patches/row-exact-verify.patch): each row has a KV stream of
its own (pocketspec/backends/llama_context.py); a decode of several rows carries at most
`exact_width` tokens (the kernels' widest exact batch; one row's prefill chunk goes alone, as it
does alone); and a prompt is prefilled in chunks of n_batch from position 0, so a later prompt
reuses only whole chunks of a row's earlier prompt (`reusable_prefix`): a token decoded, or
prefilled in a part chunk or from another start, was computed with other kernels than a fresh
prefill would use (reusing any shared prefix parted 1 of 22 greedy replies from the prompt alone).
A draft model's rows follow the same rule (their rounding only moves acceptance): one rule, at the
price of the draft prefilling again what follows a row's last whole chunk.
Elsewhere (layers on a GPU, a build without the patch) exact_width is 0: one decode carries up
to n_batch tokens, and a row's greedy tokens can differ from the prompt alone where the target's two
best logits are within the batched kernels' rounding (tests/test_llama_rows.py checks both).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pocketspec.backends.llama_context import LlamaModelContext, SequenceForward, decode_groups
from pocketspec.batch.forward_shape import AlignmentTimer, AttentionShape
from pocketspec.errors import ContextFullError
from pocketspec.speculation.prefix import exact_after_chunk, reusable_whole_chunks


class LlamaRows:
    decode_shape = AttentionShape(is_blockwise=False)  # the scheduler groups by length in units of its key_block

    def __init__(self, native: LlamaModelContext, exact_width: int = 0):
        """exact_width: the most tokens a decode of several rows may carry so that every row rounds as
        it does alone (0: up to n_batch, rounding as the batched kernels do); a draft model's rows need
        none, since verification keeps the output exact whatever they propose."""
        self.native = native
        self.exact_width = exact_width
        self.cached: list[list[int]] = [[] for _ in range(native.num_sequences)]
        self.num_exact = [0] * native.num_sequences  # leading tokens of a row a fresh prefill computes alike
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
        """Leading tokens of `prompt` that `row` holds as a fresh prefill would compute them: whole
        chunks, leaving at least one token to prefill (its logits start decoding)."""
        return reusable_whole_chunks(self.cached[row], self.num_exact[row], prompt, self.n_batch)

    def rollback(self, row: int, num_kept: int) -> None:
        self.num_exact[row] = min(self.num_exact[row], num_kept)
        if num_kept < len(self.cached[row]):
            self.native.remove(row, num_kept)
            del self.cached[row][num_kept:]

    def shift_out(self, row: int, start: int, count: int) -> None:
        """Drop `count` cached tokens of `row` from `start` and move the later ones down (a draft's window)."""
        self.native.shift_out(row, start, count)
        del self.cached[row][start:start + count]
        self.num_exact[row] = min(self.num_exact[row], start)

    def _decode(self, forwards: list[SequenceForward]) -> list[np.ndarray]:
        for forward in forwards:
            if forward.start + len(forward.tokens) > self.max_context:
                raise ContextFullError(f"row {forward.sequence_id}: {forward.start} + {len(forward.tokens)} tokens "
                                       f"exceed the {self.max_context}-token context")
            if len(forward.logits_rows) > self.max_logits_rows:
                raise ValueError(f"{len(forward.logits_rows)} logits rows exceed max_logits_rows {self.max_logits_rows}")
        results: list[np.ndarray] = [np.empty(0)] * len(forwards)
        max_tokens = min(self.n_batch, self.exact_width) if self.exact_width else self.n_batch
        for group in decode_groups(forwards, max_tokens, self.native.max_outputs):
            for index, logits in zip(group, self.native.decode([forwards[index] for index in group], copy=True)):
                results[index] = logits
                self.cached[forwards[index].sequence_id].extend(forwards[index].tokens)
        return results

    def forward(self, rows: Sequence[int], tokens: Sequence[Sequence[int]],
                num_logits: Sequence[int]) -> list[np.ndarray]:
        """Append tokens[i] to row rows[i]; logits [num_logits[i], vocab] for each row's last tokens."""
        forwards = [SequenceForward(row, self.num_cached(row), list(row_tokens),
                                    range(len(row_tokens) - count, len(row_tokens)))
                    for row, row_tokens, count in zip(rows, tokens, num_logits)]
        order = sorted(range(len(forwards)), key=lambda index: forwards[index].sequence_id)
        logits = self._decode([forwards[index] for index in order])  # llama.cpp passes runs of consecutive ids
        results: list[np.ndarray] = [np.empty(0)] * len(forwards)
        for index, row_logits in zip(order, logits):
            results[index] = row_logits
        return results

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
            self.num_exact[row] = exact_after_chunk(self.num_exact[row], self.num_cached(row) - len(chunk),
                                                    len(chunk), self.n_batch)
            if not is_last and should_stop is not None and should_stop():
                return None
        return logits[0]

    def memory_report(self) -> dict[str, int]:
        return self.native.memory_report()

    def close(self) -> None:
        self.native.close()
