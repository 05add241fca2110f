"""Bad input gets one clear line on stderr, exit code 2 and no traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pocketspec.models.catalog import model_path

LONG_PROMPT = "word " * 400


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("broken")
    truncated = folder / "truncated.gguf"
    with open(smollm2_path, "rb") as source, open(truncated, "wb") as target:
        target.write(source.read(20_000_000))
    corrupted = folder / "corrupted.gguf"
    shutil.copyfile(smollm2_path, corrupted)
    with open(corrupted, "r+b") as file:
        file.write(b"XXXX")
    return {"truncated": truncated, "corrupted": corrupted, "missing": folder / "missing.gguf"}


@pytest.mark.parametrize("kind, fragment", [("missing", "does not exist"), ("truncated", "truncated"),
                                            ("corrupted", "not a GGUF")])
def test_broken_model_files(broken_models, kind, fragment):
    result = run_cli("generate", "--target", str(broken_models[kind]), "--draft", "none", "--prompt", "hi")
    assert_one_line_error(result, fragment)


def test_unknown_catalog_name():
    assert_one_line_error(run_cli("generate", "--target", "llama-9000b", "--prompt", "hi"), "llama-9000b")


def test_unknown_pair():
    assert_one_line_error(run_cli("generate", "--pair", "no-such-pair", "--prompt", "hi"), "no-such-pair")


@pytest.mark.parametrize("flags, fragment", [
    (["--target", ""], "--target is empty"),
    (["--target", "smollm2-135m-instruct", "--draft", " "], "--draft is empty"),
    (["--pair", ""], "--pair is empty: give one of qwen-coder"),
])
def test_an_empty_model_flag_is_refused_not_read_as_the_default(flags, fragment):
    """`--draft "$DRAFT"` with DRAFT unset: an error, never the default model or drafter in disguise."""
    assert_one_line_error(run_cli("generate", *flags, "--prompt", "hi"), fragment)


def test_draft_with_another_vocabulary(smollm2_path):
    draft = model_path("qwen2.5-coder-0.5b-instruct")
    result = run_cli("generate", "--target", str(smollm2_path), "--draft", str(draft), "--prompt", "hi")
    assert_one_line_error(result, "vocabulary", "same family")


def test_prompt_longer_than_the_context(smollm2_path):
    result = run_cli("generate", "--target", str(smollm2_path), "--draft", "ngram", "--max-context", "128",
                     "--prompt", LONG_PROMPT)
    assert_one_line_error(result, "prompt has", "--max-context")


@pytest.mark.parametrize("flags, fragment", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "2"], "--top-p"),
    (["--top-k", "-3"], "--top-k"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--gamma", "many"], "--gamma"),
    (["--gamma", "99"], "--gamma"),
    (["--max-context", "10"], "--max-context"),
    (["--memory-budget", "lots"], "--memory-budget"),
    (["--memory-budget", "100MiB"], "below the minimum"),
    (["--kv-type", "q3"], "--kv-type"),
    (["--backend", "torch", "--kv-type", "bf16"], "--torch-kv-type"),
    (["--scheduler", "group"], "--scheduler applies to --batch"),  # read by --batch alone: refused, not ignored
    (["--fast-batch"], "--batch-invariant/--fast-batch applies to --batch"),
    (["--pool-rows", "4"], "--pool-rows applies to --batch"),
])
def test_nonsense_flag_values(smollm2_path, flags, fragment):
    result = run_cli("generate", "--target", str(smollm2_path), "--draft", "ngram", "--prompt", "hi", *flags)
    assert_one_line_error(result, fragment)


def test_doctor_refuses_a_cost_table_choice_it_cannot_use(smollm2_path):
    result = run_cli("doctor", "--target", str(smollm2_path), "--draft", "ngram", "--calibrate", "--backend", "torch",
                     "--kv-type", "bf16")
    assert_one_line_error(result, "--torch-kv-type")


@pytest.mark.parametrize("flag, value", [("--self-draft-window", "128"), ("--self-draft-kv-type", "int8"),
                                         ("--self-draft-keys", "attended")])
def test_doctor_calibrate_without_batch_refuses_the_self_draft_flags_it_would_ignore(smollm2_path, flag, value):
    """--calibrate alone measures the forward costs; only --calibrate --batch N prices a self-draft's window."""
    result = run_cli("doctor", "--calibrate", "--target", str(smollm2_path), "--backend", "torch", "--draft",
                     "self-sparse", flag, value)
    assert_one_line_error(result, flag, "add --batch N")


@pytest.mark.parametrize("flags, flag", [
    (["--target", "nosuch"], "--target"), (["--pair", "nosuch"], "--pair"), (["--draft", "ngram"], "--draft"),
    (["--kv-type", "bf16"], "--kv-type"), (["--no-repack"], "--repack"), (["--backend", "torch"], "--backend"),
    (["--threads", "1"], "--threads"),
])
def test_doctor_without_calibrate_refuses_what_only_calibrate_reads(flags, flag):
    """The report is the machine's: a flag that chooses models or their settings would be ignored silently."""
    assert_one_line_error(run_cli("doctor", *flags), flag, "add --calibrate")


