"""fastmm's version: one source, read by the package, the build (pyproject.toml) and the tuned cache's file names."""

__version__ = "0.1.0"
