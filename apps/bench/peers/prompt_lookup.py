"""Peer: llama-cpp-python's `LlamaPromptLookupDecoding`, the n-gram drafter people reach for
first, on the same target GGUF and prompt tokens as PocketSpec's n-gram drafter.

llama-cpp-python reports no acceptance, so each proposal is recorded with the position it
was made at and checked afterwards against the tokens that were generated.
"""

from __future__ import annotations

import time

from apps.bench.worker import emit, measured_row
from pocketspec.speculation.prefix import common_prefix_length
from pocketspec.stats import decode_token_count, peak_rss_bytes

# LlamaPromptLookupDecoding runs with its defaults: max_ngram_size 2, num_pred_tokens 10


def count_acceptance(proposals: list[tuple[int, list[int]]], sequence: list[int]) -> tuple[int, int, int]:
    """(steps, drafted, accepted) from proposals (start position in sequence, tokens).

    Drafted tokens past the end of the generated sequence could not be checked and are
    not counted.
    """
    num_drafted = num_accepted = 0
    for start, tokens in proposals:
        checkable = tokens[: max(len(sequence) - start, 0)]
        num_drafted += len(checkable)
        num_accepted += common_prefix_length(checkable, sequence[start:start + len(checkable)])
    return len(proposals), num_drafted, num_accepted


def run(job: dict) -> None:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from pocketspec.tokenizer import Tokenizer

    proposals: list[tuple[int, list[int]]] = []

    class RecordingLookup(LlamaPromptLookupDecoding):
        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            proposals.append((len(input_ids), [int(token) for token in draft]))
            return draft

    # llama-cpp-python 0.3.36 turns logits_all on for a draft model but sizes its score matrix
    # from the argument, so a prompt past n_batch tokens fails unless logits_all=True is given.
    llm = Llama(model_path=job["target"], n_ctx=job["max_context"], n_threads=job["num_threads"],
                n_threads_batch=job["num_threads"], seed=job["seed"], draft_model=RecordingLookup(),
                logits_all=True, verbose=False)
    tokenizer = Tokenizer(llm._model)
    is_end = tokenizer.is_end_of_generation
    try:
        for index, prompt in enumerate(job["prompts"]):
            if index == 0 and job["num_warmup_tokens"]:
                _generate(llm, prompt["prompt_tokens"], job["num_warmup_tokens"], job, is_end)
            proposals.clear()
            tokens, is_ended, ttft_seconds, decode_seconds = _generate(llm, prompt["prompt_tokens"], job["max_tokens"],
                                                                       job, is_end)
            num_steps, num_drafted, num_accepted = count_acceptance(proposals, prompt["prompt_tokens"] + tokens)
            emit(measured_row(prompt, tokens=tokens, num_decode_tokens=decode_token_count(len(tokens), is_ended),
                              decode_seconds=decode_seconds, ttft_seconds=ttft_seconds, peak_rss_bytes=peak_rss_bytes(),
                              num_drafted=num_drafted, num_accepted=num_accepted, num_steps=num_steps,
                              text=tokenizer.decode(tokens)))
    finally:
        llm.close()


def _generate(llm, prompt_tokens: list[int], max_tokens: int, job: dict,
              is_end) -> tuple[list[int], bool, float, float]:
    """(tokens, whether it stopped at the end-of-generation token, TTFT, decode seconds): greedy (temperature 0)
    or sampled with PocketSpec's top-k/top-p; min-p and penalties off."""
    llm.reset()  # no KV reuse from the previous prompt: every system starts each prompt cold
    tokens: list[int] = []
    is_ended = False
    started = time.perf_counter()
    first_at = started
    for token in llm.generate(prompt_tokens, temp=job["temperature"], top_k=job["top_k"], top_p=job["top_p"],
                              min_p=0.0, repeat_penalty=1.0):
        if not tokens:
            first_at = time.perf_counter()
        if is_end(token):
            is_ended = True
            break
        tokens.append(int(token))
        if len(tokens) >= max_tokens:
            break
    finished = time.perf_counter()
    return tokens, is_ended, first_at - started, finished - first_at
