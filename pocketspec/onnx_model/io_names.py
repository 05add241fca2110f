"""The names of the exported step's inputs and outputs (pocketspec/onnx_model/graph.py says what each holds)."""

TOKENS = "tokens"
LOGITS_ROWS = "logits_rows"
LOGITS = "logits"


def past_names(num_layers: int) -> list[str]:
    """The cache inputs in graph order: past_key.0, past_value.0, past_key.1, ..."""
    return [f"past_{kind}.{layer}" for layer in range(num_layers) for kind in ("key", "value")]


def new_name(past_name: str) -> str:
    """The output holding this step's part of the cache `past_name` holds the rest of."""
    return past_name.replace("past_", "new_")
