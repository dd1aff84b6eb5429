"""Shared guard of the benchmark scripts: machine load before/after, interleaved rounds, median and spread.

Why: figures taken while other jobs ran (load average 6-9 on 2 cores) once reported the slower lens-fit
estimator as 6.6x faster. Every script therefore

- records the load average (1/5/15 min) and the CPU count before and after its measurements, and warns on
  stderr and marks its result ``"loaded"`` when the 1-minute load exceeds the CPU count at either end;
- times the paths it compares in at least 3 interleaved rounds (the order rotated every round, so drift in the
  machine's speed hits every path alike) and reports per-path and per-ratio median, min, max and spread.

Ratios taken within one round are more robust under load than absolute times; both are reported.
Each script writes ``{"figures": [...], "load": {...}}`` into its ``--out`` JSON, which
``benchmarks/run_all.py`` turns into the table of ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TextIO

MIN_ROUNDS = 3


def load_now() -> dict[str, Any]:
    """Load averages (1, 5, 15 min) and CPU count at this moment (-1 where the platform has no load average)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux/macOS
        one = five = fifteen = -1.0
    return {"load_1m": round(one, 2), "load_5m": round(five, 2), "load_15m": round(fifteen, 2),
            "cpus": os.cpu_count() or 1, "unix_time": round(time.time(), 1)}


@dataclass
class Guard:
    """Context manager around a benchmark's measurements: load before/after and the "loaded" verdict."""

    name: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> "Guard":
        self.before = load_now()
        if self._over(self.before):
            self._warn("before")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.after = load_now()
        if self._over(self.after):
            self._warn("after")

    @staticmethod
    def _over(sample: Mapping[str, Any]) -> bool:
        return sample.get("load_1m", -1) > sample.get("cpus", 1)

    def _warn(self, when: str) -> None:
        s = self.before if when == "before" else self.after
        print(f"WARNING [{self.name}]: load average {s['load_1m']} exceeds the {s['cpus']} CPUs ({when} the "
              "measurements); times are inflated and ratios less reliable -- re-run on a quiet machine",
              file=self.stream, flush=True)

    @property
    def loaded(self) -> bool:
        return self._over(self.before) or self._over(self.after or self.before)

    def record(self) -> dict[str, Any]:
        """What goes into the result JSON under ``"load"``."""
        return {"before": self.before, "after": self.after or load_now(), "loaded": self.loaded,
                "status": "loaded" if self.loaded else "quiet"}

    def finish(self, result: dict[str, Any], figures: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """Attach the load record and the headline figures to ``result`` (in place) and return it."""
        if not self.after:
            self.__exit__(None, None, None)
        result["load"] = self.record()
        result["figures"] = [dict(f) for f in figures]
        return result


def summarize(xs: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and relative spread ``(max - min) / median`` of per-round values."""
    xs = [float(x) for x in xs]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "spread": None, "values": []}
    med = statistics.median(xs)
    return {"n": len(xs), "median": round(med, 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "spread": round((max(xs) - min(xs)) / med, 3) if med else None, "values": [round(x, 4) for x in xs]}


def ratios(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    """Per-round ratios ``num[i] / den[i]`` (both timed in the same round), summarized."""
    if len(num) != len(den):
        raise ValueError("ratios need the same number of rounds on both sides")
    return summarize([a / b for a, b in zip(num, den) if b])


def check_rounds(rounds: int) -> int:
    if rounds < MIN_ROUNDS:
        print(f"WARNING: {rounds} round(s) < {MIN_ROUNDS}: no spread to judge the figure by", file=sys.stderr)
    return rounds


def interleave(variants: Mapping[str, Callable[[], Any]], rounds: int, *,
               timer: Callable[[], float] = time.perf_counter) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Run every variant once per round, the order rotated each round; ``(seconds per round, last outputs)``."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    outs: dict[str, Any] = {}
    for r in range(check_rounds(rounds)):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = timer()
            outs[n] = variants[n]()
            times[n].append(timer() - t0)
    return times, outs


def figure(name: str, stats: Mapping[str, Any], *, unit: str = "×", goal: str = "") -> dict[str, Any]:
    """A headline figure for the table: ``name``, the median with its spread, the unit and the goal."""
    return {"figure": name, "median": stats.get("median"), "spread": stats.get("spread"), "n": stats.get("n"),
            "min": stats.get("min"), "max": stats.get("max"), "unit": unit, "goal": goal}
