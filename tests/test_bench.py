"""`pocketspec bench`: bad flags and suites are one line and exit code 2; a smallest real run
on SmolLM2 writes results.json, report.md and the plots (timings are not checked here), whose
texts benchmarks/replay_bench_texts.py replays, and Ctrl-C writes the completed rounds, marked
partial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apps.bench.peers import PEERS, parse_peers
from pocketspec.settings import BACKENDS
from tests.test_cli_errors import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, fragments", [
    (["--suite", "/nonexistent/suite.jsonl"], ["/nonexistent/suite.jsonl does not exist"]),
    (["--categories", "no-such-category"], ["no-such-category", "coding"]),
    (["--peers", "vllm"], ["--peers 'vllm'"]),
    (["--drafters", "medusa"], ["--drafters 'medusa'"]),
    (["--memory-budget", "2GiB,lots"], ["--memory-budget 'lots'"]),
    (["--drafters", ""], ["--drafters ''"]),
    (["--categories", ""], ["--categories is empty"]),
    (["--peers", "llama.cpp"], ["--peers llama.cpp cannot run", "needs a draft model"]),  # SmolLM2 has none
    (["--peers", "llama.cpp-ngram-simple", "--llama-tools", "/tmp"], ["--peers llama.cpp-ngram-simple cannot run",
                                                                     "/tmp"]),
    (["--drafters", "auto,ngram", "--self-draft-window", "64"], ["--self-draft-window applies to --draft self-sparse",
                                                                  "add self-sparse to --drafters"]),
    # a self-draft skipped (it runs on torch only) reads nothing either
    (["--drafters", "ngram,self-sparse", "--self-draft-window", "64"], ["--self-draft-window applies"]),
])
def test_bad_flags(smollm2_path, args, fragments):
    assert_one_line_error(run_cli("bench", "--target", str(smollm2_path), *args), *fragments)


def test_auto_names_peers_for_every_backend():
    """`--peers auto` on onnx was a KeyError traceback: every backend has its entry (onnx: none run on ORT)."""
    for backend in BACKENDS:
        assert set(parse_peers("auto", backend)) <= set(PEERS)
    assert parse_peers("auto", "onnx") == []


def test_onnx_with_auto_peers_gets_to_its_out_folder(smollm2_path, tmp_path):
    """Past the peers, to --out's check, which is the first to refuse here (nothing runs)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("earlier")
    assert_one_line_error(run_cli("bench", "--backend", "onnx", "--target", str(smollm2_path), "--out", str(out)),
                          f"--out {out} already holds report.md")


@pytest.mark.parametrize("args, fragments", [
    (["--drafters", "self-sparse", "--peers", "none"], ["nothing to compare with plain decoding",
                                                        "pocketspec-self-sparse: --draft self-sparse",
                                                        "needs --backend torch"]),
    (["--weights", "bf16"], ["--weights fp32, fp16, int4 or auto, not bf16"]),
    (["--kv-type", "q8_0"], ["--kv-type q8_0 sets llama.cpp's KV cache"]),
])
def test_what_generate_refuses_on_onnx_is_refused_before_plain_decoding_runs(smollm2_path, two_category_suite,
                                                                            tmp_path, args, fragments):
    """Generate's own checks, before a round: plain decoding ran a whole round first, then the run ended at exit 2."""
    out = tmp_path / "out"
    result = run_cli("bench", "--backend", "onnx", "--target", str(smollm2_path), "--suite", str(two_category_suite),
                     "--out", str(out), *args)
    assert_one_line_error(result, *fragments)
    assert not out.exists()


def test_bad_suite_line_names_file_and_line(smollm2_path, tmp_path):
    suite = tmp_path / "mine.jsonl"
    suite.write_text('{"prompt": "fine"}\n{"turns": "oops"}\n')
    assert_one_line_error(run_cli("bench", "--target", str(smollm2_path), "--suite", str(suite)),
                          f"{suite} line 2: `turns` must be a list")


@pytest.fixture
def two_category_suite(tmp_path):
    suite = tmp_path / "two.jsonl"
    suite.write_text('{"category": "code", "prompt": "Write a Python function that adds two numbers."}\n'
                     '{"category": "chat", "turns": ["Say hello.", "Now say goodbye."]}\n')
    return suite


