"""Seeded draws that a drafter can share with the target: the token sampled at position n of a sequence
(its index, the prompt's tokens counted) is a pure function of (seed, n, distribution).

Each token id x of position n gets its own uniform u(seed, n, x), a counter-based hash (splitmix64), so
it exists before anything is sampled and whoever asks for it gets the same value. The token drawn from
a distribution p is the winner of an exponential race: the least -log u(x) / p(x), which is x with
chance p(x) exactly (the Gumbel-max trick). A draft model draws its token for position n from its own q
with the same uniforms, and the target accepts it iff its own draw for n is that token
(pocketspec/speculation/verify.py). So every emitted token is the one plain sampling draws for that
position: a seeded reply is the same whatever drafted it, at whatever γ, alone or beside other rows.
The price, against the usual rule (accept with chance min(1, p/q), which keeps p but whose realization
follows q): the two draws agree with chance at least (1 - TV) / (1 + TV) instead of 1 - TV, TV being
the total variation between p and q (for a race over every token; a token in one side's tail group
and the other's head shares no uniform, which can cost a little more). On the qwen-coder pair, 0.69 a token against 0.73 at temperature 1
and 0.78 against 0.79 at 0.7 (benchmarks/draw_agreement.py); at temperature 0 nothing changes
(docs/exactness.md, "Seeded sampling").

Tokens under TAIL_BELOW race as one group (whose rate is their total mass) and the group's winner is
drawn inside it by inverse CDF with a uniform of its own; that is the same distribution, and it spares
a hash and a logarithm per token of a 150k vocabulary (4 ms a draw on a CPU).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

TAIL_BELOW = 1e-5  # tokens less likely than this race as one group
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
TAIL_RACE_ID = 1 << 40  # ids past any vocabulary: the tail group's own uniforms
TAIL_PICK_ID = TAIL_RACE_ID + 1
TO_UNIT = 2.0 ** -52


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 values (wrapping arithmetic)."""
    values = values + np.uint64(GOLDEN)
    values = (values ^ (values >> np.uint64(30))) * np.uint64(MIX1)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(MIX2)
    return values ^ (values >> np.uint64(31))


def position_keys(seed: int, positions: np.ndarray) -> np.ndarray:
    """The 64-bit keys (uint64) of these positions' uniforms, in one pass (a verify needs a key a row)."""
    return mix64(np.uint64(seed) ^ mix64(positions.astype(np.uint64)))


def position_key(seed: int, position: int) -> int:
    """The 64-bit key of one position's uniforms."""
    return int(position_keys(seed, np.array([position]))[0])


def reply_seed(seed: int, reply_index: int) -> int:
    """The seed of a conversation's reply_index-th reply: its first reply's is `seed` (a one-turn chat samples
    as `generate --chat` does), each later one's its own. Draws are keyed by position, and a trimmed or
    reset conversation comes back to positions its earlier replies were drawn at: with one seed for every
    reply, a reply would reuse those draws and copy them."""
    if reply_index == 0:
        return seed
    return int(mix64(np.uint64(seed) ^ mix64(np.array([reply_index], dtype=np.uint64)))[0] >> np.uint64(1))


def unit_interval(bits: np.ndarray) -> np.ndarray:
    """uint64 bits to float64 in (0, 1): the top 52 bits and a half, exact in float64 (53 bits and a half
    would round 2**53 - 0.5 up to 1.0, a race time of 0)."""
    return ((bits >> np.uint64(12)).astype(np.float64) + 0.5) * TO_UNIT


def uniforms(key: int, ids: np.ndarray) -> np.ndarray:
    """u(key, id) in (0, 1), float64, for token ids [n]."""
    return unit_interval(mix64(ids.astype(np.uint64) ^ np.uint64(key)))


def race(probs: np.ndarray, key: int) -> int:
    """The token a position with this key draws from probs [vocab] (unnormalised weights do too)."""
    is_head = probs >= TAIL_BELOW
    head = np.flatnonzero(is_head)
    best_token, best_time = -1, np.inf
    if head.size:
        times = -np.log(uniforms(key, head)) / probs[head]
        winner = int(np.argmin(times))
        best_token, best_time = int(head[winner]), float(times[winner])
    tail = np.where(is_head, 0.0, probs)
    tail_mass = float(tail.sum())
    if tail_mass <= 0:
        return best_token
    tail_race, tail_pick = uniforms(key, np.array([TAIL_RACE_ID, TAIL_PICK_ID]))
    if -np.log(tail_race) / tail_mass >= best_time:
        return best_token
    cumulative = np.cumsum(tail)
    return min(int(np.searchsorted(cumulative, tail_pick * cumulative[-1], side="right")), probs.shape[-1] - 1)


class SeededDraws:
    """A sequence's draws from `position` on: the position of the next token it chooses is the length of
    its context (the prompt and every token emitted), so they follow from what the sequence holds, the
    same for plain decoding, any drafter, a batch row or a chat's later turn, and nothing moves them."""

    def __init__(self, seed: int, position: int = 0):
        self.seed, self.position = seed, position

    @classmethod
    def after(cls, seed: int, context: Sequence[int]) -> SeededDraws:
        """The draws for the token that follows `context`."""
        return cls(seed, len(context))

    def key(self, ahead: int = 0) -> int:
        return position_key(self.seed, self.position + ahead)

    def keys(self, count: int) -> np.ndarray:
        """The keys of the next `count` positions as int64 (a device's hash works in signed 64 bits)."""
        return position_keys(self.seed, np.arange(self.position, self.position + count)).view(np.int64)

    def token(self, probs: np.ndarray, ahead: int = 0) -> int:
        """The token drawn from probs for the position `ahead` of the next one."""
        return race(probs, self.key(ahead))

    def ahead(self, count: int) -> SeededDraws:
        """The draws `count` tokens later (a draft's later positions)."""
        return SeededDraws(self.seed, self.position + count)
