"""Serving many requests from one process (`pocketspec serve`): the slots that run generations
(generation.py: the interface; batch_slots.py: the continuous-batching pool, llama.cpp and torch;
engine_slots.py: one speculative engine, for a torch split) and the
OpenAI-compatible HTTP layer on top of them."""
