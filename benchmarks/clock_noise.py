"""A real machine's wandering speed, for replays on a virtual clock (benchmarks/replay_drafting.py
--clock-noise).

A replay prices every forward at the cost table's time, so it never shows what a real run meets:
one process runs a few percent slower than the next, a busy neighbour slows the machine for a
while, and each pass has noise of its own. On the Zen 3 EPYC's Spec-Bench run, PocketSpec's
one-token step ran at 44-68 ms from process to process and within one. A controller that learns
costs from timed passes can be misled by that, and a replay without it cannot show it.

Each bench round is a process (ProcessTime). It has a speed factor for its whole life, slow spells
(a log-factor that wanders as an AR(1) over SPELL_SECONDS of the process's own time), and noise
on each pass. The replayed engine and plain decoding's reference each meet the same spells at the
same times of their own clocks, so the speedup compares the two under the same weather.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SPELL_SECONDS = 0.05  # a spell's factor holds this long, then wanders on
SPELL_MEMORY = 0.97  # how much of a spell's log-factor the next SPELL_SECONDS keep (about 1.7 s to fade)


@dataclass(frozen=True)
class ClockNoise:
    """Standard deviations of the log speed factor: of a process's, of its spells' steps, of a pass's own."""

    seed: int
    process_sigma: float
    pass_sigma: float
    spell_sigma: float

    @classmethod
    def parse(cls, text: str, seed: int) -> "ClockNoise":
        """'PROCESS,PASS,SPELL' sigmas, e.g. '0.08,0.03,0.03'; ValueError when it is not that."""
        values = [float(value) for value in text.split(",")]
        if len(values) != 3 or not all(0.0 <= value <= 1.0 for value in values):
            raise ValueError(f"need three sigmas between 0 and 1, PROCESS,PASS,SPELL; got {text!r}")
        return cls(seed, *values)

    def process(self, index: int) -> "ProcessTime":
        return ProcessTime(self, index)


class ProcessTime:
    """One process's speed over its own time, read by two clocks: the replayed engine's and plain decoding's."""

    def __init__(self, noise: ClockNoise, index: int):
        self._noise = noise
        self._spell_random = random.Random(f"{noise.seed}/{index}/spells")
        self._log_factor = self._spell_random.gauss(0.0, noise.process_sigma)
        self._spells = [0.0]
        self._pass_randoms = {name: random.Random(f"{noise.seed}/{index}/{name}") for name in ("replay", "plain")}
        self._plain_elapsed = 0.0

    def factor(self, at_seconds: float, clock: str = "replay") -> float:
        """How much slower than the table a pass that starts `at_seconds` into the process runs."""
        segment = int(at_seconds / SPELL_SECONDS)
        while len(self._spells) <= segment:
            self._spells.append(SPELL_MEMORY * self._spells[-1] + self._spell_random.gauss(0.0, self._noise.spell_sigma))
        return math.exp(self._log_factor + self._spells[segment]
                        + self._pass_randoms[clock].gauss(0.0, self._noise.pass_sigma))

    def plain_decoding(self, table_seconds: list[float]) -> float:
        """Plain decoding's passes of `table_seconds` on its own clock, which goes on from its last answer."""
        total = 0.0
        for seconds in table_seconds:
            seconds *= self.factor(self._plain_elapsed, "plain")
            total += seconds
            self._plain_elapsed += seconds
        return total