def test_missing_prompt_file(smollm2_path, tmp_path):
    result = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", str(tmp_path / "nope.txt"))
    assert_one_line_error(result, "nope.txt")


def test_empty_prompt(smollm2_path):
    assert_one_line_error(run_cli("generate", "--target", str(smollm2_path), "--prompt", "  "), "empty")


@pytest.mark.parametrize("source, stdin, said", [
    ("file", None, "--prompt-file {file} holds only whitespace"), ("-", "", "stdin holds nothing"),
])
def test_an_empty_prompt_names_where_it_came_from(smollm2_path, tmp_path, source, stdin, said):
    """`generate --prompt-file -` with nothing piped said "pass some text with --prompt or --prompt-file", as if
    neither had been given."""
    file = tmp_path / "prompt.txt"
    file.write_text(" \n\n")
    result = run_cli("generate", "--target", str(smollm2_path), "--prompt-file", str(file) if source == "file" else "-",
                     stdin=stdin)
    assert_one_line_error(result, "the prompt is empty: " + said.format(file=file))


def test_no_prompt_says_how_to_pipe_one(smollm2_path):
    """`echo hi | pocketspec generate` is not read unasked (stdin may be a shell's): the line says how to."""
    result = run_cli("generate", "--target", str(smollm2_path), stdin="hi")
    assert_one_line_error(result, "give exactly one of --prompt TEXT or --prompt-file FILE",
                          "(--prompt-file - reads stdin)")


def test_models_pull_of_an_unknown_name_lists_models_and_pairs():
    """A pull takes a model or a pair, never a path: it said "known models: ... (or pass a path to a .gguf file)"."""
    result = run_cli("models", "pull", "qwen-cooder")
    assert_one_line_error(result, "unknown model or pair 'qwen-cooder'", "smollm2-135m-instruct", "pairs: qwen-coder")
    assert "path" not in result.stderr


@pytest.mark.parametrize("args", [
    ["generate", "--target", "{model}", "--prompt", "hi", "--max-tokens", "0", "--json"],
    ["generate", "--target", "{model}", "--prompt", "hi", "--memory-budget", "10MiB", "--json"],
    ["generate", "--json", "--target", "{model}", "--prompt", " "],
    ["doctor", "--json", "--threads", "1"],
    ["doctor", "--json", "--calibrate", "--target", "{model}", "--kv-type", "q3"],
])
def test_a_json_refusal_is_one_json_object_on_stdout(smollm2_path, args):
    """Under --json, stdout is one JSON object for a refusal too ({"error": the line}), as it is for `plan`; the
    line stays on stderr, and the exit code is 2."""
    import json

    result = run_cli(*[arg.format(model=smollm2_path) for arg in args])
    assert_one_line_error(result)
    assert json.loads(result.stdout) == {"error": result.stderr.strip().removeprefix("error: ")}


@pytest.mark.parametrize("args", [
    ["generate", "--target", "{model}", "--prompt", "--json", "--max-tokens", "0"],  # --json is the prompt here
    ["generate", "--target", "{model}", "--max-tokens", "0", "--prompt", "hi", "--", "--json"],
])
def test_json_as_a_value_or_after_dashes_is_no_json_flag(smollm2_path, args):
    result = run_cli(*[arg.format(model=smollm2_path) for arg in args])
    assert result.returncode == 2 and result.stdout == ""


def test_doctor_calibrate_alone_refuses_max_gamma(smollm2_path):
    """--calibrate alone measures every width up to 32: --max-gamma was taken and ignored (exit 0)."""
    result = run_cli("doctor", "--calibrate", "--target", str(smollm2_path), "--draft", "none", "--max-gamma", "4")
    assert_one_line_error(result, "--max-gamma", "add --batch N")


def test_unknown_command_and_option():
    assert_one_line_error(run_cli("fly"), "fly")
    assert_one_line_error(run_cli("generate", "--wings"), "--wings")


@pytest.mark.parametrize("args", [[], ["models"]])
def test_a_group_named_alone_shows_its_help_not_an_error(args):
    result = run_cli(*args)
    assert result.stderr.startswith("Usage: ") and "Commands:" in result.stderr and "error" not in result.stderr


