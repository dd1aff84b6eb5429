"""The MemToC family: the evaluator (evaluate.py), its pre-flight checks (validate.py), the registered task
(task.py) and the strength sweep (sweep.py)."""
