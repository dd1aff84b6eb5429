"""Tasks: one folder per benchmark family (memtoc, codeexec, agent). The Task protocol and registry they register
with are core (memtoc.core.tasks), so the analysis layer (activations.extract) can run any task."""
