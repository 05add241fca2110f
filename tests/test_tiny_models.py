"""The whole speculative path on tiny random GGUF models (a real target/draft pair, milliseconds per step)."""

from __future__ import annotations

import pytest

from conftest import assert_drafted_past_its_window, assert_matches_plain, built_engine, same_distribution_pvalue, sampled_token_counts
from tiny_models import write_tiny_pair

PROMPT_TEXT = "the cat is def return"


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny"))


def _prompt(engine) -> list[int]:
    return engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True)


@pytest.mark.parametrize("gamma", [1, 4, 8, None])
def test_model_draft_greedy_equals_plain(tiny_pair, gamma):
    target, draft = tiny_pair
    with built_engine(target, drafter="none") as plain:
        expected = plain.generate(_prompt(plain), 64).tokens
    with built_engine(target, draft_path=draft, drafter="model", gamma=gamma) as engine:
        result = engine.generate(_prompt(engine), 64)
    # Q4_1 weights at a context under 256 tokens: batched and one-token kernels agree bit for bit
    assert result.tokens == expected
    if gamma is not None:
        assert result.stats.num_drafted > 0 and 0 < result.stats.num_accepted < result.stats.num_drafted


def test_draft_with_a_sliding_window_shorter_than_the_context(tiny_pair):
    """A short draft context (128 asked, 256 after llama.cpp's padding) under a 512-token target."""
    target, draft = tiny_pair
    with built_engine(target, drafter="none", max_context=512) as plain:
        expected = plain.generate(_prompt(plain), 300).tokens
    with built_engine(target, draft_path=draft, drafter="model", gamma=4, max_context=512,
                      draft_max_context=128) as engine:
        result = engine.generate(_prompt(engine), 300)
        assert engine.model.backend.max_context < 512
        assert_drafted_past_its_window(engine, result, len(_prompt(engine)), gamma=4)
        # past 256 cached tokens the target's kernels may round differently: near ties only
        assert_matches_plain(engine.target, _prompt(engine), result.tokens, expected)


@pytest.mark.parametrize("position", [1, 2])
def test_speculative_sampling_keeps_the_target_distribution_end_to_end(tiny_pair, position):
    """Two-sample chi-square: tokens sampled with a draft model vs without, same temperature."""
    target, draft = tiny_pair
    num_runs = 1500
    with built_engine(target, drafter="none", temperature=1.0) as plain:
        plain_counts = sampled_token_counts(plain, _prompt(plain), position, num_runs)
    with built_engine(target, draft_path=draft, drafter="model", gamma=3, temperature=1.0) as engine:
        spec_counts = sampled_token_counts(engine, _prompt(engine), position, num_runs)
        assert engine.controller.acceptance["model"].num_tried > 0
    assert same_distribution_pvalue(plain_counts, spec_counts, num_runs) > 1e-3


def test_batch_draft_rows_slide_their_windows_on_llama_cpp(tiny_pair):
    """--batch on llama.cpp with a draft context shorter than the target's: each draft row slides its own
    window (sinks + recent tokens) and keeps drafting, and each prompt's output is what it is alone."""
    from pocketspec.batch.sequence import Request
    from pocketspec.batch_session import open_batch_session
    from pocketspec.session_settings import SessionSettings
    from pocketspec.settings import BatchSettings

    target, draft = tiny_pair
    settings = SessionSettings(target=str(target), draft=str(draft), gamma=4, max_context=512, draft_window=128,
                               threads=1, options={"drafter": "model"})
    with built_engine(target, drafter="none", max_context=512) as plain:
        prompts = [_prompt(plain), plain.target.tokenizer.encode("return def the is cat", add_bos=True)]
        expected = []
        for prompt in prompts:
            plain.reset()
            expected.append(plain.generate(prompt, 300).tokens)
        with open_batch_session(settings, BatchSettings(max_batch=2, num_rows=2)) as batch:
            results = batch.engine.run([Request(prompt, 300) for prompt in prompts])
            draft_rows = batch.engine.draft.draft
            assert draft_rows.max_context < 512 and max(batch.engine.rows_per_step) == 2
        for prompt, result, tokens in zip(prompts, results, expected):
            assert_matches_plain(plain.target, prompt, result.tokens, tokens)
    first = results[0]
    assert len(prompts[0]) + len(first.tokens) - 2 * 5 > draft_rows.max_context  # it outgrew the draft's cache
    assert first.stats.steps_by_drafter.get("model", 0) >= first.stats.num_steps - 1
