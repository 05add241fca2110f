"""What a drafter returns and the small interface the engine calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass
class Draft:
    tokens: list[int]
    forward_timings: list[tuple[int, float]] = field(default_factory=list)  # (width, seconds) per draft pass

    @property
    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.forward_timings)

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        """Up to max_tokens tokens that may follow `context` (which ends with the pending token)."""

    def reset(self) -> None:
        """Forget everything tied to the previous context."""

    def close(self) -> None: ...
