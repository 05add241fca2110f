"""Peer: llama.cpp's own speculative decoding, `llama-speculative-simple` with a draft model
(draft-simple, a fixed draft length), built by native/build_llama_tools.sh from the same
llama.cpp source and flags as PocketSpec's llama-cpp-python.

One process per prompt, given PocketSpec's rendered chat prompt as text (llama.cpp parses
its special tokens) and reading back the generated text and the statistics it logs.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from pocketspec.machine_report import read_build_stamp
from apps.bench.peers.process import ChildRun, executable
from pocketspec.models.catalog import pocketspec_home

TOOL = "llama-speculative-simple"
# It prints "\n\n", the prompt, the generated text, then "\n\n" twice (after the loop and at exit).
OUTPUT_HEAD, OUTPUT_TAIL = "\n\n", "\n\n\n\n"
_STATS = {
    "prompt": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decode": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "draft_max": re.compile(r"n_draft\s+=\s+(\d+)"),
    "num_predicted": re.compile(r"n_predict\s+=\s+(\d+)"),
    "num_drafted": re.compile(r"n_drafted\s+=\s+(\d+)"),
    "num_accepted": re.compile(r"n_accept\s+=\s+(\d+)"),
}


def default_tools_dir() -> Path:
    """Where `make peers` installs the tools: the llama-cpp-python version and accelerator of this venv."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    accel = (read_build_stamp() or {}).get("accel", "cpu")
    return pocketspec_home() / "llama-tools" / f"{version}-{accel}" / "bin"


def binary_path(tools_dir: Path) -> Path:
    return tools_dir / TOOL


def missing_binary(tools_dir: Path) -> str | None:
    if executable(binary_path(tools_dir)):
        return None
    return f"{TOOL} not found in {tools_dir}: run `make peers` (native/build_llama_tools.sh) or pass --llama-tools DIR"


def command(binary: Path, target: Path, draft: Path | None, prompt_text: str, *, max_tokens: int, num_threads: int,
            max_context: int, temperature: float, top_k: int, top_p: float, seed: int,
            draft_max: int | None, spec_type: str = "draft-simple", kv_type: str | None = None) -> list[str]:
    """draft: the draft GGUF for draft-simple; None for the draftless ngram-* types. kv_type: the
    target's KV cache type, as PocketSpec's --kv-type (None: llama.cpp's, f16)."""
    # It stops once it has more than -n tokens, so -n max_tokens - 1 gives at least max_tokens
    # (a last accepted draft can add a few more).
    argv = [str(binary), "-m", str(target), "--spec-type", spec_type, "-p", prompt_text,
            "-n", str(max_tokens - 1), "-t", str(num_threads), "-c", str(max_context),
            "--temp", str(temperature), "--top-k", str(top_k), "--top-p", str(top_p), "--min-p", "0",
            "--seed", str(seed)]
    if draft is not None:
        argv += ["-md", str(draft), "-td", str(num_threads)]
    if draft_max is not None and draft is not None:
        argv += ["--spec-draft-n-max", str(draft_max)]
    if kv_type is not None:
        argv += ["--cache-type-k", kv_type, "--cache-type-v", kv_type]
    return argv


def parse_stats(log: str) -> dict:
    """The statistics llama-speculative-simple logs at exit (stderr)."""
    found = {name: pattern.search(log) for name, pattern in _STATS.items()}
    missing = [name for name, match in found.items() if match is None]
    if missing:
        raise ValueError(f"{TOOL} output lacks {', '.join(missing)}")
    num_prompt_tokens, prompt_seconds = found["prompt"].groups()
    num_decoded, decode_seconds = found["decode"].groups()
    stats = {name: int(found[name].group(1)) for name in ("draft_max", "num_predicted", "num_drafted", "num_accepted")}
    return {"num_prompt_tokens": int(num_prompt_tokens), "prompt_seconds": float(prompt_seconds), "num_decoded": int(num_decoded),
            "decode_seconds": float(decode_seconds), **stats}


def generated_text(stdout: str, prompt_text: str) -> str | None:
    """The generated text from stdout, or None when its echo of the prompt is not the prompt given."""
    head = OUTPUT_HEAD + prompt_text
    if not stdout.startswith(head):
        return None
    return stdout[len(head):].removesuffix(OUTPUT_TAIL)


def measured_row(prompt_id: str, run: ChildRun, prompt_text: str, max_tokens: int) -> dict:
    """One bench row; TTFT is its prompt time (the first token comes from its first decode step).

    Its rate counts the tokens asked for, over all its decode time: the n-gram drafts ignore -n, so
    a last step can verify a whole draft past max_tokens, and counting that draft would credit the
    peer with tokens nobody asked for (num_tokens keeps what it generated)."""
    stats = parse_stats(run.stderr)
    return {"prompt_id": prompt_id, "tokens": None, "text": generated_text(run.stdout, prompt_text),
            "num_tokens": stats["num_predicted"], "num_decode_tokens": min(stats["num_decoded"], max_tokens),
            "decode_seconds": stats["decode_seconds"], "ttft_seconds": stats["prompt_seconds"],
            "num_drafted": stats["num_drafted"], "num_accepted": stats["num_accepted"],
            "num_steps": stats["num_predicted"] - stats["num_accepted"], "draft_max": stats["draft_max"],
            "num_prompt_tokens": stats["num_prompt_tokens"],
            "peak_rss_bytes": run.peak_rss_bytes, "peak_gpu_bytes": None, "peak_memory_bytes": run.peak_rss_bytes}
