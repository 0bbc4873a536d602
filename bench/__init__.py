"""Benchmarks: ``python -m bench.NAME``; each prints one JSON object of figures last."""
