"""Plain NumPy and CuPy code on fastmm's kernels: accelerate_numpy (numpy_hook, with staging and host memory) and
accelerate_cupy (cupy_hook); the C sources of NumPy's loop and allocator live beside them."""
