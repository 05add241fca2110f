"""How a batch's forward attends, and the seconds it spends aligning rows: what the scheduler and the
engine read of either target, torch's BatchedModel (pocketspec/batch/layout.py) or llama.cpp's
LlamaRows. It imports no torch, so a batch on llama.cpp loads none."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionShape:
    """How a forward attends: blockwise (batch-invariant) with these tiles, or one SDPA call."""

    is_blockwise: bool
    key_block: int = 1
    query_tile: int = 1


class AlignmentTimer:
    """Seconds by part: building layouts, the per-row KV scatter/gather and padding, vs the rest.

    On a CPU a mark is the host clock. On a GPU it is a CUDA event recorded on the current
    stream: marking never waits for the GPU (a synchronize per mark made the timed forward
    wait 4 times a layer), and the events are read when the seconds are asked for.
    """

    def __init__(self, uses_events: bool = False):
        self.uses_events = uses_events
        self.totals = {"layout": 0.0, "kv_and_padding": 0.0}
        self.pending: list[tuple[str, object, object]] = []  # (part, start event, end event)

    def now(self):
        if not self.uses_events:
            return time.perf_counter()
        import torch  # on a GPU only: a batch on llama.cpp loads no torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, part: str, start, end) -> None:
        if self.uses_events:
            self.pending.append((part, start, end))
        else:
            self.totals[part] += end - start

    @property
    def seconds(self) -> dict[str, float]:
        if self.pending:
            self.pending[-1][2].synchronize()  # the last span ends after every earlier one
            for part, start, end in self.pending:
                self.totals[part] += start.elapsed_time(end) / 1000
            self.pending.clear()
        return dict(self.totals)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())
