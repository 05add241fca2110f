"""`pocketspec generate --prompt-file FILE.jsonl --batch N` from the command line: outputs in input
order that equal decoding each prompt alone, one-line errors, and a clean Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli_errors import assert_one_line_error, run_cli
from tiny_models import write_tiny_pair

PROMPTS = ["the cat is", "def return if else", "a of to", "while import print class self true", "in is it", "be at by"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return str(write_tiny_pair(tmp_path_factory.mktemp("tiny_batch_cli"), quant=None)[0])


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": text, "max_tokens": 6 + 4 * index} for index, text in enumerate(PROMPTS)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _batch(tiny_target: str, prompt_file: str, *args: str):
    return run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt-file", prompt_file,
                   "--threads", "1", "--max-context", "256", *args)


SELF_SPARSE = ["--draft", "self-sparse", "--self-draft-window", "80"]


@pytest.mark.parametrize("draft", [["--draft", "ngram"], SELF_SPARSE, [*SELF_SPARSE, "--self-draft-keys", "attended"]])
def test_outputs_come_in_input_order_and_equal_each_prompt_alone(tiny_target, prompt_file, tmp_path, draft):
    alone = _batch(tiny_target, prompt_file, "--batch", "1", "--draft", "none")
    output = tmp_path / "out.jsonl"
    batched = _batch(tiny_target, prompt_file, "--batch", "3", *draft, "--gamma", "3",
                     "--memory-budget", "400MiB", "--output", str(output))
    assert alone.returncode == 0 and batched.returncode == 0, batched.stderr
    expected = [json.loads(line) for line in alone.stdout.splitlines()]
    got = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["index"] for line in got] == list(range(len(PROMPTS))) and batched.stdout == ""
    assert [line["tokens"] for line in got] == [line["tokens"] for line in expected]
    assert [len(line["tokens"]) for line in got] == [6 + 4 * index for index in range(len(PROMPTS))]
    assert {"num_tokens", "latency_seconds", "acceptance_rate", "num_drafted", "num_accepted"} <= got[0]["stats"].keys()
    assert "memory plan (batch)" in batched.stderr and "tok/s in all" in batched.stderr
    if "self-sparse" in draft:  # the plan holds every row's window
        assert "self-sparse KV × 3 rows" in batched.stderr


def test_each_sampled_line_names_its_seed_and_that_seed_repeats_the_prompt_alone(tiny_target, tmp_path):
    path = tmp_path / "seeded.jsonl"
    rows = [{"prompt": PROMPTS[0]}, {"prompt": PROMPTS[1], "seed": 77}, {"prompt": PROMPTS[2]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sampled = ["--temperature", "0.9", "--max-tokens", "12"]
    batched = _batch(tiny_target, str(path), "--batch", "3", "--draft", "ngram", "--gamma", "3", "--seed", "5", *sampled)
    assert batched.returncode == 0, batched.stderr
    lines = [json.loads(line) for line in batched.stdout.splitlines()]
    assert [line["seed"] for line in lines] == [5, 77, 7]  # --seed + the line's index, or the line's own
    for row, line in zip(rows, lines):
        alone = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--threads", "1", "--max-context",
                        "256", "--prompt", row["prompt"], "--seed", str(line["seed"]), "--json", *sampled)
        assert alone.returncode == 0, alone.stderr
        assert json.loads(alone.stdout)["tokens"] == line["tokens"]


@pytest.mark.parametrize("args, fragments", [
    (["--batch", "2", "--prompt", "hi"], ["--batch", "--prompt-file"]),
    (["--batch", "2", "--draft", "self-sparse", "--self-draft-window", "20"], ["self-sparse window 20", "too small"]),
    (["--batch", "2", "--memory-budget", "100KiB"], ["cannot hold even one sequence"]),
    (["--batch", "0"], ["--batch"]),
    (["--batch", "2", "--exact-verify"], ["--exact-verify", "--batch"]),
    (["--batch", "2", "--repack"], ["--repack", "torch"]),
    (["--batch", "2", "--no-repack"], ["--no-repack", "torch"]),
    (["--batch", "2", "--kv-type", "q8_0"], ["--kv-type q8_0", "--torch-kv-type"]),
    (["--batch", "2", "--devices", "cpu:0,cpu:1"], ["--devices cpu:0,cpu:1", "one device"]),
    (["--batch", "2", "--compile"], ["--compile", "--batch pool runs its forwards eagerly"]),
    (["--batch", "2", "--json"], ["--json", "one JSON object per prompt already"]),  # it did nothing
    (["--batch", "2", "--backend", "llama.cpp", "--fast-batch"], ["--fast-batch", "torch"]),
    (["--batch", "4", "--pool-rows", "2"], ["--pool-rows 2", "fewer sequences than --batch 4"]),
])
def test_bad_batch_flags_are_one_line_errors(tiny_target, prompt_file, args, fragments):
    assert_one_line_error(_batch(tiny_target, prompt_file, *args), *fragments)


def test_a_static_step_on_a_split_is_refused_not_dropped(tiny_target):
    result = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt", "hi", "--devices",
                     "cpu:0,cpu:1", "--decode-step", "static")
    assert_one_line_error(result, "--decode-step static", "dynamic step")


@pytest.mark.parametrize("text, fragments", [
    ('{"prompt": "ok"}\n{"prompt": "x"\n', ["line 2", "not JSON"]),
    ('{"prompt": "ok"}\n{"prompt": ""}\n', ["line 2", "empty"]),
    ('{"prompt": "ok"}\n{"prompt": "' + "the " * 300 + '"}\n', ["line 2", "tokens", "--max-context"]),
])
def test_bad_prompt_files_name_the_line(tiny_target, tmp_path, text, fragments):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    assert_one_line_error(_batch(tiny_target, str(path), "--batch", "2"), *fragments)


def test_a_missing_prompt_file(tiny_target, tmp_path):
    assert_one_line_error(_batch(tiny_target, str(tmp_path / "nope.jsonl"), "--batch", "2"), "nope.jsonl")


def test_ctrl_c_writes_every_prompt_and_exits_130(tiny_target, tmp_path):
    # Enough work after the first line that the Ctrl-C always lands mid-run, even on a loaded machine
    # where this process wakes late: the tiny model may end a prompt early at its end token.
    num_prompts = len(PROMPTS) * 20
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in PROMPTS * 20))
    process = subprocess.Popen([sys.executable, "-m", "apps.cli", "generate", "--target", tiny_target, "--backend",
                                "torch", "--prompt-file", str(path), "--batch", "2", "--threads", "1",
                                "--max-tokens", "400", "--max-context", "512", "--draft", "none"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_line = process.stdout.readline()  # the first prompt is done: decoding is under way
    process.send_signal(signal.SIGINT)
    # Read the rest through the same buffered reader: communicate() reads the pipe underneath it and would
    # lose a second line that readline() had already buffered (two rows finishing in one step).
    rest, stderr = process.stdout.read(), process.stderr.read()
    process.wait(timeout=120)
    lines = [json.loads(line) for line in (first_line + rest).splitlines()]
    assert process.returncode == 130, stderr
    assert [line["index"] for line in lines] == list(range(num_prompts))
    assert lines[0]["stop_reason"] != "interrupted" and lines[-1]["stop_reason"] == "interrupted"
    assert "interrupted" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_an_output_onto_an_input_is_refused_and_the_input_kept(tiny_target, prompt_file, tmp_path, how):
    output = {"same": prompt_file, "symlink": str(tmp_path / "link.jsonl"),
              "hardlink": str(tmp_path / "hard.jsonl")}[how]
    if how == "symlink":
        os.symlink(prompt_file, output)
    elif how == "hardlink":
        os.link(prompt_file, output)
    before = Path(prompt_file).read_bytes()
    assert_one_line_error(_batch(tiny_target, prompt_file, "--batch", "2", "--output", output),
                          "--output", "--prompt-file")
    assert Path(prompt_file).read_bytes() == before


@pytest.mark.parametrize("batch", [["--batch", "2"], []])
def test_an_output_onto_the_model_is_refused_before_it_loads(tiny_target, prompt_file, batch):
    """Before a model loads, and so before a budget too small for it is refused (that one comes later)."""
    before = Path(tiny_target).stat()
    refused = _batch(tiny_target, prompt_file, *batch, "--output", tiny_target, "--memory-budget", "1KiB")
    assert_one_line_error(refused, f"--output {tiny_target} is the --target file")
    assert Path(tiny_target).stat().st_mtime_ns == before.st_mtime_ns


def _batch_writing_its_output(tiny_target, tmp_path, output: Path, max_tokens: int = 400,
                              preexec_fn=None) -> subprocess.Popen:
    """A --batch run with --output, once its first line is in the temporary file: decoding is under way."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in PROMPTS * 3))
    process = subprocess.Popen([sys.executable, "-m", "apps.cli", "generate", "--target", tiny_target, "--backend",
                                "torch", "--prompt-file", str(path), "--batch", "2", "--threads", "1",
                                "--max-tokens", str(max_tokens), "--max-context", "512", "--draft", "none",
                                "--output", str(output)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=preexec_fn)
    deadline = time.monotonic() + 120
    while not any(partial.stat().st_size for partial in tmp_path.glob(f".{output.name}.*.partial")):
        assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    return process


def test_a_killed_run_leaves_the_old_output_whole(tiny_target, tmp_path):
    """SIGKILL mid-decode: the file under --output is still the previous one, never a half-written one."""
    output = tmp_path / "out.jsonl"
    output.write_text("the previous run's outputs\n")
    process = _batch_writing_its_output(tiny_target, tmp_path, output)
    process.kill()
    process.communicate(timeout=60)
    assert output.read_text() == "the previous run's outputs\n"


def test_sigterm_keeps_the_finished_prompts_as_ctrl_c_does_and_the_old_output(tiny_target, tmp_path):
    """`kill`, `timeout` or `docker stop` mid-decode: exit 143 with one line, the previous output as it was, this
    run's lines beside it (every finished prompt was lost), and no hidden .partial file left behind."""
    output = tmp_path / "out.jsonl"
    output.write_text("the previous run's outputs\n")
    process = _batch_writing_its_output(tiny_target, tmp_path, output)
    process.terminate()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143 and stderr.strip().splitlines()[-1] == "terminated", stderr
    assert "Traceback" not in stderr and output.read_text() == "the previous run's outputs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.jsonl", "out.interrupted.jsonl", "out.jsonl"]
    lines = [json.loads(line) for line in (tmp_path / "out.interrupted.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(PROMPTS) * 3))
    assert lines[0]["stop_reason"] != "interrupted" and any(line["stop_reason"] == "interrupted" for line in lines)


def test_a_sighup_that_nohup_ignores_stays_ignored(tiny_target, tmp_path):
    """Closing the terminal of a `nohup` run: the batch goes on to its end."""
    output = tmp_path / "out.jsonl"
    process = _batch_writing_its_output(tiny_target, tmp_path, output, max_tokens=40,
                                        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    process.send_signal(signal.SIGHUP)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(lines) == len(PROMPTS) * 3 and all(line["stop_reason"] != "interrupted" for line in lines)


def test_ctrl_c_with_output_writes_the_whole_file(tiny_target, tmp_path):
    output = tmp_path / "out.jsonl"
    process = _batch_writing_its_output(tiny_target, tmp_path, output)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(PROMPTS) * 3))
    assert lines[-1]["stop_reason"] == "interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["long.jsonl", "out.jsonl"]


def test_ctrl_c_never_replaces_an_earlier_output_and_writes_its_lines_beside_it(tiny_target, tmp_path):
    output = tmp_path / "out.jsonl"
    output.write_text("the previous run's outputs\n")
    (tmp_path / "out.interrupted.jsonl").write_text("an earlier interrupted run's\n")
    process = _batch_writing_its_output(tiny_target, tmp_path, output)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    beside = tmp_path / "out.interrupted-2.jsonl"
    assert f"{output} is left as it was; this run's lines are in {beside}" in stderr
    assert output.read_text() == "the previous run's outputs\n"
    assert (tmp_path / "out.interrupted.jsonl").read_text() == "an earlier interrupted run's\n"
    lines = [json.loads(line) for line in beside.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(PROMPTS) * 3))
    assert lines[-1]["stop_reason"] == "interrupted"


