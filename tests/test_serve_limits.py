"""`pocketspec serve`'s limits on SmolLM2: an API key (401 without it, never in the logs), a full queue
(503 with Retry-After), SIGTERM and Ctrl-C during a request (exit 0, in bounded time), and the flags
refused before anything loads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from serve_process import ServerProcess, error_of
from test_cli_errors import assert_one_line_error

pytestmark = pytest.mark.real_model

API_KEY = "test-key-4b1d"
LONG_REQUEST = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1500, "stream": True}


@pytest.fixture(scope="module")
def keyed_server(smollm2_path):
    server = ServerProcess("--max-queue", "0", "--max-context", "2048", "--memory-budget", "1GiB",
                           env={"POCKETSPEC_API_KEY": API_KEY})
    yield server
    assert server.stop() == 0
    assert API_KEY not in server.stderr()


def _authorization(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("headers", [{}, _authorization("wrong-key"), {"Authorization": API_KEY}])
def test_missing_or_wrong_key_gets_401(keyed_server, headers):
    with keyed_server.client(headers=headers) as http:
        for response in (http.get("/v1/models"), http.get("/metrics"),
                         http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})):
            assert response.status_code == 401 and error_of(response)["code"] == "invalid_api_key"


def test_the_key_opens_the_api_and_health_needs_none(keyed_server):
    client = openai.OpenAI(base_url=keyed_server.api_url, api_key=API_KEY, max_retries=0)
    assert client.completions.create(model="smollm2-135m-instruct", prompt="Hello", max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.api_url, api_key="nope", max_retries=0).models.list()
    with keyed_server.client() as http:
        assert http.get("/health").status_code == 200


def test_the_budget_keeps_the_servers_own_memory_beside_the_models(keyed_server):
    """Its libraries and one request (--max-queue 0) of up to 4 MiB, three copies, come off the budget."""
    assert ("memory plan (serve): the server keeps 38.00 MiB of --memory-budget 1.00 GiB (server libraries 24.00 MiB, "
            "requests held 14.00 MiB: 1 request, running and queued, of up to --max-body 4MiB)"
            ) in keyed_server.stderr()
    assert "of 986.00 MiB" in keyed_server.stderr()  # the models' plan, within what is left


def test_full_queue_gets_503_with_retry_after(keyed_server):
    with keyed_server.client(headers=_authorization(API_KEY)) as http:
        with http.stream("POST", "/v1/completions", json=LONG_REQUEST) as running:
            # Keep the line iterator referenced: a dropped one is finalized whenever the garbage collector
            # runs, and closing it closes the connection, so the server rightly frees the place.
            lines = running.iter_lines()
            first_line = next(lines)  # generating now: the one place is taken
            refused = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, (first_line, refused.text)
            assert next(lines, None) is not None  # the first request was still streaming when the second was refused
            assert error_of(refused)["code"] == "queue_full"
        deadline = time.monotonic() + 20
        while (answer := http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})).status_code == 503:
            assert time.monotonic() < deadline, "the slot did not free after its client left"
            time.sleep(0.1)
        assert answer.status_code == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_during_a_request_exits_0_in_bounded_time(smollm2_path, sig):
    server = ServerProcess("--max-context", "2048", "--shutdown-seconds", "10")
    try:
        with server.client() as http, http.stream("POST", "/v1/completions", json=LONG_REQUEST) as running:
            lines = running.iter_lines()
            next(lines)
            started = time.monotonic()
            server.process.send_signal(sig)
            rest = "\n".join(lines)  # the stream ends: cancelled, with an error event and [DONE]
        assert server.process.wait(timeout=30) == 0, server.stderr()
        assert time.monotonic() - started < 30
        assert "shutting_down" in rest and rest.rstrip().endswith("data: [DONE]")
        assert "Traceback" not in server.stderr()
    finally:
        server.stop(signal.SIGKILL)


def test_a_signal_while_long_prompts_prefill_or_wait_ends_every_reply_as_a_shutdown(smollm2_path):
    """The slots' thread went on admitting every waiting request, prefilling its prompt, before it looked at the
    signal again; and a prompt's chunk can outlast the grace period on a CPU. uvicorn then cancelled the handlers:
    500s, streams cut without [DONE], tracebacks. Every reply now ends as a shutdown ends it."""
    server = ServerProcess("--max-context", "4096", "--max-concurrency", "4", "--shutdown-seconds", "2")
    prompts = [[100 + (index * 7919 + position * 104729) % 40000 for position in range(1800)] for index in range(6)]

    def send(index: int) -> str:
        body = {"prompt": prompts[index], "max_tokens": 50, "stream": index % 2 == 0}
        with server.client() as http:
            response = http.post("/v1/completions", json=body)
        assert response.status_code in (200, 503), response.text
        if response.status_code == 503:  # not started: the error object
            return error_of(response)["code"]
        if body["stream"]:  # started: ended with an error event (shutting_down) or whole, and [DONE]
            assert response.text.rstrip().endswith("data: [DONE]"), response.text
        return "answered"

    try:
        with ThreadPoolExecutor(len(prompts)) as pool, server.client() as http:
            replies = [pool.submit(send, index) for index in range(len(prompts))]
            deadline = time.monotonic() + 60
            while (sum(http.get("/health").json()[key] for key in ("slots_in_use", "queued")) < len(prompts)
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            outcomes = [reply.result(timeout=60) for reply in replies]
        assert server.process.wait(timeout=60) == 0, server.stderr()
        assert time.monotonic() - started < 30, server.stderr()  # the replies at 2 s; the exit after the chunk
        assert set(outcomes) <= {"answered", "shutting_down"}
        assert "Traceback" not in server.stderr() and "graceful shutdown exceeded" not in server.stderr()
    finally:
        server.stop(signal.SIGKILL)


def test_a_body_still_arriving_at_a_signal_is_answered_503_at_once(smollm2_path):
    """uvicorn would wait out --shutdown-seconds for the rest of the body, then cancel the request: a 500 in
    plain text and a traceback in the log."""
    server = ServerProcess("--shutdown-seconds", "60")
    try:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as connection:
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 100\r\n\r\n" + b'{"pro')
            time.sleep(1.5)  # the headers parsed, the app waiting for the rest of the body
            server.process.send_signal(signal.SIGINT)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503") and b'"code":"shutting_down"' in answer, answer
        assert server.process.wait(timeout=20) == 0
        assert "Traceback" not in server.stderr()
    finally:
        server.stop(signal.SIGKILL)


def _serve(*flags: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "POCKETSPEC_API_KEY"}
    return subprocess.run([sys.executable, "-m", "apps.cli", "serve", "--target", "smollm2-135m-instruct", *flags],
                          capture_output=True, text=True, timeout=120, env=environment)


def test_non_loopback_host_without_a_key_is_refused():
    assert_one_line_error(_serve("--host", "0.0.0.0"), "loopback", "--api-key")


def test_taken_port_is_refused():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert_one_line_error(_serve("--port", str(taken.getsockname()[1])), "cannot listen", "--port")


@pytest.mark.parametrize("flags, fragment", [
    (["--max-body", "lots"], "--max-body"),
    (["--max-concurrency", "0"], "--max-concurrency"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--port", "70000"], "--port"),
    (["--max-concurrency", "16", "--max-context", "4096", "--memory-budget", "400MiB", "--max-body", "64KiB",
      "--max-queue", "0"], "--max-concurrency 16"),
    # the server's own libraries and the requests it holds come off the budget before the models plan
    (["--memory-budget", "200MiB"], "the server keeps 262.00 MiB of --memory-budget 200.00 MiB"),
    (["--memory-budget", "400MiB"], "what is left for the models: the server keeps 262.00 MiB"),
    (["--max-concurrency", "300"], "at most 256 sequences; lower --max-concurrency"),  # llama.cpp's LLAMA_MAX_SEQ
])
def test_bad_flags_get_one_line(flags, fragment):
    assert_one_line_error(_serve(*flags), fragment)


def test_a_refusal_that_is_not_the_budgets_gets_no_budget_advice(tmp_path):
    """The server's share of --memory-budget is named where the models' plan was refused, not on a model that
    is missing (whose error then read as if the budget were to blame)."""
    missing = tmp_path / "absent.gguf"
    result = _serve("--target", str(missing), "--memory-budget", "3GiB")
    assert_one_line_error(result, f"model file {missing} does not exist")
    assert "budget" not in result.stderr
