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

from dataclasses import dataclass, field
from typing import Callable, Sequence

from memplanner.defaults import NGRAM_MAX_N, NGRAM_MIN_N
from pocketspec.drafters.base import Draft
from pocketspec.drafters.corpus import OutputCorpus
from pocketspec.drafters.suffix_index import MAX_MATCH_LENGTH, SuffixIndex


@dataclass
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
    has_probs = False

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
        """A new generation from `prompt`: the index is kept where the prompt extends every token it holds
        (a chat's next turn: only the new turn is indexed, not the whole conversation again), else it
        starts empty. The whole prefix is compared, once: within a generation `_index` checks only the
        join, as a context there only grows."""
        indexed = self._context.tokens
        if len(prompt) < len(indexed) or list(prompt[:len(indexed)]) != indexed:
            self.reset()

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep a finished output for later requests (the corpus drops the oldest past its bound)."""
        self.corpus.remember(tokens)

    def _index(self, context: Sequence[int]) -> None:
        indexed = self._context.tokens
        num_indexed = len(indexed)
        recent = max(0, num_indexed - self.max_n)
        if len(context) < num_indexed or list(context[recent:num_indexed]) != indexed[recent:]:
            self.reset()  # the context was rewritten, not extended
            num_indexed = 0
        self._context.extend(context[num_indexed:])

    def _continuations(self, walked: list[int]):
        """The continuations of the longest known suffix of `walked`: their counts, a rank key (most seen,
        then latest), the suffix's length and its entries in the context's own index; None when unknown."""
        for n in range(min(self.max_n, len(walked)), self.min_n - 1, -1):
            key = tuple(walked[-n:])
            in_context = self._context.followers(key)
            counts = self.corpus.counts(key)  # a copy: other engines may add to the corpus meanwhile
            if not in_context and not counts:
                continue
            for token, seen in (in_context or {}).items():
                counts[token] = counts.get(token, 0) + seen[0]

            def rank(token: int) -> tuple[int, int]:
                latest = in_context.get(token) if in_context else None
                return counts[token], latest[1] if latest else -1

            return counts, rank, n, in_context
        return None

    def _next(self, walked: list[int]) -> tuple[int, MatchEvidence] | None:
        found = self._continuations(walked)
        if found is None:
            return None
        counts, rank, n, in_context = found
        token = max(counts, key=rank)
        latest = in_context.get(token) if in_context else None
        length = n
        if latest is not None and n == self.max_n:
            length = self._context.backward_match(walked, latest[1], n)
        return token, MatchEvidence(length, counts[token] / sum(counts.values()))

    def branches(self, context: Sequence[int], max_branches: int, max_tokens: int) -> list[list[int]]:
        """Up to max_branches proposals of up to max_tokens each, one per continuation of the context's
        longest known suffix, best first: the branches of a token tree (benchmarks/replay_drafting.py
        measures whether verifying them together would pay)."""
        if max_tokens <= 0 or len(context) < self.min_n:
            return []
        self._index(context)
        walked = list(context[-MAX_MATCH_LENGTH - 1:])
        found = self._continuations(walked)
        if found is None:
            return []
        counts, rank, _, _ = found
        branches = []
        for first in sorted(counts, key=rank, reverse=True)[:max_branches]:
            branch = [first]
            while len(branch) < max_tokens and (step := self._next(walked + branch)) is not None:
                branch.append(step[0])
            branches.append(branch)
        return branches

    def propose_scored(self, context: Sequence[int], max_tokens: int,
                       probability: Callable[[MatchEvidence], float] | None = None, *,
                       min_first: float = 0.0, min_survival: float = 0.0) -> Proposal:
        """Up to max_tokens continuing `context`, each with its evidence.

        probability(evidence): each token's acceptance chance, kept in the proposal. The walk then
        stops as soon as the rest cannot pay: a first token less likely than min_first, or a next
        token reached with a chance under min_survival. Most steps of ordinary text end at the
        first token, so a step that drafts nothing costs a lookup, not a 31-token walk.
        """
        proposal = Proposal()
        if max_tokens <= 0 or len(context) < self.min_n:
            return proposal
        self._index(context)
        walked = list(context[-MAX_MATCH_LENGTH - 1:])
        survival = 1.0
        for _ in range(max_tokens):
            found = self._next(walked)
            if found is None:
                break
            token, evidence = found
            proposal.tokens.append(token)
            proposal.evidence.append(evidence)
            if probability is not None:
                chance = probability(evidence)
                proposal.probabilities.append(chance)
                survival *= chance
                if (len(proposal.tokens) == 1 and chance < min_first) or survival < min_survival:
                    break
            walked.append(token)
        return proposal

    def lookup(self, context: Sequence[int], max_tokens: int) -> list[int]:
        return self.propose_scored(context, max_tokens).tokens

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(tokens=self.lookup(context, max_tokens))

    def close(self) -> None:
        self.reset()
