"""How ``memtoc elicitation-agreement`` shows its result (the job: :mod:`memtoc.jobs.elicitation`)."""

from __future__ import annotations

from typing import Any


def present_elicitation_agreement(res: Any, cfg: Any) -> int:
    print(res.markdown)
    return 0
