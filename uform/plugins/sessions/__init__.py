"""What the backend plugins share: session options and replicas, CUDA devices, E4M3
through standard DequantizeLinear (the reference quantization), sessions over weights widened
into a temporary file, and the cuda backend's float16 products."""
