"""PocketSpec: lossless speculative decoding runtime for memory-constrained devices."""

__version__ = "0.1.0"
