"""The PyTorch model behind --backend torch: model, static KV cache, weight formats and loaders."""
