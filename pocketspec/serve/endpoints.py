"""POST /v1/chat/completions and /v1/completions: a request body in, a whole response or a stream of
server-sent events out. Everything that can be refused is refused before the request is admitted,
so a bad request never takes a slot or a place in the queue."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from pocketspec.conversation.chat_template import encode_chat, encode_prompt
from pocketspec.errors import ModelLost, UserError
from pocketspec.serve.api_errors import (CLIENT_CLOSED_REQUEST, APIError, bad_request, error_body, from_validation,
                                         shutting_down_error)
from pocketspec.serve.api_requests import ChatCompletionRequest, CompletionRequest
from pocketspec.serve.api_responses import (SSE_DONE, ChatShape, ResponseShape, TextShape, finish_reason, sse_event,
                                            usage)
from pocketspec.serve.generation import GenerationRequest
from pocketspec.serve.http_io import ClosingStream, read_body, watch_disconnect
from pocketspec.serve.live_generation import LiveGeneration
from pocketspec.serve.request_checks import (GenerationOptions, chat_messages, checked_token_ids, completion_prompt,
                                             generation_options)
from pocketspec.serve.server_state import ServerState
from pocketspec.tokenizer import counted_tokens

log = logging.getLogger("pocketspec.serve")
SEED_HEADER = "x-pocketspec-seed"  # on every generation's response (docs/serve.md)


def check_model(model: str | None, model_id: str) -> None:
    if model is not None and model != model_id:
        raise APIError(404, f"model {model!r} is not served here; this server serves {model_id!r}",
                       param="model", code="model_not_found")


def check_prompt(prompt_tokens: list[int], max_context: int, param: str) -> None:
    if not prompt_tokens:
        raise bad_request("the prompt is empty", param=param)
    if len(prompt_tokens) >= max_context:  # past the margin, maybe only a first part's tokens (Tokenizer.encode)
        raise bad_request(f"the prompt has {counted_tokens(len(prompt_tokens), max_context)} tokens, which leaves no room for a reply in a context of "
                          f"{max_context}: shorten it", param=param, code="context_length_exceeded")


def model_lost_error(reason: str) -> APIError:
    return APIError(500, f"{reason}; the server cannot generate any more: restart it", code="model_lost")


def generation_error(error: BaseException) -> APIError:
    """What a client is told when its generation raised (the slots refused it, or it failed)."""
    if isinstance(error, ModelLost):  # logged once, when _record marks the server down
        answer = model_lost_error(str(error))
    elif isinstance(error, UserError):
        answer = bad_request(str(error))
    else:
        log.error("generation failed: %s: %s", type(error).__name__, error)
        answer = APIError(500, f"generation failed: {type(error).__name__}")
    answer.is_counted = True  # by _record, when the generation ended
    return answer


async def _parsed(request: Request, state: ServerState, body_class):
    if state.shutting_down.is_set():
        raise shutting_down_error()
    if state.model_lost is not None:  # not queued for a model that cannot run
        raise model_lost_error(state.model_lost)
    try:
        body = body_class.model_validate_json(await read_body(request, state.max_body_bytes,
                                                              state.shutting_down.is_set))
    except ValidationError as error:
        raise from_validation(error) from None
    check_model(body.model, state.model_id)
    return body


async def chat_completions(request: Request, state: ServerState):
    body = await _parsed(request, state, ChatCompletionRequest)
    options = generation_options(body, state.defaults)
    messages = chat_messages(body)
    slots = state.slots
    try:
        prompt_tokens = await asyncio.to_thread(encode_chat, slots.tokenizer, slots.template, messages,
                                                slots.max_context)
    except UserError as error:  # the template refused the conversation
        raise bad_request(str(error), param="messages") from None
    check_prompt(prompt_tokens, slots.max_context, "messages")
    return await _respond(request, state, ChatShape(state.model_id), options, prompt_tokens)


async def completions(request: Request, state: ServerState):
    body = await _parsed(request, state, CompletionRequest)
    options = generation_options(body, state.defaults)
    slots = state.slots
    prompt = completion_prompt(body)
    if isinstance(prompt, str):
        prompt_tokens = await asyncio.to_thread(encode_prompt, slots.tokenizer, slots.template, prompt, chat=False,
                                                max_tokens=slots.max_context)
    else:
        prompt_tokens = checked_token_ids(prompt, slots.tokenizer.vocab_size)
    check_prompt(prompt_tokens, slots.max_context, "prompt")
    return await _respond(request, state, TextShape(state.model_id), options, prompt_tokens)


def _record(state: ServerState, endpoint: str, live: LiveGeneration) -> None:
    """When a generation ends, however: free its place, count it and forget it."""
    state.live.discard(live)
    state.admission.release()
    future = live.future
    if future.cancelled() or future.exception() is not None:
        error = None if future.cancelled() else future.exception()
        if isinstance(error, ModelLost) and state.model_lost is None:
            log.error("the model cannot run any more: %s; /health answers 503 until the server is restarted", error)
            state.model_lost = str(error)
        is_refused = isinstance(error, UserError) and not isinstance(error, ModelLost)
        state.metrics.record_generation(endpoint, "rejected" if is_refused else "failed", None, 0)
        return
    outcome = future.result()
    reason = finish_reason(outcome.stop_reason, live.is_stopped_by_string)
    label = reason or ("disconnected" if live.is_client_gone else "shutdown")
    state.metrics.record_generation(endpoint, label, outcome, live.num_completion_tokens(outcome))


async def _respond(request: Request, state: ServerState, shape: ResponseShape, options: GenerationOptions,
                   prompt_tokens: list[int]):
    state.admission.admit()
    endpoint = "chat" if isinstance(shape, ChatShape) else "completions"
    try:
        live = LiveGeneration(state.slots, GenerationRequest(prompt_tokens, options.max_new_tokens, options.sampling),
                              options.stops, is_shutting_down=state.shutting_down.is_set,
                              on_done=lambda done: _record(state, endpoint, done))
    except BaseException:
        state.admission.release()
        raise
    if live.future.done() and live.future.exception() is not None:  # refused when submitted
        raise generation_error(live.future.exception())
    state.live.add(live)  # until _record (its _finish runs on this loop, later)
    # the seed the reply was sampled with, so that a `seed: -1` request can be repeated (OpenAI's body has no field)
    headers = {SEED_HEADER: str(options.sampling.seed)}
    if options.is_stream:
        return ClosingStream(_events(live, shape, options.include_usage), on_close=live.leave, headers=headers)
    return await _whole(request, live, shape, headers)


async def _whole(request: Request, live: LiveGeneration, shape: ResponseShape,
                 headers: dict[str, str]) -> JSONResponse:
    watcher = asyncio.create_task(watch_disconnect(request, live.leave))
    try:
        text = "".join([piece async for piece in live.texts()])
        outcome = await live.outcome()
    except Exception as error:
        raise generation_error(error) from None
    finally:
        watcher.cancel()
        live.leave()
    reason = finish_reason(outcome.stop_reason, live.is_stopped_by_string)
    if reason is None:  # cancelled, and counted by _record as the client's leaving or the shutdown
        error = (APIError(CLIENT_CLOSED_REQUEST, "the client disconnected before it was answered",
                          code="client_disconnected") if live.is_client_gone else shutting_down_error())
        error.is_counted = True
        raise error
    return JSONResponse(shape.full(text, reason, usage(outcome, live.num_completion_tokens(outcome))), headers=headers)


async def _events(live: LiveGeneration, shape: ResponseShape, include_usage: bool):
    opening = shape.opening_chunk()
    if opening is not None:
        yield sse_event(opening)
    async for text in live.texts():
        yield sse_event(shape.chunk(text))
    try:
        outcome = await live.outcome()
    except Exception as error:
        yield sse_event(error_body(generation_error(error)))
        yield SSE_DONE
        return
    reason = finish_reason(outcome.stop_reason, live.is_stopped_by_string)
    yield sse_event(shape.chunk(None, reason) if reason is not None else error_body(shutting_down_error()))
    if include_usage:
        yield sse_event(shape.usage_chunk(usage(outcome, live.num_completion_tokens(outcome))))
    yield SSE_DONE
