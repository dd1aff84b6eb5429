"""``memtoc codeexec extract``: the residual stream at the final prompt token after the first tool return.

The capture is the code-executor task (``memtoc.tasks.codeexec.task``) through the one extract job
(:func:`memtoc.jobs.extract.extract`, entry :func:`memtoc.jobs.codeexec.extract_codeexec`); this module holds its
config and the prompts and rows it captures.

For every problem x condition the conversation is built exactly as the agent loop builds a trial with
``--first-call scripted`` (:func:`memtoc.tasks.codeexec.agent.scripted_conversation`): system and task turns, the
scripted ``python_executor`` call, really executed in the sandbox, and its return (true in P0, corrupted in
P1/P2). The model turn that would follow is not generated; one forward over the rendered conversation
captures the requested sites at ``last_input`` (the token the model's reply is conditioned on) and, if asked,
on the tool return (``tool_span``) or from it onward (``from_tool_return``).

With ``--run RUN_DIR`` (the overreliance paper's protocol) the prompts are instead the recorded trajectories of
that evaluation run -- the model's own tool calls -- cut right after each trial's first tool return, and the
index's ``outcome`` / ``cell`` columns carry what the model then did (:mod:`memtoc.tasks.codeexec.trajectories`);
``episode_id`` is then the trial key ``<problem>|<condition>|<policy>|<repetition>``.

Rows go into the activation store of ``memtoc extract`` (``activations.store``), with the index columns used
this way: ``episode_id`` = ``<problem>|<condition>|<policy>``, ``question_id`` = the problem id (so probes
group folds by problem and ``memtoc direction`` pairs conditions within a problem), ``condition`` = P0 / P1+
/ ..., ``arm`` = ``codeexec``, ``formulation`` = the policy. ``memtoc probe --label condition --positive P1+
--negative P0`` and ``memtoc direction --contrast P1+:P0`` then read it like any MemToC store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from memtoc.tasks.codeexec.agent import (AgentConfig, ScriptedConversation, TrialSpec, scripted_conversation)
from memtoc.tasks.codeexec.conditions import TOOL_CONDITIONS
from memtoc.tasks.codeexec.run import SandboxCheck, check_task
from memtoc.tasks.codeexec.sandbox import ExecutionResult, run_python
from memtoc.core.config import CaptureSettings, CodeexecTask, ConfigError, JobSettings, ModelSpec, composed
from memtoc.core.options import option

if TYPE_CHECKING:  # torch and h5py: loaded when a block is captured, not by the config (read by --help)
    from activations.positions import PositionSelector
    from activations.store import RowBlock

__all__ = ["CodeexecExtractConfig", "FirstReturnPrompt", "first_return_prompts"]


@composed(nested=("agent",))
@dataclass
class CodeexecExtractConfig:
    """``memtoc codeexec extract``: the run's pieces (tool conditions only, scripted first call) plus capture."""
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-store", "run": "input-run", "adapter": "input-dir"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "sites"}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=lambda: CodeexecTask(conditions=("P0", "P1+", "P1-"), split="dev"))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="codeexec_acts.h5"))
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(first_call="scripted"))
    capture: CaptureSettings = field(default_factory=CaptureSettings)   # positions: last_input, tool_span, ...
    #: A ``codeexec evaluate`` run directory: capture its recorded (model-initiated) trajectories after their
    #: first tool return, labelled by outcome (``memtoc.tasks.codeexec.trajectories``), instead of scripted prompts.
    run: str | None = field(default=None, metadata=option("run"))
    sandbox: SandboxCheck = field(default_factory=SandboxCheck)
    TASK_NAME: ClassVar[str] = "codeexec"     #: the task the jobs run for this config (memtoc.core.tasks)

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        if "no_tool" in self.conditions:
            raise ConfigError("--conditions: no_tool has no tool return to capture after; choose from "
                              f"{', '.join(TOOL_CONDITIONS)}")
        if self.run is None and self.agent.first_call != "scripted":
            raise ConfigError("without --run the capture builds the first tool return from the scripted call "
                              "(first_call=scripted); give --run RUN_DIR to capture a run's own trajectories")


@dataclass(frozen=True)
class FirstReturnPrompt:
    """One problem x condition: the rendered conversation up to the model's reply to the first tool return."""

    spec: TrialSpec
    conversation: ScriptedConversation

    @property
    def text(self) -> str:
        return self.conversation.text

    @property
    def return_span(self) -> tuple[int, int] | None:
        return self.conversation.return_span

    @property
    def episode_id(self) -> str:
        s = self.spec
        return f"{s.problem.id}|{s.condition}|{s.policy}"


def run_once_per_code(executor: Callable[..., ExecutionResult]) -> Callable[..., ExecutionResult]:
    """Run each distinct code once (every condition of a problem runs the same scripted code)."""
    cache: dict[tuple, ExecutionResult] = {}

    def run(code: str, **kw: Any) -> ExecutionResult:
        key = (code, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = executor(code, **kw)
        return cache[key]
    return run


def first_return_prompts(specs: Sequence[TrialSpec], fmt: Any, config: AgentConfig, *,
                         executor: Callable[..., ExecutionResult] = run_python) -> list[FirstReturnPrompt]:
    return [FirstReturnPrompt(spec, scripted_conversation(spec, fmt, config, executor=executor)) for spec in specs]


def capture_block(backend: Any, items: Sequence[FirstReturnPrompt], sites: Sequence[int],
                  selector: PositionSelector) -> RowBlock:
    """The store rows of ``items``: one forward of their first-return prompts, captured at ``sites``."""
    from activations.capture import ResidualCapture
    from activations.store import RowBlock

    texts = [it.text for it in items]
    cap = ResidualCapture(sites, selector, prompts=texts, tool_spans=[it.return_span for it in items])
    backend.preformatted().forward(texts, capture=cap)
    sel = cap.selection
    assert sel is not None
    counts = np.bincount(sel.row, minlength=len(items)) if len(sel) else np.zeros(len(items), np.int64)
    rows = [items[int(r)] for r in sel.row]
    index = {
        "episode_id": [it.episode_id for it in rows], "question_id": [it.spec.problem.id for it in rows],
        "condition": [it.spec.condition for it in rows], "arm": ["codeexec"] * len(rows),
        "formulation": [it.spec.policy for it in rows], "position_kind": [str(k) for k in sel.kind],
        "token_index": sel.token_index.astype(np.int32), "token_id": sel.token_id.astype(np.int32),
        "token_str": backend.tokenizer.batch_decode([[int(t)] for t in sel.token_id]) if len(sel) else [],
    }
    meta = [{"episode_id": it.episode_id, "n_rows": int(counts[i]), "n_prompt_tokens": lay.n_prompt,
             "n_generated_tokens": 0} for i, (it, lay) in enumerate(zip(items, cap.layouts))]
    return RowBlock(episodes=meta, index=index, acts={s: cap.values[s] for s in sites})