@pytest.mark.parametrize("batch", [[], ["--batch", "2"]])
def test_an_output_in_a_missing_folder_is_refused_before_the_model_loads(tiny_target, prompt_file, tmp_path, batch):
    missing = tmp_path / "missing" / "out.jsonl"
    source = ["--prompt-file", prompt_file] if batch else ["--prompt", "the cat is"]
    result = run_cli("generate", "--target", "no-such-model", *source, *batch, "--output", str(missing))
    assert_one_line_error(result, "--output", f"the folder {missing.parent} does not exist")


def test_dot_slash_dash_is_the_file_named_dash(tiny_target, tmp_path, monkeypatch):
    """pathlib prints ./- as "-": the piped stdin was read instead of the file, and stdout written instead."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-").write_text(json.dumps({"prompt": "the cat is", "id": "from the file"}) + "\n")
    result = subprocess.run([sys.executable, "-m", "apps.cli", "generate", "--target", tiny_target, "--backend",
                             "torch", "--prompt-file", "./-", "--batch", "2", "--threads", "1", "--max-context",
                             "256", "--max-tokens", "4", "--output", "./out-", "--draft", "none"],
                            input=json.dumps({"prompt": "piped"}) + "\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "", result.stderr
    (line,) = [json.loads(text) for text in (tmp_path / "out-").read_text().splitlines()]
    assert (line["id"], line["line"]) == ("from the file", 1)


def test_output_dash_is_stdout_as_prompt_file_dash_is_stdin(tiny_target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ("generate", "--target", tiny_target, "--backend", "torch", "--prompt", "the cat is", "--threads", "1",
            "--max-context", "256", "--max-tokens", "8", "--draft", "none", "--json")
    alone, dashed = run_cli(*args), run_cli(*args, "--output", "-")
    assert dashed.returncode == 0, dashed.stderr
    assert json.loads(dashed.stdout)["tokens"] == json.loads(alone.stdout)["tokens"]
    assert list(tmp_path.iterdir()) == []  # no file named "-"


@pytest.mark.parametrize("as_json", [False, True])
def test_output_without_batch_holds_the_text(tiny_target, tmp_path, as_json):
    output = tmp_path / "out.txt"
    extra = ["--json"] if as_json else []
    alone = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt", "the cat is", "--threads",
                    "1", "--max-context", "256", "--max-tokens", "8", "--draft", "none", "--json")
    result = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt", "the cat is", "--threads",
                     "1", "--max-context", "256", "--max-tokens", "8", "--draft", "none", "--output", str(output),
                     *extra)
    assert alone.returncode == 0 and result.returncode == 0, result.stderr
    assert result.stdout == ""
    expected = json.loads(alone.stdout)
    if as_json:
        assert json.loads(output.read_text())["tokens"] == expected["tokens"]
    else:
        assert output.read_text() == expected["text"] + "\n"


def test_output_without_batch_is_never_the_prompt_file(tiny_target, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the cat is")
    result = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt-file", str(prompt),
                     "--output", str(prompt), "--max-context", "256")
    assert_one_line_error(result, "--output", "--prompt-file")
    assert prompt.read_text() == "the cat is"


def test_chat_on_a_model_without_a_template_says_chatml_once(tiny_target, prompt_file):
    batched = _batch(tiny_target, prompt_file, "--batch", "2", "--chat", "--max-tokens", "4")
    alone = run_cli("generate", "--target", tiny_target, "--backend", "torch", "--prompt", "the cat is", "--chat",
                    "--threads", "1", "--max-context", "256", "--max-tokens", "4")
    for result in (batched, alone):
        assert result.returncode == 0, result.stderr
        assert result.stderr.count("carries no chat template: using ChatML") == 1, result.stderr


def test_a_lines_seed_past_the_largest_wraps_into_seeds_range():
    from apps.batch_generate import _line_seed

    assert [_line_seed(2**63 - 2, index) for index in range(3)] == [2**63 - 2, 2**63 - 1, 0]


def test_a_batch_wider_than_its_prompts_holds_only_their_sequences(smollm2_path, prompt_file):
    """`--batch 64` over 6 prompts on llama.cpp plans and allocates 6 sequences, not 64 that no prompt fills."""
    batched = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", prompt_file, "--batch", "64",
                      "--draft", "none", "--max-context", "512", "--memory-budget", "1GiB", "--threads", "1")
    assert batched.returncode == 0, batched.stderr
    assert len(batched.stdout.splitlines()) == len(PROMPTS)
    assert f"{len(PROMPTS)} sequences of 512 tokens share the context" in batched.stderr


def test_more_sequences_than_llama_cpp_holds_are_refused_naming_the_flag(smollm2_path, tmp_path):
    from pocketspec.backends.llama_context import max_sequences

    path = tmp_path / "many.jsonl"
    count = max_sequences() + 1
    path.write_text("".join(json.dumps({"prompt": f"line {index}"}) + "\n" for index in range(count)))
    refused = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", str(path), "--batch", str(count),
                      "--draft", "none")
    assert_one_line_error(refused, f"--batch {count}", f"at most {max_sequences()} sequences", "lower --batch")
    pooled = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", str(path), "--batch", "4",
                     "--pool-rows", str(count), "--draft", "none")
    assert_one_line_error(pooled, f"--pool-rows {count}", "lower --pool-rows")


def test_sequences_that_do_not_fit_the_budget_name_the_flag_that_asked_for_them(smollm2_path, prompt_file):
    refused = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", prompt_file, "--batch", "6",
                      "--draft", "none", "--memory-budget", "269MiB")
    assert_one_line_error(refused, "--batch 6 with 4096 tokens each", "or lower --batch")
    assert "--max-concurrency" not in refused.stderr
    # the minimum it names counts the sequences' logits rows: it is enough, with no second refusal for them
    minimum = float(re.search(r"minimum ([\d.]+) MiB", refused.stderr).group(1))
    fits = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", prompt_file, "--batch", "6",
                   "--draft", "none", "--max-tokens", "2", "--memory-budget", f"{math.ceil(minimum)}MiB")
    assert fits.returncode == 0, fits.stderr


def test_sequences_that_no_context_fits_name_the_need_of_the_shortest_context_each(smollm2_path, prompt_file):
    """'even --max-context 512' means 512 tokens for every sequence, their logits rows counted: enough."""
    refused = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", prompt_file, "--batch", "4",
                      "--draft", "none", "--memory-budget", "100MiB")
    assert_one_line_error(refused, "--batch 4 with 4096 tokens each", "even --max-context 512 needs")
    need = float(re.search(r"needs ([\d.]+) MiB", refused.stderr).group(1))
    fits = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", prompt_file, "--batch", "4",
                   "--draft", "none", "--max-tokens", "2", "--max-context", "512",
                   "--memory-budget", f"{math.ceil(need)}MiB")
    assert fits.returncode == 0, fits.stderr
