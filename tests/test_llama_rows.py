"""`--batch` on llama.cpp (pocketspec/batch/llama_rows.py), on SmolLM2 and the qwen-coder draft: the
batch engine steps several rows of one context in one llama_decode from one thread, each row rolls back
on its own, and with the row-exact kernels every row computes what the same prompt computes alone, bit
for bit: a prompt prefilled behind other rows' tokens, a decode of several rows wider than the kernels'
exact width, and a prompt that reuses whole chunks of an earlier one; so greedy replies are equal token
for token."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import numpy as np
import pytest

from test_cli_errors import run_cli
from conftest import assert_matches_plain
from pocketspec.backends.ggml_ops import row_exact_max_rows
from pocketspec.backends.llama_context import LlamaModelContext
from pocketspec.batch.llama_rows import LlamaRows
from pocketspec.batch.sequence import Request
from pocketspec.batch_session import open_batch_session
from pocketspec.session import open_session
from pocketspec.session_settings import SessionSettings
from pocketspec.errors import ContextFullError
from pocketspec.settings import BatchSettings, ModelSettings, SamplingSettings

pytestmark = pytest.mark.real_model
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Count from one to five.",
             "What do bees make?", "Say hello in Spanish.", "Which planet is the largest?"]
MAX_NEW_TOKENS = 32


def _settings(smollm2_path, drafter: str) -> SessionSettings:
    """drafter "model": SmolLM2 drafts for itself as a draft model (a context of rows of its own)."""
    draft = str(smollm2_path) if drafter == "model" else drafter
    return SessionSettings(target=str(smollm2_path), draft=draft, max_context=512, threads=1,
                           sampling=SamplingSettings(temperature=0.0))


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_prompts_decoded_together_equal_each_alone(smollm2_path, drafter, monkeypatch):
    import llama_cpp

    decodes = []  # (thread, tokens) of every llama_decode
    real_decode = llama_cpp.llama_decode

    def recorded_decode(context, batch):
        decodes.append((threading.get_ident(), batch.n_tokens))
        return real_decode(context, batch)

    with open_batch_session(_settings(smollm2_path, drafter), BatchSettings(max_batch=3, num_rows=3)) as batch:
        prompts = [batch.encode(question, chat=True) for question in QUESTIONS]
        monkeypatch.setattr(llama_cpp, "llama_decode", recorded_decode)
        results = batch.engine.run([Request(prompt, MAX_NEW_TOKENS) for prompt in prompts])
        monkeypatch.undo()
        assert {thread for thread, _ in decodes} == {threading.get_ident()}  # no thread waits inside a forward
        assert max(batch.engine.rows_per_step) == 3 and sum(result.stats.num_drafted for result in results) > 0
        if drafter == "model":
            assert batch.engine.draft is not None
        # the controller of a 3-row step prices it as decodes of 3 x its rows in passes within the row-exact
        # kernels, from this machine's table
        table = batch.engine.target_costs
        assert table is not None and table.max_pass_tokens == row_exact_max_rows()
        assert batch.engine.controller_for(3).target_costs.measured.forward_seconds(2) == table.forward_seconds(6)
    with open_session(_settings(smollm2_path, drafter)) as alone:
        for prompt, result in zip(prompts, results):
            alone.reset()
            expected = alone.engine.generate(prompt, MAX_NEW_TOKENS).tokens
            assert len(expected) > 3
            if row_exact_max_rows():
                assert result.tokens == expected
            else:  # a build without the row-exact kernels: a wider batch rounds otherwise
                assert_matches_plain(alone.engine.target, prompt, result.tokens, expected)


def _text_tokens(rows: LlamaRows, num_tokens: int, topic: str) -> list[int]:
    text = " ".join(f"Note {index} on {topic}: the {topic} log grew by {index * 7 % 13} lines today."
                    for index in range(num_tokens // 8))
    tokens = rows.native.tokenizer.encode(text, add_bos=True)
    assert len(tokens) >= num_tokens
    return tokens[:num_tokens]


def _alone(path, settings: ModelSettings, prompt: list[int], *steps: list[int]) -> list[np.ndarray]:
    """The prompt's last logits, then those of each step's tokens after it, in a context of one sequence."""
    rows = LlamaRows(LlamaModelContext(path, settings))
    try:
        return [rows.prefill(0, prompt)] + [rows.forward([0], [tokens], [len(tokens)])[0] for tokens in steps]
    finally:
        rows.close()


@pytest.mark.parametrize("model", ["smollm2_path", "qwen_draft_path"])
def test_rows_decoded_together_compute_what_each_computes_alone(model, request):
    """Prompts prefilled one after another (the last behind 41 + 23 + 77 tokens of the others: llama.cpp's
    tiled prefill attention reads its cache in tiles of 64 cells), a decode of the rows out of order with
    widths 1, 9, 4 and 9 (llama.cpp splits it where widths differ), then one of 4 rows x 9 tokens, wider than
    the row-exact kernels' 32 (qwen's Q4_K weights take other kernels past them)."""
    exact_width = row_exact_max_rows()
    if exact_width == 0:
        pytest.skip("this llama.cpp build has no row-exact kernels (PocketSpec's patch)")
    path = request.getfixturevalue(model)
    settings = ModelSettings(max_context=256, num_threads=1)
    rows = LlamaRows(LlamaModelContext(path, settings, num_sequences=4), exact_width=exact_width)
    try:
        prompts = [_text_tokens(rows, length, topic)
                   for length, topic in ((41, "lamp"), (23, "boat"), (77, "bread"), (100, "garden"))]
        prefilled = [rows.prefill(row, prompt) for row, prompt in enumerate(prompts)]
        uneven_rows, widths = [3, 1, 0, 2], {3: 1, 1: 9, 0: 4, 2: 9}
        uneven = {row: prompts[row][-widths[row]:] for row in uneven_rows}
        uneven_logits = dict(zip(uneven_rows, rows.forward(uneven_rows, [uneven[row] for row in uneven_rows],
                                                            [widths[row] for row in uneven_rows])))
        drafts = [prompt[-9:] for prompt in prompts]
        decoded = rows.forward(range(4), drafts, [9] * 4)
    finally:
        rows.close()
    assert sum(len(draft) for draft in drafts) > exact_width
    for row, prompt in enumerate(prompts):
        expected = _alone(path, settings, prompt, uneven[row], drafts[row])
        for got, alone in zip((prefilled[row], uneven_logits[row], decoded[row]), expected):
            np.testing.assert_array_equal(got, alone)


def test_a_prompt_reuses_whole_chunks_of_an_earlier_one_and_computes_what_it_computes_alone(smollm2_path):
    settings = ModelSettings(max_context=2048, num_threads=1)
    rows = LlamaRows(LlamaModelContext(smollm2_path, settings, num_sequences=2), exact_width=row_exact_max_rows())
    try:
        text = _text_tokens(rows, 1300, "lamp")
        assert rows.n_batch == 512
        rows.prefill(0, text[:700])  # a whole chunk and a part one
        rows.forward([0], [text[700:1100]], [1])  # decoded tokens: never reused
        assert rows.reusable_prefix(0, text) == 512  # 1100 tokens shared, only the first chunk computed alike
        later = text[:700] + _text_tokens(rows, 60, "boat")[1:]
        assert rows.reusable_prefix(0, later) == 512
        assert rows.reusable_prefix(0, text[:300] + [7]) == 0  # inside the first chunk: nothing
        rows.rollback(0, 512)
        reused = rows.prefill(0, later[512:])
        assert rows.reusable_prefix(0, later) == 512  # a part chunk of later's own is not reusable either
    finally:
        rows.close()
    np.testing.assert_array_equal(reused, _alone(smollm2_path, settings, later)[0])


def test_generate_batch_runs_on_llama_cpp_from_the_command_line(smollm2_path, tmp_path):
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": question, "max_tokens": 8}) + "\n"
                                   for question in QUESTIONS[:4]))
    common = ["generate", "--target", str(smollm2_path), "--prompt-file", str(prompt_file), "--threads", "1",
              "--max-context", "256", "--draft", "ngram", "--chat"]
    batched, alone = run_cli(*common, "--batch", "2"), run_cli(*common, "--batch", "1")
    assert batched.returncode == 0 and alone.returncode == 0, batched.stderr + alone.stderr
    lines = [json.loads(line) for line in batched.stdout.splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3]
    assert all(0 < len(line["tokens"]) <= 8 for line in lines) and "tok/s in all" in batched.stderr
    assert [line["tokens"][0] for line in lines] == [json.loads(line)["tokens"][0] for line in alone.stdout.splitlines()]


def test_a_row_rolls_back_without_touching_the_others(smollm2_path):
    rows = LlamaRows(LlamaModelContext(smollm2_path, ModelSettings(max_context=256, num_threads=1), num_sequences=2))
    try:
        tokens = rows.native.tokenizer.encode("The quick brown fox jumps over the lazy dog", add_bos=True)
        rows.prefill(1, tokens[:-1])
        (expected,) = rows.forward([1], [tokens[-1:]], [1])
        rows.prefill(0, tokens[:4])
        rows.rollback(0, 1)  # drops positions of row 0 only
        rows.prefill(0, tokens[::-1])
        rows.rollback(1, len(tokens) - 1)
        (again,) = rows.forward([1], [tokens[-1:]], [1])
        np.testing.assert_array_equal(again, expected)
        assert rows.num_cached(0) == 1 + len(tokens) and rows.num_cached(1) == len(tokens)
    finally:
        rows.close()


def test_each_row_holds_its_share_of_the_context(smollm2_path):
    rows = LlamaRows(LlamaModelContext(smollm2_path, ModelSettings(max_context=256, num_threads=1), num_sequences=3))
    try:
        assert rows.max_context == 256
        rows.prefill(2, [1] * 256)
        with pytest.raises(ContextFullError):
            rows.forward([2], [[1]], [1])
    finally:
        rows.close()


def test_exact_verify_caps_every_row_as_it_caps_one_request_alone(smollm2_path):
    """--exact-verify probes the widest exact verify on one row alone, before any request, and the batch's
    rows draft within it as one request does (a server on llama.cpp runs the batch engine)."""
    settings = replace(_settings(smollm2_path, "ngram"), exact_verify=True)
    with open_session(settings) as alone:
        expected = alone.engine.limits
        expected_notes = [note for note in alone.notes if note.startswith("--exact-verify")]
    notes = []
    with open_batch_session(settings, BatchSettings(max_batch=2, num_rows=2), on_note=notes.append) as batch:
        assert batch.engine.limits == expected
        assert batch.engine.target.num_cached(0) == 0  # the probe left the row empty
    assert [note for note in notes if note.startswith("--exact-verify")] == expected_notes  # the same advice
