"""One torch model and a static KV cache of several rows, each row one sequence with its own length.

`forward` runs new tokens of any subset of rows in one pass (ragged lengths allowed)
and returns each row's logits; `rollback` of a row is a length move, as for one
sequence. A prompt is prefilled alone in its row, with the fast kernels, in chunks of n_batch that start
at multiples of n_batch: its KV cache is then a function of the prompt only, the same whether
other rows are busy or not. So a row keeps, after its request leaves, the whole chunks of its
prompt, and a later prompt that begins with them prefills only the rest (`reusable_prefix`),
bit for bit as a fresh prefill would: tokens decoded or prefilled in a part chunk are never
reused, since other kernels or another chunk width computed them.
Decoding forwards use the batch-invariant kernels when the settings ask for them.
A self-skip draft is another BatchedModel over the same model with fewer layers.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Callable, Sequence

import numpy as np
import torch

from memplanner.sizes import round_up
from pocketspec.batch.forward_shape import AlignmentTimer, AttentionShape
from pocketspec.batch.layout import BatchLayout, RowInput
from pocketspec.errors import ContextFullError
from pocketspec.speculation.prefix import exact_after_chunk, reusable_whole_chunks
from pocketspec.settings import BatchSettings
from pocketspec.torch_model import attended_keys
from pocketspec.torch_model.invariant import TileShape
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import Transformer, rope_angles

FAST_ATTENTION = AttentionShape(is_blockwise=False)


class BatchedModel:
    def __init__(self, model: Transformer, *, num_rows: int, max_context: int, kv_dtype: str, n_batch: int,
                 settings: BatchSettings, tiles: TileShape | None = None, num_layers: int | None = None,
                 max_logits_rows: int | None = None):
        """tiles: the TileShape of the model's RowTiled parts (make_batch_invariant), None when not wrapped;
        max_logits_rows: logits rows one row may ask for in a forward, the verify positions the batch plan
        sized (None: as many as its context holds)."""
        device = model.tok_embeddings.weight.device
        settings = replace(settings, is_batch_invariant=settings.batch_invariance_on(device.type))
        if settings.is_batch_invariant and tiles is None:
            raise ValueError("batch-invariant decoding needs a model wrapped by make_batch_invariant")
        self.model, self.settings, self.tiles = model, settings, tiles
        self.num_layers = num_layers or model.config.num_layers
        self.max_context, self.n_batch = max_context, min(n_batch, max_context)
        self.max_logits_rows = max_logits_rows or max_context
        config = model.config
        # room for the padding of the last key block
        capacity = round_up(max_context, settings.key_block) if settings.is_batch_invariant else max_context
        self.cache = StaticKVCache(num_layers=self.num_layers, num_kv_heads=config.num_kv_heads,
                                   head_dim=config.head_dim, max_context=capacity, kv_dtype=kv_dtype, device=device,
                                   max_batch=num_rows)
        # one table for every position: a position's rotation never depends on the batch
        self.rope = rope_angles(torch.arange(capacity, device=device), model.inv_freq)
        self.decode_shape = (AttentionShape(True, settings.key_block, settings.query_tile)
                             if settings.is_batch_invariant else FAST_ATTENTION)
        self.timer = AlignmentTimer(uses_events=device.type == "cuda")
        self.cached: list[list[int]] = [[] for _ in range(num_rows)]
        self.num_exact = [0] * num_rows  # leading cached tokens a fresh prefill would compute bit for bit

    @property
    def num_rows(self) -> int:
        return len(self.cached)

    def num_cached(self, row: int) -> int:
        return len(self.cached[row])

    @torch.inference_mode()
    def _run(self, items: Sequence[RowInput], shape: AttentionShape, tile_rows: int) -> list[np.ndarray]:
        for item in items:
            if item.start + len(item.tokens) > self.max_context:
                raise ContextFullError(f"row {item.row}: {item.start} + {len(item.tokens)} tokens exceed the "
                                       f"{self.max_context}-token context")
        if self.tiles is not None:
            self.tiles.rows = tile_rows
        layout = BatchLayout(items, rope=self.rope, shape=shape, timer=self.timer)
        logits = self.model(layout.tokens, 0, self.cache, layout.logits_rows, num_layers=self.num_layers,
                            layout=layout)[0]  # [sum of num_logits, vocab]
        for item in items:
            self.cached[item.row][item.start:] = item.tokens
        return _split(logits, layout.logits_counts)

    def forward(self, rows: Sequence[int], tokens: Sequence[Sequence[int]],
                num_logits: Sequence[int]) -> list[np.ndarray]:
        """Append tokens[i] to row rows[i]; logits [num_logits[i], vocab] for each row's last tokens."""
        items = [RowInput(row, self.num_cached(row), list(row_tokens), count)
                 for row, row_tokens, count in zip(rows, tokens, num_logits)]
        tile_rows = self.settings.row_tile if self.settings.is_batch_invariant else 0
        return self._run(items, self.decode_shape, tile_rows)

    def reusable_prefix(self, row: int, prompt: Sequence[int]) -> int:
        """Leading tokens of `prompt` that `row` holds as a fresh prefill would compute them: whole
        chunks, leaving at least one token to prefill (its logits start the decoding)."""
        return reusable_whole_chunks(self.cached[row], self.num_exact[row], prompt, self.n_batch)

    def prefill(self, row: int, tokens: Sequence[int],
                should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Append a prompt (or its part after `reusable_prefix`) to `row` alone, in chunks of n_batch;
        logits [vocab] of its last token (None: stopped)."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        if self.num_cached(row) % self.n_batch:
            raise ValueError(f"row {row} holds {self.num_cached(row)} tokens: a prefill starts at a multiple of "
                             f"{self.n_batch}")
        for first in range(0, len(tokens), self.n_batch):
            chunk = list(tokens[first:first + self.n_batch])
            is_last = first + self.n_batch >= len(tokens)
            logits = self._run([RowInput(row, self.num_cached(row), chunk, 1 if is_last else 0)], FAST_ATTENTION, 0)
            self.num_exact[row] = exact_after_chunk(self.num_exact[row], self.num_cached(row) - len(chunk),
                                                    len(chunk), self.n_batch)
            if not is_last and should_stop is not None and should_stop():
                return None
        return logits[0][0]

    def rollback(self, row: int, num_kept: int) -> None:
        del self.cached[row][num_kept:]
        self.num_exact[row] = min(self.num_exact[row], num_kept)

    def hold_for_timing(self, row: int, num_cached: int) -> None:
        """For timing only (pocketspec/batch/step_calibration.py): the row counts num_cached tokens over
        whatever its cache holds, as a forward's cost depends on how many tokens are cached, not which.
        Its tokens are placeholders no prompt can reuse; rollback(row, 0) empties it."""
        if not 0 <= num_cached <= self.max_context:
            raise ValueError(f"row {row} holds 0 to {self.max_context} tokens, not {num_cached}")
        self.cached[row] = [-1] * num_cached
        self.num_exact[row] = 0

    @torch.inference_mode()
    def shift_out(self, row: int, start: int, count: int) -> None:
        """Drop `count` cached tokens of `row` from `start` and move the later ones down, their keys
        rotated to their new positions (a self-sparse draft's window, pocketspec/drafters/draft_window.py)."""
        self.cache.shift(start, count, self.num_cached(row), self.model.inv_freq, rows=slice(row, row + 1))
        del self.cached[row][start:start + count]
        self.num_exact[row] = min(self.num_exact[row], start)

    @torch.inference_mode()
    def hold_attended_view(self, row: int, source: BatchedModel, selection: Sequence[int], num_observed: int,
                           recent_start: int, recent_end: int) -> None:
        """Fill `row` from the same row of `source` (the target's pool, over the same model): per layer and KV
        head, the len(selection) positions before recent_start that the row's last num_observed tokens up to
        recent_end attended to most, then positions recent_start .. recent_end - 1 (a self-sparse draft that
        keeps attended keys, pocketspec/drafters/attended_window.py). The row then holds `selection`
        (stand-ins for the chosen keys, which differ by head) and the recent tokens."""
        observed = source.cached[row][recent_end - num_observed:recent_end]
        attended_keys.hold_attended_view(self.model, source.cache, self.cache, observed, num_selected=len(selection),
                                         recent_start=recent_start, recent_end=recent_end,
                                         num_layers=self.num_layers, row=row)
        self.cached[row] = list(selection) + source.cached[row][recent_start:recent_end]
        self.num_exact[row] = 0  # no prompt can reuse the stand-ins

    def memory_report(self) -> dict[str, int]:
        weight_bytes = sum(tensor.numel() * tensor.element_size()
                           for tensor in [*self.model.parameters(), *self.model.buffers()])
        return {"weights": weight_bytes, "kv_cache": self.cache.num_bytes}


def _split(logits: torch.Tensor, counts: Sequence[int]) -> list[np.ndarray]:
    array = logits.float().cpu().numpy()
    bounds = np.cumsum([0, *counts])
    return [array[start:end] for start, end in zip(bounds[:-1], bounds[1:])]
