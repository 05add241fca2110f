"""Which sequences of the pool step together; pure, so it is tested without a model.

`pad` takes the sequences that have waited longest (all of them when the pool is no
larger than the batch); their different lengths are padded and masked (layout.py).
`group` takes the largest set of sequences of equal length (in units of
`length_bucket`, the attention's key block), as EXSPEC does, so that little is padded;
a sequence left waiting `max_wait` steps has its group go next.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from pocketspec.settings import SCHEDULERS


@dataclass(frozen=True)
class Candidate:
    key: int
    length: int  # tokens in the sequence's context
    last_step: int  # the step it last ran in (-1: never)


def pick(candidates: list[Candidate], *, max_batch: int, policy: str, step: int, length_bucket: int = 1,
         max_wait: int = 8) -> list[int]:
    """Keys of the sequences to step now (at most max_batch), longest-waiting first."""
    if policy not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {policy!r}: use one of {', '.join(SCHEDULERS)}")
    by_wait = sorted(candidates, key=lambda candidate: (candidate.last_step, candidate.key))
    if policy == "pad" or not by_wait:
        return [candidate.key for candidate in by_wait[:max_batch]]
    groups: dict[int, list[Candidate]] = defaultdict(list)
    for candidate in by_wait:
        groups[candidate.length // length_bucket].append(candidate)
    oldest = by_wait[0]
    if step - oldest.last_step > max_wait:
        chosen = groups[oldest.length // length_bucket]
    else:
        chosen = max(groups.values(), key=lambda group: (min(len(group), max_batch), -group[0].last_step))
    return [candidate.key for candidate in chosen[:max_batch]]
