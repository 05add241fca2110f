"""The servers of one engine, one request at a time: `pocketspec serve --devices cpu:0,cpu:1` on SmolLM2
(torch), a target split by layers, or by rows with rank 0 serving and a spawned rank following, and
`--backend onnx`. Each answers a greedy chat exactly as `generate` does with the same flags; concurrency
on them is refused with one line.
"""

from __future__ import annotations

import contextlib
import json
import time

import openai
import psutil
import pytest

from pocketspec.stats import vm_hwm_bytes
from serve_process import ServerProcess, error_of, metric_value
from test_cli_errors import assert_one_line_error, run_cli

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
QUESTION = "Name three colours of the rainbow."
SPLIT = ("--backend", "torch", "--devices", "cpu:0,cpu:1", "--max-context", "512")


def _generated_alone(flags: tuple, max_tokens: int, question: str) -> dict:
    """`generate --chat --json` of the question in a fresh process, on the same split."""
    generated = run_cli("generate", "--target", MODEL, "--draft", "ngram", "--threads", "1", *flags,
                        "--max-tokens", str(max_tokens), "--chat", "--json", "--prompt", question)
    assert generated.returncode == 0, generated.stderr
    return json.loads(generated.stdout)


@contextlib.contextmanager
def _asking(flags: tuple, max_tokens: int):
    """ask(question) -> the chat completion of a server on `flags`, greedy; the server stops cleanly after."""
    server = ServerProcess(*flags, "--max-tokens", str(max_tokens))
    try:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)

        def ask(question: str):
            return client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": question}], temperature=0)
        ask.server = server
        yield ask
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.mark.parametrize("split_mode", ["layer", "row"])
def test_a_split_target_serves_what_generate_returns_with_the_same_split(smollm2_path, split_mode):
    flags = (*SPLIT, "--split-mode", split_mode)
    expected = _generated_alone(flags, 16, QUESTION)
    with _asking(flags, 16) as ask:
        reply = ask(QUESTION)
        assert expected["tokens"] and reply.choices[0].message.content == expected["text"]
        assert reply.usage.completion_tokens == len(expected["tokens"])
        if split_mode == "row":
            _assert_peak_gauge_counts_every_rank(ask.server)


def _assert_peak_gauge_counts_every_rank(server: ServerProcess) -> None:
    """On cpu:N the budget bounds every rank's process; the gauge showed the serving process's alone."""
    with server.client() as http:
        gauge = metric_value(http.get("/metrics").text, "pocketspec_peak_memory_bytes")
    processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
    peaks = [vm_hwm_bytes(process.pid) or 0 for process in processes]
    assert len(peaks) >= 2 and gauge >= 0.9 * sum(peaks), (gauge, peaks)


def test_a_row_split_server_whose_rank_died_says_so_on_health_and_to_every_request(smollm2_path):
    """It answered every later request 400 invalid_request, counted as rejected, logged nothing, and /health
    stayed ok: no load balancer or supervisor could tell the server could not generate any more."""
    server = ServerProcess(*SPLIT, "--split-mode", "row", "--max-tokens", "8")
    try:
        follower = next(child for child in psutil.Process(server.process.pid).children()
                        if "spawn_main" in " ".join(child.cmdline()))
        follower.kill()
        deadline = time.monotonic() + 30
        while follower.is_running() and follower.status() != psutil.STATUS_ZOMBIE:  # rank 0 reaps it later
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with server.client() as http:
            # the request that finds the rank gone, then one refused before it is queued (a stream too)
            for stream in (False, False, True):
                answer = http.post("/v1/completions", json={"prompt": "hi", "stream": stream})
                assert answer.status_code == 500 and error_of(answer)["code"] == "model_lost", answer.text
                assert "rank 1 was killed by signal 9" in error_of(answer)["message"]
            health = http.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "model_lost"
            metrics = http.get("/metrics").text
        assert 'pocketspec_requests_total{endpoint="completions",outcome="failed"} 3.0' in metrics
        assert server.stderr().count("the model cannot run any more") == 1
    finally:
        assert server.stop() == 0, server.stderr()


def test_concurrent_requests_on_a_split_torch_target_are_refused_with_one_line(smollm2_path):
    result = run_cli("serve", "--target", MODEL, "--draft", "ngram", *SPLIT, "--max-concurrency", "2", "--port", "0")
    assert_one_line_error(result, "--max-concurrency 2 with --devices", "--max-concurrency 1")


def test_a_split_target_reuses_whole_chunks_only_so_a_later_request_computes_what_it_would_alone(smollm2_path):
    """The split's one engine keeps the whole 512-token prefill chunks a next prompt shares, not any prefix:
    a request after another that shares 915 tokens with it reuses 512 and answers as the same request alone
    (generate, a fresh process, the same split)."""
    shared = " ".join(f"item {index}" for index in range(200))  # about 900 tokens
    first, second = f"{shared}\nHow many items?", f"{shared}\nName the last item."
    flags = (*SPLIT[:-1], "1536")
    expected = _generated_alone(flags, 12, second)
    with _asking(flags, 12) as ask:
        assert ask(first).usage.prompt_tokens_details.cached_tokens == 0
        reply = ask(second)
        assert reply.usage.prompt_tokens_details.cached_tokens == 512  # any prefix: all 915 shared
        assert reply.choices[0].message.content == expected["text"]


def test_onnx_serves_what_generate_returns_and_refuses_concurrency(smollm2_path):
    """ONNX Runtime decodes one sequence at a time: its server runs one engine (it was refused whatever
    --max-concurrency said)."""
    flags = ("--backend", "onnx", "--weights", "fp32", "--max-context", "512")
    expected = _generated_alone(flags, 12, QUESTION)
    with _asking(flags, 12) as ask:
        reply = ask(QUESTION)
        assert expected["tokens"] and reply.choices[0].message.content == expected["text"]
    result = run_cli("serve", "--target", MODEL, *flags, "--max-concurrency", "2", "--port", "0")
    assert_one_line_error(result, "--max-concurrency 2 with --backend onnx", "--max-concurrency 1")
