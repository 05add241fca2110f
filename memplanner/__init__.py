"""Memory planner: a pure model of every byte speculative decoding needs (no torch, no llama_cpp)."""
