"""Running one system of `pocketspec bench` over some prompts (one round, see apps/bench/rounds.py):
PocketSpec and the Python peers in a worker process, llama-speculative-simple once per prompt.

Plain decoding runs first in each round because its rows are the reference: the prompt
tokens and text the peers are given, and the output each system must match at temperature 0.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from apps.bench.suite import SuitePrompt
from apps.bench.peers import llama_bench, llama_speculative
from apps.bench.peers.process import describe_failure, run_child, run_peer


@dataclass
class System:
    name: str
    kind: str  # plain | pocketspec | peer
    runner: str  # pocketspec | prompt-lookup | transformers | llama-speculative
    family: str  # systems that differ only by memory budget share a family (one line on the frontier plot)
    draft: str | None = None  # pocketspec: the --draft value; peers: the draft GGUF path
    budget: str | None = None
    budget_bytes: int | None = None
    spec_type: str | None = None  # llama-speculative: llama.cpp's --spec-type (draft-simple, ngram-*)
    status: str = "ok"  # ok | skipped | failed
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    # per worker process (one a round): seconds outside the timed prompts (imports, model load, warm-up)
    startup_seconds: list[float] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason

    def describe(self) -> dict:
        return asdict(self)

    def note(self, text: str) -> None:
        if text not in self.notes:  # each round's process says it again
            self.notes.append(text)


@dataclass(frozen=True)
class BenchJob:
    """What every system shares: models, prompts and decoding settings."""

    target_path: Path
    draft_path: Path | None
    prompts: list[SuitePrompt]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    num_threads: int
    max_context: int
    num_warmup_tokens: int
    pocketspec_options: dict  # SessionSettings fields (exact_verify, repack, kv_type) and the backend flags
    llama_tools_dir: Path
    peer_draft_max: int | None
    pair: str | None = None  # the pair a PocketSpec system without a --draft value takes its draft from


def _worker_job(system: System, job: BenchJob, prompts: list[SuitePrompt], reference: dict[str, dict]) -> dict:
    options = dict(job.pocketspec_options)
    if system.budget is not None:
        options["memory_budget"] = system.budget
    draft = system.draft if system.runner == "pocketspec" else (str(job.draft_path) if job.draft_path else None)
    prompts = [{"prompt_id": prompt.prompt_id, "text": prompt.text, "conversation": prompt.conversation_id,
                "prompt_tokens": reference.get(prompt.prompt_id, {}).get("prompt_tokens")} for prompt in prompts]
    return {"runner": system.runner, "target": str(job.target_path), "draft": draft, "pair": job.pair,
            "prompts": prompts,
            "max_tokens": job.max_tokens, "temperature": job.temperature, "top_k": job.top_k, "top_p": job.top_p,
            "seed": job.seed, "num_threads": job.num_threads, "max_context": job.max_context,
            "num_warmup_tokens": job.num_warmup_tokens, "options": options}


def pocketspec_settings(system: System, job: BenchJob):
    """The SessionSettings a PocketSpec system's worker opens its session from (apps/bench/worker.py)."""
    from apps.bench.worker import session_settings

    return session_settings(_worker_job(system, job, [], {}))


def _run_worker(system: System, job: BenchJob, prompts: list[SuitePrompt], reference: dict[str, dict],
                advance) -> list[dict]:
    rows: list[dict] = []

    def on_line(line: str) -> None:
        if not line.strip():
            return
        record = json.loads(line)
        if "note" in record:
            system.note(f"{system.name}: {record['note']}")
        else:
            rows.append(record)
            advance()

    run = run_child([sys.executable, "-m", "apps.bench.worker"],
                    stdin_text=json.dumps(_worker_job(system, job, prompts, reference)), on_line=on_line)
    if run.returncode != 0:
        system.status, system.reason = "failed", describe_failure(run, f"{system.name} worker")
        return []
    system.startup_seconds.append(run.seconds - sum(row["ttft_seconds"] + row["decode_seconds"] for row in rows))
    return rows


def _run_llama_speculative(system: System, job: BenchJob, prompts: list[SuitePrompt], reference: dict[str, dict],
                           advance) -> list[dict]:
    binary = llama_speculative.binary_path(job.llama_tools_dir)
    rows = []
    for prompt in prompts:
        argv = llama_speculative.command(
            binary, job.target_path, job.draft_path if system.spec_type == "draft-simple" else None,
            reference[prompt.prompt_id]["prompt_text"], spec_type=system.spec_type,
            max_tokens=job.max_tokens, num_threads=job.num_threads, max_context=job.max_context,
            temperature=job.temperature, top_k=job.top_k, top_p=job.top_p, seed=job.seed,
            draft_max=job.peer_draft_max, kv_type=job.pocketspec_options.get("kv_type"))
        run = run_peer(argv)
        if run.returncode != 0:
            system.status, system.reason = "failed", f"prompt {prompt.prompt_id}: " + describe_failure(
                run, llama_speculative.TOOL)
            return []
        row = llama_speculative.measured_row(prompt.prompt_id, run, reference[prompt.prompt_id]["prompt_text"],
                                             job.max_tokens)
        row["is_retokenized"] = row["num_prompt_tokens"] != len(reference[prompt.prompt_id]["prompt_tokens"])
        rows.append(row)
        advance()
    return rows


