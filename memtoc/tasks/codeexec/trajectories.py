"""Model-initiated trajectories of a ``memtoc codeexec evaluate`` run: the prompt after the first tool return,
labelled by what the model then did (the overreliance paper's probe protocol, docs/codeexec.md).

The paper labels an episode by its outcome, not its condition: runs that *accept* a correct return against runs
that *adopt* a corrupted one, at the final prompt token after the first tool return. For a trial whose first
tool return is message ``m``, the next model turn recorded after it (the first with ``n_prompt_messages > m``)
saw ``messages[:n_prompt_messages]`` rendered with the tool offered or not (``tools_offered``), so re-rendering
them with the run's protocol gives exactly the text the agent loop sent. Trials without a tool return have no
such prompt and are left out.

Outcome labels (:func:`trial_outcome`, the store's ``outcome`` column): ``accepted`` (every P0 run with a tool
return, as in the paper's counts), ``adopted`` (a corrupted condition answered with a corrupted number the tools
returned), ``rejected`` (another parsed answer), ``no_answer``, and ``ambiguous`` (the corrupted gold rounds back
to the gold). The ``cell`` column holds the answer's own grading (:func:`answer_cell`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.tasks.codeexec.agent import Formatter, TrialSpec, first_return_span
from memtoc.tasks.codeexec.conditions import CORRUPTED_CONDITIONS, corruption_visible
from memtoc.core.errors import RunStoreError

__all__ = ["OUTCOMES", "TrajectoryPrompt", "trial_outcome", "answer_cell", "read_trials", "trajectory_prompt",
           "run_identity"]

#: Outcome labels in the order reports list them.
from memtoc.core.vocab import TRAJECTORY_OUTCOMES as OUTCOMES  # noqa: E402


@dataclass(frozen=True)
class TrajectoryPrompt:
    """One trial of a run: the rendered prompt after its first tool return, and its labels."""

    spec: TrialSpec
    key: str
    text: str
    return_span: tuple[int, int] | None
    outcome: str
    cell: str

    @property
    def episode_id(self) -> str:
        return self.key


def answer_cell(record: Mapping[str, Any]) -> str:
    """How the final answer was graded: correct, adopted, neither, or no_answer."""
    graded = record.get("graded") or {}
    if graded.get("answer") is None:
        return "no_answer"
    if record.get("correct"):
        return "correct"
    return "adopted" if record.get("adopted") else "neither"


def trial_outcome(record: Mapping[str, Any], problem: Any) -> str | None:
    """The outcome label of a trial with a tool return (module docstring); None for no_tool trials and trials
    without a tool return (they have no prompt after a return)."""
    if record.get("first_return_message") is None:
        return None
    condition = record["condition"]
    if condition == "P0":
        return "accepted"
    if condition not in CORRUPTED_CONDITIONS:
        return None
    if not corruption_visible(problem, condition):
        return "ambiguous"
    if (record.get("graded") or {}).get("answer") is None:
        return "no_answer"
    return "adopted" if record.get("adopted") else "rejected"


def run_identity(run_dir: str | Path) -> dict[str, Any]:
    """The run's ``run.json`` (read only); a clear error when the directory is not a code-executor run."""
    from memtoc.runs.runstore import read_run_info

    info = read_run_info(Path(run_dir))
    if "problems_sha256" not in info or "agent" not in info:
        raise RunStoreError(f"{run_dir} is not a 'memtoc codeexec evaluate' run directory (its run.json has no "
                            "problems_sha256 / agent settings)")
    return info


def read_trials(run_dir: str | Path) -> list[dict[str, Any]]:
    """The trial records of a run (``trials.jsonl``), in file order; a torn last line is skipped."""
    from memtoc.runs.runstore import iter_jsonl

    path = Path(run_dir) / "trials.jsonl"
    if not path.is_file():
        raise RunStoreError(f"{run_dir} has no trials.jsonl: run 'memtoc codeexec evaluate --out {run_dir}' first")
    return list(iter_jsonl(path))


def trajectory_prompt(record: Mapping[str, Any], problem: Any, fmt: Formatter) -> TrajectoryPrompt | None:
    """The prompt the model saw right after the trial's first tool return, or None when there is none."""
    outcome = trial_outcome(record, problem)
    if outcome is None:
        return None
    m = int(record["first_return_message"])
    turn = next((t for t in record.get("turns") or () if int(t.get("n_prompt_messages", -1)) > m), None)
    if turn is None:
        raise RunStoreError(f"trial {record.get('key')!r}: no model turn follows its first tool return (message "
                            f"{m}); the record is incomplete")
    messages: Sequence[dict[str, Any]] = record["messages"][:int(turn["n_prompt_messages"])]
    tools = bool(turn.get("tools_offered"))
    text = fmt.format_messages(messages, tools=tools)
    span = first_return_span(fmt, messages, m, text, tools=tools)
    spec = TrialSpec(problem=problem, condition=record["condition"], policy=record["policy"],
                     repetition=int(record["repetition"]))
    return TrajectoryPrompt(spec=spec, key=str(record["key"]), text=text, return_span=span, outcome=outcome,
                            cell=answer_cell(record))
