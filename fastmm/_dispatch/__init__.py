"""NumPy's matrix-product functions on device arrays: NumPy's rules (numpy_rules) and the products (products)."""
