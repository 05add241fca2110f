"""Defaults the planner, the runtime and the CLI share, each defined here once.

memplanner is the lowest layer (it imports neither pocketspec nor torch), so a value both
the planner and the runtime need lives here; pocketspec.settings and the CLI read it.
"""

from __future__ import annotations

MAX_GAMMA = 8  # a draft model's longest draft; its verify pass reads MAX_GAMMA + 1 logits rows
# A draftless (n-gram) proposal costs nothing to draft, so only the verify's width limits it:
# on the 2-core CPU a verify of 16 rows costs what one of 8 does (issue 13's llama-bench table).
MAX_DRAFTLESS_GAMMA = 31
# n-gram drafting matches suffixes of NGRAM_MIN_N to NGRAM_MAX_N tokens (pocketspec/drafters/ngram.py).
# One token is enough to propose: the controller prices a one-token match by what such matches were
# accepted, so it drafts them only where a verify is cheap. Replayed on the 244 recorded answers
# (benchmarks/replay_drafting.py, 2026-11-28): 1.96x -> 2.11x plain with the H200's flat verify costs,
# 1.41x both ways with the EPYC's steep ones.
NGRAM_MIN_N, NGRAM_MAX_N = 1, 8
# Tokens one llama.cpp decode call takes at most (prefill chunks); the planner's buffers assume it too
N_BATCH = 512
MAX_NEW_TOKENS = 128  # tokens one generate call (or one bench prompt) may add
ATTENTION_SINK_TOKENS = 4  # first tokens a sliding draft window always keeps (StreamingLLM)
# A sliding draft window drops this many more tokens than it must, so it moves rarely.
SLIDE_SLACK_TOKENS = 64
# Per-token acceptance before any is measured, from the qwen-coder pair: the planner
# predicts speed with it and the runtime's γ controller starts from it.
ACCEPTANCE_PRIORS = {"model": 0.8, "ngram": 0.3, "none": 0.0}
# A pair's draft model is loaded only where the calibrated costs predict it this much faster
# than plain decoding at the prior. Tables measured minutes apart on a shared CPU predicted
# 0.99x and 1.02x for the same pair, and noise should not decide whether 0.5 GiB is loaded; and
# the prior is optimistic: on the 2-core EPYC the qwen-coder pair predicted 1.09x, yet auto with
# its draft model ran Spec-Bench (one prompt a category) at 1.17x plain against 1.26x without it
# (acceptance 0.59-0.80 outside math and code, a draft pass 0.6 of the target's; docs/bench.md,
# 2026-12-03), so the margin also covers what exploring a draft model that cannot pay costs.
DRAFT_MODEL_MIN_SPEEDUP = 1.15
# llama.cpp KV cache types. Quantized KV changes outputs slightly. bf16, as big as f16, rounds
# attention alike at every batch width on llama.cpp's CPU backend, where one token with an f16
# cache past 256 cached tokens takes a path of its own: that keeps --exact-verify drafting there.
LLAMA_KV_TYPES = ("f16", "bf16", "q8_0", "q4_0")
