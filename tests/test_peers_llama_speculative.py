"""Reading llama-speculative-simple's output, on text captured from real runs of the tool
built by native/build_llama_tools.sh (qwen-coder pair, greedy, 2 threads):
max_tokens/ stops at -n, end_of_generation/ stops at the end-of-turn token."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.bench.peers.llama_speculative import command, generated_text, measured_row, missing_binary, parse_stats
from apps.bench.peers.process import ChildRun

CAPTURED = Path(__file__).parent / "data" / "llama_speculative_simple"


def captured(case: str) -> tuple[str, str, str]:
    folder = CAPTURED / case
    return tuple((folder / name).read_text() for name in ("prompt.txt", "stdout.txt", "stderr.txt"))


def test_stats_from_a_run_that_hit_max_tokens():
    _, _, stderr = captured("max_tokens")
    assert parse_stats(stderr) == {"num_prompt_tokens": 41, "prompt_seconds": 0.611, "num_decoded": 27,
                                   "decode_seconds": 2.104, "draft_max": 3, "num_predicted": 27, "num_drafted": 24,
                                   "num_accepted": 19}


def test_generated_text_is_cut_from_the_prompt_echo_and_exit_newlines():
    prompt, stdout, _ = captured("max_tokens")
    assert generated_text(stdout, prompt) == ('```python\ndef is_prime(num):\n    """\n    Check if a number is prime.'
                                              '\n\n    Args:\n    num (int): The')
    prompt, stdout, _ = captured("end_of_generation")
    assert generated_text(stdout, prompt) == "Paris"  # the end-of-turn token is not printed


def test_a_prompt_echo_that_differs_gives_no_text():
    prompt, stdout, _ = captured("max_tokens")
    assert generated_text(stdout, prompt.replace("prime", "odd")) is None


def test_measured_row_counts_steps_as_tokens_minus_accepted():
    prompt, stdout, stderr = captured("end_of_generation")
    run = ChildRun(0, stdout, stderr, peak_rss_bytes=123, seconds=1.0)
    row = measured_row("q1", run, prompt, max_tokens=8)
    assert row["text"] == "Paris" and row["tokens"] is None
    assert (row["num_tokens"], row["num_drafted"], row["num_accepted"], row["num_steps"]) == (2, 3, 1, 1)
    assert row["num_decode_tokens"] == 2
    # a last draft past the limit is generated, not counted in the rate
    assert measured_row("q1", run, prompt, max_tokens=1)["num_decode_tokens"] == 1
    assert row["ttft_seconds"] == pytest.approx(2.515) and row["decode_seconds"] == pytest.approx(2.021)
    assert row["peak_memory_bytes"] == 123


def test_truncated_output_is_an_error():
    _, _, stderr = captured("max_tokens")
    with pytest.raises(ValueError, match="lacks num_accepted"):
        parse_stats(stderr.split("n_accept")[0])


def test_command_is_greedy_with_a_draft_model_and_leaves_draft_length_to_llama_cpp(tmp_path):
    argv = command(Path("/bin/tool"), Path("t.gguf"), Path("d.gguf"), "prompt", max_tokens=128, num_threads=2,
                   max_context=2048, temperature=0.0, top_k=0, top_p=1.0, seed=0, draft_max=None)
    assert argv[argv.index("-md") + 1] == "d.gguf" and argv[argv.index("--spec-type") + 1] == "draft-simple"
    assert argv[argv.index("-n") + 1] == "127" and argv[argv.index("-td") + 1] == "2"
    assert "--spec-draft-n-max" not in argv
    assert missing_binary(tmp_path).startswith("llama-speculative-simple not found")


def test_the_peers_run_at_the_benchs_kv_type():
    """--kv-type bf16 changes the target's numerics, so the peers must decode with the same cache."""
    common = dict(max_tokens=16, num_threads=2, max_context=512, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                  draft_max=None, spec_type="ngram-mod")
    argv = command(Path("/bin/tool"), Path("t.gguf"), None, "prompt", kv_type="bf16", **common)
    assert argv[argv.index("--cache-type-k") + 1] == argv[argv.index("--cache-type-v") + 1] == "bf16"
    assert "--cache-type-k" not in command(Path("/bin/tool"), Path("t.gguf"), None, "prompt", **common)
