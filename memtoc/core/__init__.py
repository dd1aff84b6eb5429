"""Core: errors, vocabulary, file I/O, registries, provenance, the model and decoding records (runtime), the backend
registry (backend_kinds), the FINAL line's grammar, the option table, the config pieces and their flat record, the
Task protocol and registry, plots. The bottom layer: it imports no other memtoc folder (tests/test_layering.py)."""
