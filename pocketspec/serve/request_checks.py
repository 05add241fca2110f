"""From a parsed request body to what the slots run, or a 400 that names the field at fault.

A field the server does not support is refused by name, never ignored, unless its value asks for
nothing (`logprobs: false`, `n: 1`, `tools: []`, `frequency_penalty: 0`, any field set to null):
clients that spell out OpenAI's defaults still work. `user`, `metadata`, a message's `name` and chat's
`safety_identifier` and `prompt_cache_key` are declared in api_requests.py, typed as OpenAI types them,
and unused. Numeric ranges are SamplingSettings' and GenerationSettings' own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pocketspec.serve.api_errors import bad_request
from pocketspec.serve.api_requests import ChatCompletionRequest, CompletionRequest, SamplingFields
from pocketspec.setting_ranges import setting_range
from pocketspec.settings import GenerationSettings, SamplingSettings

MAX_STOP_STRINGS = 4  # as OpenAI
_PENALTIES = {"frequency_penalty": (0,), "presence_penalty": (0,), "logit_bias": ({},)}
CHAT_NEUTRAL = {**_PENALTIES, "logprobs": (False,), "top_logprobs": (0,), "tools": ([],), "functions": ([],),
                # with no tools, "auto" chooses none of them (a tool given is refused as `tools`)
                "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
                "parallel_tool_calls": (True, False), "response_format": ({"type": "text"},),
                "modalities": (["text"],), "store": (False,), "service_tier": ("auto", "default"),
                "verbosity": ("medium",), "prompt_cache_retention": ("in_memory",),
                # OpenAI's fields that ask for something whatever their value: refused as unsupported, not unknown
                "reasoning_effort": (), "prediction": (), "audio": (), "web_search_options": (), "moderation": (),
                "prompt_cache_options": ()}
COMPLETION_NEUTRAL = {**_PENALTIES, "echo": (False,), "best_of": (1,), "suffix": ("",), "logprobs": ()}
# the padding OpenAI adds to stream chunks against length side channels: none here
STREAM_OPTIONS_NEUTRAL = {"include_obfuscation": (False,)}
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class RequestDefaults:
    """What a request leaves out: the server's sampling flags and --max-tokens."""

    sampling: SamplingSettings = SamplingSettings()
    max_tokens: int = GenerationSettings().max_reply_tokens


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int
    sampling: SamplingSettings
    stops: tuple[str, ...] = ()
    is_stream: bool = False
    include_usage: bool = False


def refuse_extra(extra: dict | None, neutral: dict[str, tuple], prefix: str = "") -> None:
    """400 naming the first field in `extra` that asks for something this server does not do."""
    for name, value in (extra or {}).items():
        if value is None or _asks_for_nothing(value, neutral.get(name, ())):
            continue
        what = "is not supported by this server" if name in neutral else "is not a field this server knows"
        raise bad_request(f"`{prefix}{name}` {what}; leave it out", param=prefix + name, code="unsupported_parameter")


def _asks_for_nothing(value, neutral_values: tuple) -> bool:
    """Equal to a neutral value, a boolean only to a boolean: `logprobs: 0` is not `false`, nor `best_of: true`
    1 (while `frequency_penalty: 0.0` is 0)."""
    return any(isinstance(value, bool) == isinstance(neutral, bool) and value == neutral for neutral in neutral_values)


def refuse_unsupported(body: SamplingFields) -> None:
    is_chat = isinstance(body, ChatCompletionRequest)
    refuse_extra(body.model_extra, CHAT_NEUTRAL if is_chat else COMPLETION_NEUTRAL)
    if body.stream_options is not None:
        refuse_extra(body.stream_options.model_extra, STREAM_OPTIONS_NEUTRAL, "stream_options.")
    if body.n not in (None, 1):
        raise bad_request(f"n = {body.n} is not supported: this server returns one choice per request (n = 1)",
                          param="n", code="unsupported_parameter")
    for index, message in enumerate(body.messages if is_chat else []):
        check_role(message.role, index)  # before its fields, which depend on the role (`tool_call_id`)
        refuse_extra(message.model_extra, {}, f"messages[{index}].")


