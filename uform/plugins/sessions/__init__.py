"""What the backend plugins share: session options and replicas, CUDA devices, and E4M3
through standard DequantizeLinear (the reference quantization)."""
