"""The GPU side: arrays as the kernels see them (arrays), the plan carried out and replayed (gemm), kernels loaded
and launched through the CUDA driver (cuda)."""
