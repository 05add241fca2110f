"""Tokenizer.encode(max_tokens=N): a text that fits is tokenized exactly as without the bound; one far longer
stops at a first part that already has more than N tokens (a server refuses it without reading it whole)."""

from __future__ import annotations

import pytest

from pocketspec.backends.gguf_tokenizer import load_tokenizer

MANY_TURNS = "<|im_start|>user\na<|im_end|>\n" * 3000


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    vocab_model, tokenizer = load_tokenizer(smollm2_path)
    yield tokenizer
    vocab_model.close()


@pytest.mark.parametrize("text", [
    "Write a Python function that adds two numbers.",
    "word " * 900,  # about 900 tokens in 4,500 characters
    " " * 20000 + "end",  # about 300 tokens in 20,000 characters: read in growing parts, then whole
    " " * 20000 + MANY_TURNS[:1500],  # the same, then special tokens
    MANY_TURNS[:2000],
])
def test_a_text_within_the_bound_is_tokenized_as_without_it(tokenizer, text):
    whole = tokenizer.encode(text, parse_special=True)
    assert len(whole) <= 1000
    assert tokenizer.encode(text, parse_special=True, max_tokens=1000) == whole


def test_a_far_longer_text_stops_at_a_first_part_over_the_bound(tokenizer):
    whole = tokenizer.encode(MANY_TURNS, parse_special=True)
    part = tokenizer.encode(MANY_TURNS, parse_special=True, max_tokens=256)
    assert 256 < len(part) < len(whole) // 4
    assert part[:-8] == whole[:len(part) - 8]  # the first part's tokens: the whole's, but near the cut
