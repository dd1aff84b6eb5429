"""MemToC episodes as agent tasks (paper App. G): the question's tool offered through the chat template, the
model's call validated against its schema and executed (its return = the episode's controlled payload), the
answer scored by the one scorer, under three tool-choice protocols (guided, auto, two-stage).

Modules: :mod:`~memtoc.agent.calls` (finding, validating and classifying calls: T1-T4),
:mod:`~memtoc.agent.schemas` (tool schemas of a benchmark), :mod:`~memtoc.agent.protocols` (prompt texts),
:mod:`~memtoc.agent.loop` (the episode loop on :func:`memtoc.toolchat.lockstep`), :mod:`~memtoc.agent.metrics`
(agreement, execution rate, paired protocol contrasts), :mod:`~memtoc.agent.task` (the registered task and its
run directory), :mod:`~memtoc.agent.cli` (``memtoc agent evaluate``). See docs/agent.md.
"""
