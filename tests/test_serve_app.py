"""The server's application on scripted slots (no model): stop strings across token boundaries, multi-byte
characters split over tokens, a stop string cancelling the generation, the API key check, loopback."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from pocketspec.conversation.chat_template import ChatTemplate
from pocketspec.errors import UserError
from pocketspec.serve.app import build_app, is_authorized
from pocketspec.serve.generation import GenerationOutcome, Slots
from pocketspec.serve.serve_settings import ServeSettings
from pocketspec.serve.listen import is_loopback
from pocketspec.serve.server_state import new_server_state
from pocketspec.session_settings import SessionSettings
from pocketspec.tokenizer import TextStreamer


class ByteTokenizer:
    """A token is one byte of UTF-8, so a character can be split over tokens."""

    adds_bos = False

    def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = False,
               max_tokens: int | None = None) -> list[int]:
        return list(text.encode())

    def piece(self, token: int, special: bool = False) -> bytes:
        return bytes([token])

    def streamer(self) -> TextStreamer:
        return TextStreamer(self)


class ScriptedSlots(Slots):
    """Replies to every request with the same text, `step` tokens at a time, on its own thread."""

    def __init__(self, reply: str, step: int = 1, refusal: Exception | None = None, seconds_per_step: float = 0.002,
                 gate: threading.Event | None = None):
        super().__init__()
        self.gate = gate  # each step waits for it: a step that outlasts a shutdown's grace period
        self.tokenizer, self.template, self.max_context = ByteTokenizer(), ChatTemplate(None), 256
        self.reply, self.step, self.refusal = list(reply.encode()), step, refusal
        self.seconds_per_step = seconds_per_step
        self._thread = ThreadPoolExecutor(1)

    def submit(self, request, on_tokens, is_cancelled):
        if self.refusal is not None:
            refused = Future()
            refused.set_exception(self.refusal)
            return refused
        return self._thread.submit(self._generate, request, on_tokens, is_cancelled)

    def _generate(self, request, on_tokens, is_cancelled) -> GenerationOutcome:
        tokens, emitted = self.reply[:request.max_new_tokens], []
        for start in range(0, len(tokens), self.step):
            if self.gate is not None:
                self.gate.wait()
            if is_cancelled():
                return GenerationOutcome(emitted, "cancelled", len(request.prompt_tokens))
            emitted += tokens[start:start + self.step]
            on_tokens(tokens[start:start + self.step])
            time.sleep(self.seconds_per_step)
        reason = "max_tokens" if len(self.reply) > request.max_new_tokens else "end_of_generation"
        return GenerationOutcome(emitted, reason, len(request.prompt_tokens), num_drafted=4, num_accepted=3)

    def in_use(self) -> int:
        return 0  # not counted: no test here reads the gauges' values

    def queued(self) -> int:
        return 0

    def close(self) -> None:
        self._thread.shutdown()


def _client(reply: str, step: int = 1, api_key: str | None = None, refusal: Exception | None = None,
            seconds_per_step: float = 0.002) -> TestClient:
    state = new_server_state(ScriptedSlots(reply, step, refusal, seconds_per_step),
                             SessionSettings(target="/models/fake.gguf"),
                             ServeSettings(), max_tokens=64, api_key=api_key)
    return TestClient(build_app(state))


def _streamed(client: TestClient, body: dict) -> tuple[str, list[dict]]:
    response = client.post("/v1/completions", json={**body, "stream": True})
    events = [event.removeprefix("data: ") for event in response.text.split("\n\n") if event]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    return "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"]), chunks


def test_stop_string_spanning_tokens_is_cut_and_stops_the_generation():
    reply = "Hello wonderful world, and much more text after it"
    # 40 ms a token: the cancel has over a second to arrive (at 2 ms, a loaded machine's 60 ms lost the race)
    text, chunks = _streamed(_client(reply, seconds_per_step=0.04), {"prompt": "hi", "stop": ["wonder", "zzz"],
                                                                     "stream_options": {"include_usage": True}})
    assert text == "Hello " and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] < len(reply) - 10  # cancelled soon after the stop


def test_replies_still_waiting_for_a_step_at_the_end_of_the_grace_period_end_as_a_shutdown():
    """A step that outlasts --shutdown-seconds (a long prompt's chunk on a CPU): uvicorn cancelled the handlers
    waiting for it, a 500 in plain text and a stream cut without [DONE]. They now end as a shutdown ends them."""
    gate = threading.Event()
    state = new_server_state(ScriptedSlots("never sent", gate=gate), SessionSettings(target="/models/fake.gguf"),
                             ServeSettings(), max_tokens=64, api_key=None)
    with TestClient(build_app(state)) as client, ThreadPoolExecutor(2) as pool:
        whole = pool.submit(client.post, "/v1/completions", json={"prompt": "hi"})
        stream = pool.submit(client.post, "/v1/completions", json={"prompt": "hi", "stream": True})
        deadline = time.monotonic() + 30
        while len(state.live) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        state.shutting_down.set()
        client.portal.call(state.abandon_live_generations)
        whole_answer, stream_answer = whole.result(timeout=30), stream.result(timeout=30)
        gate.set()  # the scripted step ends: cancelled, after the replies
    assert whole_answer.status_code == 503 and whole_answer.json()["error"]["code"] == "shutting_down"
    assert '"code":"shutting_down"' in stream_answer.text and stream_answer.text.rstrip().endswith("data: [DONE]")


def test_multibyte_characters_split_over_tokens_arrive_whole():
    reply = "héllo ✓ 日本"
    text, chunks = _streamed(_client(reply), {"prompt": "hi"})
    assert text == reply and all("\ufffd" not in chunk["choices"][0]["text"] for chunk in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_cut_in_the_middle_of_a_character_leaves_that_character_out(stream):
    """max_tokens ends "ab🐉" two bytes into its four-byte dragon: no U+FFFD the model never meant."""
    client = _client("ab🐉")
    body = {"prompt": "x", "max_tokens": 4}
    if stream:
        text, _ = _streamed(client, body)
    else:
        text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert text == "ab"


def test_whole_response_with_stop_and_usage():
    response = _client("one two three", step=3).post(
        "/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "count"}],
                                      "stop": "three"}).json()
    assert response["choices"][0]["message"]["content"] == "one two "
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["usage"]["drafted_tokens"] == 4 and response["usage"]["acceptance_rate"] == 0.75


def test_a_reply_counts_its_tokens_up_to_the_one_that_completed_the_stop_string():
    """However far the slots ran before they saw the stop (here at least to the end of its 3-token step)."""
    response = _client("one two three four", step=3).post("/v1/completions", json={"prompt": "count",
                                                                                    "stop": "three"}).json()
    assert response["choices"][0]["text"] == "one two "
    assert response["usage"]["completion_tokens"] == len(b"one two three")


def test_a_streamed_reply_counts_its_tokens_to_the_stop_string_too():
    _, chunks = _streamed(_client("one two three four", step=3), {"prompt": "count", "stop": ["two", "zz"],
                                                                  "stream_options": {"include_usage": True}})
    assert chunks[-1]["usage"]["completion_tokens"] == len(b"one two")


def test_metrics_count_a_reply_that_met_its_stop_string_and_max_tokens_in_one_step_as_stopped():
    """The client is told `stop` and 13 tokens: /metrics says the same, though the slots' last step emitted the
    stop string's end and 3 tokens more all at once and ended the generation at max_tokens."""
    client = _client("one two three four", step=20)
    response = client.post("/v1/completions", json={"prompt": "count", "stop": "three", "max_tokens": 16}).json()
    assert response["choices"][0]["finish_reason"] == "stop" and response["usage"]["completion_tokens"] == 13
    metrics = client.get("/metrics").text
    assert 'pocketspec_requests_total{endpoint="completions",outcome="stop"} 1.0' in metrics
    assert 'pocketspec_tokens_total{kind="completion"} 13.0' in metrics


def test_length_finish_when_max_tokens_cuts_the_reply():
    response = _client("abcdefgh").post("/v1/completions", json={"prompt": "x", "max_tokens": 3}).json()
    assert response["choices"][0] == {"index": 0, "text": "abc", "logprobs": None, "finish_reason": "length"}


def test_a_request_the_slots_refuse_gets_400_before_any_stream_and_counts_once():
    client = _client("x", refusal=UserError("the prompt does not fit a row"))
    response = client.post("/v1/completions", json={"prompt": "hi", "stream": True})
    assert response.status_code == 400 and "does not fit a row" in response.json()["error"]["message"]
    metrics = client.get("/metrics").text
    assert 'pocketspec_requests_total{endpoint="completions",outcome="rejected"} 1.0' in metrics


def test_errors_have_the_openai_shape():
    client = _client("x")
    for response, status in ((client.get("/v2/none"), 404), (client.put("/v1/completions"), 405),
                             (client.post("/v1/completions", content=b"{"), 400)):
        assert response.status_code == status
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_api_key():
    client = _client("x", api_key="k1")
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer k1"}).json()["data"][0]["id"] == "fake"
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("header, key, expected", [
    (None, None, True), (None, "k", False), ("Bearer k", "k", True), ("bearer  k", "k", True),
    ("Bearer k2", "k", False), ("k", "k", False), ("Basic k", "k", False),
])
def test_is_authorized(header, key, expected):
    assert is_authorized(header, key) is expected


@pytest.mark.parametrize("host, expected", [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("192.168.1.4", False),
                                            ("::", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


@pytest.mark.parametrize("host, api_key, refusal", [
    ("0.0.0.0", None, "not a loopback address"), ("0.0.0.0", "", "not a loopback address"),
    ("0.0.0.0", " ", "no client could send it"), ("127.0.0.1", "key ", "no client could send it"),
    ("0.0.0.0", "clé", "printable ASCII"), ("127.0.0.1", "key\tkey", "printable ASCII"),
    ("0.0.0.0", "key", None), ("127.0.0.1", "", None), ("127.0.0.1", None, None),
    ("no.such.host.invalid", None, "--host 'no.such.host.invalid' does not resolve"),  # RFC 6761: never resolves
    ("a" * 70 + ".com", None, "does not resolve"),  # a label past 63 characters: a UnicodeError from idna
])
def test_an_exposed_server_needs_a_key_that_a_client_can_send(host, api_key, refusal):
    from pocketspec.serve.listen import check_exposure

    if refusal is None:
        check_exposure(host, api_key)
    else:
        with pytest.raises(UserError, match=refusal):
            check_exposure(host, api_key)


@pytest.mark.parametrize("path", ["/health", "/v1/models"])
def test_headers_past_16_kib_that_arrive_whole_get_431(path):
    """h11 refuses only a header block still incomplete past its limit; one read of up to 64 KiB passed it."""
    client = _client("x")
    assert client.get(path, headers={"x-small": "a" * 1000}).status_code == 200
    response = client.get(path, headers={"x-big": "a" * 20_000})
    assert response.status_code == 431 and response.json()["error"]["code"] == "headers_too_large"
