"""The bounds benchmarks/replay_drafting.py sets beside the controller, on the same recorded outputs and
costs: the oracle (a controller that knew how much of each proposal the target accepts, for chains and for
token trees) and the copy bound (any drafter that copies what it has read)."""

from __future__ import annotations

import math

from memplanner.measured_costs import MeasuredCosts
from pocketspec.drafters.ngram import NgramDrafter
from pocketspec.speculation.prefix import common_prefix_length


def oracle_seconds(drafter: NgramDrafter, costs: MeasuredCosts, prompt: list[int], output: list[int],
                   max_gamma: int, max_branches: int = 1) -> float:
    """Decode time of a controller that knew how much of each proposal the target accepts: the bound on
    what any choice of γ can reach with this drafter's proposals on these costs, choosing step by step
    the γ with the most tokens per second. With max_branches > 1, a token tree: the best k
    (<= max_branches) branches of the suffix match, each cut to the same γ, verified in one forward of
    1 + (their tokens) rows, every row paid for, with the k and γ that give the most tokens per second."""
    sequence = prompt + output
    position, seconds = len(prompt) + 1, 0.0
    drafter.reset()
    while position < len(sequence):
        depth = position - 1
        room = min(max_gamma, len(sequence) - position - 1)
        branches = drafter.branches(sequence[:position], max_branches, room) if room > 0 else []
        truth = sequence[position:]
        best = (1 / costs.forward_seconds(1, depth), 1, 1)  # (tokens per second, tokens, width): no draft
        for num_branches in range(1, len(branches) + 1):
            chosen = branches[:num_branches]
            num_matched = max(common_prefix_length(branch, truth) for branch in chosen)
            for gamma in range(1, max(map(len, chosen)) + 1):
                width = 1 + sum(min(gamma, len(branch)) for branch in chosen)
                if width > max_gamma + 1:
                    break
                num_tokens = min(gamma, num_matched) + 1
                best = max(best, (num_tokens / costs.forward_seconds(width, depth), num_tokens, width))
        _, num_tokens, width = best
        seconds += costs.forward_seconds(width, depth)
        position += num_tokens
    drafter.remember(output)
    return seconds


def copy_bound_seconds(costs: MeasuredCosts, prompt: list[int], output: list[int], max_gamma: int,
                       earlier_pairs: set[tuple[int, int]]) -> float:
    """The least decode time of a drafter that drafts the recorded output itself, but only the tokens
    that a copy can propose: a token is copyable where (token before it, it) occurred earlier in the
    prompt, in the output before it or in earlier_pairs (earlier outputs; this output's pairs are
    added). The widths of all the steps are chosen together, so it is a bound, not a policy."""
    sequence = prompt + output
    seen = set(earlier_pairs) | set(zip(prompt, prompt[1:]))
    is_copyable = [False] * len(sequence)
    for index in range(len(prompt), len(sequence)):
        pair = (sequence[index - 1], sequence[index])
        is_copyable[index] = pair in seen
        seen.add(pair)
    earlier_pairs.update(zip(output, output[1:]))
    # seconds_from[position]: the least time to decode sequence[position:], the token before it pending
    seconds_from = [0.0] * (len(sequence) + 1)
    for position in range(len(sequence) - 1, len(prompt), -1):
        best, num_drafted = math.inf, 0
        while True:  # a step drafts num_drafted copyable tokens and adds the target's own next token
            step = costs.forward_seconds(num_drafted + 1, position - 1) + seconds_from[position + num_drafted + 1]
            best = min(best, step)
            if (num_drafted >= max_gamma or position + num_drafted + 1 >= len(sequence)
                    or not is_copyable[position + num_drafted]):
                break
            num_drafted += 1
        seconds_from[position] = best
    return seconds_from[len(prompt) + 1]
