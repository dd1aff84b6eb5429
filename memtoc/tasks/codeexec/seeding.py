"""Seeded draws that are byte-for-byte the same on every Python, numpy and platform version.

The problem set and its corruption factors are a benchmark: a seed must name one fixed set forever. Python's
``random`` and numpy's generators do not promise that (numpy explicitly allows stream changes), so the draws
here come from SHA-256 of ``"{seed}/{label}/{counter}"``: the first 8 bytes of each digest, read big-endian, are
one uniform 64-bit integer. Integers in a range come from rejection sampling (no modulo bias). Every
:class:`SeededStream` is keyed by a label, so independent parts (each operation's operands, each problem's
factors, the split) never shift one another when one of them changes.
"""

from __future__ import annotations

import hashlib
from typing import MutableSequence, TypeVar

T = TypeVar("T")

_U64 = 1 << 64


class SeededStream:
    """An endless, deterministic stream of uniform integers for one (seed, label) pair."""

    def __init__(self, seed: int, label: str) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = seed
        self.label = label
        self._counter = 0

    def next_u64(self) -> int:
        """The next uniform integer in [0, 2**64)."""
        digest = hashlib.sha256(f"{self.seed}/{self.label}/{self._counter}".encode("utf-8")).digest()
        self._counter += 1
        return int.from_bytes(digest[:8], "big")

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high], both ends included."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        n = high - low + 1
        if n > _U64:
            raise ValueError("range wider than 2**64")
        limit = (_U64 // n) * n          # accept only draws below a multiple of n: no modulo bias
        while True:
            x = self.next_u64()
            if x < limit:
                return low + x % n

    def shuffle(self, items: MutableSequence[T]) -> None:
        """Fisher-Yates shuffle in place (from the last position down)."""
        for i in range(len(items) - 1, 0, -1):
            j = self.randint(0, i)
            items[i], items[j] = items[j], items[i]
