"""Second MemToC benchmark family: corrupted returns of a code executor.

The question is the one MemToC asks about knowledge tools -- does a model follow a wrong tool return or its
own knowledge? -- asked in an agent loop where the tool is ``python_executor`` and its stdout has been
corrupted. This package holds the offline parts; the agent loop on model backends and the probe/steer study
build on them.

Modules, one job each:

- :mod:`~memtoc.tasks.codeexec.problems`: the 300 seeded arithmetic problems (50 each of +, x, /, mod, log, ^),
  gold answers in exact Decimal arithmetic, the fixed 200 dev / 100 held-out split, canonical JSONL.
- :mod:`~memtoc.tasks.codeexec.conditions`: the conditions (no_tool, P0, P1+/-, P2+/-), per-problem corruption
  factors, and corruption of a tool's stdout (every numeric token times the factor, nothing else changed).
- :mod:`~memtoc.tasks.codeexec.sandbox`: :func:`run_python`, a real, contained Python executor (process group,
  rlimits, kernel isolation -- Landlock, user+network namespace, seccomp, see :mod:`~memtoc.tasks.codeexec.isolation`
  -- with an audit-hook policy as a second layer, scratch dir, output cap).
- :mod:`~memtoc.tasks.codeexec.grader`: ``FINAL ANSWER`` parsing, correctness and adoption.
- :mod:`~memtoc.tasks.codeexec.metrics`: accuracy, adoption, override and tool-call ratio with item-bootstrap CIs.
- :mod:`~memtoc.tasks.codeexec.prompts`: system/task prompts, the forced final-answer turn, the policies
  (Plain / Compare / Verify / Disclose); texts live in ``codeexec/data/*.json``.
- :mod:`~memtoc.tasks.codeexec.numtokens` (what a number is, half-up rounding), :mod:`~memtoc.tasks.codeexec.seeding`
  (version-independent seeded draws), :mod:`~memtoc.tasks.codeexec.resources` (data-file loading).
"""

from memtoc.tasks.codeexec.conditions import (
    CONDITIONS,
    CORRUPTED_CONDITIONS,
    CorruptionConfig,
    CorruptionFactors,
    ToolReturn,
    corrupt_stdout,
    corrupted_gold,
    corrupted_numbers,
    tool_return,
)
from memtoc.tasks.codeexec.grader import GradedAnswer, grade, grade_answer, parse_answer
from memtoc.tasks.codeexec.metrics import MetricsConfig, Trial, summarize
from memtoc.tasks.codeexec.problems import (Problem, generate_problems, problems_from_jsonl, problems_sha256,
    problems_to_jsonl)
from memtoc.tasks.codeexec.prompts import POLICIES, final_answer_turn, system_prompt, user_prompt
from memtoc.tasks.codeexec.sandbox import ExecutionResult, run_python

__all__ = [
    "CONDITIONS", "CORRUPTED_CONDITIONS", "CorruptionConfig", "CorruptionFactors", "ToolReturn",
    "corrupt_stdout", "corrupted_gold", "corrupted_numbers", "tool_return",
    "GradedAnswer", "grade", "grade_answer", "parse_answer",
    "MetricsConfig", "Trial", "summarize",
    "Problem", "generate_problems", "problems_from_jsonl", "problems_sha256", "problems_to_jsonl",
    "POLICIES", "final_answer_turn", "system_prompt", "user_prompt",
    "ExecutionResult", "run_python",
]
