"""One request's generation as the event loop sees it: text as it is decoded, cut before a stop
string, then the outcome.

The slots generate on their own thread. Their tokens cross to the loop through
call_soon_threadsafe and are decoded there as they arrive, with the tokenizer's streamer (a
multi-byte character split over tokens is held until whole), into an asyncio.Queue of text.
is_cancelled, which the slots poll between steps, turns true when a stop string is seen, the client
leaves or the server shuts down, so the slot frees within one step. The slots may have generated a
few tokens more by then: the reply's token count is the tokens decoded up to the one that completed
the stop string, the same in every run (the text is the same too). Every token is decoded before the
generation's end is handled, so on_done sees whether a stop string ended the reply however far the
client has read. A generation the slots have not ended when the server's grace period runs out (a long
prompt's chunk still computing) is abandoned: its reply ends there, cancelled, so that its response
ends as a shutdown's does instead of being cut off with the connection.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Sequence

from pocketspec.serve.generation import GenerationOutcome, GenerationRequest, Slots
from pocketspec.serve.stop_strings import StopText

_DONE = object()


class LiveGeneration:
    def __init__(self, slots: Slots, request: GenerationRequest, stops: Sequence[str], *,
                 is_shutting_down: Callable[[], bool], on_done: Callable[[LiveGeneration], None]):
        self._loop = asyncio.get_running_loop()
        self._pieces: asyncio.Queue = asyncio.Queue()
        self._streamer = slots.tokenizer.streamer()
        self._stop_text = StopText(stops)
        self._is_shutting_down = is_shutting_down
        self._on_done = on_done
        self._is_cancelled = False  # written on the loop, read on the slots' thread
        self._num_tokens_read = 0
        self._tokens: list[int] = []  # every token the slots sent, for an abandoned generation's outcome
        self._abandoned: GenerationOutcome | None = None
        self._num_prompt_tokens = len(request.prompt_tokens)
        self.is_client_gone = False
        self.is_done = False
        self.future = slots.submit(request, self._on_tokens, self._should_stop)
        self.future.add_done_callback(lambda _: self._call_on_loop(self._finish))

    @property
    def is_stopped_by_string(self) -> bool:
        return self._stop_text.is_stopped

    def leave(self) -> None:
        """The client is gone (or its response ended early): stop generating for it."""
        if not self.is_done and self._abandoned is None:
            self.is_client_gone = self._is_cancelled = True

    def num_completion_tokens(self, outcome: GenerationOutcome) -> int:
        """The reply's tokens: up to the one that completed a stop string, else all that were generated."""
        return self._num_tokens_read if self.is_stopped_by_string else len(outcome.tokens)

    async def texts(self) -> AsyncIterator[str]:
        """The reply's text in pieces as they are decoded, up to the first stop string; once only."""
        while (text := await self._pieces.get()) is not _DONE:
            yield text

    def _decode_to_stop(self, tokens: list[int]) -> str:
        """What of `tokens` can be handed on, decoded one token at a time up to the end of a stop string."""
        text = ""
        for token in tokens:
            if self._stop_text.is_stopped:
                break
            self._num_tokens_read += 1
            text += self._stop_text.push(self._streamer.push([token]))
        return text

    async def outcome(self) -> GenerationOutcome:
        """How the generation ended; asked once texts() has ended."""
        if self._abandoned is not None:
            return self._abandoned
        return await asyncio.wrap_future(self.future)

    def abandon(self) -> None:
        """End the reply now, as cancelled, whatever the slots still do for it (on the loop)."""
        if self.is_done or self.future.done() or self._abandoned is not None:  # done: _finish is on its way
            return
        self._is_cancelled = True
        self._abandoned = GenerationOutcome(list(self._tokens), "cancelled", self._num_prompt_tokens)
        self._end_texts()

    def _on_tokens(self, tokens: list[int]) -> None:  # on the slots' thread
        self._call_on_loop(self._take_tokens, list(tokens))

    def _take_tokens(self, tokens: list[int]) -> None:
        if self._abandoned is not None:
            return
        self._tokens += tokens
        self._hand_on(self._decode_to_stop(tokens))
        self._is_cancelled = self._is_cancelled or self._stop_text.is_stopped

    def _hand_on(self, text: str) -> None:
        if text:
            self._pieces.put_nowait(text)

    def _should_stop(self) -> bool:  # on the slots' thread
        return self._is_cancelled or self._is_shutting_down()

    def _call_on_loop(self, function, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop has closed (a forced exit): no one is left to read
            self._is_cancelled = True

    def _finish(self) -> None:  # after every _take_tokens: the slots sent their tokens before the future ended
        is_abandoned = self._abandoned is not None
        self.is_done = True
        if not is_abandoned:
            self._end_texts()
        self._on_done(self)

    def _end_texts(self) -> None:
        self._hand_on(self._stop_text.push(self._streamer.flush()) + self._stop_text.finish())
        self._pieces.put_nowait(_DONE)
