"""OpenAI's response bodies and stream chunks for the two endpoints, and `usage` with PocketSpec's
speculative stats beside OpenAI's token counts. Pure: a response is built from text, a finish
reason and a GenerationOutcome."""

from __future__ import annotations

import json
import secrets
import time

from pocketspec.serve.generation import GenerationOutcome

SSE_DONE = "data: [DONE]\n\n"


def sse_event(payload: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def finish_reason(stop_reason: str, is_stopped_by_string: bool) -> str | None:
    """OpenAI's finish_reason; None for a generation cancelled before it finished (a client gone, a shutdown)."""
    if is_stopped_by_string or stop_reason == "end_of_generation":
        return "stop"
    if stop_reason in ("max_tokens", "context_full"):
        return "length"
    return None


def usage(outcome: GenerationOutcome, num_completion_tokens: int) -> dict:
    """OpenAI's counts (completion_tokens: the reply's tokens, up to the one that completed a stop string)
    and PocketSpec's: draft tokens proposed and accepted, and the prompt tokens found already cached."""
    return {
        "prompt_tokens": outcome.num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": outcome.num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.num_reused_tokens},
        "drafted_tokens": outcome.num_drafted,
        "accepted_tokens": outcome.num_accepted,
        "acceptance_rate": round(outcome.acceptance_rate, 4),
    }


class ResponseShape:
    """One response's id, creation time and model; subclasses fill in the endpoint's choice."""

    id_prefix = ""
    object_name = ""
    chunk_object_name = ""

    def __init__(self, model_id: str):
        self.id = f"{self.id_prefix}-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model_id = model_id

    def _envelope(self, object_name: str, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model_id,
                "choices": choices, **extra}

    def full(self, text: str, finish: str, usage_: dict) -> dict:
        return self._envelope(self.object_name, [{"index": 0, **self._whole(text), "logprobs": None,
                                                  "finish_reason": finish}], usage=usage_)

    def chunk(self, text: str | None = None, finish: str | None = None) -> dict:
        return self._envelope(self.chunk_object_name, [{"index": 0, **self._piece(text), "logprobs": None,
                                                        "finish_reason": finish}])

    def usage_chunk(self, usage_: dict) -> dict:
        return self._envelope(self.chunk_object_name, [], usage=usage_)

    def opening_chunk(self) -> dict | None:
        return None

    def _whole(self, text: str) -> dict:
        raise NotImplementedError

    def _piece(self, text: str | None) -> dict:
        raise NotImplementedError


class ChatShape(ResponseShape):
    id_prefix, object_name, chunk_object_name = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def opening_chunk(self) -> dict:
        return self._envelope(self.chunk_object_name, [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                        "logprobs": None, "finish_reason": None}])

    def _whole(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def _piece(self, text: str | None) -> dict:
        return {"delta": {} if text is None else {"content": text}}


class TextShape(ResponseShape):
    id_prefix, object_name, chunk_object_name = "cmpl", "text_completion", "text_completion"

    def _whole(self, text: str) -> dict:
        return {"text": text}

    def _piece(self, text: str | None) -> dict:
        return {"text": text or ""}
