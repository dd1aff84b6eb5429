"""Core: errors, vocabulary, file I/O, registries, provenance, the option table and the composed config pieces,
the Task protocol and registry, plots. Imports nothing above the core layer (tests/test_layering.py)."""
