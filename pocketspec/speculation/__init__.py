"""Speculative decoding itself: the step, the engine around it, the controller that picks γ, verification."""
