"""fastmm's airspeed velocity suite: one module per topic (see docs/benchmarks.md)."""
