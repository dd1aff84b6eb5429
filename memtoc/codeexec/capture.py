"""``memtoc codeexec extract``: the residual stream at the final prompt token after the first tool return.

For every problem x condition the conversation is built exactly as the agent loop builds a trial with
``--first-call scripted`` (:func:`memtoc.codeexec.agent.scripted_conversation`): system and task turns, the
scripted ``python_executor`` call, really executed in the sandbox, and its return (true in P0, corrupted in
P1/P2). The model turn that would follow is not generated; one forward over the rendered conversation
captures the requested sites at ``last_input`` (the token the model's reply is conditioned on) and, if asked,
on the tool return (``tool_span``) or from it onward (``from_tool_return``).

Rows go into the activation store of ``memtoc extract`` (``activations.store``), with the index columns used
this way: ``episode_id`` = ``<problem>|<condition>|<policy>``, ``question_id`` = the problem id (so probes
group folds by problem and ``memtoc direction`` pairs conditions within a problem), ``condition`` = P0 / P1+
/ ..., ``arm`` = ``codeexec``, ``formulation`` = the policy. ``memtoc probe --label condition --positive P1+
--negative P0`` and ``memtoc direction --contrast P1+:P0`` then read it like any MemToC store.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

import memtoc
from activations import ActivationStoreError
from activations.capture import ResidualCapture, parse_layers
from memtoc.backends.base import InspectableBackend
from activations.positions import PositionSelector
from activations.store import ActivationWriter, RowBlock
from memtoc.codeexec.agent import (AgentConfig, ScriptedConversation, TrialSpec, formatter_for,
                                   scripted_conversation)
from memtoc.codeexec.problems import problems_sha256, generate_problems
from memtoc.codeexec.conditions import TOOL_CONDITIONS
from memtoc.codeexec.run import check_task, select_problems
from memtoc.codeexec.sandbox import ExecutionResult, run_python
from memtoc.config import CaptureSettings, CodeexecTask, ConfigError, JobSettings, ModelSpec, composed

__all__ = ["CodeexecExtractConfig", "FirstReturnPrompt", "first_return_prompts", "extract_codeexec"]


@composed(nested=("agent",))
@dataclass
class CodeexecExtractConfig:
    """``memtoc codeexec extract``: the run's pieces (tool conditions only, scripted first call) plus capture."""

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=lambda: CodeexecTask(conditions=("P0", "P1+", "P1-"), split="dev"))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="codeexec_acts.h5"))
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(first_call="scripted"))
    capture: CaptureSettings = field(default_factory=CaptureSettings)   # positions: last_input, tool_span, ...

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        if "no_tool" in self.conditions:
            raise ConfigError("--conditions: no_tool has no tool return to capture after; choose from "
                              f"{', '.join(TOOL_CONDITIONS)}")
        if self.agent.first_call != "scripted":
            raise ConfigError("the capture builds the first tool return from the scripted call (first_call=scripted)")


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


def _memoized(executor: Callable[..., ExecutionResult]) -> Callable[..., ExecutionResult]:
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


def _block(backend: Any, items: Sequence[FirstReturnPrompt], sites: Sequence[int],
           selector: PositionSelector) -> RowBlock:
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


def extract_codeexec(cfg: CodeexecExtractConfig, *, backend: Any = None,
                     executor: Callable[..., ExecutionResult] = run_python,
                     log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> dict[str, Any]:
    """Run (or resume) the capture into ``cfg.out``; returns counts and the store path."""
    from activations.extract import storage_dtype_for
    from memtoc.provenance import git_revision

    selector = PositionSelector.parse(cfg.positions)
    if selector.needs_generation or "all" in selector.kinds:
        raise ActivationStoreError("codeexec extract captures prompt positions: last_input, tool_span, "
                                   "from_tool_return")
    problems = select_problems(cfg.seed, cfg.split, cfg.limit)
    specs = [TrialSpec(problem=p, condition=c, policy=cfg.policy) for p in problems for c in cfg.conditions]
    if backend is None:
        from memtoc.backends.factory import load_backend

        backend = load_backend(cfg.model_spec)
    if not isinstance(backend, InspectableBackend):
        raise ActivationStoreError(f"backend {getattr(backend, 'name', type(backend).__name__)!r} has no forward "
                                   "pass with capture; use the hf backend")
    fmt = formatter_for(backend, cfg.agent.protocol)
    parts = backend.parts
    sites = parse_layers(cfg.layers, parts.n_sites)
    prov = backend.provenance()
    weights_sha = (prov.get("weights") or {}).get("sha256")
    storage = storage_dtype_for(cfg.store_dtype, str(prov.get("dtype")))
    identity = {"family": "codeexec", "model": weights_sha or prov.get("model"),
                "chat_template_sha256": prov.get("chat_template_sha256"), "model_dtype": prov.get("dtype"),
                "problems_sha256": problems_sha256(generate_problems(cfg.seed)), "problem_seed": cfg.seed,
                "policy": cfg.policy, "protocol": fmt.protocol, "agent": cfg.agent.to_dict(), "sites": list(sites),
                "positions": list(selector.kinds), "storage_dtype": storage}
    provenance = {
        "model_id": str(prov.get("model")), "weights_sha256": str(weights_sha), "weights": prov.get("weights"),
        "architecture": str(prov.get("architecture")), "model_dtype": str(prov.get("dtype")),
        "device": str(prov.get("device")), "n_layers": int(prov.get("n_layers") or parts.n_layers),
        "chat_template_sha256": str(prov.get("chat_template_sha256")), "benchmark": "codeexec",
        "package_version": memtoc.__version__, "git": git_revision(), "versions": prov.get("versions"),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.flat(), "positions": list(selector.kinds),
        "capture_point": "the final prompt token after the first (scripted) tool return",
        "site_convention": "site 0 = embedding output (input of block 0); site s = output of block s-1",
    }
    d_model = parts.d_model
    writer = ActivationWriter.open(cfg.out, identity=identity, provenance=provenance, sites=sites, d_model=d_model,
                                   storage_dtype=storage)
    run = _memoized(executor)
    n_new = 0
    todo = [s for s in specs if f"{s.problem.id}|{s.condition}|{s.policy}" not in writer.done]
    bar = tqdm(total=len(todo), desc="codeexec extract", unit="prompt", disable=not cfg.progress, file=sys.stderr)
    try:
        for lo in range(0, len(todo), cfg.agent.batch_size):
            items = first_return_prompts(todo[lo:lo + cfg.agent.batch_size], fmt, cfg.agent, executor=run)
            writer.append(_block(backend, items, sites, selector))
            n_new += len(items)
            bar.update(len(items))
        complete = writer.finish(planned=[f"{s.problem.id}|{s.condition}|{s.policy}" for s in specs])
        n_done = writer.n_episodes
    finally:
        bar.close()
        writer.close()
    if n_new == 0:
        log(f"{cfg.out}: nothing left to extract ({n_done} prompts already stored)")
    return {"path": Path(cfg.out), "n_planned": len(specs), "n_new": n_new, "n_done": n_done, "complete": complete}
