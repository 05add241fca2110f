"""The torch backend on SmolLM2-135M (the same GGUF llama.cpp runs): it agrees with llama.cpp,
and on fp32 CPU greedy speculative decoding equals plain decoding for every drafter."""

from __future__ import annotations

import numpy as np
import pytest

from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.backends.torch_open import open_self_draft
from pocketspec.chat_template import encode_chat, template_for
from pocketspec.engine import SpeculativeEngine
from pocketspec.settings import ModelSettings, SpeculationSettings

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five fruits, one per line.",
    "Explain why the sky is blue to a child.",
    "Translate 'good morning, my friend' into Spanish and German.",
]
REPETITIVE_PROMPT = ("Copy this list exactly, twice:\n"
                     "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda, mu\n")
NUM_GENERATED = 64
SETTINGS = ModelSettings(backend="torch", weights="fp32", max_context=1024, max_logits_rows=NUM_GENERATED + 1)


@pytest.fixture(scope="module")
def smollm2_torch(smollm2_path):
    with TorchBackend.open(smollm2_path, SETTINGS) as backend:
        yield backend


def _chat(backend, text: str) -> list[int]:
    tokenizer = backend.tokenizer
    return encode_chat(tokenizer, template_for(tokenizer), [{"role": "user", "content": text}])


def _llama_cpp_greedy(backend: LlamaCppBackend, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """llama.cpp's plain greedy continuation and the logits it chose each token from."""
    backend.rollback(0)
    logits = [backend.prefill(prompt).copy()]
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < NUM_GENERATED:
        logits.append(backend.forward(tokens[-1:], [0])[0].copy())
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, np.stack(logits)


def test_agrees_with_llama_cpp_over_64_greedy_tokens(smollm2_path, smollm2_torch):
    reference = LlamaCppBackend(smollm2_path, ModelSettings(max_context=1024))
    num_agreeing = num_positions = 0
    try:
        for text in PROMPTS:
            prompt = _chat(smollm2_torch, text)
            tokens, theirs = _llama_cpp_greedy(reference, prompt)
            smollm2_torch.rollback(0)
            smollm2_torch.prefill(prompt[:-1])
            # the same sequence through torch, scored at the positions llama.cpp chose from
            ours = smollm2_torch.forward(prompt[-1:] + tokens[:-1], range(NUM_GENERATED))
            cosines = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
            assert cosines.min() >= 0.99, f"{text!r}: cosine {cosines.min():.4f} at {int(cosines.argmin())}"
            num_agreeing += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
            num_positions += NUM_GENERATED
    finally:
        reference.close()
    assert num_agreeing / num_positions >= 0.95


def _generate(target, prompt: list[int], num_tokens: int, *, drafter: str, gamma=None, draft_backend=None):
    engine = SpeculativeEngine(target, draft_backend=draft_backend,
                               speculation=SpeculationSettings(drafter=drafter, gamma=gamma))
    target.rollback(0)
    return engine.generate(prompt, num_tokens)


@pytest.mark.parametrize("prompt_text", [REPETITIVE_PROMPT, PROMPTS[1]])
def test_ngram_greedy_equals_plain_exactly(smollm2_torch, prompt_text):
    prompt = _chat(smollm2_torch, prompt_text)
    expected = _generate(smollm2_torch, prompt, 96, drafter="none").tokens
    result = _generate(smollm2_torch, prompt, 96, drafter="ngram", gamma=6)
    assert result.tokens == expected
    if prompt_text is REPETITIVE_PROMPT:
        assert result.stats.num_accepted > 0


@pytest.mark.parametrize("kind, kv_type", [("self-sparse", "auto"), ("self-sparse", "int8"), ("self-skip", "auto")])
def test_self_draft_greedy_equals_plain_exactly(smollm2_torch, kind, kv_type):
    """A 128-position sparse window under a 1024-token target slides during these 200 tokens."""
    prompt = _chat(smollm2_torch, PROMPTS[1])
    expected = _generate(smollm2_torch, prompt, 200, drafter="none").tokens
    speculation = SpeculationSettings(self_draft_window=128, self_draft_kv_type=kv_type, self_skip_layers=20)
    draft_backend = open_self_draft(smollm2_torch, kind, SETTINGS, speculation)
    result = _generate(smollm2_torch, prompt, 200, drafter="model", gamma=4, draft_backend=draft_backend)
    assert result.tokens == expected
    assert result.stats.num_accepted > 0
    if kind == "self-sparse":
        assert draft_backend.max_context == 128 and len(prompt) + 200 > 128
