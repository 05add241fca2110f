"""`pocketspec serve` on SmolLM2, driven by the real `openai` client and by raw HTTP: chat and completions,
whole and streamed, stop strings, usage, every refusal in OpenAI's error shape, a client that leaves
mid-stream, /health and /metrics. One server for the module."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from serve_process import ServerProcess, error_of, metric_value
from test_cli_errors import run_cli

from pocketspec.backends.gguf_tokenizer import load_tokenizer
from pocketspec.serve.http_protocol import MAX_HEADER_BYTES

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
MAX_CONTEXT = "512"


@pytest.fixture(scope="module")
def server(smollm2_path):
    server = ServerProcess("--max-context", MAX_CONTEXT, "--max-tokens", "24", "--max-body", "64KiB")
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


def _chat(client, content: str = QUESTION, **options):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **options)


def test_greedy_chat_equals_generate(client):
    """First in the module: the server's engine starts as fresh as generate's."""
    generated = run_cli("generate", "--target", MODEL, "--draft", "ngram", "--threads", "1", "--max-context",
                        MAX_CONTEXT, "--max-tokens", "24", "--chat", "--json", "--prompt", QUESTION)
    assert generated.returncode == 0, generated.stderr
    expected = json.loads(generated.stdout)
    reply = _chat(client, temperature=0)
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.completion_tokens == len(expected["tokens"])
    assert reply.usage.prompt_tokens == expected["stats"]["num_prompt_tokens"]
    assert reply.choices[0].finish_reason == ("stop" if expected["stop_reason"] == "end_of_generation" else "length")


def test_chat_reply_carries_usage_with_speculative_stats(client):
    reply = _chat(client, max_tokens=8)
    usage = reply.usage
    assert reply.object == "chat.completion" and reply.model == MODEL and reply.choices[0].message.role == "assistant"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and 0 < usage.completion_tokens <= 8
    extra = usage.model_dump()
    assert {"drafted_tokens", "accepted_tokens", "acceptance_rate"} <= extra.keys()
    assert extra["accepted_tokens"] <= extra["drafted_tokens"]


def test_streamed_chat_equals_the_whole_reply(client):
    whole = _chat(client, max_tokens=16).choices[0].message.content
    chunks = list(_chat(client, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_stream_ends_with_done(server):
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4, "stream": True}
    with server.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(event.startswith("data: ") for event in events)


def test_completion(client):
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6)
    assert completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 6 and completion.choices[0].text
    streamed = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == completion.choices[0].text


@pytest.mark.parametrize("wrap", [lambda ids: ids, lambda ids: [ids]], ids=["token ids", "a list of one"])
def test_a_prompt_of_token_ids_completes_as_its_text_does(client, smollm2_path, wrap):
    vocab_model, tokenizer = load_tokenizer(smollm2_path)
    try:
        prompt = "The capital of France is"
        token_ids = tokenizer.encode(prompt, add_bos=tokenizer.adds_bos)
    finally:
        vocab_model.close()
    from_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    from_ids = client.completions.create(model=MODEL, prompt=wrap(token_ids), max_tokens=8, temperature=0)
    assert from_ids.choices[0].text == from_text.choices[0].text
    assert from_ids.usage.prompt_tokens == from_text.usage.prompt_tokens == len(token_ids)


@pytest.mark.parametrize("prompt, param", [([49152], "prompt"), ([5, -1], "prompt"), ([], "prompt"),
                                           ([[1], [2]], "prompt")])
def test_a_prompt_of_ids_outside_the_vocabulary_or_of_none_gets_400(client, prompt, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert refused.value.param == param and refused.value.status_code == 400


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_ends_the_text_before_it(client, stream):
    prompt = "1, 2, 3, 4, 5, 6,"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12).choices[0].text
    stop = full.strip()[2:5]  # a few characters into the continuation, wherever the tokens split
    assert stop and stop in full
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stop=[stop], stream=True))
        text = "".join(chunk.choices[0].text for chunk in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stop=stop).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert text == full[:full.index(stop)] and stop not in text and reason == "stop"


def test_models_and_health(client, server):
    assert [model.id for model in client.models.list()] == [MODEL]
    with server.client() as http:
        health = http.get("/health").json()
    assert health["status"] == "ok" and health["slots"] == 1 and health["model"] == MODEL


@pytest.mark.parametrize("options, param", [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"extra_body": {"tools": [{"type": "function", "function": {"name": "f"}}]}}, "tools"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"temperature": 500}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_unsupported_or_out_of_range_fields_get_400_naming_them(client, options, param):
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, max_tokens=4, **options)
    assert refused.value.param == param and refused.value.status_code == 400


def test_neutral_values_of_unsupported_fields_are_accepted(client):
    reply = _chat(client, max_tokens=2, n=1, logprobs=False, frequency_penalty=0, presence_penalty=0, user="me",
                  response_format={"type": "text"})
    assert reply.choices[0].message.content is not None


def test_unknown_model_gets_404(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_found" and refused.value.param == "model"


@pytest.mark.parametrize("content, status, param", [
    (b'{"messages": [', 400, None),
    (b'{"messages": "hi"}', 422, "messages"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}', 422, "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 422, "stream"),
    (b'[1, 2]', 422, None),
    (b'{"messages": [{"role": "tool", "content": "hi"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "hi", "name": 3}]}', 422, "messages[0].name"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "user": 5}', 422, "user"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "metadata": [1]}', 422, "metadata"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}', 400,
     "messages[0].content[0]"),
])
def test_malformed_bodies(server, content, status, param):
    with server.client() as http:
        response = http.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    assert error_of(response)["param"] == param


def test_prompt_longer_than_the_context_gets_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, "word " * 600)
    assert refused.value.code == "context_length_exceeded"


def test_a_conversation_of_thousands_of_turns_is_refused_as_over_the_context(client):
    """(Tokenizer.encode stops at a first part over the context: tests/test_tokenizer.py.)"""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}] * 2000)
    assert refused.value.code == "context_length_exceeded"
    assert f"more than {MAX_CONTEXT} tokens" in refused.value.message


def test_body_over_max_body_gets_413(server):
    with server.client() as http:
        response = http.post("/v1/completions", json={"prompt": "x" * 100_000, "max_tokens": 1})
    assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"


def test_unknown_endpoint_and_method(server):
    with server.client() as http:
        assert error_of(http.get("/v1/nothing"))["message"].startswith("no such endpoint")
        assert http.get("/v1/chat/completions").status_code == 405


def _wait_for_free_slot(http: httpx.Client, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while http.get("/health").json()["slots_in_use"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http.get("/health").json()["slots_in_use"] == 0


def test_client_leaving_mid_stream_frees_the_slot(server, client):
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 400, "stream": True}
    with server.client() as http:
        before = http.get("/metrics").text
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert all(next(lines) is not None for _ in range(6))
        _wait_for_free_slot(http)
        after = http.get("/metrics").text
    assert metric_value(after, "pocketspec_requests_total", outcome="disconnected") == \
        metric_value(before, "pocketspec_requests_total", outcome="disconnected") + 1
    num_generated = metric_value(after, "pocketspec_tokens_total", kind="completion") - \
        metric_value(before, "pocketspec_tokens_total", kind="completion")
    assert num_generated < 400  # it stopped before its 400 tokens (how soon depends on this machine's speed)
    assert _chat(client, max_tokens=2).choices[0].message.content is not None


def test_a_whole_request_whose_client_leaves_counts_once_as_disconnected(server):
    """Not also as `busy`: the 503 it was answered (to no one) had counted as a refusal."""
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 400}
    with server.client() as http:
        before = http.get("/metrics").text
        with pytest.raises(httpx.ReadTimeout):  # 400 tokens in 0.15 s would be over 2,500 a second
            http.post("/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.15))
        _wait_for_free_slot(http)
        deadline = time.monotonic() + 20
        while metric_value(after := http.get("/metrics").text, "pocketspec_requests_total", endpoint="completions",
                      outcome="disconnected") == metric_value(before, "pocketspec_requests_total", endpoint="completions",
                                                         outcome="disconnected") and time.monotonic() < deadline:
            time.sleep(0.05)
    for outcome, more in (("disconnected", 1), ("busy", 0), ("length", 0)):
        assert metric_value(after, "pocketspec_requests_total", endpoint="completions", outcome=outcome) == \
            metric_value(before, "pocketspec_requests_total", endpoint="completions", outcome=outcome) + more, outcome


def test_client_leaving_while_sending_its_body_is_counted_not_logged_as_a_failure(server):
    """Content-Length promises 1000 bytes, 20 arrive, the connection closes: no 500 and no traceback."""
    host, port = server.url.removeprefix("http://").split(":")
    with server.client() as http:
        before = http.get("/metrics").text
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "1, 2, 3,')
        deadline = time.monotonic() + 20
        while metric_value(after := http.get("/metrics").text, "pocketspec_requests_total", outcome="disconnected") == \
                metric_value(before, "pocketspec_requests_total", outcome="disconnected") and time.monotonic() < deadline:
            time.sleep(0.05)
    assert metric_value(after, "pocketspec_requests_total", endpoint="completions", outcome="disconnected") == \
        metric_value(before, "pocketspec_requests_total", endpoint="completions", outcome="disconnected") + 1
    assert metric_value(after, "pocketspec_requests_total", outcome="failed") == \
        metric_value(before, "pocketspec_requests_total", outcome="failed")
    assert "ClientDisconnect" not in server.stderr() and "Traceback" not in server.stderr()


@pytest.mark.parametrize("head", [b"Content-Length: twelve\r\n", b"Content-Length: 5\r\nContent-Length: 6\r\n",
                                  b"No colon in this header\r\n"])
def test_request_that_is_not_http_gets_the_openai_error_shape(server, client, head):
    """uvicorn parses these before the app sees them; its own answer was a plain-text 400."""
    response = _raw_answer(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                           head + b"\r\n" + b'{"prompt": "1"}')
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http"
    assert _chat(client, max_tokens=2).choices[0].message.content is not None  # the server goes on
    assert "Traceback" not in server.stderr()


@pytest.mark.parametrize("ending", [b"", b"\r\nConnection: close\r\n\r\n"])  # cut off, or whole in one read
def test_headers_past_the_servers_limit_get_431_in_the_openai_error_shape(server, client, ending):
    response = _raw_answer(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " +
                           b"a" * (MAX_HEADER_BYTES + 1) + ending)
    assert response.status_code == 431 and error_of(response)["code"] == "headers_too_large"
    assert _chat(client, max_tokens=2).choices[0].message.content is not None


def _raw_answer(server, request: bytes) -> httpx.Response:
    """The server's answer to bytes sent as they are, read until it closes the connection."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return httpx.Response(int(answer.split(b" ", 2)[1]), headers=_headers_of(answer),
                          content=answer.partition(b"\r\n\r\n")[2])


