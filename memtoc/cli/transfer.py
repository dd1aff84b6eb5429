"""How ``memtoc transfer-table`` shows its result (the job: :mod:`memtoc.jobs.transfer_table`)."""

from __future__ import annotations

from typing import Any


def present_transfer_table(res: Any, cfg: Any) -> int:
    print(res.markdown)
    return 0
