"""Bad inputs, tried on every subcommand the way a new user would, and how each one is met.

    .venv/bin/python benchmarks/bad_input_sweep.py [--only TEXT] [--out benchmarks/results]

Each row runs `python -m apps.cli ...` in a subprocess and records the input, the exit
code, the first line on stderr, whether a traceback or a native abort showed, and whether
a file that existed before the row (inputs, transcripts, outputs) changed. A row passes
when it ends with exit 2, one line on stderr and no traceback, or when it is a documented
success (exit 0, the reason in its `why`), and in both cases nothing already saved changed.
Models: SmolLM2 by path (pull it first), tiny GGUFs with broken headers written here.
Every row has its own POCKETSPEC_HOME: one that links the real models folder, an empty
one, one under a file, or a read-only one. Results: benchmarks/results/bad_input_sweep.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

STRAY = b"caf\xe9 \xff na\xefve"  # Latin-1 bytes, and one byte that is never UTF-8
ROW_TIMEOUT_S = 240
NATIVE_CRASH_CODES = (132, 134, 136, 139)  # SIGILL, SIGABRT (a GGML_ASSERT), SIGFPE, SIGSEGV, as a shell reports them
FAST = ["--draft", "none", "--max-tokens", "2"]


@dataclass
class Case:
    command: str  # the subcommand, for grouping
    args: list  # after `pocketspec`; "{name}" is a file of the workspace; bytes stay bytes
    expect: int = 2  # 0: a documented success
    why: str = ""  # what a success must show, or what the row tries
    stdin: bytes | None = None
    home: str = "models"  # models | empty | under_file | read_only
    may_change: tuple[str, ...] = ()  # files the user asked to change (a resumed transcript grows)


def cases() -> list[Case]:
    gen = ["generate", "--target", "{smollm2}", "--prompt", "hi", *FAST]
    chat = ["chat", "--target", "{smollm2}", *FAST]
    plan = ["plan", "--target", "{smollm2}", "--draft", "none"]
    bench = ["bench", "--target", "{smollm2}", "--peers", "none", "--drafters", "ngram", "--per-category", "1",
             "--max-tokens", "2", "--out", "{bench_out}"]
    rows = [Case("generate", gen + flags) for flags in (
        ["--temperature", "nan"], ["--temperature", "inf"], ["--temperature", "-1"], ["--temperature", "1e-30"],
        ["--top-p", "nan"], ["--top-p", "0"], ["--top-p", "1.5"], ["--top-k", "-3"], ["--top-k", "1e3"],
        ["--top-k", "9" * 30], ["--seed", "-2"], ["--seed", "1.5"], ["--seed", str(2**64)], ["--threads", "-1"],
        ["--max-tokens", "0"], ["--max-tokens", "-5"], ["--max-tokens", str(10**12)], ["--gamma", "-1"],
        ["--gamma", "99"], ["--gamma", "1.5"], ["--gamma", "nan"], ["--max-context", "10"],
        ["--max-context", str(10**9)], ["--memory-budget", "lots"], ["--memory-budget", "-1G"],
        ["--memory-budget", "0"], ["--memory-budget", "1e3G"], ["--memory-budget", "1" + "0" * 400],
        ["--memory-budget", "100MiB"], ["--memory-budget", "cpu:0=abc"],
        ["--kv-type", "q3"], ["--devices", "cuda:0"], ["--devices", "cuda:7"], ["--devices", "rocm:0"],
        ["--devices", "cuda:0,cuda:0"], ["--devices", "gpu"], ["--split-mode", "row"],
        ["--split-mode", "row", "--devices", "cpu:0"], ["--device", "cuda"],
        ["--backend", "torch", "--device", "cuda:7"], ["--backend", "torch", "--device", "rocm"],
        ["--backend", "torch", "--devices", "cuda:0"], ["--backend", "torch", "--draft", "self-sparse",
                                                        "--self-draft-window", "5"],
        ["--self-skip-layers", "-1"], ["--batch", "0"], ["--batch", "2"], ["--wings"],
    )]
    rows += [
        Case("generate", gen + ["--seed", "-1", "--temperature", "0.7"], 0, "--seed -1 draws a seed and shows it"),
        Case("generate", gen + ["--threads", "100000"], 0, "--threads above the cores: capped, with a warning"),
        Case("generate", gen + ["--memory-budget", "3GiB,"], 0, "a list of one budget: the split plan for one CPU"),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt", STRAY], 0,
             "stray bytes in --prompt become U+FFFD, with a note"),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt-file", "{latin1_txt}"], 0,
             "stray bytes in --prompt-file become U+FFFD, with a note"),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt-file", "{missing}"]),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt-file", "{workspace}"]),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt-file", "{empty_txt}"]),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt", ""]),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST]),
        Case("generate", ["generate", "--target", "{smollm2}", *FAST, "--prompt", "hi", "--output", "{saved_txt}"],
             expect=0, why="--output without --batch is honoured: the reply replaces the file named, as asked, "
                           "once complete", may_change=("saved.txt",)),
        Case("generate", ["generate", "--target", "{smollm2}", "--backend", "torch", "--batch", "2", "--prompt-file",
                          "{prompts_jsonl}", "--output", "{prompts_jsonl}", "--max-tokens", "2"],
             why="--output is the --prompt-file"),
        Case("generate", ["generate", "--target", "{smollm2}", "--backend", "torch", "--batch", "2", "--prompt-file",
                          "{bad_prompts_jsonl}", "--max-tokens", "2"]),
        Case("generate", ["generate", "--target", "llama-9000b", "--prompt", "hi"]),
        Case("generate", ["generate", "--pair", "no-such-pair", "--prompt", "hi"]),
        Case("generate", ["generate", "--target", "smollm2-135m-instruct", "--prompt", "hi"], home="empty",
             why="a catalog model not downloaded"),
        Case("generate", ["generate", "--target", "smollm2-135m-instruct", "--prompt", "hi"], home="under_file"),
        Case("generate", ["generate", "--target", "smollm2-135m-instruct", "--prompt", "hi"], home="read_only"),
        Case("generate", ["generate", "--target", b"/nonexistent/\xff.gguf", "--prompt", "hi"],
             why="a path with a stray byte"),
    ]
    rows += [Case("generate", ["generate", "--target", "{" + model + "}", *FAST, "--prompt", "hi"])
             for model in ("missing_gguf", "truncated_gguf", "text_gguf", "arch_gguf", "zero_heads_gguf",
                           "blocks_gguf", "kv_heads_gguf", "eos_gguf")]
    rows += [Case("generate", ["generate", "--target", "{" + model + "}", *FAST, "--prompt", "hi", "--memory-budget",
                               "1GiB"]) for model in ("arch_gguf", "zero_heads_gguf")]
    rows += [
        Case("chat", chat, 0, "stray bytes on stdin become U+FFFD, with a note", stdin=STRAY),
        Case("chat", chat + ["--system", STRAY], 0, "stray bytes in --system become U+FFFD", stdin=b"hi"),
        Case("chat", chat + ["--seed", "-1", "--temperature", "0.8"], 0, "--seed -1 shows the seed", stdin=b"hi"),
        Case("chat", chat, stdin=b""),
        Case("chat", chat, stdin=b"   \n"),
        Case("chat", chat + ["--temperature", "nan"], stdin=b"hi"),
        Case("chat", chat + ["--top-p", "inf"], stdin=b"hi"),
        Case("chat", chat + ["--max-tokens", "0"], stdin=b"hi"),
        Case("chat", chat + ["--resume", "{missing}"], stdin=b"hi"),
        Case("chat", chat + ["--resume", "{notes_txt}"], stdin=b"hi", why="a file that is not a transcript"),
        Case("chat", chat + ["--resume", "{torn_jsonl}"], 0, "a transcript with a torn last line: repaired, "
             "the original kept", stdin=b"hi", may_change=("torn.jsonl",)),
        Case("chat", ["chat", "--target", "smollm2-135m-instruct", "--draft", "none"], stdin=b"hi", home="under_file"),
        Case("chat", ["chat", "--target", "smollm2-135m-instruct", "--draft", "none"], stdin=b"hi", home="read_only"),
        Case("chat", chat + ["--devices", "cuda:0"], stdin=b"hi"),
    ]
    rows += [Case("plan", plan + flags) for flags in (
        ["--alpha", "nan"], ["--alpha", "2"], ["--alpha", "-0.1"], ["--max-context", "10"], ["--max-gamma", "0"],
        ["--max-gamma", "99"], ["--memory-budget", "nonsense"], ["--memory-budget", "1KiB"],
        ["--temperature", "inf"], ["--max-tokens", "0"], ["--devices", "cuda:0"],
        ["--devices", "cuda:0,cuda:1", "--memory-budget", "1GiB,x"], ["--max-context", "100000"],
    )]
    rows += [Case("plan", ["plan", "--target", "{" + model + "}", "--draft", "none"])
             for model in ("arch_gguf", "zero_heads_gguf", "blocks_gguf", "kv_heads_gguf", "truncated_gguf")]
    rows += [Case("plan", ["plan", "--target", "smollm2-135m-instruct", "--draft", "none"], home="under_file")]
    rows += [Case("bench", bench + flags) for flags in (
        ["--per-category", "0"], ["--max-tokens", "1"], ["--temperature", "nan"], ["--threads", "-1"],
        ["--suite", "{missing}"], ["--suite", "{notes_txt}"], ["--drafters", "nope"], ["--peers", "nope"],
        ["--memory-budget", "lots"], ["--devices", "cuda:0"], ["--categories", "nope"], ["--max-context", "100"],
        ["--peer-draft-max", "0"], ["--seed", "-7"],
    )]
    rows += [Case("bench", bench[:-1] + [out], why=why) for out, why in (
        ("{notes_txt}/sub", "an --out under a file: refused before the first round, not after it"),
        ("{earlier_bench}", "an --out holding an earlier run's results.json: kept unless --force"),
    )]
    rows += [
        Case("models", ["models", "pull", "nope"]),
        Case("models", ["models", "pull", "smollm2-135m-instruct"], home="under_file"),
        Case("models", ["models", "pull", "smollm2-135m-instruct"], home="read_only"),
        Case("models", ["models", "path", "nope"]),
        Case("models", ["models", "path", "smollm2-135m-instruct"], home="empty"),
        Case("models", ["models", "path", "smollm2-135m-instruct"], home="under_file"),
        Case("models", ["models", "list"], 0, "lists the catalog; nothing is downloaded there", home="under_file"),
        Case("models", ["models", "pull"]),
        Case("doctor", ["doctor"], 0, "reports the unusable POCKETSPEC_HOME", home="under_file"),
        Case("doctor", ["doctor", "--json"], 0, "reports the read-only POCKETSPEC_HOME", home="read_only"),
        Case("doctor", ["doctor", "--bogus"]),
        Case("cli", ["fly"]),
    ]
    return rows


def _snapshot(folders: list[Path]) -> dict[str, tuple]:
    """(size, mtime, hash of small files) of every file under `folders`."""
    state = {}
    for folder in folders:
        for path in folder.rglob("*") if folder.is_dir() else []:
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.st_size < 2**20 else ""
                state[str(path)] = (stat.st_size, stat.st_mtime_ns, digest)
    return state


def build_workspace(folder: Path, smollm2: Path) -> dict[str, Path]:
    from tiny_models import write_header_variant

    files = {"workspace": folder, "smollm2": smollm2, "missing": folder / "missing.txt",
             "missing_gguf": folder / "missing.gguf", "bench_out": folder / "bench-out"}
    inputs = folder / "inputs"
    inputs.mkdir()
    (inputs / "latin1.txt").write_bytes(STRAY)
    (inputs / "empty.txt").write_bytes(b"")
    (inputs / "notes.txt").write_text("these are notes, not JSON\n")
    (inputs / "saved.txt").write_text("an earlier result the user keeps\n")
    (inputs / "prompts.jsonl").write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    (inputs / "bad_prompts.jsonl").write_text('{"prompt": "one"}\n[1, 2]\n')
    (inputs / "torn.jsonl").write_text('{"type": "header", "version": 1, "target": null, "draft": "none"}\n'
                                       '{"type": "user", "content": "hi"}\n'
                                       '{"type": "assistant", "content": "hel')
    (inputs / "text.gguf").write_text("this is not a model\n")
    (inputs / "earlier-bench").mkdir()
    (inputs / "earlier-bench" / "results.json").write_text('{"rows": []}\n')
    with open(smollm2, "rb") as source:
        (inputs / "truncated.gguf").write_bytes(source.read(4_000_000))
    broken = {"arch_gguf": dict(arch="notallama"), "zero_heads_gguf": dict(attention__head_count=0),
              "blocks_gguf": dict(block_count=5), "kv_heads_gguf": dict(attention__head_count_kv=3),
              "eos_gguf": dict(token_eos=10**6)}
    for name, values in broken.items():
        files[name] = write_header_variant(inputs / f"{name}.gguf", **values)
    for path in inputs.iterdir():
        files.setdefault(path.name.replace(".", "_").replace("-", "_"), path)
    return files


def _homes(folder: Path, models: Path) -> dict[str, Path]:
    homes = {"models": folder / "home-models", "empty": folder / "home-empty",
             "under_file": folder / "a-file" / "pocketspec", "read_only": folder / "home-read-only"}
    homes["models"].mkdir()
    (homes["models"] / "models").symlink_to(models)
    homes["empty"].mkdir()
    (folder / "a-file").write_text("a file where POCKETSPEC_HOME's parent should be\n")
    homes["read_only"].mkdir()
    return homes


def _read_only(command: list, folder: Path) -> list:
    """`command` run where `folder` cannot be written: a read-only bind mount as root, else no write bits."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return command
    script = f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", *command]


