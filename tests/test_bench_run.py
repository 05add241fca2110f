"""Comparing each system's output with plain decoding, and the rows results.json keeps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from apps.bench.run import BenchJob, System, add_closing_notes, final_rows, matches_plain, tokens_past_limit
from apps.bench.suite import SuitePrompt

JOB = BenchJob(Path("t.gguf"), Path("d.gguf"), [SuitePrompt("1", "coding", "hi")], max_tokens=4, temperature=0.0,
               top_k=0, top_p=1.0, seed=0, num_threads=2, max_context=2048, num_warmup_tokens=0,
               pocketspec_options={}, llama_tools_dir=Path("/nowhere"), peer_draft_max=None)
PLAIN = {"prompt_id": "1", "tokens": [5, 6, 7, 8], "text": "a b c d", "num_tokens": 4}


def test_tokens_are_compared_where_a_system_reports_them():
    assert matches_plain({"tokens": [5, 6, 7, 8], "text": "other"}, PLAIN, JOB, "pocketspec") is True
    assert matches_plain({"tokens": [5, 6, 7, 9], "text": "a b c d"}, PLAIN, JOB, "pocketspec") is False


def test_text_only_peers_may_run_past_max_tokens_but_not_past_an_end():
    assert matches_plain({"tokens": None, "text": "a b c d e"}, PLAIN, JOB, "peer") is True
    assert matches_plain({"tokens": None, "text": "a b x d e"}, PLAIN, JOB, "peer") is False
    assert matches_plain({"tokens": None, "text": None}, PLAIN, JOB, "peer") is False  # its prompt echo differed
    ended_early = {**PLAIN, "num_tokens": 3, "text": "a b c"}
    assert matches_plain({"tokens": None, "text": "a b c d"}, ended_early, JOB, "peer") is False


def test_when_sampling_only_pocketspec_which_draws_as_plain_does_is_compared():
    sampled = replace(JOB, temperature=0.7)
    assert matches_plain({"tokens": [5, 6, 7, 8], "text": ""}, PLAIN, sampled, "pocketspec") is True
    assert matches_plain({"tokens": [5, 6, 7, 1], "text": ""}, PLAIN, sampled, "pocketspec") is False
    assert matches_plain({"tokens": None, "text": "a b c d"}, PLAIN, sampled, "peer") is None


def test_final_rows_drop_token_lists_keep_texts_and_add_category_rate_and_match():
    raw = {"prompt_id": "1", "tokens": [5, 6, 7, 8], "text": "a b c d", "prompt_tokens": [1, 2],
           "prompt_text": "hi", "num_decode_tokens": 3, "decode_seconds": 0.5, "ttft_seconds": 0.1}
    (row,) = final_rows(System("pocketspec-ngram", "pocketspec", "pocketspec", "pocketspec-ngram"), [raw], JOB,
                        {"1": PLAIN})
    assert row["system"] == "pocketspec-ngram" and row["category"] == "coding"
    assert row["matches_plain"] is True and row["tokens_per_second"] == 6.0
    assert row["text"] == "a b c d" and not {"tokens", "prompt_tokens", "prompt_text"} & set(row)
    (plain,) = final_rows(System("plain", "plain", "pocketspec", "plain"), [raw], JOB, {"1": PLAIN})
    assert plain["prompt_text"] == "hi" and plain["text"] == "a b c d"  # every answer's prompt, once
    assert not {"tokens", "prompt_tokens"} & set(plain)


def test_a_peer_that_ran_past_max_tokens_is_told_with_its_mean_excess():
    assert tokens_past_limit([{"num_tokens": 52}, {"num_tokens": 4}, {"num_tokens": 3}], 4) == 16.0
    assert tokens_past_limit([], 4) == 0.0
    ngram_mod = System("llama.cpp-ngram-mod", "peer", "llama-speculative", "llama.cpp-ngram-mod", spec_type="ngram-mod")
    rows = [{"system": ngram_mod.name, "num_tokens": 52, "is_retokenized": False}]
    add_closing_notes([ngram_mod], JOB, rows)
    assert any("48 tokens a prompt past --max-tokens 4" in note for note in ngram_mod.notes)
    assert any("--spec-type ngram-mod at llama.cpp's defaults" in note for note in ngram_mod.notes)
    on_time = System("llama.cpp-ngram-mod", "peer", "llama-speculative", "llama.cpp-ngram-mod", spec_type="ngram-mod")
    add_closing_notes([on_time], JOB, [{**rows[0], "num_tokens": 4}])
    assert not any("past --max-tokens" in note for note in on_time.notes)


def test_llama_bench_runs_once_for_every_llama_cpp_peer():
    """Each peer ran llama-bench again and noted its own rate: three notes of one figure, three different."""
    peers = [System(f"llama.cpp-{kind}", "peer", "llama-speculative", f"llama.cpp-{kind}", spec_type=kind)
             for kind in ("ngram-simple", "ngram-mod")]
    add_closing_notes(peers, JOB, [{"system": peer.name, "num_tokens": 4, "is_retokenized": False} for peer in peers])
    assert [sum("llama-bench" in note for note in peer.notes) for peer in peers] == [1, 0]

