"""One system of `pocketspec bench` in its own process, so that its peak memory is its own.

    python -m apps.bench.worker < job.json

The job names a runner (PocketSpec, or a peer that runs in Python), the models and the
prompts; each prompt's measurements go to stdout as one JSON line, notes as {"note": ...}.
A UserError is one line on stderr and exit code 2, as in the CLI.
"""

from __future__ import annotations

import importlib
import json
import sys

from pocketspec.errors import UserError
from pocketspec.stats import budgeted_peak_bytes, gpu_allocator_peaks

LEARNED_CURVE_DEPTH = 512  # cached tokens at which the verify costs are reported (llama-bench -d 512 compares)

RUNNERS = {
    "pocketspec": "apps.bench.worker:run_pocketspec",
    "prompt-lookup": "apps.bench.peers.prompt_lookup:run",
    "transformers": "apps.bench.peers.transformers_assisted:run",
}


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def gpu_peak_bytes() -> int | None:
    """torch's CUDA/ROCm allocator peaks summed over every GPU used, when this process used one through torch."""
    peaks = gpu_allocator_peaks()
    return sum(peaks.values()) if peaks else None


def measured_row(prompt: dict, *, tokens: list[int], num_decode_tokens: int, decode_seconds: float,
                 ttft_seconds: float, peak_rss_bytes: int, num_drafted=None, num_accepted=None, num_steps=None,
                 peak_memory_bytes: int | None = None, **extra) -> dict:
    """The fields every runner reports for one prompt (peak_memory_bytes: what --memory-budget bounds, the GPU
    allocator's when one was used; a PocketSpec session's own, which counts a row split's other ranks)."""
    gpu_bytes = gpu_peak_bytes()
    return {"prompt_id": prompt["prompt_id"], "tokens": tokens, "num_tokens": len(tokens),
            "num_decode_tokens": num_decode_tokens, "decode_seconds": decode_seconds, "ttft_seconds": ttft_seconds,
            "num_drafted": num_drafted, "num_accepted": num_accepted, "num_steps": num_steps,
            "peak_rss_bytes": peak_rss_bytes, "peak_gpu_bytes": gpu_bytes,
            "peak_memory_bytes": budgeted_peak_bytes() if peak_memory_bytes is None else peak_memory_bytes, **extra}


def session_settings(job: dict):
    """The job's PocketSpec system as the SessionSettings every front end opens (options: the bench's
    backend flags, its --memory-budget, --gamma, --exact-verify, --repack and --kv-type)."""
    from apps.flags import parse_gamma
    from pocketspec.session_settings import SessionSettings, options_read_by
    from pocketspec.settings import SamplingSettings

    options = dict(job["options"])
    return SessionSettings(
        target=job["target"], draft=job["draft"], pair=job.get("pair"),
        sampling=SamplingSettings(temperature=job["temperature"], top_k=job["top_k"], top_p=job["top_p"],
                                  seed=job["seed"]),
        gamma=parse_gamma(options.pop("gamma", "auto")), memory_budget=options.pop("memory_budget", None),
        max_context=job["max_context"], threads=job["num_threads"], max_new_tokens=job["max_tokens"],
        repack=options.pop("repack", None), kv_type=options.pop("kv_type", None),
        exact_verify=options.pop("exact_verify", None), options=options_read_by(job["draft"], options))


def run_pocketspec(job: dict) -> None:
    from pocketspec.session import open_session

    with open_session(session_settings(job)) as session:
        for note in session.notes:
            emit({"note": note})
        engine = session.engine
        tokenizer = session.tokenizer
        template = session.template

        def generate(prompt_tokens: list[int], max_tokens: int):
            session.reset(job["seed"])  # every prompt starts from empty caches, as in the peers
            return engine.generate(prompt_tokens, max_tokens)

        conversations: dict[str, list[dict]] = {}  # each conversation's messages so far
        for index, prompt in enumerate(job["prompts"]):
            conversation = prompt.get("conversation") or prompt["prompt_id"]
            messages = conversations.get(conversation, []) + [{"role": "user", "content": prompt["text"]}]
            # plain decoding's prompt when the bench has it: a later turn then follows the same replies
            prompt_tokens = prompt.get("prompt_tokens") or session.encode_messages(messages)
            if index == 0:
                engine.warm_up(prompt_tokens, job["num_warmup_tokens"])
            try:
                result = generate(prompt_tokens, job["max_tokens"])
            except UserError as error:  # a prompt too long for the context: which one
                raise UserError(f"prompt {prompt['prompt_id']}: {error}") from None
            stats, reply = result.stats, tokenizer.decode(result.tokens)
            emit(measured_row(prompt, tokens=result.tokens, num_decode_tokens=stats.num_decode_tokens,
                              decode_seconds=stats.decode_seconds, ttft_seconds=stats.prefill_seconds,
                              peak_rss_bytes=stats.peak_rss_bytes, peak_memory_bytes=session.peak_memory_bytes(),
                              num_drafted=stats.num_drafted,
                              num_accepted=stats.num_accepted, num_steps=stats.num_steps,
                              stop_reason=result.stop_reason, prompt_text=template.render(messages),
                              steps_by_drafter=stats.steps_by_drafter,
                              step_seconds_by_drafter=stats.step_seconds_by_drafter,
                              loop_seconds=stats.loop_seconds,
                              steps_by_gamma={str(gamma): count for gamma, count in stats.steps_by_gamma.items()},
                              verify_costs=engine.controller.target_costs.learned_curve(LEARNED_CURVE_DEPTH),
                              prompt_tokens=prompt_tokens, text=reply))
            conversations[conversation] = messages + [{"role": "assistant", "content": reply}]


def main() -> None:
    job = json.load(sys.stdin)
    module_name, _, function_name = RUNNERS[job["runner"]].partition(":")
    try:
        getattr(importlib.import_module(module_name), function_name)(job)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(UserError.exit_code)


if __name__ == "__main__":
    main()
