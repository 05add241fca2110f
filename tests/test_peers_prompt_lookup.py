"""Counting prompt-lookup acceptance from recorded proposals (llama-cpp-python reports none)."""

from __future__ import annotations

from apps.bench.peers.prompt_lookup import count_acceptance


def test_each_proposal_is_checked_against_what_came_at_its_position():
    sequence = [1, 2, 3, 4, 5, 6, 7, 8]
    proposals = [(3, [4, 5, 9]),  # two accepted, then wrong
                 (6, []),         # no match in the context: a plain step
                 (6, [7, 8])]     # both accepted
    assert count_acceptance(proposals, sequence) == (3, 5, 4)


def test_drafted_tokens_past_the_end_are_not_counted():
    assert count_acceptance([(6, [7, 8, 9, 10])], [1, 2, 3, 4, 5, 6, 7, 8]) == (1, 2, 2)
    assert count_acceptance([(8, [1, 2])], [1, 2, 3, 4, 5, 6, 7, 8]) == (1, 0, 0)