def test_generate_json_has_the_documented_keys(smollm2_path):
    import json

    result = run_cli("generate", "--target", str(smollm2_path), "--draft", "ngram", "--prompt", "Hello",
                     "--max-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert {"text", "tokens", "stats"} <= output.keys()
    assert {"num_tokens", "seconds", "tokens_per_second", "num_steps", "num_drafted", "num_accepted",
            "acceptance_rate", "mean_accepted_per_step", "peak_rss_bytes", "peak_memory_bytes"} <= output["stats"].keys()
    assert output["stats"]["num_tokens"] == len(output["tokens"]) <= 8


def test_a_context_past_the_trained_length_is_refused_as_plan_refuses_it(smollm2_path):
    from pocketspec.models.gguf_check import check_gguf

    too_long = str(check_gguf(smollm2_path).context_length + 1)
    lines = []
    for command in (["generate", "--prompt", "hi"], ["plan"], ["chat"]):
        result = run_cli(command[0], "--target", str(smollm2_path), "--draft", "ngram", "--max-context", too_long,
                         *command[1:], stdin="hi")
        assert_one_line_error(result, f"--max-context {too_long}", "trained context")
        lines.append(result.stderr.strip())
    assert len(set(lines)) == 1


def test_a_small_context_stays_the_size_asked_for(smollm2_path):
    """llama.cpp pads n_ctx to a multiple of 256; --max-context 64 still means 64 tokens."""
    from conftest import built_engine

    with built_engine(smollm2_path, drafter="none", max_context=64) as engine:
        assert engine.target.max_context == 64
        prompt = engine.target.tokenizer.encode("the cat is", add_bos=True, parse_special=False)
        result = engine.generate(prompt, 200)
        assert engine.target.num_cached <= 64
    # The last token is sampled from the 64th position's logits and never cached.
    assert result.stop_reason == "context_full" and len(prompt) + len(result.tokens) == 65


def test_a_piped_chat_refused_before_its_first_turn_leaves_no_transcript(smollm2_path, tmp_path):
    """A message longer than the context is refused (exit 2); the new chat's header-only file is removed, while a
    chat that was answered keeps its transcript."""
    from conftest import home_with_measurements

    home = home_with_measurements(tmp_path / "home")
    env = {**os.environ, "POCKETSPEC_HOME": str(home)}
    chat = [sys.executable, "-m", "apps.cli", "chat", "--target", str(smollm2_path), "--draft", "none",
            "--max-context", "256", "--max-tokens", "2"]
    refused = subprocess.run(chat, input="word " * 400, capture_output=True, text=True, timeout=300, env=env)
    assert_one_line_error(refused, "256")
    assert not list((home / "chats").glob("*.jsonl"))
    answered = subprocess.run(chat, input="hi", capture_output=True, text=True, timeout=300, env=env)
    assert answered.returncode == 0, answered.stderr
    assert len(list((home / "chats").glob("*.jsonl"))) == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["generate", "generate --json", "chat"])
def test_a_full_disk_under_stdout_is_one_line(smollm2_path, tmp_path, command):
    """/dev/full fails every write as a full disk does: one line and exit 2, not an OSError's traceback."""
    from conftest import home_with_measurements

    name, *flags = command.split()
    args = [name, "--target", str(smollm2_path), "--draft", "ngram", "--threads", "1", "--max-tokens", "4", *flags]
    if name == "generate":
        args += ["--prompt", "The sky is"]
    env = {**os.environ, "POCKETSPEC_HOME": str(home_with_measurements(tmp_path / "home"))}
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "apps.cli", *args], stdout=full, stderr=subprocess.PIPE,
                                input="hi" if name == "chat" else None, text=True, env=env, timeout=300)
    assert_one_line_error(result, "cannot write the output", "No space left on device")


def test_a_closed_stdout_is_one_line_and_a_closed_stderr_leaves_the_output(smollm2_path):
    args = [sys.executable, "-m", "apps.cli", "generate", "--target", str(smollm2_path), "--draft", "ngram",
            "--threads", "1", "--max-tokens", "4", "--prompt", "The sky is"]
    closed_stdout = subprocess.run(args, stderr=subprocess.PIPE, text=True, timeout=300,
                                   preexec_fn=lambda: os.close(1))
    assert_one_line_error(closed_stdout, "stdout is closed")
    closed_stderr = subprocess.run(args, stdout=subprocess.PIPE, text=True, timeout=300,
                                   preexec_fn=lambda: os.close(2))
    assert closed_stderr.returncode == 0 and closed_stderr.stdout.strip()


def test_text_past_what_the_context_can_hold_is_refused_unread(smollm2_path, tmp_path):
    """A prompt file or piped message of more bytes than --max-context tokens can take is refused after
    reading that much, not read whole (`< /dev/zero` grew a chat to the machine's memory)."""
    from apps.text_input import prompt_bytes_limit

    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"word " * (prompt_bytes_limit(256) // 5 + 1))
    flags = ("--target", str(smollm2_path), "--draft", "none", "--max-context", "256")
    generated = run_cli("generate", *flags, "--prompt-file", str(huge))
    assert_one_line_error(generated, f"--prompt-file {huge} holds more than 32.00 KiB", "more than the context")
    with open(huge, "rb") as stdin:
        chatted = subprocess.run([sys.executable, "-m", "apps.cli", "chat", *flags], stdin=stdin,
                                 capture_output=True, text=True, timeout=300)
    assert_one_line_error(chatted, "stdin holds more than 32.00 KiB")


def test_a_chat_with_stdin_closed_is_one_line(smollm2_path):
    closed_stdin = subprocess.run([sys.executable, "-m", "apps.cli", "chat", "--target", str(smollm2_path)],
                                  capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.close(0))
    assert_one_line_error(closed_stdin, "stdin is closed")