@pytest.mark.real_model
def test_smallest_run_writes_results_report_and_plots(smollm2_path, two_category_suite, tmp_path):
    out = tmp_path / "out"
    result = run_cli("bench", "--target", str(smollm2_path), "--suite", str(two_category_suite),
                     "--max-tokens", "8", "--drafters", "auto,ngram,self-sparse", "--peers", "prompt-lookup",
                     "--threads", "1",
                     "--exact-verify", "--out", str(out))
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    status = {system["name"]: (system["status"], system["reason"]) for system in results["systems"]}
    assert status["plain"] == ("ok", None) and status["pocketspec-ngram"] == ("ok", None)
    assert status["pocketspec-auto"] == ("ok", None)  # no draft model: auto drafts n-grams, as generate does
    assert status["prompt-lookup"] == ("ok", None)
    assert status["pocketspec-self-sparse"] == ("skipped", "--draft self-sparse drafts with the target's own weights "
                                                           "and needs --backend torch")
    assert {(row["system"], row["category"]) for row in results["rows"]} == {
        (system, category) for system in ("plain", "pocketspec-auto", "pocketspec-ngram", "prompt-lookup")
        for category in ("code", "chat", "chat (turn 2)")}  # a second turn follows plain decoding's first reply
    assert results["rounds"]["num_completed"] == 2 and not results["rounds"]["is_partial"]
    assert {(row["category"], row["round"]) for row in results["rows"]} == {
        ("code", 0), ("chat", 1), ("chat (turn 2)", 1)}
    assert all(len(system["startup_seconds"]) == 2 for system in results["systems"] if system["status"] == "ok")
    # with --exact-verify greedy n-gram drafting is lossless on any CPU: each output equals plain decoding's
    assert [row["matches_plain"] for row in results["rows"] if row["system"] == "pocketspec-ngram"] == [True] * 3
    assert all(row["peak_memory_bytes"] > 50 * 2**20 and row["num_tokens"] >= 1 for row in results["rows"])
    assert results["machine"]["doctor"]["llama_cpp"]["version"] == "0.3.36"
    report = (out / "report.md").read_text()
    assert "## code" in report and "## chat" in report and "× prompt-lookup" in report
    assert all((out / name).stat().st_size > 10_000 for name in ("speedup.png", "frontier.png"))
    # every system's text replays with PocketSpec's drafting, beside its measured speedup
    costs = ROOT / "benchmarks" / "results" / "traces" / "costs_qwen2.5-coder-1.5b_2threads.json"
    replayed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replay_bench_texts.py"), str(out),
                               "--costs", str(costs), "--target", str(smollm2_path), "--out", str(tmp_path / "texts")],
                              capture_output=True, text=True, timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    comparison = json.loads((tmp_path / "texts.json").read_text())["comparison"]
    assert set(comparison) == {"plain", "pocketspec-auto", "pocketspec-ngram", "prompt-lookup"}
    assert set(comparison["plain"]) == {"code", "chat", "chat (turn 2)", "all"}
    assert comparison["plain"]["all"]["measured"] == pytest.approx(1.0)
    assert all(item["replayed"] >= 0.9 and item["num_prompts"] >= 1 for item in comparison["prompt-lookup"].values())


