"""Adapters: recipes (TOML experiments) over the jobs."""
