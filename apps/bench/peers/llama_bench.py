"""Reference: llama.cpp's `llama-bench` token generation rate on the target (plain decoding, no
prompt), built with llama-speculative-simple, to check that PocketSpec's plain decoding runs
at llama.cpp's own speed."""

from __future__ import annotations

import json
from pathlib import Path

from apps.bench.peers.process import describe_failure, executable, run_peer

TOOL = "llama-bench"


def command(binary: Path, model: Path, *, num_tokens: int, num_threads: int, num_repetitions: int = 3) -> list[str]:
    return [str(binary), "-m", str(model), "-p", "0", "-n", str(num_tokens), "-t", str(num_threads),
            "-r", str(num_repetitions), "-o", "json"]


def parse_rate(stdout: str) -> tuple[float, float]:
    """(mean tok/s, standard deviation) from llama-bench's JSON output."""
    test = json.loads(stdout)[0]
    return float(test["avg_ts"]), float(test["stddev_ts"])


def reference_note(tools_dir: Path, model: Path, *, num_tokens: int, num_threads: int) -> str:
    binary = tools_dir / TOOL
    if not executable(binary):
        return f"{TOOL} not found in {tools_dir}: no llama.cpp plain-decoding reference"
    run = run_peer(command(binary, model, num_tokens=num_tokens, num_threads=num_threads))
    if run.returncode != 0:
        return describe_failure(run, TOOL)
    rate, deviation = parse_rate(run.stdout)
    return (f"{TOOL} tg{num_tokens} on the target ({num_threads} threads): {rate:.2f} ± {deviation:.2f} tok/s, "
            "llama.cpp's own plain decoding, to compare with the plain row")
