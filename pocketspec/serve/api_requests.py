"""The bodies of OpenAI's /v1/chat/completions and /v1/completions that the server reads, as strict
pydantic models: a value of the wrong type is refused (422), never coerced ("0.5" is not a number).

Only the supported fields are declared, and those that are accepted and unused (`user`, `metadata`, a
message's `name`, and on chat `user`'s successors `safety_identifier` and `prompt_cache_key`), so that they
are typed. Everything else a client sends lands in `model_extra`, where pocketspec/serve/request_checks.py
refuses it by name unless its value asks for nothing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = None


class TextPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None  # a participant's name: accepted and unused (no chat template here shows it)


class SamplingFields(_Body):
    """What both endpoints share; None means the server's default (its flags)."""

    model: str | None = None  # None: the one model served
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # an extension: OpenAI has no top_k
    seed: int | None = None  # -1 draws a seed for this request
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # accepted and unused: an end-user id for abuse monitoring, and tags for OpenAI's dashboard
    user: str | None = None
    metadata: dict[str, str] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    # accepted and unused: what OpenAI replaces `user` with, an end-user id for abuse monitoring and a key that
    # routes requests to its caches (this server finds a cached prefix without one)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class CompletionRequest(SamplingFields):
    # text, or token ids, alone or as a list of one (OpenAI's four forms; one prompt a request)
    prompt: str | list[str] | list[int] | list[list[int]]
