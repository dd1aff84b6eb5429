"""``memtoc serve``: what is shown when the server stops (the job is :mod:`memtoc.jobs.serve`; it prints its URL
itself once it listens)."""

from __future__ import annotations

from typing import Any


def present_serve(res: Any, cfg: Any) -> int:
    """The engine passes the server ran, and the requests they answered."""
    s = res.stats
    print(f"memtoc serve: stopped ({res.url}); {s.passes} engine passes answered {s.rows_asked} requests")
    return 0
