"""The ONNX Runtime backend's model: the torch model exported with its KV cache as graph inputs and outputs."""
