"""MemToC: memory-tool conflict benchmark, evaluator and scorer.

When a tool return contradicts what a language model knows, which source does the model follow?
This package builds the benchmark episodes, runs models through one backend seam, scores answers with
one deterministic scorer and aggregates them into the paper's metrics.
"""

__version__ = "0.1.0"
