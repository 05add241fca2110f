"""Batched speculative decoding on the torch backend: many sequences in one static KV cache, stepped together."""
