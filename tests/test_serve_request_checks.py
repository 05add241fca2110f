"""A request body becomes what the slots run, or a 400/422 naming the field at fault: no model needed."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pocketspec.serve.api_errors import APIError, from_validation, param_of
from pocketspec.serve.api_requests import ChatCompletionRequest, CompletionRequest
from pocketspec.serve.request_checks import (RequestDefaults, chat_messages, checked_token_ids, completion_prompt,
                                             generation_options)
from pocketspec.settings import SamplingSettings

DEFAULTS = RequestDefaults(SamplingSettings(temperature=0.7, top_k=40, seed=5), max_tokens=64)
HELLO = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps({"messages": HELLO, **fields}))


def _refused(function, *args) -> APIError:
    with pytest.raises(APIError) as refused:
        function(*args)
    return refused.value


def test_defaults_fill_what_the_request_leaves_out():
    options = generation_options(_chat(), DEFAULTS)
    assert options.sampling == DEFAULTS.sampling and options.max_new_tokens == 64
    assert options.stops == () and not options.is_stream and not options.include_usage


def test_request_fields_override_the_defaults():
    options = generation_options(_chat(temperature=0, top_p=0.5, seed=9, max_completion_tokens=7, stop="END",
                                       stream=True, stream_options={"include_usage": True}), DEFAULTS)
    assert options.sampling == SamplingSettings(temperature=0.0, top_k=40, top_p=0.5, seed=9)
    assert options.max_new_tokens == 7 and options.stops == ("END",) and options.include_usage


def test_seed_minus_one_draws_one_per_request():
    assert generation_options(_chat(seed=-1), DEFAULTS).sampling.seed >= 0


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"), ({"n": 0}, "n"), ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"max_token": 5}, "max_token"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": True, "other": 1}}, "stream_options.other"),
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"seed": -7}, "seed"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": [""]}, "stop"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_refusals_name_the_field(fields, param):
    error = _refused(generation_options, _chat(**fields), DEFAULTS)
    assert error.status == 400 and error.param == param, error.message
    assert param.split(".")[0] in error.message


def test_neutral_values_and_user_are_accepted():
    generation_options(_chat(n=1, logprobs=False, tools=[], tool_choice="none", frequency_penalty=0, user="u1",
                             response_format={"type": "text"}, parallel_tool_calls=True, logit_bias=None), DEFAULTS)


@pytest.mark.parametrize("field, value", [("logprobs", 0), ("parallel_tool_calls", 1), ("frequency_penalty", False)])
def test_a_number_is_not_taken_for_a_neutral_boolean_or_the_other_way(field, value):
    assert _refused(generation_options, _chat(**{field: value}), DEFAULTS).param == field


def test_a_neutral_number_may_be_written_as_a_float():
    generation_options(_chat(frequency_penalty=0.0, presence_penalty=0.0), DEFAULTS)


def test_what_multi_agent_and_dashboard_clients_send_is_accepted():
    """A participant's name, tags for OpenAI's dashboard, the default tier, and tool_choice "auto" with no tool."""
    generation_options(_chat(messages=[{"role": "user", "content": "x", "name": "alice"}], metadata={"run": "7"},
                             service_tier="auto", tools=[], tool_choice="auto"), DEFAULTS)
    assert _refused(generation_options, _chat(tools=[{"type": "function"}], tool_choice="auto"),
                    DEFAULTS).param == "tools"


def test_messages_are_flattened_for_the_template():
    body = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]})
    assert chat_messages(body) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one\ntwo"}]


@pytest.mark.parametrize("message, param", [
    ({"role": "tool", "content": "x"}, "messages[0].role"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}, "messages[0].content[0]"),
])
def test_messages_the_server_cannot_render_are_refused(message, param):
    assert _refused(chat_messages, ChatCompletionRequest.model_validate({"messages": [message]})).param == param


def test_an_unsupported_role_is_named_before_the_fields_that_go_with_it():
    error = _refused(generation_options, _chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "c"}]),
                     DEFAULTS)
    assert error.param == "messages[0].role" and "'tool' is not supported" in error.message


@pytest.mark.parametrize("content", [None, []])
def test_a_user_message_without_content_is_refused(content):
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": content}]})
    assert _refused(chat_messages, body).param == "messages[0].content"
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"},
                                                              {"role": "assistant", "content": content}]})
    assert chat_messages(body)[1] == {"role": "assistant", "content": ""}


def test_message_fields_are_checked_like_the_body():
    error = _refused(generation_options, _chat(messages=[{"role": "user", "content": "x", "tool_calls": [1]}]),
                     DEFAULTS)
    assert error.param == "messages[0].tool_calls"


def test_completion_prompt_is_one_text_or_one_list_of_token_ids():
    def prompt_of(prompt):
        return completion_prompt(CompletionRequest.model_validate({"prompt": prompt}))

    assert prompt_of(["only"]) == "only" and prompt_of("text") == "text"
    assert prompt_of([3, 1, 2]) == [3, 1, 2] and prompt_of([[3, 1, 2]]) == [3, 1, 2] and prompt_of([]) == []
    for two_prompts in (["a", "b"], [[1], [2]]):
        assert _refused(prompt_of, two_prompts).param == "prompt"


@pytest.mark.parametrize("prompt", ['[true]', '[1, "a"]', '[1.5]', '[[1], "a"]'])
def test_a_prompt_that_is_neither_text_nor_token_ids_gets_422(prompt):
    with pytest.raises(ValidationError) as invalid:
        CompletionRequest.model_validate_json(f'{{"prompt": {prompt}}}')
    error = from_validation(invalid.value)
    assert (error.status, error.param) == (422, "prompt"), error.message


def test_token_ids_must_be_in_the_vocabulary():
    assert checked_token_ids([0, 9], vocab_size=10) == [0, 9]
    for bad in ([10], [1, -1]):
        error = _refused(checked_token_ids, bad, 10)
        assert error.status == 400 and error.param == "prompt" and str(bad[-1]) in error.message


@pytest.mark.parametrize("body, status, param", [
    ('{"messages": ', 400, None),
    ('{"messages": "hi"}', 422, "messages"),
    ('{"messages": [{"role": "user", "content": 3}]}', 422, "messages[0].content"),
    ('{"messages": [], "temperature": 1}', 422, "messages"),
    ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5}', 422, "max_tokens"),
    ('{"messages": [{"role": "user", "content": "x"}], "stop": 1}', 422, "stop"),
    ('["not", "an", "object"]', 422, None),
])
def test_wrong_types_become_openai_errors(body, status, param):
    with pytest.raises(ValidationError) as invalid:
        ChatCompletionRequest.model_validate_json(body)
    error = from_validation(invalid.value)
    assert (error.status, error.param) == (status, param), error.message


def test_param_of_reads_pydantic_locations():
    assert param_of(("body", "messages", 0, "content", "str")) == "messages[0].content"
    assert param_of(("stop", "list[str]", 2)) == "stop"
    assert param_of(()) is None


@pytest.mark.parametrize("request_, param", [
    (lambda: CompletionRequest.model_validate({"prompt": "x", "logprobs": 2}), "logprobs"),
    (lambda: _chat(reasoning_effort="low"), "reasoning_effort"),
    (lambda: _chat(prediction={"type": "content", "content": "x"}), "prediction"),
])
def test_openais_own_fields_are_refused_as_unsupported_not_as_unknown(request_, param):
    """`logprobs: 2` on /v1/completions is OpenAI's field: "not a field this server knows" misled."""
    error = _refused(generation_options, request_(), DEFAULTS)
    assert error.param == param and "is not supported by this server" in error.message


def test_a_text_part_without_its_text_says_so():
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    error = _refused(chat_messages, body)
    assert error.param == "messages[0].content[0].text" and "without `text`" in error.message
