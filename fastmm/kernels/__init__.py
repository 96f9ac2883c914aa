"""fastmm's SGEMM kernels: CUDA sources (one file per family, in teaching order) and their configurations."""
