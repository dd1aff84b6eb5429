"""The control arms of ``memtoc/data/controls.json`` (memtoc.bench.controls) as conditions: each returns its
payload, which carries no factual value, so the tool counts as wrong; a run that selects one records the file's
hash in its identity."""

from __future__ import annotations

from memtoc.bench.conditions.base import Condition, register_condition
from memtoc.bench.controls import CONTROL_ARMS, load_controls


def _payload(arm: str):
    return lambda q, p: load_controls().arms[arm].tool_output


for place, arm in enumerate(CONTROL_ARMS):
    register_condition(Condition(arm, False, _payload(arm), sets={"controls": place},
                                 identity=lambda: {"controls_sha256": load_controls().sha256},
                                 description=f"control arm {arm} (memtoc/data/controls.json)"))
