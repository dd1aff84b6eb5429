"""The MemToC task: episodes, the closed-book pass then the single-turn tool pass, the one scorer, the metric table.

Its evaluation is the MemToC implementation of the task hooks (:mod:`memtoc.core.tasks`), run by
:func:`memtoc.jobs.evaluate.evaluate` (over :func:`memtoc.tasks.evaluation.evaluate_task`); what the extract and sweep
job bodies (:func:`memtoc.jobs.extract.extract`, :func:`memtoc.jobs.sweep.sweep`) call of the family is here as
plain functions: :func:`capture_plan` (the episodes to capture), :func:`strength_config`, :func:`evaluate_strengths`
(one closed book, strengths as rows) and :func:`finished_records`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm import tqdm

import memtoc
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import plan_episodes
from memtoc.tasks.memtoc.evaluation import (PROTOCOL_FIELDS, EvaluationConfig, batches_of, bind_episodes,
                                            check_run_selection, closed_book_key, closed_book_record,
                                            given_protocol_fields, resolve_protocol, run_identity, scored_record,
                                            settings_identity)
from memtoc.scoring.metrics import metric_table
from memtoc.bench.protocol import fallback_warning, frame_fallback, header_lines, protocol_block
from memtoc.core.config import field_value, flat_record
from memtoc.core.provenance import git_revision
from memtoc.runs.result import RunResult, read_summary
from memtoc.runs.runstore import RunStore, read_run_info, refuse_if_written
from memtoc.core.tasks import register_task
from memtoc.tasks.validate import recorded_identity

__all__ = ["MemtocTask", "MemtocEvaluation", "CapturePlan", "capture_plan", "strength_config", "finished_records",
           "evaluate_strengths"]


@dataclass
class MemtocEvaluation:
    """One MemToC evaluation: the planned episodes and the (resumable) run store they are scored into."""

    cfg: EvaluationConfig
    edit: Any = None
    run_kind: str = ""
    done_text: str = "episodes already scored"
    store: Any = None
    episodes: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # Everything that needs no weights is checked here: nothing loads and nothing is written on a user error.
        self.edit_spec = self.edit.spec if self.edit is not None else None
        explicit = given_protocol_fields(self.cfg)
        self.cfg = resolve_protocol(self.cfg)    # the protocol's settings where the user set nothing (None)
        self.cfg.check()
        self.batch_size = self.cfg.effective_batch_size()
        self.bench = load_benchmark(self.cfg.selection.benchmark)
        self.episodes = plan_episodes(self.cfg, self.bench)
        self.planned = {ep.episode_id for ep in self.episodes}
        refuse_if_written(self.cfg.job.out)          # a live writer on --out: refuse before the model loads
        check_run_selection(self.cfg, self.episodes)   # a folder holds one selection: no other is added to it
        self.frame = self.episodes[0].frame if self.episodes else (
            self.bench.default_frame if self.cfg.intervention.frame == "auto" else self.cfg.intervention.frame)
        self.fallback = frame_fallback(self.cfg.intervention.frame, self.frame, self.bench.has_schemas,
                                       self.bench.name)
        self.cb_source = self._closed_book_source()
        values = {f: field_value(self.cfg, f) for f in PROTOCOL_FIELDS}
        values["frame"] = self.frame
        self.protocol = protocol_block(self.cfg.protocol, values, given=explicit,
                                       closed_book_source=self.cb_source.record() if self.cb_source else None,
                                       fallback=self.fallback)

    def _closed_book_source(self) -> Any:
        """The run whose closed-book answers this run reuses (``--closed-book-from``), checked before loading."""
        if not self.cfg.closed_book_from:
            return None
        from memtoc.bench.prompts import load_prompt_set
        from memtoc.runs.shared_closed_book import load_closed_book_source

        needed: dict[str, str] = {}
        for ep in self.episodes:
            needed.setdefault(closed_book_key(ep.question.id, ep.formulation), ep.closed_book_prompt)
        return load_closed_book_source(
            self.cfg.closed_book_from, closed_book=self.cfg.intervention.closed_book,
            prompt_version=load_prompt_set().prompt_version,
            formulations=sorted({ep.formulation for ep in self.episodes}), needed=needed,
            edits_closed_book=bool(self.edit_spec and self.edit_spec.get("apply_to_closed_book")),
            max_new_tokens=self.cfg.generation.max_new_tokens, dtype=self.cfg.model_spec.dtype)

    def header_lines(self) -> list[str]:
        """The run header: the protocol and every setting that differs from the paper; a frame fallback, loudly."""
        lines = header_lines(self.protocol)
        if self.fallback:
            lines.append(fallback_warning(self.fallback))
        return lines

    def settings(self) -> dict[str, Any]:
        identity = settings_identity(self.cfg, self.bench, self.frame, self.edit_spec,
                                     existing=recorded_identity(self.cfg.job.out))
        if self.cb_source is not None:  # only then, so runs with their own closed-book pass keep their identity
            identity["closed_book_source"] = self.cb_source.record()
        return identity

    def open(self, backend: Any, settings: Mapping[str, Any]) -> Path:
        cfg, bench = self.cfg, self.bench
        provenance = backend.provenance()
        identity = run_identity(cfg, bench, provenance, self.frame, self.edit_spec, settings=dict(settings))
        if self.cb_source is not None:   # the model is known now: the source must be the same model
            self.cb_source.check_model(identity)
        extra = {"protocol": self.protocol, "frame_fallback": self.fallback}
        self.store = RunStore.open(cfg.job.out, identity=identity, run_info={
            "config": flat_record(cfg), "provenance": provenance, "edit": self.edit_spec,
            "package_version": memtoc.__version__, "git": git_revision(), "seed": cfg.job.seed,
            "benchmark": {"name": bench.name, "files": bench.files}, **extra, "status": "running"})
        if any(self.store.run_info().get(k) != v for k, v in extra.items()):
            self.store.update_run_info(**extra)   # a resumed run: this invocation's protocol record
        return self.store.root

    def resume_line(self) -> str | None:
        """What a resumed run says before generating: how much of its plan the folder already holds (None for a
        fresh run, and for a finished one, whose "nothing left to run" line says it)."""
        planned = self.planned
        cb_planned = {closed_book_key(ep.question.id, ep.formulation) for ep in self.episodes}
        done = sum(1 for k in planned if k in self.store.episodes)
        cb_done = sum(1 for k in cb_planned if k in self.store.closed_book)
        if (done == 0 and cb_done == 0) or (done == len(planned) and cb_done == len(cb_planned)):
            return None
        return (f"{self.store.root}: resuming: {done} of {len(planned)} episodes and {cb_done} of {len(cb_planned)} "
                f"closed-book answers already done; {len(planned) - done} episodes to run")

    def solve(self, backend: Any, edit: Any) -> int:
        """The closed-book pass (one answer per question and formulation), then the tool-conditioned pass."""
        return self.solve_closed_book(backend, edit) + self.solve_tool_pass(backend, edit)

    def tool_todo(self) -> list[Any]:
        """The episodes of the tool-conditioned pass not scored yet, in the order they are batched."""
        return sorted((ep for ep in self.episodes if ep.episode_id not in self.store.episodes),
                      key=lambda e: len(e.prompt))

    def score_tool_batch(self, batch: Sequence[Any], gens: Sequence[Any]) -> int:
        """Score one batch of the tool-conditioned pass against the closed-book memory and append it."""
        edit_name = self.edit_spec.get("name") if self.edit_spec else None
        recs = [scored_record(ep, gen, self.store.closed_book.get(closed_book_key(ep.question.id, ep.formulation)),
                              self.bench, edit_name) for ep, gen in zip(batch, gens)]
        return self.store.episodes.append(recs)

    def solve_tool_pass(self, backend: Any, edit: Any) -> int:
        """The tool-conditioned pass, scored against the closed-book memory of the same formulation."""
        todo = self.tool_todo()
        n_ep = 0
        with tqdm(total=len(todo), desc="evaluate", unit="prompt", disable=not self.cfg.job.progress,
                  file=sys.stderr) as bar:
            for batch in batches_of(todo, self.batch_size):
                gens = backend.generate([ep.prompt for ep in batch], self.cfg.generation,
                                        edit=bind_episodes(edit, batch, with_tool=True))
                n_ep += self.score_tool_batch(batch, gens)
                bar.update(len(batch))
        self.n_ep = n_ep
        return n_ep

    def solve_closed_book(self, backend: Any, edit: Any) -> int:
        """The closed-book pass: one answer per question and formulation (copied from ``--closed-book-from``)."""
        cfg, store, gen_cfg, batch_size = self.cfg, self.store, self.cfg.generation, self.batch_size
        edit_closed_book = bool(self.edit_spec and self.edit_spec.get("apply_to_closed_book"))
        cb_needed: dict[str, Any] = {}
        for ep in self.episodes:
            cb_needed.setdefault(closed_book_key(ep.question.id, ep.formulation), ep)
        self.n_closed_book = len(cb_needed)
        cb_todo = [(k, ep) for k, ep in cb_needed.items() if k not in store.closed_book]
        n_cb = 0
        with tqdm(total=len(cb_todo), desc="closed book", unit="prompt", disable=not cfg.job.progress,
                  file=sys.stderr) as bar:
            if self.cb_source is not None and cb_todo:   # the shared pass: copied, never re-elicited
                n_cb += store.closed_book.append(self.cb_source.answers([k for k, _ in cb_todo]))
                bar.update(len(cb_todo))
                cb_todo = []
            for batch in batches_of(sorted(cb_todo, key=lambda kv: len(kv[1].closed_book_prompt)), batch_size):
                gens = backend.generate([ep.closed_book_prompt for _, ep in batch], gen_cfg,
                                        edit=bind_episodes(edit, [ep for _, ep in batch], with_tool=False)
                                        if edit_closed_book else None)
                recs = [closed_book_record(ep, gen, self.bench, cfg.intervention.closed_book)
                        for (_, ep), gen in zip(batch, gens)]
                n_cb += store.closed_book.append(recs)
                bar.update(len(batch))
        self.n_cb = n_cb
        return n_cb

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self.store.episodes.records() if r["episode_id"] in self.planned]

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        self.table = metric_table(list(records), seed=self.cfg.job.seed)
        extra = self.bench.summarize_records(list(records)) if self.bench.summarize_records else {}
        return {"n_episodes": {"planned": len(self.planned), "done": len(records)},
                "n_closed_book": self.n_closed_book, "metrics": self.table.to_dict(), **extra}

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> RunResult:
        self.store.update_run_info(status="complete" if len(records) == len(self.planned) else "partial")
        return RunResult(root=self.store.root, records=records, summary=summary, table_text=self.table.format_text(),
                         n_new=n_new, new={"closed_book": self.n_cb, "episodes": self.n_ep}, table=self.table,
                         store=self.store, family="memtoc")


@dataclass
class CapturePlan:
    """What ``memtoc extract`` captures of the MemToC family: the episodes in capture order (the evaluator's own,
    sorted by prompt length), the store-identity fields known before the model loads, and the family's
    provenance attributes (benchmark, prompts)."""

    episodes: list
    settings: dict[str, Any]
    provenance: dict[str, Any]


def capture_plan(cfg: Any, selector: Any, existing: Mapping[str, Any] | None) -> CapturePlan:
    """The episodes of ``cfg`` (an ``ExtractConfig``) and their store settings; ``existing``: the identity an
    existing store recorded (its prompt-template hash is kept when only the hashing changed)."""
    from memtoc.bench.prompts import load_prompt_set, prompt_identity

    bench = load_benchmark(cfg.selection.benchmark)
    episodes = sorted(plan_episodes(cfg, bench), key=lambda e: len(e.prompt))    # batches of alike lengths
    prompts = load_prompt_set()
    frame = episodes[0].frame if episodes else cfg.intervention.frame
    templates = prompts.templates_sha256(frame=frame, intervention=cfg.intervention.prompt_intervention,
                                         closed_book=cfg.intervention.closed_book)
    settings = {
        "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        **prompt_identity(prompts, templates, existing, where=str(cfg.job.out)),
        "frame": frame, "prompt_intervention": cfg.intervention.prompt_intervention,
        "closed_book": cfg.intervention.closed_book,
        "positions": list(selector.kinds),
        "max_new_tokens": cfg.generation.max_new_tokens if selector.needs_generation else None,
    }
    provenance = {"benchmark": bench.name, "benchmark_files": bench.files,
                  "prompt_version": prompts.prompt_version, "prompts_sha256": prompts.sha256,
                  "prompt_templates_sha256": templates}
    return CapturePlan(episodes=episodes, settings=settings, provenance=provenance)


def strength_config(cfg: Any, out: Path, closed_book_from: Path | None = None) -> EvaluationConfig:
    """The evaluation config of one strength of the sweep ``cfg`` (a ``SweepConfig``) into ``out``: the sweep's own
    pieces (hf or vllm: both apply edits), the edit passed as an object; ``closed_book_from``: the run whose
    closed-book answers this strength reuses (the sweep's untreated closed book)."""
    return EvaluationConfig(model_spec=cfg.model_spec, selection=cfg.selection,
                            intervention=replace(cfg.intervention, edit=None), generation=cfg.generation,
                            job=replace(cfg.job, out=str(out)),
                            closed_book_from=None if closed_book_from is None else str(closed_book_from))


def finished_records(evaluations: Mapping[float, MemtocEvaluation], run_dirs: Mapping[float, Path],
                     model: str) -> dict[float, list[dict[str, Any]]] | None:
    """Every strength's records when every run directory is complete with all its planned episodes and was made
    with ``model`` (the identity's model id), read without loading a model; else None."""
    out = {}
    for s, ev in evaluations.items():
        root = run_dirs[s]
        if not (root / "run.json").is_file():
            return None
        info = read_run_info(root)
        if info.get("status") != "complete" or (info.get("identity") or {}).get("model") != model:
            return None
        recs = [r for r in RunStore.read(root, warn=None).episodes.records() if r["episode_id"] in ev.planned]
        if len(recs) != len(ev.planned):
            return None
        out[s] = recs
    return out


def evaluate_strengths(cfg: Any, edits: Mapping[float, Any], run_dirs: Mapping[float, Path], base_dir: Path,
                       backend: Any, log: Any) -> dict[float, list[dict[str, Any]]]:
    """Every strength's evaluation of the sweep ``cfg`` with one closed-book pass and, where the edit allows, one
    tool pass; returns each strength's records. ``edits``: strength -> the steered edit (``base_dir``'s first).

    The untreated closed book of ``base_dir`` (strength 0's run) is reused by every other strength as
    ``--closed-book-from`` does, unless the edit applies to the closed book or a strength's directory was made with
    its own. When the strengths differ only in strength and the edit's kind has row appliers, the tool passes of
    all strengths run as rows of the same batches (:func:`solve_tool_pass_as_rows`), with the same records.
    """
    from memtoc.tasks.evaluation import finish_evaluation, open_evaluation

    share = not any(e.apply_to_closed_book for e in edits.values())
    opened: dict[float, tuple[Any, Path, int]] = {}
    for s, e in edits.items():
        own = run_dirs[s] == base_dir or not share
        old = recorded_identity(run_dirs[s])
        if old is not None and "closed_book_source" not in old:
            own = True                 # made with its own closed book: resumed as it was
        log(f"sweep: strength {s:g} (spec strength {e.strength:g}, toward {cfg.sweep.direction}) -> {run_dirs[s]}"
            + ("" if own else f" (closed book of {base_dir})"))
        job, _, _, root = open_evaluation(strength_config(cfg, run_dirs[s], None if own else base_dir),
                                          backend=backend, edit=e, log=log)
        opened[s] = (job, root, job.solve_closed_book(backend, e))
    first = next(iter(edits.values()))
    if len(edits) > 1 and all(e.has_row_appliers and first.same_but_strength(e) for e in edits.values()):
        n_new = solve_tool_pass_as_rows([opened[s][0] for s in edits], backend, first,
                                        [e.strength for e in edits.values()])
    else:
        n_new = [opened[s][0].solve_tool_pass(backend, e) for s, e in edits.items()]
    out = {}
    for (s, (job, root, n_cb)), n in zip(opened.items(), n_new):
        finish_evaluation(job, root, n_cb + n, log=log)
        out[s] = job.records()
        job.store.close()              # a long-lived worker must not keep the writer locks
    return out


def solve_tool_pass_as_rows(jobs: Sequence[MemtocEvaluation], backend: Any, edit: Any,
                            strengths: Sequence[float]) -> list[int]:
    """The tool-conditioned pass of evaluations that differ only in the edit's strength, as rows of one batch.

    Each batch of episodes (``--batch-size`` episodes, sorted by prompt length as one evaluation sorts them) is
    generated once per strength that still needs it, all in one ``generate`` call with one strength per row
    (``edit.bind(..., strengths=...)``): the rows share the prompt's prefill up to the first edited token and
    decode together; each row is scored into its own evaluation's store. Returns the new records per job.
    """
    todos = [j.tool_todo() for j in jobs]
    todo = [{ep.episode_id for ep in t} for t in todos]
    by_id: dict[str, Any] = {}
    for ep in (ep for t in todos for ep in t):
        by_id.setdefault(ep.episode_id, ep)
    episodes = sorted(by_id.values(), key=lambda e: len(e.prompt))
    n_new = [0] * len(jobs)
    cfg = jobs[0].cfg
    with tqdm(total=sum(len(t) for t in todo), desc="evaluate (strengths as rows)", unit="prompt",
              disable=not cfg.job.progress, file=sys.stderr) as bar:
        for batch in batches_of(episodes, jobs[0].batch_size):
            rows = [(i, ep) for i in range(len(jobs)) for ep in batch if ep.episode_id in todo[i]]
            gens = backend.generate([ep.prompt for _, ep in rows], cfg.generation,
                                    edit=edit.bind([ep.prompt for _, ep in rows],
                                                   [ep.tool_output_span for _, ep in rows],
                                                   strengths=[strengths[i] for i, _ in rows]))
            for i, job in enumerate(jobs):
                mine = [(ep, g) for (k, ep), g in zip(rows, gens) if k == i]
                if mine:
                    n_new[i] += job.score_tool_batch([ep for ep, _ in mine], [g for _, g in mine])
            bar.update(len(rows))
    for j, n in zip(jobs, n_new):
        j.n_ep = n
    return n_new


class MemtocTask:
    """The MemToC benchmark family (the default task of every job)."""

    name = "memtoc"

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> MemtocEvaluation:
        if options:
            raise TypeError(f"the memtoc task takes no evaluation options, got {', '.join(options)}")
        return MemtocEvaluation(cfg, edit)

    def read_run(self, root: Path) -> RunResult:
        """A MemToC run directory read back: its scored episodes, ``summary.json`` and the metric table
        recomputed from the records with the run's seed (as the job computed it)."""
        root = Path(root)
        store = RunStore.read(root, warn=None)
        records = store.episodes.records()
        table = metric_table(records, seed=(read_run_info(root).get("config") or {}).get("seed", 0))
        return RunResult(root=root, records=records, summary=read_summary(root),
                         table_text=table.format_text(), new={"closed_book": 0, "episodes": 0}, table=table,
                         store=store, family="memtoc")


register_task(MemtocTask())
