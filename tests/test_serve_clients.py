"""`pocketspec serve` as clients meet it: the request fields the current `openai` client sends in place of
older ones (`safety_identifier` and `prompt_cache_key` replace `user`), stream options, an API key that no
client can put in a header, and an uptime monitor's HEAD probe. One server for the module, on SmolLM2."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from serve_process import ServerProcess, error_of
from test_cli_errors import assert_one_line_error

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    server = ServerProcess("--max-context", "512", "--max-tokens", "4")
    yield server
    assert server.stop() == 0, server.stderr()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


def test_the_successors_of_user_and_the_default_values_of_newer_fields_are_accepted(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, safety_identifier="hashed-user-42",
                                           prompt_cache_key="conversation-7", verbosity="medium",
                                           prompt_cache_retention="in_memory")
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_without_obfuscation_is_served(client, endpoint):
    options = {"stream": True, "stream_options": {"include_obfuscation": False, "include_usage": True}}
    if endpoint == "chat":
        chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, **options))
    else:
        chunks = list(client.completions.create(model=MODEL, prompt="Hello", **options))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("options, param", [
    ({"verbosity": "low"}, "verbosity"),
    ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
])
def test_newer_fields_that_ask_for_something_are_refused_as_unsupported(client, options, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, **options)
    assert refused.value.param == param and refused.value.code == "unsupported_parameter"
    assert "is not supported by this server" in refused.value.message


@pytest.mark.parametrize("field", ["safety_identifier", "prompt_cache_key"])
def test_the_successors_of_user_are_typed_as_openai_types_them(server, field):
    with server.client() as http:
        response = http.post("/v1/chat/completions", json={"messages": HELLO, field: 42})
    assert response.status_code == 422 and error_of(response)["param"] == field, response.text


def test_an_uptime_monitors_head_probe_of_health_gets_200_without_a_body(server):
    with server.client() as http:
        response = http.head("/health")
    assert response.status_code == 200 and response.content == b""


def test_an_api_key_no_client_can_send_is_refused_before_the_model_loads(smollm2_path):
    """httpx (the openai client's transport) refuses a header value that is not ASCII, so such a server
    would answer 401 to every request."""
    result = subprocess.run([sys.executable, "-m", "apps.cli", "serve", "--target", MODEL, "--port", "0",
                             "--api-key", "clé"], capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, "--api-key", "character 3 is not printable ASCII")
    assert "é" not in result.stderr  # nothing of the key is printed
