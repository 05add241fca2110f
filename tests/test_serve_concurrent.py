"""`pocketspec serve --backend torch`: requests sent at once are answered together by the continuous-
batching pool, and at temperature 0 each returns exactly the tokens it returns alone (the
batch-invariant kernels), through the real server and the real `openai` client."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from serve_process import ServerProcess

pytestmark = pytest.mark.real_model

MODEL = "smollm2-135m-instruct"
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Count from one to five.",
             "What do bees make?", "Say hello in Spanish.", "Which planet is the largest?",
             "What is two plus two?", "Name a fruit that is yellow."]
SERVER_SEED = 11


@pytest.fixture(scope="module")
def client(smollm2_path):
    server = ServerProcess("--backend", "torch", "--max-concurrency", "4", "--max-context", "512",
                           "--max-tokens", "20", "--seed", str(SERVER_SEED))
    yield openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)
    assert server.stop() == 0, server.stderr()


def test_the_servers_seed_is_that_of_every_request_without_one(client):
    """`serve --seed N`: a sampled request without a seed samples with N, so it repeats its reply."""
    def ask():
        reply = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTIONS[0]}], temperature=1.0, max_tokens=8)
        return reply.headers["x-pocketspec-seed"], reply.parse().choices[0].message.content

    first = ask()
    assert first[0] == str(SERVER_SEED) and first[1] and ask() == first


def _reply(client, question: str) -> str:
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                           temperature=0)
    return reply.choices[0].message.content


def test_eight_concurrent_requests_each_equal_the_request_alone(client):
    alone = [_reply(client, question) for question in QUESTIONS]
    assert all(alone)
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda question: _reply(client, question), QUESTIONS))
    assert together == alone


@pytest.fixture(scope="module")
def self_sparse_client(smollm2_path):
    server = ServerProcess("--backend", "torch", "--draft", "self-sparse", "--max-concurrency", "4",
                           "--max-context", "512", "--max-tokens", "24")
    yield openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)
    assert server.stop() == 0, server.stderr()


def test_seeded_sampled_requests_with_a_draft_model_repeat_alone_and_together(self_sparse_client, client):
    """A self-sparse draft drafts every request; with a seed each, sampled replies sent one by one and then all
    at once (beside each other's drafts, after the controller and the corpus have learned) are the same, and
    are what the n-gram-drafting server samples for them."""
    def sampled(server_client, index_question):
        index, question = index_question
        reply = server_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], temperature=1.0, seed=100 + index,
            max_tokens=20)
        return reply.choices[0].message.content

    numbered = list(enumerate(QUESTIONS))
    alone = [sampled(self_sparse_client, item) for item in numbered]
    assert all(alone) and len(set(alone)) == len(alone)
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda item: sampled(self_sparse_client, item), numbered))
    assert together == alone
    assert [sampled(client, item) for item in numbered] == alone
