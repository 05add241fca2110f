"""Defaults the planner, the runtime and the CLI share, each defined here once.

memplanner is the lowest layer (it imports neither pocketspec nor torch), so a value both
the planner and the runtime need lives here; pocketspec.settings and the CLI read it.
"""

from __future__ import annotations

MAX_GAMMA = 8  # longest draft; a verify pass reads MAX_GAMMA + 1 logits rows
MAX_NEW_TOKENS = 128  # tokens one generate call (or one bench prompt) may add
ATTENTION_SINK_TOKENS = 4  # first tokens a sliding draft window always keeps (StreamingLLM)
# Per-token acceptance before any is measured, from the qwen-coder pair: the planner
# predicts speed with it and the runtime's γ controller starts from it.
ACCEPTANCE_PRIORS = {"model": 0.8, "ngram": 0.3, "none": 0.0}
LLAMA_KV_TYPES = ("f16", "q8_0", "q4_0")  # llama.cpp KV cache types, best first: quantized KV changes outputs slightly
