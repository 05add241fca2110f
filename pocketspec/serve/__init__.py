"""Serving many requests from one process (`pocketspec serve`): the slots that run generations
(generation.py: the interface; engine_slots.py: one speculative engine, llama.cpp; batch_slots.py:
the continuous-batching pool, torch) and the OpenAI-compatible HTTP layer on top of them."""
