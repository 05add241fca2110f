"""Peer: transformers' assisted generation (`generate(assistant_model=...)`) on the same GGUF
pair, which transformers dequantizes (llama and qwen2) into torch weights: the peer for
PocketSpec's `--backend torch`.

Needs the `peers` extra (transformers, accelerate). Acceptance is counted by wrapping
AssistedCandidateGenerator.update_candidate_strategy, which every assisted step calls
with the verified logits (one row per drafted token, plus one) and the number accepted.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from apps.bench.worker import emit, measured_row
from pocketspec.errors import UserError
from pocketspec.stats import decode_token_count, peak_rss_bytes

# assistant_model= with transformers' default draft schedule, on the GGUF pair dequantized


def missing_requirement() -> str | None:
    """Why this peer cannot run in this environment, or None."""
    for module in ("transformers", "accelerate", "torch"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[peers]')"
    return None


def count_steps(records: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(steps, drafted, accepted) from one (drafted, accepted) pair per assisted step."""
    return len(records), sum(drafted for drafted, _ in records), sum(accepted for _, accepted in records)


class _TimingStreamer:
    """Times the first tokens generate() hands out after the prompt (streamers get the prompt first)."""

    def __init__(self):
        self.num_puts = 0
        self.first_at = 0.0
        self.num_first_tokens = 0

    def put(self, tokens) -> None:
        self.num_puts += 1
        if self.num_puts == 2:
            self.first_at = time.perf_counter()
            self.num_first_tokens = int(tokens.numel())

    def end(self) -> None:
        pass


def _load(path: str, dtype, device: str):
    from transformers import AutoModelForCausalLM

    gguf = Path(path)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    return model.to(device).eval()


def run(job: dict) -> None:
    reason = missing_requirement()
    if reason:
        raise UserError(reason)
    if not job["draft"]:
        raise UserError("transformers assisted generation needs a draft model (--pair or --draft NAME)")
    import torch
    import transformers
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    from pocketspec.backends.torch_backend import resolve_weights_format
    from pocketspec.torch_model.device import resolve_device
    from pocketspec.torch_model.quantize import FLOAT_DTYPES

    torch.set_num_threads(job["num_threads"])
    device = job["options"].get("device", "cpu")
    # the float format PocketSpec's torch backend computes in for these options (int8/int4: float32)
    weights = resolve_weights_format(job["options"].get("weights", "auto"), resolve_device(device))
    dtype = FLOAT_DTYPES.get(weights, torch.float32)
    target = _load(job["target"], dtype, device)
    draft = _load(job["draft"], dtype, device)
    emit({"note": f"transformers {transformers.__version__}: {dtype} weights on {device}, "
                  "the assistant's draft length and confidence threshold at transformers' defaults"})
    records: list[tuple[int, int]] = []
    original_update = AssistedCandidateGenerator.update_candidate_strategy

    def recording_update(self, input_ids, scores, num_matches):
        records.append((int(scores.shape[1]) - 1, int(num_matches)))
        return original_update(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = recording_update
    eos_ids = target.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids] if eos_ids is not None else [])

    def generate(prompt_tokens: list[int], max_tokens: int):
        input_ids = torch.tensor([prompt_tokens], device=device)
        streamer = _TimingStreamer()
        sampling = ({"do_sample": True, "temperature": job["temperature"], "top_k": job["top_k"] or None,
                     "top_p": job["top_p"]} if job["temperature"] > 0 else {"do_sample": False})
        started = time.perf_counter()
        with torch.no_grad():
            output = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                     max_new_tokens=max_tokens, streamer=streamer,
                                     pad_token_id=next(iter(eos_ids), None), **sampling)
        finished = time.perf_counter()
        tokens = [int(token) for token in output[0, len(prompt_tokens):]]
        ends = [index for index, token in enumerate(tokens) if token in eos_ids]
        return (tokens[: ends[0]] if ends else tokens), bool(ends), streamer, started, finished

    for index, prompt in enumerate(job["prompts"]):
        if index == 0 and job["num_warmup_tokens"]:
            generate(prompt["prompt_tokens"], job["num_warmup_tokens"])
        records.clear()
        torch.manual_seed(job["seed"])
        tokens, is_ended, streamer, started, finished = generate(prompt["prompt_tokens"], job["max_tokens"])
        num_steps, num_drafted, num_accepted = count_steps(records)
        first_at = streamer.first_at or finished
        num_decode_tokens = decode_token_count(len(tokens), is_ended, streamer.num_first_tokens)
        emit(measured_row(prompt, tokens=tokens, num_decode_tokens=num_decode_tokens,
                          decode_seconds=finished - first_at, ttft_seconds=first_at - started,
                          peak_rss_bytes=peak_rss_bytes(), num_drafted=num_drafted, num_accepted=num_accepted,
                          num_steps=num_steps))
