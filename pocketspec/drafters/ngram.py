"""Draftless drafting by suffix match: continue the context the way its current suffix continued before.

An incremental index maps every n-gram (n in [min_n, max_n]) of the context to the tokens
that followed it, with counts and the latest position. A proposal walks token by token: the
longest indexed suffix of (context + proposal so far) picks the most frequent continuation
(the latest on ties). Each proposed token carries its evidence, as SuffixDecoding
(arXiv 2411.04975) scores its speculation tree: the matched length (extended backwards past
max_n along the source, so a long verbatim copy is seen as one) and the share of that
continuation among the suffix's continuations. The controller turns evidence into an
acceptance probability learned online.

A bounded corpus of earlier outputs (pocketspec/drafters/corpus.py: other requests, earlier
`--batch` prompts) is indexed the same way and consulted beside the context; it survives
`reset()`, and a session's engines share one.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Callable, Sequence

from memplanner.defaults import NGRAM_MAX_N, NGRAM_MIN_N
from pocketspec.drafters.base import Draft
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.suffix_index import COUNT_BITS, COUNT_MASK, MAX_MATCH_LENGTH, SuffixIndex, token_array


@dataclass(slots=True)
class MatchEvidence:
    """Why one proposed token was proposed."""

    match_length: int  # tokens of the suffix that matched where the continuation was seen
    share: float  # this continuation's count over every continuation of that suffix


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    evidence: list[MatchEvidence] = field(default_factory=list)
    probabilities: list[float] = field(default_factory=list)  # each token's acceptance chance, when scored

    def __len__(self) -> int:
        return len(self.tokens)


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_n: int = NGRAM_MIN_N, max_n: int = NGRAM_MAX_N, corpus: OutputCorpus | None = None):
        """corpus: earlier outputs to draft from, shared with other drafters (a new one when None)."""
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.corpus = corpus if corpus is not None else OutputCorpus(min_n, max_n)
        self.reset()

    def reset(self) -> None:
        self._context = SuffixIndex(self.min_n, self.max_n)

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation from `prompt`, indexed now, with the prefill, so that the first step walks at
        once. The index is kept where the prompt extends every token it holds (a chat's next turn: only
        the new turn is indexed, not the whole conversation again), else it starts empty. The whole
        prefix is compared, once: within a generation `_index` checks only the join, as a context there
        only grows."""
        indexed = self._context.tokens
        if len(prompt) < len(indexed) or token_array(prompt[:len(indexed)]) != indexed:
            self.reset()
        self._index(prompt)

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep a finished output for later requests (the corpus drops the oldest past its bound)."""
        self.corpus.remember(tokens)

    def _index(self, context: Sequence[int]) -> None:
        indexed = self._context.tokens
        num_indexed = len(indexed)
        recent = max(0, num_indexed - self.max_n)
        if len(context) < num_indexed or token_array(context[recent:num_indexed]) != indexed[recent:]:
            self.reset()  # the context was rewritten, not extended
            num_indexed = 0
        self._context.extend(context[num_indexed:])

    def _continuations_at(self, walked: array, n: int):
        """(counts, sightings in the context) of the continuations of walked's last n tokens; None when unknown."""
        key = walked[-n:].tobytes()
        in_context = self._context.followers(key)
        counts = self.corpus.counts(key)
        if in_context is None:
            return None if counts is None else (counts, None)
        if counts is None:
            if len(in_context) == 1:  # most n-grams of a copy: one follower, and the corpus knows nothing
                (token, seen), = in_context.items()
                return {token: seen & COUNT_MASK}, in_context
            counts = {}
        for token, seen in in_context.items():
            counts[token] = counts.get(token, 0) + (seen & COUNT_MASK)
        return counts, in_context

    def _continuations(self, walked: array, longest: int):
        """The continuations of the longest known suffix of `walked`, of at most `longest` tokens: their counts,
        the suffix's length and its sightings in the context's own index; None when unknown.

        Every suffix of a known n-gram is known (it ended where the n-gram ended, before the same token),
        so the known lengths run from min_n up to the longest, and a bisection finds it: the longest length
        first, where a copy goes on, then three probes at most where text is new."""
        longest = min(longest, len(walked))
        if longest < self.min_n:
            return None
        found = self._continuations_at(walked, longest)
        if found is not None:
            return found[0], longest, found[1]
        known, unknown = self.min_n - 1, longest  # the longest known length lies in [known, unknown)
        while unknown - known > 1:
            n = (known + unknown) // 2
            probed = self._continuations_at(walked, n)
            if probed is None:
                unknown = n
            else:
                known, found = n, probed
        return None if found is None else (found[0], known, found[1])

    @staticmethod
    def _rank(counts: dict[int, int], in_context: dict[int, int] | None) -> Callable[[int], tuple[int, int]]:
        """A continuation's rank key: most seen, then latest seen in the context."""
        def rank(token: int) -> tuple[int, int]:
            latest = in_context.get(token) if in_context else None
            return counts[token], -1 if latest is None else latest >> COUNT_BITS

        return rank

    def _next(self, walked: array, previous: tuple[int, int, int] | None = None) \
            -> tuple[int, MatchEvidence, tuple[int, int, int]] | None:
        """The next token after `walked`, its evidence, and where it was found: (the suffix length n it was
        found at, the end of its latest sighting in the context and how far walked agreed backwards there,
        or -1 and 0 where the agreement was not matched); None when no suffix of `walked` is known.

        previous: what the call for walked[:-1] returned, on a walk. It bounds this lookup: a known suffix of
        walked is one token longer at most than walked[:-1]'s longest (drop its last token: what is left
        was seen before that token). And where the copy goes on from that sighting, the agreement is one
        longer, with nothing compared."""
        max_n = self.max_n
        longest = max_n if previous is None else min(max_n, previous[0] + 1)
        if len(walked) >= longest:  # first, what most tokens of a copy find: one follower, wherever it was seen
            key = walked[-longest:].tobytes()
            sole = self._context.sole_follower(key)
            if sole is not None:
                token, end = sole
                if self.corpus.only_followed_by(key, token):  # the counts would be {token: any}: a share of 1
                    if longest < max_n:
                        return token, MatchEvidence(longest, 1.0), (longest, -1, 0)
                    agreement = self._agreement(walked, end, previous)
                    return token, MatchEvidence(agreement, 1.0), (max_n, end, agreement)
            elif not self._context.knows(key) and (token := self.corpus.sole_token(key)) is not None:
                return token, MatchEvidence(longest, 1.0), (longest, -1, 0)  # an earlier output's, alone
        found = self._continuations(walked, longest)
        if found is None:
            return None
        counts, n, in_context = found
        if len(counts) == 1:  # the one continuation: nothing to rank
            token, share = next(iter(counts)), 1.0
        else:
            token = max(counts, key=self._rank(counts, in_context))
            share = counts[token] / sum(counts.values())
        latest = in_context.get(token) if in_context else None
        if latest is None or n < max_n:
            return token, MatchEvidence(n, share), (n, -1, 0)
        end = latest >> COUNT_BITS
        agreement = self._agreement(walked, end, previous)
        return token, MatchEvidence(agreement, share), (n, end, agreement)

    def _agreement(self, walked: array, end: int, previous: tuple[int, int, int] | None) -> int:
        """How far `walked`, whose last max_n tokens end at `end` in the context, agrees with the context
        backwards (at most MAX_MATCH_LENGTH): one more than walked[:-1] did at end - 1, where that is where
        it was found (walked and the context before `end` are each one token longer than that agreement
        could reach, so only the cap binds)."""
        if previous is not None and previous[1] + 1 == end:
            return min(previous[2] + 1, MAX_MATCH_LENGTH)
        return self._context.backward_match(walked, end, self.max_n)

    def branches(self, context: Sequence[int], max_branches: int, max_tokens: int) -> list[list[int]]:
        """Up to max_branches proposals of up to max_tokens each, one per continuation of the context's
        longest known suffix, best first: the branches of a token tree (benchmarks/replay_drafting.py
        measures whether verifying them together would pay)."""
        if max_tokens <= 0 or len(context) < self.min_n:
            return []
        self._index(context)
        walked = token_array(context[-MAX_MATCH_LENGTH - 1:])
        found = self._continuations(walked, self.max_n)
        if found is None:
            return []
        counts, _, in_context = found
        branches = []
        for first in sorted(counts, key=self._rank(counts, in_context), reverse=True)[:max_branches]:
            branch, found_at = token_array([first]), None
            while len(branch) < max_tokens and (step := self._next(walked + branch, found_at)) is not None:
                branch.append(step[0])
                found_at = step[2]
            branches.append(branch.tolist())
        return branches

    def propose_scored(self, context: Sequence[int], max_tokens: int,
                       probability: Callable[[MatchEvidence], float] | None = None, *,
                       first_pays: Callable[[float], bool] | None = None, min_survival: float = 0.0) -> Proposal:
        """Up to max_tokens continuing `context`, each with its evidence.

        probability(evidence): each token's acceptance chance, kept in the proposal. The walk then
        stops as soon as the rest cannot pay: a first token whose chance first_pays(chance) rejects, or
        a next token reached with a chance under min_survival. Most steps of ordinary text end at the
        first token, so a step that drafts nothing costs a lookup, not a 31-token walk.
        """
        proposal = Proposal()
        if max_tokens <= 0 or len(context) < self.min_n:
            return proposal
        self._index(context)
        walked = token_array(context[-MAX_MATCH_LENGTH - 1:])
        survival = 1.0
        found_at = None
        for _ in range(max_tokens):
            found = self._next(walked, found_at)
            if found is None:
                break
            token, evidence, found_at = found
            proposal.tokens.append(token)
            proposal.evidence.append(evidence)
            if probability is not None:
                chance = probability(evidence)
                proposal.probabilities.append(chance)
                survival *= chance
                if (len(proposal.tokens) == 1 and first_pays is not None and not first_pays(chance)) \
                        or survival < min_survival:
                    break
            walked.append(token)
        return proposal

    def lookup(self, context: Sequence[int], max_tokens: int) -> list[int]:
        return self.propose_scored(context, max_tokens).tokens

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(tokens=self.lookup(context, max_tokens))

    def close(self) -> None:
        self.reset()