def run_system(system: System, job: BenchJob, prompts: list[SuitePrompt], reference: dict[str, dict],
               advance) -> list[dict]:
    """The system's raw rows, one per prompt, calling advance() after each.

    A failed system gets status `failed`, a one-line reason and no rows: the others still run.
    """
    if system.runner == "llama-speculative":
        return _run_llama_speculative(system, job, prompts, reference, advance)
    return _run_worker(system, job, prompts, reference, advance)


def add_closing_notes(systems: list[System], job: BenchJob, rows: list[dict]) -> None:
    """Notes that need every round: llama-speculative-simple's settings and tokenization, and
    llama-bench's plain-decoding rate on the target (run once, after the rounds, noted on the first of them)."""
    peers = [system for system in systems if system.runner == "llama-speculative" and system.status == "ok"]
    for system in peers:
        own_rows = [row for row in rows if row["system"] == system.name]
        num_retokenized = sum(row["is_retokenized"] for row in own_rows)
        if num_retokenized:
            system.note(f"{system.name}: {num_retokenized} of {len(own_rows)} prompts tokenized to another length "
                        "than PocketSpec's")
        system.note(f"{system.name}: {llama_speculative.TOOL} {_draft_setting(system, own_rows)}, "
                    f"--temp {job.temperature}, -t {job.num_threads}, -c {job.max_context}")
        overshoot = tokens_past_limit(own_rows, job.max_tokens)
        if overshoot > 0:
            system.note(f"{system.name}: {overshoot:.0f} tokens a prompt past --max-tokens {job.max_tokens}, on "
                        f"average: its last draft ignores the limit; its tok/s counts the {job.max_tokens} tokens "
                        f"asked for over all its decode time")
    if peers:
        peers[0].note(llama_bench.reference_note(job.llama_tools_dir, job.target_path, num_tokens=job.max_tokens,
                                                 num_threads=job.num_threads))


def _draft_setting(system: System, rows: list[dict]) -> str:
    if system.spec_type == "draft-simple":
        draft_max = rows[0].get("draft_max") if rows else None
        return f"--spec-draft-n-max {draft_max} (fixed draft length)"
    return f"--spec-type {system.spec_type} at llama.cpp's defaults for it"


def tokens_past_limit(rows: list[dict], max_tokens: int) -> float:
    """Mean tokens a row generated past max_tokens (llama-speculative-simple's n-gram drafts are not
    cut at its -n, so its last step can add a whole draft)."""
    if not rows:
        return 0.0
    return sum(max(0, row["num_tokens"] - max_tokens) for row in rows) / len(rows)


def matches_plain(row: dict, plain: dict, job: BenchJob, kind: str) -> bool | None:
    """Whether a system's output equals plain decoding's: at temperature 0 for every system; when sampling,
    for PocketSpec's (`kind`: System.kind), whose seeded draws are plain decoding's whatever drafted
    (pocketspec/speculation/draws.py; every prompt starts from the job's seed), and not for a peer, which
    samples with a sampler of its own.

    Tokens are compared where the system reports them; llama-speculative-simple gives only
    text, and may run a few tokens past --max-tokens, so plain's text must then begin it.
    """
    if job.temperature > 0 and kind != "pocketspec":
        return None
    if row.get("tokens") is not None:
        return row["tokens"] == plain["tokens"]
    if row["text"] is None:
        return False
    return row["text"] == plain["text"] or (plain["num_tokens"] >= job.max_tokens
                                            and row["text"].startswith(plain["text"]))


def final_rows(system: System, raw_rows: list[dict], job: BenchJob, reference: dict[str, dict]) -> list[dict]:
    """Rows for results.json: measurements, category, whether they match plain, and the text each
    system generated (plain's rows also its prompt), so a replay can price any drafter on any system's
    text (benchmarks/replay_bench_texts.py); no token lists."""
    categories = {prompt.prompt_id: prompt.report_category for prompt in job.prompts}
    dropped = ("tokens", "prompt_tokens") if system.kind == "plain" else ("tokens", "prompt_tokens", "prompt_text")
    rows = []
    for raw in raw_rows:
        row = {key: value for key, value in raw.items() if key not in dropped}
        row.update(system=system.name, category=categories[raw["prompt_id"]],
                   matches_plain=matches_plain(raw, reference[raw["prompt_id"]], job, system.kind))
        row["tokens_per_second"] = raw["num_decode_tokens"] / raw["decode_seconds"] if raw["decode_seconds"] else 0.0
        rows.append(row)
    return rows
