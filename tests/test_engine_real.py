"""On real GGUF models: speculative output equals plain decoding at temperature 0, token for token."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_matches_plain, built_engine
from pocketspec.conversation.chat_template import encode_chat, template_for

REPETITIVE_PROMPT = (
    "Copy this list exactly, twice:\n"
    "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda, mu\n"
    "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa, lambda, mu\n"
)
CODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def _chat_tokens(engine, text: str) -> list[int]:
    tokenizer = engine.target.tokenizer
    return encode_chat(tokenizer, template_for(tokenizer), [{"role": "user", "content": text}])


def _plain_tokens(target_path, prompt_text: str, max_new_tokens: int, **engine_args) -> list[int]:
    """Plain decoding's tokens, decoded once per model, prompt and settings (the longest asked for
    first: greedy tokens do not depend on how many follow them)."""
    key = (str(target_path), prompt_text, tuple(sorted(engine_args.items())))
    tokens = _PLAIN_TOKENS.get(key, [])
    if len(tokens) < max_new_tokens:
        with built_engine(target_path, drafter="none", **engine_args) as engine:
            result = engine.generate(_chat_tokens(engine, prompt_text), max_new_tokens)
            assert result.stats.num_drafted == 0
            tokens = _PLAIN_TOKENS[key] = result.tokens
    return tokens[:max_new_tokens]


_PLAIN_TOKENS: dict[tuple, list[int]] = {}


def _long_document_prompt() -> str:
    """A Spec-Bench summarization prompt: its context passes 256 tokens, where kernels diverge."""
    from pathlib import Path

    from apps.prompt_file import read_prompt_rows

    rows = read_prompt_rows(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "spec_bench.jsonl", "data")
    for row in rows:
        if row.prompt_id == "242":
            return row.text
    raise AssertionError("question 242 is missing from spec_bench.jsonl")


@pytest.mark.parametrize("gamma", [None, 3, 6])
@pytest.mark.parametrize("prompt_text", [REPETITIVE_PROMPT, CODE_PROMPT])
def test_smollm2_ngram_greedy_equals_plain(smollm2_path, prompt_text, gamma):
    expected = _plain_tokens(smollm2_path, prompt_text, 96)
    with built_engine(smollm2_path, drafter="ngram", gamma=gamma) as engine:
        prompt = _chat_tokens(engine, prompt_text)
        result = engine.generate(prompt, 96)
        assert_matches_plain(engine.target, prompt, result.tokens, expected)
    if gamma is not None and prompt_text is REPETITIVE_PROMPT:
        assert result.stats.num_drafted > 0 and result.stats.num_accepted > 0


def test_qwen_pair_model_draft_greedy_equals_plain(qwen_target_path, qwen_draft_path):
    expected = _plain_tokens(qwen_target_path, CODE_PROMPT, 40)
    with built_engine(qwen_target_path, draft_path=qwen_draft_path, drafter="model", gamma=4) as engine:
        prompt = _chat_tokens(engine, CODE_PROMPT)
        result = engine.generate(prompt, 40)
        assert result.stats.steps_by_drafter.get("model", 0) > 0 and result.stats.num_accepted > 0
        assert_matches_plain(engine.target, prompt, result.tokens, expected)


def test_a_draft_model_that_pays_drafts_from_the_first_step_after_a_long_prompt(smollm2_path):
    """The draft model's cache follows the context lazily, so the first step after the prompt feeds it the whole
    prompt. On these tables (a verify nearly as cheap as one token, as on a GPU; a draft pass a fortieth of the
    target's, its catch-up paid token by token) the draft model pays, but not within one step: priced whole into
    the first step, the catch-up lost to plain decoding at every step, as the lag grew, and drafter=model decoded
    plainly throughout. The output stays plain decoding's."""
    from memplanner.measured_costs import MeasuredCosts
    from pocketspec.backends.torch_open import open_backend
    from pocketspec.settings import ModelSettings, SpeculationSettings
    from pocketspec.speculation.engine import SpeculativeEngine

    prompt_text = _long_document_prompt()
    expected = _plain_tokens(smollm2_path, prompt_text, 96, max_context=2048)
    widths = range(1, 33)
    verify = MeasuredCosts("nearly free verify", {0: {width: 0.02 * (1 + 0.02 * (width - 1)) for width in widths}})
    draft = MeasuredCosts("cheap draft", {0: {width: 0.0005 * width for width in widths}})
    settings = ModelSettings(num_threads=1, max_context=2048)  # a test worker has one core: 2 threads spin
    with open_backend(smollm2_path, settings) as target, open_backend(smollm2_path, settings) as draft_backend:
        engine = SpeculativeEngine(target, draft_backend=draft_backend, target_costs=verify, draft_costs=draft,
                                   speculation=SpeculationSettings(drafter="model"))
        prompt = _chat_tokens(engine, prompt_text)
        assert len(prompt) > 256
        result = engine.generate(prompt, 96)
        assert result.stats.steps_by_drafter.get("model", 0) > 0 and result.stats.num_accepted > 0
        assert_matches_plain(target, prompt, result.tokens, expected)


def _what_decisions_read(engine) -> tuple:
    """Everything the engine learns from a generation and later decisions read."""
    controller = engine.controller
    return (controller.target_costs.learned(), controller.draft_costs.learned(),
            {name: (estimate.num_accepted, estimate.num_tried) for name, estimate in controller.acceptance.items()},
            dict(controller.match_acceptance._counts), controller.step_overhead_seconds,
            engine.ngram.corpus.num_tokens if engine.ngram else None)  # the draws keep nothing


def test_qwen_pair_adaptive_greedy_equals_plain(qwen_target_path, qwen_draft_path):
    expected = _plain_tokens(qwen_target_path, REPETITIVE_PROMPT, 40)
    with built_engine(qwen_target_path, draft_path=qwen_draft_path) as engine:
        prompt = _chat_tokens(engine, REPETITIVE_PROMPT)
        learned = _what_decisions_read(engine)
        engine.warm_up(prompt, 4)  # as a bench worker does before its first timed prompt
        assert _what_decisions_read(engine) == learned
        assert engine.target.num_cached == 0 and engine.model.backend.num_cached == 0
        result = engine.generate(prompt, 40)
        assert_matches_plain(engine.target, prompt, result.tokens, expected)


def test_a_warm_up_leaves_nothing_that_a_decision_reads(smollm2_path):
    """A bench worker warms up on its first prompt, then times it: the warm-up's tokens in the corpus
    of outputs, or its passes in the controller, would make that prompt decide as no user's does."""
    expected = _plain_tokens(smollm2_path, REPETITIVE_PROMPT, 48)
    with built_engine(smollm2_path, drafter="ngram") as engine:
        prompt = _chat_tokens(engine, REPETITIVE_PROMPT)
        learned = _what_decisions_read(engine)
        engine.warm_up(prompt, 4)
        assert _what_decisions_read(engine) == learned
        result = engine.generate(prompt, 48)
        assert_matches_plain(engine.target, prompt, result.tokens, expected)
        assert _what_decisions_read(engine) != learned  # what the check reads does change with a generation


def test_long_context_speculation_diverges_only_at_near_ties(qwen_target_path):
    document = _long_document_prompt()
    expected = _plain_tokens(qwen_target_path, document, 64, max_context=2048)
    with built_engine(qwen_target_path, drafter="ngram", gamma=8, max_context=2048) as engine:
        prompt = _chat_tokens(engine, document)
        assert len(prompt) > 256
        result = engine.generate(prompt, 64)
        assert result.stats.num_drafted > 0
        assert_matches_plain(engine.target, prompt, result.tokens, expected)


def test_exact_verify_is_bit_identical_at_long_context(qwen_target_path):
    """--exact-verify only drafts where the probe proved batches exact, so nothing may differ."""
    document = _long_document_prompt()
    expected = _plain_tokens(qwen_target_path, document, 48, max_context=2048)
    with built_engine(qwen_target_path, drafter="ngram", max_context=2048, exact_verify=True) as engine:
        result = engine.generate(_chat_tokens(engine, document), 48)
        probed_width = engine.controller.max_gamma + 1
    assert result.tokens == expected
    with built_engine(qwen_target_path, drafter="ngram", gamma=max(probed_width - 1, 1), max_context=2048) as engine:
        backend = engine.target
        tokens = backend.tokenizer.encode(document, add_bos=False)[:400]
        backend.prefill(tokens[:-probed_width])
        num_kept = backend.num_cached
        singles = np.stack([backend.forward([token], [0])[0].copy() for token in tokens[-probed_width:]])
        backend.rollback(num_kept)
        batched = backend.forward(tokens[-probed_width:], range(probed_width)).copy()
        assert np.array_equal(batched, singles)


def test_exact_verify_with_a_bf16_kv_cache_and_unrepacked_weights_drafts_past_256_cached_tokens_and_equals_plain(
        qwen_target_path):
    """llama.cpp's CPU attention takes a path of its own for one token over an f16 cache past 256
    cached tokens, but rounds a bf16 cache alike at every batch width, so with these settings the
    probe's exact width holds deep into the context. How wide it is depends on the CPU and the build
    (7 rows on the Xeon and the EPYC of docs/bench.md), so the test asks only what holds on any
    machine: γ is capped at the probed width, a fixed γ drafts wherever that width is 2 or more, the
    only notes are the verify mode's and the one that says γ was lowered, and the output is plain
    decoding's, bit for bit."""
    document = _long_document_prompt()
    layout = dict(max_context=2048, kv_type="bf16", repack=False)
    expected = _plain_tokens(qwen_target_path, document, 48, **layout)
    gamma = 6
    with built_engine(qwen_target_path, drafter="ngram", exact_verify=True, gamma=gamma, **layout) as engine:
        assert engine.target.settings.kv_type == "bf16" and not engine.target.settings.repack_weights
        prompt = _chat_tokens(engine, document)
        assert len(prompt) > 256
        result = engine.generate(prompt, 48)
        exact_width = engine.target.exact_verify_width(min(gamma + 1, engine.target.max_logits_rows))  # cached
        assert engine.controller.max_draftless_gamma == exact_width - 1
        assert all("lowered" in note or "decoding is plain" in note or note.startswith("verify: exact")
                   for note in engine.notes)
        assert any(f"--gamma {gamma} lowered" in note for note in engine.notes) == (exact_width <= gamma)
    assert result.tokens == expected
    if exact_width >= 2:
        assert result.stats.num_drafted > 0
    else:
        assert result.stats.num_drafted == 0


def test_qwen_pair_seeded_sampling_equals_plain_seeded_sampling(qwen_target_path, qwen_draft_path):
    """The draft model draws each token with the draws the target verifies with, so a seeded sampled reply is
    plain sampling's, token for token (with --exact-verify every verify rounds as one-token decoding does, so
    the logits, and so the draws, are plain decoding's bit for bit; its width is 3 rows here, γ = 2)."""
    sampled, prompt_text = dict(temperature=0.9, seed=7), "Write four lines of a poem about a lighthouse."
    expected = _plain_tokens(qwen_target_path, prompt_text, 48, **sampled)
    with built_engine(qwen_target_path, draft_path=qwen_draft_path, drafter="model", gamma=2, exact_verify=True,
                      **sampled) as engine:
        result = engine.generate(_chat_tokens(engine, prompt_text), 48)
    assert result.stats.steps_by_drafter.get("model", 0) > 0 and 0 < result.stats.num_accepted < result.stats.num_drafted
    assert result.tokens == expected


def test_sampling_is_reproducible_with_a_seed(smollm2_path):
    # a fixed γ: the adaptive controller's choices follow measured timings, and without --exact-verify
    # llama.cpp's verify rounds differently at each width, which can move a near-tied draw
    outputs = []
    for _ in range(2):
        with built_engine(smollm2_path, drafter="ngram", gamma=4, temperature=0.8, seed=42, top_k=40) as engine:
            outputs.append(engine.generate(_chat_tokens(engine, REPETITIVE_PROMPT), 48).tokens)
    assert outputs[0] == outputs[1]


def test_kv_reuse_across_calls_equals_a_fresh_run(smollm2_path):
    with built_engine(smollm2_path, drafter="ngram") as engine:
        first_prompt = _chat_tokens(engine, CODE_PROMPT)
        first = engine.generate(first_prompt, 24)
        follow_up = first_prompt + first.tokens + engine.target.tokenizer.encode(" And in C?", add_bos=False)
        reused = engine.generate(follow_up, 24)
        assert reused.stats.num_reused_tokens >= len(first_prompt)
    with built_engine(smollm2_path, drafter="ngram") as fresh_engine:
        fresh = fresh_engine.generate(follow_up, 24)
        # the reused run prefills the follow-up's new tokens alone, the fresh one the whole follow-up (past the
        # row-exact kernels' 32 rows): stock kernels round by where a prefill starts, so a near-tie may part them
        assert_matches_plain(fresh_engine.target, follow_up, reused.tokens, fresh.tokens)


def test_stops_at_end_of_generation(smollm2_path):
    with built_engine(smollm2_path, drafter="ngram") as engine:
        result = engine.generate(_chat_tokens(engine, "Say only the word yes."), 64)
    assert result.stop_reason == "end_of_generation" and 0 < len(result.tokens) < 64
    # the end token is not emitted, but its decode step is counted, as llama.cpp's tools count it
    assert result.stats.is_ended_by_end_token and result.stats.num_decode_tokens == len(result.tokens)


def test_a_generation_cut_at_max_tokens_decodes_all_but_the_prefills_token(smollm2_path):
    with built_engine(smollm2_path, drafter="none") as engine:
        result = engine.generate(_chat_tokens(engine, CODE_PROMPT), 8)
    assert result.stop_reason == "max_tokens" and not result.stats.is_ended_by_end_token
    assert result.stats.num_decode_tokens == 7 == result.stats.num_steps


def test_memory_report_names_weights_and_the_buffers_llama_cpp_allocated(smollm2_path):
    with built_engine(smollm2_path, drafter="none", max_context=512) as engine:
        report = engine.target.memory_report()
    assert report["weights"] > 50_000_000
    assert any("KV" in name for name in report) and any("compute" in name for name in report)
    kv_bytes = sum(size for name, size in report.items() if "KV" in name)
    assert 10_000_000 < kv_bytes < 20_000_000  # 30 layers x 512 cells x 3 heads x 64 x (K+V) x f16 = 11.25 MiB


def test_an_engine_that_reuses_whole_chunks_only_reuses_none_of_a_part_chunk(smollm2_path):
    """A server's engine (EngineSlots) reuses the whole n_batch prefill chunks a prompt shares with the last,
    as a fresh prefill computes them, never a part chunk; its output equals a fresh engine's."""
    with built_engine(smollm2_path, drafter="ngram", max_context=2048) as engine:
        engine.reuses_whole_chunks_only = True
        n_batch = engine.target.n_batch
        document = engine.target.tokenizer.encode(_long_document_prompt(), add_bos=False)[:n_batch + 100]
        assert len(document) == n_batch + 100
        engine.generate(document, 4)
        shared = document[:n_batch + 60] + engine.target.tokenizer.encode(" Summarise it.", add_bos=False)
        reused = engine.generate(shared, 12)
        assert reused.stats.num_reused_tokens == n_batch  # not the n_batch + 60 shared
        short = document[:40]
        assert engine.generate(short, 4).stats.num_reused_tokens == 0  # a part chunk: prefilled again
        assert engine.generate(shared, 12).stats.num_reused_tokens == 0  # the cache holds the short one now
    with built_engine(smollm2_path, drafter="ngram", max_context=2048) as fresh_engine:
        assert fresh_engine.generate(shared, 12).tokens == reused.tokens


@pytest.mark.parametrize("prompt_text, max_new_tokens", [("Say only the word yes.", 64), (REPETITIVE_PROMPT, 40),
                                                          (REPETITIVE_PROMPT, 400)])
def test_after_a_generation_the_target_caches_what_plain_decoding_caches(smollm2_path, prompt_text, max_new_tokens):
    """A draft accepted past the end token (the model drafting for itself accepts everything) or past max tokens
    stayed in the cache; a chat's next prompt, which begins with the reply and its end token, then reused it and
    prefilled the rest from a later start, which stock kernels round differently (a qwen chat's second reply
    parted from plain decoding's at a non-tie of the verify)."""
    cached = {}
    for drafter, draft_path in (("none", None), ("ngram", None), ("model", smollm2_path)):
        gamma = None if drafter == "none" else 6
        with built_engine(smollm2_path, drafter=drafter, draft_path=draft_path, gamma=gamma) as engine:
            prompt = _chat_tokens(engine, prompt_text)
            result = engine.generate(prompt, max_new_tokens)
            cached[drafter] = (result.tokens, result.stop_reason, list(engine.target.cached_tokens))
            assert drafter == "none" or result.stats.num_accepted > 0
    assert cached["ngram"] == cached["none"] and cached["model"] == cached["none"]
