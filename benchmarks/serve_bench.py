"""Serving speed: Spec-Bench prompts replayed from N concurrent clients against `pocketspec serve`
(auto drafting, and `--draft none`) and llama.cpp's own `llama-server` (with and without `-md`,
the same `-np`), all on the same model files, threads and context per slot.

    .venv/bin/python benchmarks/serve_bench.py [--clients 1,2,4,8] [--prompts 16] [--max-tokens 128]
        [--pair qwen-coder | --target smollm2-135m-instruct] [--threads 2] [--memory-budget 3GiB] [--backend torch] [--device cuda]
        [--systems pocketspec,pocketspec-none,llama-server,llama-server-md] [--rounds 2]

For each system and N it starts a fresh server with N slots, warms it with one short request,
then N clients send the first `--prompts` prompts (each client takes the next prompt when its
last one ends; chat completions, streamed, temperature 0, `--max-tokens`). The systems take turns
at each N, `--rounds` times over (this machine's speed drifts by 15 % over minutes: a system run
alone later would carry that drift into its ratios), and each is reported over all its rounds.
It records output throughput over the whole replay, time to first token and inter-token latency
(p50, p99 over requests), and the server's peak resident memory (VmHWM) against --memory-budget.
Results: benchmarks/results/serve_bench.{json,md,png}. `make peers` builds llama-server.

Data: Spec-Bench (benchmarks/data/spec_bench.jsonl, Apache-2.0, see SPEC_BENCH_LICENSE); the
prompts are taken across its categories in file order, every len/prompts-th one.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.bench.peers.llama_speculative import default_tools_dir  # noqa: E402
from apps.prompt_file import read_prompt_rows  # noqa: E402
from apps.report import write_results  # noqa: E402
from memplanner import parse_size  # noqa: E402
from pocketspec.models.catalog import resolve_pair  # noqa: E402
from pocketspec.models.model_files import resolve_model  # noqa: E402
from pocketspec.stats import vm_hwm_bytes  # noqa: E402
from serve_bench_results import merge_rounds, plot, summarize, summarize_requests  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
SYSTEMS = ("pocketspec", "pocketspec-none", "llama-server", "llama-server-md")
START_SECONDS = 600
URL_LINE = re.compile(r"listening on (http://\S+)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server subprocess: started, waited for, its peak memory read, stopped."""

    def __init__(self, argv: list[str], url: str | None = None):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE if url is None else self.log,
                                        stderr=self.log, text=True)
        self.url = url or self._url_from_stdout()
        self._wait_until_healthy()

    def _url_from_stdout(self) -> str:
        found: queue.Queue = queue.Queue()

        def read() -> None:
            for line in self.process.stdout:
                match = URL_LINE.search(line)
                if match:
                    found.put(match.group(1))
            found.put(None)

        threading.Thread(target=read, daemon=True).start()
        url = found.get(timeout=START_SECONDS)
        if url is None:
            raise RuntimeError(f"the server exited: {self.logged()}")
        return url

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited ({self.process.returncode}): {self.logged()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not become healthy in {START_SECONDS} s")

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read()[-2000:]

    def peak_memory_bytes(self) -> int | None:
        return vm_hwm_bytes(self.process.pid)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start(system: str, num_clients: int, args, target: Path, draft: Path | None) -> Server:
    if system.startswith("pocketspec"):
        model = ["--target", args.target] if args.target else ["--pair", args.pair]
        argv = [sys.executable, "-m", "apps.cli", "serve", *model, "--port", "0",
                "--max-concurrency", str(num_clients), "--max-queue", str(num_clients), "--threads", str(args.threads),
                "--max-context", str(args.max_context), "--temperature", "0", "--backend", args.backend]
        if system == "pocketspec-none":
            argv += ["--draft", "none"]
        if args.memory_budget:
            argv += ["--memory-budget", args.memory_budget]
        if args.device and args.backend == "torch":  # llama.cpp's device is its build's (and llama-server's -ngl)
            argv += ["--device", args.device]
        return Server(argv)
    port = _free_port()
    argv = [str(args.llama_tools / "llama-server"), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(num_clients), "-c", str(args.max_context * num_clients), "-t", str(args.threads),
            "-tb", str(args.threads), "--no-webui"]
    if system == "llama-server-md":
        argv += ["-md", str(draft)]
    if args.device == "cuda":
        argv += ["-ngl", "999", "-ngld", "999"]
    return Server(argv, url=f"http://127.0.0.1:{port}")


def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def stream_one(url: str, model: str, prompt: str, max_tokens: int, tokenizer) -> dict:
    """One streamed chat completion: seconds to the first token, each chunk's time and the tokens made."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    chunk_times, text, usage = [], "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=None) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            delta = "".join(choice.get("delta", {}).get("content") or "" for choice in chunk.get("choices", []))
            if delta:
                chunk_times.append(time.perf_counter())
                text += delta
    usage = usage or {}
    tokens = usage.get("completion_tokens") or len(tokenizer.encode(text, add_bos=False))
    drafts = {"drafted": usage.get("drafted_tokens", 0), "accepted": usage.get("accepted_tokens", 0)}
    if not chunk_times:
        return {"tokens": tokens, "ttft": None, "itl": None, "ended": time.perf_counter(), **drafts}
    itl = (chunk_times[-1] - chunk_times[0]) / (tokens - 1) if tokens > 1 else None
    return {"tokens": tokens, "ttft": chunk_times[0] - sent, "itl": itl, "ended": chunk_times[-1], **drafts}


def replay(url: str, prompts: list[str], num_clients: int, max_tokens: int, tokenizer) -> dict:
    model = model_id(url)
    work: queue.Queue = queue.Queue()
    for prompt in prompts:
        work.put(prompt)
    done: list[dict] = []
    errors: list[str] = []

    def client() -> None:
        while True:
            try:
                prompt = work.get_nowait()
            except queue.Empty:
                return
            try:
                done.append(stream_one(url, model, prompt, max_tokens, tokenizer))
            except httpx.HTTPError as error:
                errors.append(str(error))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(num_clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return summarize_requests(done, errors, seconds)


def pick_prompts(count: int) -> list[str]:
    rows = read_prompt_rows(DATA_PATH, "spec_bench.jsonl")
    step = max(1, len(rows) // count)
    return [row.text for row in rows[::step][:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--prompts", type=int, default=16, help="Prompts replayed per N.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-context", type=int, default=2048, help="Tokens per slot.")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--target", default=None, help="A target without a draft model (n-grams only; no -md peer).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-budget", default=None)
    parser.add_argument("--backend", default="llama.cpp", choices=["llama.cpp", "torch"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rounds", type=int, default=1, help="Replays of every system at every N, interleaved.")
    parser.add_argument("--llama-tools", type=Path, default=None)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.llama_tools = args.llama_tools or default_tools_dir()
    systems = args.systems.split(",")
    unknown = [system for system in systems if system not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    if any(system.startswith("llama-server") for system in systems) and not (args.llama_tools / "llama-server").exists():
        parser.error(f"llama-server not found in {args.llama_tools}: run `make peers`")
    clients = [int(n) for n in args.clients.split(",")]
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: run at least one round")
    if args.target:
        target, draft = resolve_model(args.target), None
        if "llama-server-md" in systems:
            parser.error("llama-server-md needs a draft model: pass --pair, or leave it out of --systems")
    else:
        pair = resolve_pair(args.pair)
        target, draft = resolve_model(pair.target), resolve_model(pair.draft)
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
    from pocketspec.settings import ModelSettings

    budget_bytes = parse_size(args.memory_budget) if args.memory_budget else None
    config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    columns = ["system", "N", "requests", "output tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 s", "ITL p99 s",
               "acceptance", "peak memory", "errors"]
    results: dict[str, dict[str, dict]] = {}
    failures: list[str] = []

    def save() -> tuple[Path, Path]:
        """Written after every run, so an interrupted bench keeps what it measured."""
        rows, notes = summarize(results, clients, budget_bytes)
        payload = {"config": config, "prompts": len(prompts), "results": results, "failures": failures}
        return write_results(args.out_dir, "serve_bench", payload,
                             f"Serving {args.target or args.pair} ({args.backend}, {args.threads} threads)",
                             columns, rows, notes + failures)

    with LlamaCppBackend(target, ModelSettings(max_context=64)) as backend:
        tokenizer = backend.tokenizer
        prompts = pick_prompts(args.prompts)
        runs: dict[tuple[str, int], list[dict]] = {}
        # Each round runs every system at one N back to back, so the machine's drift over a long bench
        # falls on all of them alike; more rounds average it out.
        for round_index in range(args.rounds):
            for num_clients in clients:
                for system in systems:
                    print(f"round {round_index + 1}/{args.rounds}: {system}, {num_clients} clients ...",
                          file=sys.stderr, flush=True)
                    try:
                        server = start(system, num_clients, args, target, draft)
                    except RuntimeError as error:
                        failures.append(f"{system}, N={num_clients}: {error}")
                        print(f"  failed: {error}", file=sys.stderr, flush=True)
                        continue
                    try:
                        stream_one(server.url, model_id(server.url), "Say hi.", 4, tokenizer)  # warm up
                        run = replay(server.url, prompts, num_clients, args.max_tokens, tokenizer)
                        run["peak_memory_bytes"] = server.peak_memory_bytes()
                    finally:
                        server.stop()
                    runs.setdefault((system, num_clients), []).append(run)
                    results.setdefault(system, {})[str(num_clients)] = merge_rounds(runs[(system, num_clients)])
                    print(f"  {run['tok_per_s']:.2f} tok/s, {run['requests']} requests, {len(run['errors'])} errors",
                          file=sys.stderr, flush=True)
                    json_path, markdown_path = save()
    json_path, markdown_path = save()
    plot(results, args.out_dir / "serve_bench.png")
    print(f"wrote {json_path}, {markdown_path} and serve_bench.png", file=sys.stderr)


if __name__ == "__main__":
    main()
