"""The MemToC family: its evaluation pieces (evaluation.py: config, protocol, identity, the scored record), the
registered task (task.py) and the sweep's rows and table (sweep.py). The jobs that run it are memtoc.jobs."""
