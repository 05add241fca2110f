"""The slots a server generates with, on SmolLM2: requests that join while others run return
exactly the tokens they return alone (torch's batch-invariant pool; greedy), a cancelled request
frees its slot within a step, one slot serves requests in turn, and llama.cpp's rows run requests
together, each as it runs alone, each sent to the slot that has whole chunks of its prompt cached."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from pocketspec.backends.ggml_ops import row_exact_max_rows
from pocketspec.conversation.chat_template import encode_chat
from pocketspec.serve.generation import GenerationRequest
from pocketspec.serve.open import open_slots
from pocketspec.session_settings import SessionSettings
from pocketspec.settings import SamplingSettings

pytestmark = pytest.mark.real_model
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.",
             "Count from one to five in words.", "What do bees make?", "Say hello in Spanish.",
             "Which planet is the largest?"]


def _settings(backend: str) -> SessionSettings:
    return SessionSettings(target="smollm2-135m-instruct", draft="ngram", max_context=512, threads=1,
                           options={"backend": backend})


def _prompt(slots, question: str) -> list[int]:
    return encode_chat(slots.tokenizer, slots.template, [{"role": "user", "content": question}])


def _generate(slots, prompt_tokens, max_new_tokens=24, sampling=SamplingSettings(), is_cancelled=lambda: False):
    streamed: list[int] = []
    future = slots.submit(GenerationRequest(prompt_tokens, max_new_tokens, sampling), streamed.extend, is_cancelled)
    return future, streamed


@pytest.fixture(scope="module")
def torch_slots(one_torch_thread):
    slots = open_slots(_settings("torch"), max_concurrency=4)
    yield slots
    slots.close()


def _assert_concurrent_requests_equal_each_alone(slots) -> None:
    prompts = [_prompt(slots, question) for question in QUESTIONS]
    alone = [_generate(slots, prompt)[0].result(timeout=300).tokens for prompt in prompts]
    submitted = []
    for prompt in prompts:  # more requests than rows, joining while others run
        submitted.append(_generate(slots, prompt))
        time.sleep(0.05)
    assert all(len(tokens) > 4 for tokens in alone)
    for (future, streamed), expected in zip(submitted, alone):
        outcome = future.result(timeout=300)
        assert outcome.tokens == expected and streamed == expected
        assert outcome.stop_reason in ("max_tokens", "end_of_generation")
    assert slots.in_use() == 0 and slots.queued() == 0


def test_concurrent_requests_equal_each_alone_on_the_torch_pool(torch_slots):
    _assert_concurrent_requests_equal_each_alone(torch_slots)


def test_a_cancelled_request_stops_and_frees_its_row(torch_slots):
    """Cancelled as its first tokens stream (a client that disconnects then), a long answer stops at the next
    step: no race between the test's thread and the pool's."""
    prompt = _prompt(torch_slots, "Write a long story about a lighthouse keeper and his dog.")
    cancel = threading.Event()

    def on_tokens(tokens: list[int]) -> None:
        cancel.set()

    future = torch_slots.submit(GenerationRequest(prompt, 400, SamplingSettings()), on_tokens, cancel.is_set)
    outcome = future.result(timeout=60)
    assert outcome.stop_reason == "cancelled" and len(outcome.tokens) < 400
    assert _generate(torch_slots, prompt)[0].result(timeout=300).stop_reason in ("max_tokens", "end_of_generation")
    assert torch_slots.in_use() == 0


def test_each_request_samples_with_its_own_settings_and_seed(torch_slots):
    prompt = _prompt(torch_slots, QUESTIONS[1])
    sampled = SamplingSettings(temperature=1.0, seed=7)
    first, second = (_generate(torch_slots, prompt, sampling=sampled)[0].result(timeout=300).tokens
                     for _ in range(2))
    assert len(first) > 4 and first == second  # the same seed draws the same tokens, whatever ran before


def test_the_torch_pool_sends_a_conversation_to_the_row_that_holds_its_prompt(one_torch_thread):
    """A second turn whose prompt begins with the first (over 512 tokens, one prefill chunk) goes to
    the row that holds it and prefills only the rest; evicted (two other long prompts fill both
    rows), the same second turn prefilled whole returns the same tokens."""
    slots = open_slots(replace(_settings("torch"), max_context=2048), max_concurrency=2)
    try:
        story = " ".join(f"Day {day}: the keeper lit the lamp at dusk and wrote the weather in the log."
                         for day in range(1, 40))
        messages = [{"role": "user", "content": f"{story}\nWhat did the keeper do each day?"}]
        first_prompt = encode_chat(slots.tokenizer, slots.template, messages)
        assert len(first_prompt) > 512
        first = _generate(slots, first_prompt, max_new_tokens=12)[0].result(timeout=300)
        answer = slots.tokenizer.decode(first.tokens)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And at dawn?"}]
        second_prompt = encode_chat(slots.tokenizer, slots.template, messages)
        assert second_prompt[:512] == first_prompt[:512]
        second = _generate(slots, second_prompt, max_new_tokens=12)[0].result(timeout=300)
        assert second.num_reused_tokens == 512 and second.tokens
        others = [_generate(slots, _prompt(slots, f"{question} {story}"), max_new_tokens=2)[0]
                  for question in QUESTIONS[:2]]
        assert all(other.result(timeout=300).num_reused_tokens == 0 for other in others)
        again = _generate(slots, second_prompt, max_new_tokens=12)[0].result(timeout=300)
        assert again.num_reused_tokens == 0 and again.tokens == second.tokens
    finally:
        slots.close()


def test_one_slot_serves_requests_in_turn_and_reuses_whole_chunks_of_the_last_prompt():
    slots = open_slots(replace(_settings("llama.cpp"), max_context=2048), max_concurrency=1)
    try:
        story = " ".join(f"Day {day}: the keeper lit the lamp at dusk." for day in range(1, 60))
        prompt = _prompt(slots, f"{story}\n{QUESTIONS[2]}")
        assert len(prompt) > 512
        futures = [_generate(slots, prompt) for _ in range(3)]
        outcomes = [future.result(timeout=300) for future, _ in futures]
        assert outcomes[0].tokens and outcomes[0].tokens == outcomes[1].tokens == outcomes[2].tokens
        assert outcomes[0].num_reused_tokens == 0
        assert outcomes[2].num_reused_tokens == 512  # the same prompt again: its first chunk was kept
        short = _prompt(slots, QUESTIONS[2])
        assert [_generate(slots, short)[0].result(timeout=300).num_reused_tokens for _ in range(2)] == [0, 0]
    finally:
        slots.close()


def test_llama_rows_run_requests_as_each_runs_alone_and_each_goes_where_its_prefix_is_cached():
    slots = open_slots(replace(_settings("llama.cpp"), max_context=2048), max_concurrency=2)
    try:
        assert slots.num_slots == 2
        if row_exact_max_rows():  # each row rounds as alone only with the row-exact kernels
            _assert_concurrent_requests_equal_each_alone(slots)
        stories = [_prompt(slots, " ".join(f"Day {day}: the {keeper} lit the lamp at dusk." for day in range(1, 60)))
                   for keeper in ("keeper", "baker")]
        assert all(len(story) > 512 for story in stories)  # a whole chunk of 512 to keep
        futures = [_generate(slots, story, max_new_tokens=12)[0] for story in stories]
        outcomes = [future.result(timeout=300) for future in futures]  # slot 0 took the first, slot 1 the second
        for story, outcome in reversed(list(zip(stories, outcomes))):  # each again, second first
            again = _generate(slots, story + outcome.tokens[:4], max_new_tokens=4)[0].result(timeout=300)
            assert again.num_reused_tokens == 512  # went to the slot that had its first chunk cached
        assert slots.in_use() == 0 and slots.queued() == 0
    finally:
        slots.close()


def test_a_request_cancelled_while_its_prompt_prefills_stops_at_the_next_chunk():
    """A client that leaves while its long prompt prefills frees the slot at the next chunk, before the rest of
    the prompt and its first token; meanwhile the slot shows as in use, not the request as queued."""
    slots = open_slots(replace(_settings("llama.cpp"), max_context=2048), max_concurrency=1)
    try:
        story = " ".join(f"Day {day}: the keeper lit the lamp at dusk." for day in range(1, 120))
        prompt = _prompt(slots, story)
        assert len(prompt) > 1024  # more than one chunk of 512
        seen: list[tuple[int, int]] = []

        def is_cancelled() -> bool:  # true once the prompt holds the slot: at its first chunk's end
            seen.append((slots.in_use(), slots.queued()))
            return slots.in_use() > 0

        outcome = slots.submit(GenerationRequest(prompt, 8, SamplingSettings()), lambda tokens: None,
                               is_cancelled).result(timeout=300)
        assert outcome.stop_reason == "cancelled" and outcome.tokens == []
        assert seen[-1] == (1, 0) and slots.in_use() == 0 and slots.queued() == 0
        assert _generate(slots, _prompt(slots, QUESTIONS[0]), max_new_tokens=4)[0].result(timeout=300).tokens
    finally:
        slots.close()


def test_serving_on_llama_cpp_loads_no_torch(smollm2_path):
    """--memory-budget bounds the whole process: the pool that serves llama.cpp must not pull in torch
    (about 180 MiB resident on this CPU)."""
    code = ("import sys\n"
            "from pocketspec.serve.open import open_slots\n"
            "from pocketspec.session_settings import SessionSettings\n"
            f"settings = SessionSettings(target={str(smollm2_path)!r}, draft='ngram', max_context=256, threads=1)\n"
            "open_slots(settings, max_concurrency=2).close()\n"
            "print(sorted(name for name in ('torch', 'torchao') if name in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_a_waiting_request_whose_client_left_is_answered_while_another_runs(one_torch_thread):
    """One slot (a torch target split over two devices, as ONNX serves): a request that waits in the queue and
    whose client leaves is answered as cancelled within a step of the running one, freeing its place at once."""
    settings = replace(_settings("torch"), draft="none", options={"backend": "torch", "devices": "cpu:0,cpu:1"})
    slots = open_slots(settings, max_concurrency=1)
    try:
        client_gone = threading.Event()
        counting = slots.tokenizer.encode(", ".join(str(number) for number in range(1, 30)) + ",")
        running = slots.submit(GenerationRequest(counting, 100, SamplingSettings()),  # counts on, far past a step
                               lambda tokens: client_gone.set(), lambda: False)
        waiting_streamed: list[int] = []
        waiting = slots.submit(GenerationRequest(_prompt(slots, QUESTIONS[1]), 24, SamplingSettings()),
                               waiting_streamed.extend, client_gone.is_set)
        was_running_done = []
        waiting.add_done_callback(lambda _: was_running_done.append(running.done()))  # on the engine's thread
        outcome = waiting.result(timeout=300)
        assert was_running_done == [False]  # answered between the running request's steps
        assert outcome.stop_reason == "cancelled" and outcome.tokens == [] and waiting_streamed == []
        assert running.result(timeout=600).stop_reason == "max_tokens"
        assert slots.queued() == 0 and slots.in_use() == 0
    finally:
        slots.close()
