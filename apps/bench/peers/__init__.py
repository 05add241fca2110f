"""The peers `pocketspec bench` runs beside PocketSpec, one module each.

- llama.cpp: llama.cpp's own `llama-speculative-simple` with the draft model (built by
  native/build_llama_tools.sh); llama.cpp-ngram-*: the same tool with its draftless drafters,
  each at llama.cpp's default setting for it
- prompt-lookup: llama-cpp-python's LlamaPromptLookupDecoding
- transformers: transformers' assisted generation (the `peers` extra)
"""

from __future__ import annotations

from pocketspec.errors import UserError

# peer name -> (system name in the report, the runner that measures it, llama.cpp's --spec-type)
PEERS = {
    "llama.cpp": ("llama.cpp-speculative", "llama-speculative", "draft-simple"),
    "llama.cpp-ngram-simple": ("llama.cpp-ngram-simple", "llama-speculative", "ngram-simple"),
    "llama.cpp-ngram-map-k": ("llama.cpp-ngram-map-k", "llama-speculative", "ngram-map-k"),
    "llama.cpp-ngram-mod": ("llama.cpp-ngram-mod", "llama-speculative", "ngram-mod"),
    "prompt-lookup": ("prompt-lookup", "prompt-lookup", None),
    "transformers": ("transformers-assisted", "transformers", None),
}
# The peers that run on the same kind of engine as each --backend (pocketspec.settings.BACKENDS): none runs on
# ONNX Runtime, and one on another engine would compare the engines' speed, not their drafting
DEFAULT_PEERS = {"llama.cpp": ("llama.cpp", "llama.cpp-ngram-simple", "llama.cpp-ngram-map-k", "llama.cpp-ngram-mod",
                               "prompt-lookup"),
                 "torch": ("transformers",),
                 "onnx": ()}


def parse_peers(text: str, backend: str) -> list[str]:
    """`auto`, `none`, `all` or a comma-separated list of peer names."""
    if text == "auto":
        return list(DEFAULT_PEERS[backend])
    if text == "none":
        return []
    if text == "all":
        return list(PEERS)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PEERS]
    if unknown or not names:
        raise UserError(f"--peers {text!r}: use auto, none, all or a list of {', '.join(PEERS)}")
    return list(dict.fromkeys(names))
