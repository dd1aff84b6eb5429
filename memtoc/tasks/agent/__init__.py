"""MemToC episodes as agent tasks (paper App. G): the question's tool offered through the chat template, the
model's call validated against its schema and executed (its return = the episode's controlled payload), the
answer scored by the one scorer, under three tool-choice protocols (guided, auto, two-stage).

Modules: :mod:`~memtoc.tasks.agent.calls` (finding, validating and classifying calls: T1-T4),
:mod:`~memtoc.tasks.agent.schemas` (tool schemas of a benchmark), :mod:`~memtoc.tasks.agent.protocols` (prompt texts),
:mod:`~memtoc.tasks.agent.loop` (the episode policy on the shared loop, :func:`memtoc.tasks.loop.run_loop`),
:mod:`~memtoc.tasks.agent.metrics`
(agreement, execution rate, paired protocol contrasts), :mod:`~memtoc.tasks.agent.task` (the registered task and its
run directory), :mod:`~memtoc.cli.agent` (``memtoc agent evaluate``). See docs/agent.md.
"""