def _in_range(settings_class, field_name: str, param: str, value):
    range_ = setting_range(settings_class, field_name)
    if not range_.contains(value):
        raise bad_request(f"{param} must be {range_.describe()}, got {value}", param=param)
    return value


def sampling_for(body: SamplingFields, defaults: SamplingSettings) -> SamplingSettings:
    """The request's sampling: each field it gives, checked, over the server's defaults; seed -1 draws one."""
    given = {name: getattr(body, name) for name in ("temperature", "top_p", "top_k", "seed")}
    checked = {name: _in_range(SamplingSettings, name, name, value)
               for name, value in given.items() if value is not None}
    return replace(defaults, **checked).with_seed_drawn()


def max_tokens_for(body: SamplingFields, default: int) -> int:
    """max_completion_tokens (chat), else max_tokens, else the server's --max-tokens."""
    for param in ("max_completion_tokens", "max_tokens"):
        value = getattr(body, param, None)
        if value is not None:
            return _in_range(GenerationSettings, "max_new_tokens", param, value)
    return default


def stop_strings_for(body: SamplingFields) -> tuple[str, ...]:
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"stop has {len(stops)} strings; give at most {MAX_STOP_STRINGS}", param="stop")
    if any(stop == "" for stop in stops):
        raise bad_request("stop strings must not be empty", param="stop")
    return tuple(stops)


def generation_options(body: SamplingFields, defaults: RequestDefaults) -> GenerationOptions:
    """Everything the request asks of the generation, checked; 400 naming the first field at fault."""
    refuse_unsupported(body)
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options is only allowed with stream: true", param="stream_options")
    return GenerationOptions(
        max_new_tokens=max_tokens_for(body, defaults.max_tokens),
        sampling=sampling_for(body, defaults.sampling),
        stops=stop_strings_for(body),
        is_stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def check_role(role: str, index: int) -> None:
    if role not in CHAT_ROLES:
        raise bad_request(f"messages[{index}].role {role!r} is not supported: use one of {', '.join(CHAT_ROLES)}",
                          param=f"messages[{index}].role")


def _message_text(message, index: int) -> str:
    if message.role != "assistant" and message.content in (None, []):
        raise bad_request(f"messages[{index}] (role {message.role!r}) has no content", param=f"messages[{index}].content")
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    for part_index, part in enumerate(message.content):
        where = f"messages[{index}].content[{part_index}]"
        if part.type != "text":
            raise bad_request(f"content parts of type {part.type!r} are not supported: send text",
                              param=where, code="unsupported_parameter")
        if part.text is None:
            raise bad_request(f"{where} is a text part without `text`", param=f"{where}.text")
        refuse_extra(part.model_extra, {}, f"{where}.")
    return "\n".join(part.text for part in message.content)


def chat_messages(body: ChatCompletionRequest) -> list[dict[str, str]]:
    """The conversation as the chat template takes it: role and text (a `developer` message is a system one)."""
    messages = []
    for index, message in enumerate(body.messages):
        check_role(message.role, index)
        messages.append({"role": CHAT_ROLES[message.role], "content": _message_text(message, index)})
    return messages


def completion_prompt(body: CompletionRequest) -> str | list[int]:
    """The prompt as text, or as token ids given by the client: a string, a list of token ids, or a
    list holding one of either."""
    prompt = body.prompt
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return prompt  # an empty list: refused as an empty prompt
    if len(prompt) != 1:
        raise bad_request(f"prompt holds {len(prompt)} prompts; send one per request", param="prompt")
    return prompt[0]


def checked_token_ids(token_ids: list[int], vocab_size: int) -> list[int]:
    """A prompt of token ids as the client gave them (no BOS added), each an id of this model's vocabulary."""
    for index, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise bad_request(f"prompt[{index}] = {token} is not a token id of this model (0 to {vocab_size - 1})",
                              param="prompt", code="invalid_token_id")
    return token_ids

