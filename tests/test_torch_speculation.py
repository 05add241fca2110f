"""Through the torch backend on tiny F32 models: greedy speculative decoding equals plain decoding
token for token for every drafter, and speculative sampling keeps the target distribution."""

from __future__ import annotations

import pytest

from conftest import assert_drafted_past_its_window, built_engine, same_distribution_pvalue, sampled_token_counts
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT_TEXT = "the cat is def return"
TORCH = dict(backend="torch", weights="fp32")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_torch"), quant=None)


def _prompt(engine) -> list[int]:
    return engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True)


def _long_prompt(engine) -> list[int]:
    """Longer than an 80-position self-sparse window."""
    return engine.target.tokenizer.encode(" ".join([PROMPT_TEXT] * 24), add_bos=True)


def _plain(target, num_tokens: int, max_context: int = 1024) -> list[int]:
    with built_engine(target, drafter="none", max_context=max_context, **TORCH) as plain:
        result = plain.generate(_prompt(plain), num_tokens)
        assert result.stats.num_drafted == 0
        return result.tokens


@pytest.mark.parametrize("gamma", [1, 4, None])
def test_draft_model_greedy_equals_plain(tiny_pair, gamma):
    target, draft = tiny_pair
    expected = _plain(target, 64)
    with built_engine(target, draft_path=draft, drafter="model", gamma=gamma, **TORCH) as engine:
        result = engine.generate(_prompt(engine), 64)
    assert result.tokens == expected
    if gamma is not None:  # adaptive γ may find drafting not worth it on a model this small
        assert result.stats.num_drafted > 0 and 0 < result.stats.num_accepted < result.stats.num_drafted


def test_ngram_greedy_equals_plain(tiny_pair):
    target, _ = tiny_pair
    expected = _plain(target, 200)
    with built_engine(target, drafter="ngram", gamma=4, **TORCH) as engine:
        result = engine.generate(_prompt(engine), 200)
    assert result.tokens == expected
    assert result.stats.num_accepted > 0  # a random model falls into loops that n-grams predict


@pytest.mark.parametrize("kv_type, keys", [("fp32", "sinks"), ("int8", "sinks"), ("fp32", "attended"),
                                           ("int8", "attended")])
def test_self_sparse_greedy_equals_plain_while_its_window_slides(tiny_pair, kv_type, keys):
    target, _ = tiny_pair
    expected = _plain(target, 300, max_context=512)
    with built_engine(target, drafter="model", gamma=4, max_context=512, self_draft="self-sparse",
                      self_draft_settings=dict(self_draft_window=96, self_draft_kv_type=kv_type, self_draft_keys=keys),
                      **TORCH) as engine:
        result = engine.generate(_prompt(engine), 300)
        draft_backend = engine.model.backend
        assert draft_backend.model is engine.target.model  # the same modules: no weight copy
        assert draft_backend.memory_report()["weights"] == 0
        assert draft_backend.cache.kv_dtype == kv_type and draft_backend.max_context == 96
        assert_drafted_past_its_window(engine, result, len(_prompt(engine)), gamma=4)
        if keys == "attended":  # the keys were chosen again each time the window filled: every 24 tokens or so
            assert engine.model.window.num_choices >= 8
    assert result.tokens == expected
    assert result.stats.num_accepted > 0


@pytest.mark.parametrize("keys", ["sinks", "attended"])
def test_a_prompt_longer_than_the_window_is_priced_as_what_the_draft_will_feed(tiny_pair, keys):
    """The controller prices a draft's catch-up by its lag: for a prompt the draft never saw, that is what the
    first proposal feeds after sliding (or choosing keys), never the whole prompt, or it would never draft."""
    target, _ = tiny_pair
    with built_engine(target, drafter="model", gamma=4, max_context=1024, self_draft="self-sparse",
                      self_draft_settings=dict(self_draft_window=96, self_draft_keys=keys), **TORCH) as engine:
        prompt = _long_prompt(engine)
        engine.target.prefill(prompt)
        lag = engine.model.lag(prompt)
        assert lag == len(engine.model.window.feed(prompt, 1)) - 1 and len(prompt) > 96 > lag


def test_self_skip_greedy_equals_plain(tiny_pair):
    target, _ = tiny_pair
    expected = _plain(target, 64)
    with built_engine(target, drafter="model", gamma=3, self_draft="self-skip", **TORCH) as engine:
        result = engine.generate(_prompt(engine), 64)
        assert engine.model.backend.num_layers == 1 and engine.target.num_layers == 2
    assert result.tokens == expected
    assert result.stats.num_drafted > 0


@pytest.mark.parametrize("self_draft, keys", [(None, None), ("self-sparse", "sinks"), ("self-sparse", "attended")])
def test_speculative_sampling_keeps_the_target_distribution(tiny_pair, self_draft, keys):
    """Two-sample chi-square at the third generated token: with a draft vs without, temperature 1. The
    self-sparse window (80 positions) is shorter than the prompt, so the drafts attend over sinks or attended keys."""
    target, draft = tiny_pair
    num_runs, position = 1200, 2
    with built_engine(target, drafter="none", temperature=1.0, **TORCH) as plain:
        prompt = _long_prompt(plain) if keys else _prompt(plain)
        plain_counts = sampled_token_counts(plain, prompt, position, num_runs)
    window = dict(self_draft_window=80, self_draft_keys=keys) if keys else None
    with built_engine(target, draft_path=None if self_draft else draft, drafter="model", gamma=3, temperature=1.0,
                      self_draft=self_draft, self_draft_settings=window, **TORCH) as engine:
        spec_counts = sampled_token_counts(engine, prompt, position, num_runs)
        assert engine.controller.acceptance["model"].num_tried > 0
        assert keys != "attended" or engine.model.window.num_choices > 0
    assert same_distribution_pvalue(plain_counts, spec_counts, num_runs) > 1e-3
