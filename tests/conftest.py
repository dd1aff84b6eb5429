"""Shared fixtures: the MemToC release data folder and small models built from a config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_memtoc_dir() -> Path | None:
    """``$MEMTOC_SHARED_DATA`` or ``../shared/memtoc`` beside the checkout; None when absent."""
    env = os.environ.get("MEMTOC_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "memtoc")
    return next((c for c in candidates if (c / "mapping_575.jsonl").exists()), None)


@pytest.fixture(scope="session")
def shared_memtoc() -> Path:
    path = shared_memtoc_dir()
    if path is None:
        pytest.skip("MemToC release data not found: set MEMTOC_SHARED_DATA or place it at ../shared/memtoc")
    return path
