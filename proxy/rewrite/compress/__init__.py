"""Compress: layered history compaction (clear old tool results, then an LLM summary), recorded and replayed."""
