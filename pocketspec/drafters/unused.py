"""An n-gram proposal a step did not draft, checked later against the tokens that really came.

Steps that draft nothing are most steps of ordinary text, and they would teach the
controller's match acceptance nothing. So a sequence (pocketspec/speculation/engine.py, and each row of
pocketspec/batch/engine.py) holds its last unused proposal and scores it once the context
has either left it or run past its end.
"""

from __future__ import annotations

from pocketspec.drafters.ngram import Proposal
from pocketspec.speculation.prefix import common_prefix_length


class UnusedProposal:
    def __init__(self) -> None:
        self._held: tuple[int, Proposal] | None = None  # (context length when proposed, the proposal)

    def hold(self, start: int, proposal: Proposal) -> None:
        """Keep `proposal`, made when the context had `start` tokens, unless one is held already."""
        if proposal.tokens and self._held is None:
            self._held = (start, proposal)

    def clear(self) -> None:
        self._held = None

    def score(self, context: list[int], controller) -> None:
        """Tell the controller (pocketspec.speculation.controller.GammaController) how much of the held proposal
        the context confirms, once that is settled."""
        if self._held is None:
            return
        start, proposal = self._held
        num_matched = common_prefix_length(proposal.tokens, context[start:])
        if num_matched < len(context) - start or num_matched == len(proposal):
            controller.observe_step(drafter="ngram", num_drafted=len(proposal), num_accepted=num_matched,
                                    evidence=proposal.evidence)
            self._held = None