def _headers_of(answer: bytes) -> list[tuple[str, str]]:
    lines = answer.partition(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
    return [tuple(part.strip() for part in line.split(":", 1)) for line in lines]


def test_metrics_count_requests_and_tokens(server, client):
    with server.client() as http:
        before = http.get("/metrics").text
        _chat(client, max_tokens=3)
        assert http.post("/v1/chat/completions", json={"messages": [], "n": 2}).status_code == 422
        after = http.get("/metrics").text
    finished = sum(metric_value(after, "pocketspec_requests_total", endpoint="chat", outcome=outcome) -
                   metric_value(before, "pocketspec_requests_total", endpoint="chat", outcome=outcome)
                   for outcome in ("stop", "length"))
    assert finished == 1
    assert metric_value(after, "pocketspec_tokens_total", kind="prompt") > metric_value(before, "pocketspec_tokens_total",
                                                                             kind="prompt")
    assert metric_value(after, "pocketspec_peak_memory_bytes") > 0 and metric_value(after, "pocketspec_slots") == 1
    assert metric_value(after, "pocketspec_requests_total", endpoint="chat", outcome="rejected") == \
        metric_value(before, "pocketspec_requests_total", endpoint="chat", outcome="rejected") + 1


def _reply_text(reply: httpx.Response, stream: bool) -> str:
    """The content of a whole chat reply, or what its stream's chunks carry."""
    if not stream:
        return reply.json()["choices"][0]["message"]["content"]
    chunks = [json.loads(line[len("data: "):]) for line in reply.text.splitlines() if line.startswith("data: {")]
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_a_drawn_seed_is_in_a_header_and_repeats_the_reply(server, stream):
    """OpenAI's reply has no field for the seed; `seed: -1` draws one, and the response's x-pocketspec-seed
    header names it (every generation's does), so that the reply can be asked for again."""
    def ask(seed: int) -> tuple[str, str]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "temperature": 1.0,
                "seed": seed, "max_tokens": 12, "stream": stream}
        with server.client() as http:
            reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.headers["x-pocketspec-seed"], _reply_text(reply, stream)

    drawn, first = ask(-1)
    assert int(drawn) >= 0 and first
    assert ask(int(drawn)) == (drawn, first)


def test_a_request_without_a_seed_gets_one_drawn_for_it(server):
    """The server runs without --seed: as OpenAI's API and llama-server, the same request sampled twice is two
    samples (each with its own seed, named in the header), not one reply repeated."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "temperature": 1.0,
            "max_tokens": 4}
    with server.client() as http:
        seeds = {http.post("/v1/chat/completions", json=body).headers["x-pocketspec-seed"] for _ in range(3)}
    assert len(seeds) == 3 and all(int(seed) >= 0 for seed in seeds)
