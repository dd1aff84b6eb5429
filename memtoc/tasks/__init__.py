"""Tasks: one folder per benchmark family (memtoc, codeexec, agent), and beside them what every family shares
(``evaluation``: open / solve / finish any task's evaluation; ``validate``: the checks before a model loads;
``sweep_format``: strengths and the sweep tables' number formats), so no family imports another. The Task protocol
and registry they register with are core (memtoc.core.tasks); the jobs that run any task are memtoc.jobs."""
