"""Memory planner: a pure model of every byte speculative decoding needs (no torch, no llama_cpp).

Front ends (apps/) use only what this package exports; the runtime (pocketspec/) plans through
its submodules.
"""

from memplanner.sizes import format_bytes, parse_size

__all__ = ["format_bytes", "parse_size"]
