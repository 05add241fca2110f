"""Several sequences of one llama.cpp context (pocketspec/backends/llama_sequences.py), on SmolLM2:
engines on their own threads decode together, roll back on their own, and each request's greedy
tokens equal the same request alone, token by token; at a first difference, if any, the target's
own top-2 gap must be within kernel rounding (a wider batch rounds differently, as a verify does)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import assert_matches_plain
from pocketspec.backends.llama_context import LlamaModelContext
from pocketspec.backends.llama_cpp_backend import LlamaSequence
from pocketspec.backends.llama_sequences import DecodeRounds
from pocketspec.session import open_session
from pocketspec.session_settings import SessionSettings
from pocketspec.settings import ModelSettings, SamplingSettings

pytestmark = pytest.mark.real_model
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Count from one to five.",
             "What do bees make?", "Say hello in Spanish.", "Which planet is the largest?",
             "What is two plus two?", "Name a fruit that is yellow."]
NUM_SEQUENCES = 4
MAX_NEW_TOKENS = 32


def _settings(smollm2_path, drafter: str) -> SessionSettings:
    """drafter "model": SmolLM2 drafts for itself as a draft model (its own shared context, batched alike)."""
    draft = str(smollm2_path) if drafter == "model" else drafter
    return SessionSettings(target=str(smollm2_path), draft=draft, max_context=512, threads=1,
                           sampling=SamplingSettings(temperature=0.0))


@pytest.mark.parametrize("drafter", ["ngram", "none", "model"])
def test_requests_decoded_together_equal_each_alone(smollm2_path, drafter, monkeypatch):
    import llama_cpp

    decoding_threads = set()  # every llama_decode runs on the rounds' one thread (one OpenMP team)
    real_decode = llama_cpp.llama_decode

    def recorded_decode(*args):
        decoding_threads.add(threading.get_ident())
        return real_decode(*args)

    with open_session(_settings(smollm2_path, drafter), num_sequences=NUM_SEQUENCES) as shared:
        monkeypatch.setattr(llama_cpp, "llama_decode", recorded_decode)
        prompts = [shared.encode(question, chat=True) for question in QUESTIONS]
        rounds = shared.shared_contexts.rounds
        together: dict[int, list[int]] = {}

        def generate(engine_index: int) -> None:
            rounds.join()
            try:
                for index in range(engine_index, len(prompts), NUM_SEQUENCES):  # two requests per engine
                    engine = shared.engines[engine_index]
                    engine.reset()
                    together[index] = engine.generate(prompts[index], MAX_NEW_TOKENS).tokens
            finally:
                rounds.leave()

        threads = [threading.Thread(target=generate, args=(index,)) for index in range(NUM_SEQUENCES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert len(together) == len(prompts)
        assert rounds.num_forwards > 2 * rounds.num_rounds  # most rounds carried several sequences
        assert len(decoding_threads) == 1 and not decoding_threads & {thread.ident for thread in threads}
        monkeypatch.undo()
        if drafter == "ngram":  # one corpus of finished outputs for every sequence's drafter
            assert len({id(engine.ngram.corpus) for engine in shared.engines}) == 1
            assert shared.engines[0].ngram.corpus.counts(tuple(together[1][:2]))  # engine 1's answer, seen by 0
        if drafter == "model":
            assert all(engine.model is not None for engine in shared.engines)
            assert len({id(engine.model.backend.native) for engine in shared.engines}) == 1  # one draft context
    with open_session(_settings(smollm2_path, drafter)) as alone:
        for index, prompt in enumerate(prompts):
            alone.reset()
            expected = alone.engine.generate(prompt, MAX_NEW_TOKENS).tokens
            assert len(expected) > 3
            assert_matches_plain(alone.engine.target, prompt, together[index], expected)


def test_a_sequence_rolls_back_without_touching_the_others(smollm2_path):
    native = LlamaModelContext(smollm2_path, ModelSettings(max_context=256, num_threads=1), num_sequences=2)
    try:
        rounds = DecodeRounds()
        first, second = LlamaSequence(native, 0, rounds), LlamaSequence(native, 1, rounds)
        tokens = first.tokenizer.encode("The quick brown fox jumps over the lazy dog", add_bos=True)
        second.prefill(tokens[:-1])
        expected = second.forward(tokens[-1:], [0])[0].copy()
        first.prefill(tokens[:4])
        first.rollback(1)  # drops positions of sequence 0 only
        first.prefill(tokens[::-1])
        second.rollback(len(tokens) - 1)
        again = second.forward(tokens[-1:], [0])[0]
        np.testing.assert_array_equal(again, expected)
        assert first.num_cached == 1 + len(tokens) and second.num_cached == len(tokens)
    finally:
        native.close()


def test_each_sequence_holds_its_share_of_the_context(smollm2_path):
    native = LlamaModelContext(smollm2_path, ModelSettings(max_context=256, num_threads=1), num_sequences=3)
    try:
        sequence = LlamaSequence(native, 2, DecodeRounds())
        assert sequence.max_context == 256
        sequence.prefill([1] * 256)
        from pocketspec.errors import ContextFullError

        with pytest.raises(ContextFullError):
            sequence.forward([1], [0])
    finally:
        native.close()