def _worker_tokens(smollm2_path, *, temperature: float, top_k: int, top_p: float) -> list[int]:
    """The tokens a PocketSpec bench worker generates for one prompt, plain decoding."""
    job = {"runner": "pocketspec", "target": str(smollm2_path), "draft": "none",
           "prompts": [{"prompt_id": "1", "text": "Tell me a story about a cat.", "prompt_tokens": None}],
           "max_tokens": 16, "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": 0,
           "num_threads": 1, "max_context": 512, "num_warmup_tokens": 0, "options": {}}
    run = subprocess.run([sys.executable, "-m", "apps.bench.worker"], input=json.dumps(job), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (row,) = [record for record in map(json.loads, run.stdout.splitlines()) if "note" not in record]
    return row["tokens"]


def test_the_worker_opens_the_jobs_kv_type_and_verify_mode():
    """--kv-type and --exact-verify reach each PocketSpec worker's session, not its backend options."""
    from apps.bench.worker import session_settings

    job = {"target": "t.gguf", "draft": "none", "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0,
           "max_context": 512, "num_threads": 1, "max_tokens": 8,
           "options": {"kv_type": "bf16", "exact_verify": True, "repack": None, "backend": "llama.cpp"}}
    settings = session_settings(job)
    assert settings.kv_type == "bf16" and settings.exact_verify
    assert "kv_type" not in settings.options and "exact_verify" not in settings.options


def test_each_worker_gets_the_self_draft_flags_its_drafter_reads():
    """`--drafters ngram,self-sparse --self-draft-window 64`: the self-sparse worker's window, not the n-gram's."""
    from apps.bench.worker import session_settings

    options = {"backend": "torch", "self_draft_window": 64, "self_skip_layers": 2}
    job = {"target": "t.gguf", "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "max_context": 512,
           "num_threads": 1, "max_tokens": 8, "options": options}
    assert session_settings({**job, "draft": "ngram"}).options == {"backend": "torch"}
    assert session_settings({**job, "draft": "self-sparse"}).options == {"backend": "torch", "self_draft_window": 64}
    assert session_settings({**job, "draft": "self-skip"}).options == {"backend": "torch", "self_skip_layers": 2}


@pytest.mark.real_model
def test_pocketspec_workers_sample_with_the_jobs_top_k_and_top_p(smollm2_path):
    """The peers get --top-k/--top-p; PocketSpec's worker must too, or sampled runs compare different settings.
    Both cuts below leave only the most likely token, so a hot temperature still decodes greedily."""
    greedy = _worker_tokens(smollm2_path, temperature=0.0, top_k=0, top_p=1.0)
    assert _worker_tokens(smollm2_path, temperature=2.0, top_k=1, top_p=1.0) == greedy
    assert _worker_tokens(smollm2_path, temperature=2.0, top_k=0, top_p=1e-6) == greedy


def _stopped_bench(smollm2_path, suite, out, signum: int, when: str, *extra: str) -> tuple[int, list[str]]:
    """A bench sent `signum` (to its process group, as a terminal's Ctrl-C is) once its progress shows `when`:
    (its exit code, its stderr lines)."""
    bench = subprocess.Popen([sys.executable, "-m", "apps.cli", "bench", "--target", str(smollm2_path), "--suite",
                              str(suite), "--max-tokens", "8", "--drafters", "ngram", "--peers", "none",
                              "--threads", "1", "--out", str(out), *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    for line in bench.stderr:  # off a terminal the progress bar prints each new label on a line
        lines.append(line)
        if when in line:
            os.killpg(bench.pid, signum)
            break
    lines += bench.stderr.readlines()
    return bench.wait(timeout=120), lines


@pytest.mark.real_model
@pytest.mark.parametrize("signum, exit_code, last_line", [(signal.SIGINT, 130, "interrupted"),
                                                          (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_or_sigterm_writes_the_completed_rounds_marked_partial(smollm2_path, two_category_suite, tmp_path,
                                                                      signum, exit_code, last_line):
    out = tmp_path / "out"
    returncode, lines = _stopped_bench(smollm2_path, two_category_suite, out, signum, "chat (2/2): plain")
    assert returncode == exit_code, "".join(lines)
    assert lines[-1].strip() == last_line and not any("Traceback" in line for line in lines)
    results = json.loads((out / "results.json").read_text())
    assert results["rounds"]["num_completed"] == 1 and results["rounds"]["is_partial"]
    assert {(row["system"], row["category"], row["round"]) for row in results["rows"]} == {
        ("plain", "code", 0), ("pocketspec-ngram", "code", 0)}
    report = (out / "report.md").read_text()
    assert "(partial)" in report and "stopped after 1 of 2 rounds" in report and "## code" in report


@pytest.mark.real_model
def test_a_forced_run_stopped_before_any_round_leaves_the_earlier_results(smollm2_path, two_category_suite,
                                                                          tmp_path):
    """--force replaces an earlier run's files with this run's, not with "nothing was measured" beside old plots."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("results.json", "report.md", "speedup.png"):
        (out / name).write_text(f"earlier {name}")
    returncode, lines = _stopped_bench(smollm2_path, two_category_suite, out, signal.SIGINT, "code (1/2): plain",
                                       "--force")
    assert returncode == 130 and any("no round completed" in line for line in lines), "".join(lines)
    assert {path.name: path.read_text() for path in out.iterdir()} == {
        name: f"earlier {name}" for name in ("results.json", "report.md", "speedup.png")}


@pytest.mark.real_model
def test_a_run_stopped_before_any_round_removes_the_folders_it_made(smollm2_path, two_category_suite, tmp_path):
    """"--out is left as it was" was said over an empty folder (and its new parents) that the run had made."""
    out = tmp_path / "new" / "out"
    returncode, lines = _stopped_bench(smollm2_path, two_category_suite, out, signal.SIGINT, "code (1/2): plain")
    assert returncode == 130 and any("no round completed" in line for line in lines), "".join(lines)
    assert not (tmp_path / "new").exists()


@pytest.mark.real_model
def test_a_run_where_nothing_but_plain_decoding_ran_exits_2(smollm2_path, two_category_suite, tmp_path):
    """A budget no PocketSpec system fits: each fails in its worker, the report says why, and the exit code says
    that nothing was compared (it was 0, a script would take the run for a result)."""
    out = tmp_path / "out"
    result = run_cli("bench", "--target", str(smollm2_path), "--suite", str(two_category_suite), "--max-tokens", "8",
                     "--drafters", "ngram", "--peers", "none", "--memory-budget", "1KiB", "--threads", "1",
                     "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: nothing was compared with plain decoding")
    assert "below the minimum" in (out / "report.md").read_text()


@pytest.mark.real_model
def test_a_system_failing_in_a_later_round_loses_its_rows_and_the_others_go_on(smollm2_path, two_category_suite,
                                                                               tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    replay = Path(__file__).parent / "data" / "llama_speculative_simple" / "max_tokens"
    fake = tools / "llama-speculative-simple"  # replays a captured run, and fails on the second round's prompt
    fake.write_text(f'#!/bin/sh\ncase "$*" in *"Say hello."*) echo "out of cheese" >&2; exit 3;; esac\n'
                    f'cat "{replay}/stdout.txt"; cat "{replay}/stderr.txt" >&2\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    result = run_cli("bench", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--suite",
                     str(two_category_suite), "--max-tokens", "8", "--drafters", "ngram", "--peers", "llama.cpp",
                     "--llama-tools", str(tools), "--threads", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    failed = next(system for system in results["systems"] if system["name"] == "llama.cpp-speculative")
    assert failed["status"] == "failed" and failed["reason"].startswith("round chat: ")
    assert failed["reason"].endswith("exited with code 3: out of cheese")
    assert {(row["system"], row["round"]) for row in results["rows"]} == {
        (system, index) for system in ("plain", "pocketspec-ngram") for index in (0, 1)}
    assert f"- llama.cpp-speculative: {failed['reason']}" in (out / "report.md").read_text()


@pytest.mark.parametrize("name", ["results.json", "report.md", "speedup.png"])
def test_an_earlier_runs_files_are_kept_unless_forced(smollm2_path, tmp_path, name):
    """Any file the bench would write, not only results.json: a user's own notes in report.md too."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("earlier")
    assert_one_line_error(run_cli("bench", "--target", str(smollm2_path), "--out", str(out)),
                          f"--out {out} already holds {name}", "--force")
    assert (out / name).read_text() == "earlier"


def test_a_suite_that_the_run_would_write_over_is_refused_even_with_force(smollm2_path, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    suite = out / "results.json"
    suite.write_text('{"prompt": "Say hi.", "category": "a"}\n')
    assert_one_line_error(run_cli("bench", "--target", str(smollm2_path), "--suite", str(suite), "--out", str(out),
                                  "--force"), f"--out {suite} is the --suite file")
    assert suite.read_text() == '{"prompt": "Say hi.", "category": "a"}\n'


def test_an_out_folder_that_cannot_be_made_is_refused_before_any_round(smollm2_path, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("kept")
    assert_one_line_error(run_cli("bench", "--target", str(smollm2_path), "--out", str(a_file / "sub")),
                          f"cannot make --out {a_file / 'sub'}")
    assert a_file.read_text() == "kept"


def test_a_self_drafts_bad_flag_on_torch_is_refused_with_generates_reason(smollm2_path, two_category_suite, tmp_path):
    """On torch a self-draft whose flags generate refuses (a window too small) is the user's to fix, in generate's
    words, not skipped with advice to add the drafter the user named."""
    out = tmp_path / "out"
    result = run_cli("bench", "--backend", "torch", "--target", str(smollm2_path), "--suite", str(two_category_suite),
                     "--out", str(out), "--drafters", "self-sparse,ngram", "--self-draft-window", "20")
    assert_one_line_error(result, "self-sparse window 20 is too small")
    assert not out.exists()
