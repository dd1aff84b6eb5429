"""``benchmarks/_guard.py``: the load verdict, interleaved rounds and the summaries (no wall-clock asserts:
the load and the clock are injected)."""

from __future__ import annotations

import importlib.util
import io
import itertools
import statistics
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def guard():
    spec = importlib.util.spec_from_file_location("_guard", REPO / "benchmarks" / "_guard.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_guard"] = mod            # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("_guard", None)


@pytest.mark.parametrize("loads,loaded", [((0.5, 1.1), False), ((3.0, 0.2), True), ((0.2, 2.5), True)])
def test_loaded_when_the_load_exceeds_the_cpus(guard, monkeypatch, loads, loaded):
    seq = iter([(loads[0], 0.0, 0.0), (loads[1], 0.0, 0.0)])
    monkeypatch.setattr(guard.os, "getloadavg", lambda: next(seq))
    monkeypatch.setattr(guard.os, "cpu_count", lambda: 2)
    err = io.StringIO()
    with guard.Guard("t", stream=err) as g:
        pass
    rec = g.finish({}, [guard.figure("x", guard.summarize([1.0, 2.0, 3.0]))])
    assert rec["load"]["loaded"] is loaded and rec["load"]["status"] == ("loaded" if loaded else "quiet")
    assert rec["load"]["before"]["load_1m"] == loads[0] and rec["load"]["after"]["load_1m"] == loads[1]
    assert ("WARNING" in err.getvalue()) is loaded
    assert rec["figures"][0]["median"] == 2.0


def test_interleave_rotates_the_order_and_times_each_call(guard):
    calls = []
    clock = itertools.count(0.0, 1.0)                          # every timer() call advances by 1 s
    times, outs = guard.interleave({"a": lambda: calls.append("a") or "A", "b": lambda: calls.append("b") or "B",
                                    "c": lambda: calls.append("c") or "C"}, 3, timer=lambda: next(clock))
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3} and outs == {"a": "A", "b": "B", "c": "C"}


def test_summaries_and_per_round_ratios(guard):
    xs = [2.0, 4.0, 3.0, 10.0]
    st = guard.summarize(xs)
    assert st["median"] == statistics.median(xs) and (st["min"], st["max"], st["n"]) == (2.0, 10.0, 4)
    assert st["spread"] == pytest.approx((10 - 2) / 3.5, abs=1e-3)
    r = guard.ratios([2.0, 6.0, 3.0], [1.0, 2.0, 3.0])
    assert r["values"] == [2.0, 3.0, 1.0] and r["median"] == 2.0
    with pytest.raises(ValueError):
        guard.ratios([1.0], [1.0, 2.0])


def test_every_timing_script_is_guarded_and_run_by_run_all():
    """Each bench_*.py records the load through _guard and is one of run_all's commands."""
    from pathlib import Path

    from benchmarks.run_all import BENCHES

    here = Path(__file__).resolve().parents[2] / "benchmarks"
    scripts = sorted(p.name for p in here.glob("bench_*.py"))
    unguarded = [s for s in scripts if "_guard.Guard(" not in (here / s).read_text()]
    assert unguarded == []
    assert sorted(script for script, _, _ in BENCHES.values()) == scripts
