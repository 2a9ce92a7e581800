"""fastermodels: publish pruned PyTorch nets as safetensors, TorchScript and ONNX."""
