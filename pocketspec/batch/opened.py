"""A batch engine as an opener returns it (torch: open.py, llama.cpp: open_llama.py), with what it owns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OpenedBatch:
    engine: object  # pocketspec.batch.engine.BatchEngine
    tokenizer: object
    owned: list  # what close() closes: the tokenizer's vocabulary model (torch), the contexts (llama.cpp)

    def close(self) -> None:
        while self.owned:
            self.owned.pop().close()
