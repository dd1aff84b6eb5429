"""Second MemToC benchmark family: corrupted returns of a code executor.

The question is the one MemToC asks about knowledge tools -- does a model follow a wrong tool return or its
own knowledge? -- asked in an agent loop where the tool is ``python_executor`` and its stdout has been
corrupted. Its modules (problems, conditions, sandbox, agent, grader, metrics, ...) are described in
docs/codeexec.md; this package re-exports the offline parts.
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