def _shown(arg) -> str:
    if isinstance(arg, bytes):
        return "$'" + "".join(chr(b) if 32 <= b < 127 and b != 39 else f"\\x{b:02x}" for b in arg) + "'"
    return shlex.quote(arg)


def run_case(case: Case, files: dict[str, Path], homes: dict[str, Path], watched: list[Path]) -> dict:
    args = [arg if isinstance(arg, bytes) else arg.format(**{name: str(path) for name, path in files.items()})
            for arg in case.args]
    command = [sys.executable, "-m", "apps.cli", *args]
    if case.home == "read_only":
        command = _read_only(command, homes["read_only"])
    env = {**os.environ, "POCKETSPEC_HOME": str(homes[case.home]), "PYTHONPATH": str(ROOT)}
    env.pop("POCKETSPEC_CATALOG", None)
    before = _snapshot(watched)
    started = time.perf_counter()
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, input=case.stdin or b"", capture_output=True,
                                timeout=ROW_TIMEOUT_S)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    except subprocess.TimeoutExpired as expired:
        code, stdout, stderr = "timeout", expired.stdout or b"", expired.stderr or b""
    seconds = time.perf_counter() - started
    after = _snapshot(watched)
    changed = sorted(Path(path).name for path, state in before.items()
                     if after.get(path) != state and Path(path).name not in case.may_change)
    err_text = stderr.decode("utf-8", "backslashreplace")
    lines = [line for line in err_text.splitlines() if line.strip()]
    has_traceback = ("Traceback (most recent call last)" in err_text + stdout.decode("utf-8", "replace")
                     or code in NATIVE_CRASH_CODES or (isinstance(code, int) and code < 0))
    if case.expect == 2:
        passed = code == 2 and len(lines) == 1 and not has_traceback
    else:
        passed = code == 0 and not has_traceback
    return {"command": case.command, "input": " ".join(_shown(arg) for arg in case.args), "home": case.home,
            "expected_exit": case.expect, "why": case.why, "exit": code, "first_stderr_line": lines[0] if lines else "",
            "num_stderr_lines": len(lines), "traceback": has_traceback, "changed_files": changed,
            "passed": passed and not changed, "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="Run only the rows whose input contains this text.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    from apps.report import write_results
    from pocketspec.models.catalog import model_path

    smollm2 = model_path("smollm2-135m-instruct")
    if not smollm2.exists():
        sys.exit(f"error: {smollm2} is absent; run: pocketspec models pull smollm2-135m-instruct")
    chosen = [case for case in cases() if args.only is None or args.only in " ".join(map(_shown, case.args))]
    with tempfile.TemporaryDirectory(prefix="bad-input-sweep-") as temporary:
        folder = Path(temporary)
        files = build_workspace(folder, smollm2)
        homes = _homes(folder, smollm2.parent)
        watched = [folder / "inputs", homes["models"] / "models", homes["empty"]]
        rows = []
        for number, case in enumerate(chosen, start=1):
            row = run_case(case, files, homes, watched)
            rows.append(row)
            print(f"{number:3d}/{len(chosen)} {'ok  ' if row['passed'] else 'FAIL'} exit {row['exit']} "
                  f"{row['command']} {row['input'][:70]} :: {row['first_stderr_line'][:90]}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    num_passed = sum(row["passed"] for row in rows)
    summary = {"num_rows": len(rows), "num_passed": num_passed,
               "num_one_line_exit_2": sum(row["passed"] and row["expected_exit"] == 2 for row in rows),
               "num_documented_successes": sum(row["passed"] and row["expected_exit"] == 0 for row in rows),
               "num_tracebacks": sum(row["traceback"] for row in rows),
               "num_changed_saved_files": sum(bool(row["changed_files"]) for row in rows),
               "commands": sorted({row["command"] for row in rows})}
    table = [[index, row["command"], f"`{row['input'].replace('|', '¦')}`", row["home"], row["exit"],
              row["first_stderr_line"].replace("|", "¦")[:160], "yes" if row["traceback"] else "",
              ", ".join(row["changed_files"]), "pass" if row["passed"] else "FAIL"]
             for index, row in enumerate(rows, start=1)]
    notes = [f"{num_passed} of {len(rows)} rows pass: {summary['num_one_line_exit_2']} end in one line with exit 2, "
             f"{summary['num_documented_successes']} are documented successes; {summary['num_tracebacks']} "
             f"tracebacks; {summary['num_changed_saved_files']} rows changed a file that existed before.",
             "A row passes with exit 2, one stderr line and no traceback (or exit 0 where `why` documents a "
             "success), and no pre-existing file changed. {smollm2} and the {*_gguf} files are paths in a "
             "temporary workspace; `home` is the POCKETSPEC_HOME the row ran with.",
             "Re-run: .venv/bin/python benchmarks/bad_input_sweep.py"]
    write_results(args.out, "bad_input_sweep", {"summary": summary, "rows": rows}, "Bad-input sweep",
                  ["#", "command", "input", "home", "exit", "first stderr line", "traceback", "changed", "verdict"],
                  table, notes)
    print(notes[0])


if __name__ == "__main__":
    main()
