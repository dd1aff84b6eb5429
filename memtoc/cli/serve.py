"""``memtoc serve``: what is shown when the server stops (the job is :mod:`memtoc.jobs.serve`; it prints its URL
itself once it listens)."""

from __future__ import annotations

from typing import Any


def present_serve(res: Any, cfg: Any) -> int:
    """The engine passes the server ran, and the requests they answered."""
    s = res.stats
    passes = f"{s.passes} engine pass" + ("" if s.passes == 1 else "es")
    requests = f"{s.rows_asked} request" + ("" if s.rows_asked == 1 else "s")
    print(f"memtoc serve: stopped ({res.url}); {passes} answered {requests}")
    return 0
