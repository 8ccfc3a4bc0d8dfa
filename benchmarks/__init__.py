"""lingc benchmarks; run from the repo root as ``python -m benchmarks.<name>``."""
