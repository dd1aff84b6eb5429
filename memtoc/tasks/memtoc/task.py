"""The MemToC task: episodes, the closed-book pass then the single-turn tool pass, the one scorer, the metric table.

Its evaluation, extraction and sweep are the MemToC implementations of the task hooks (:mod:`memtoc.core.tasks`);
the jobs that run them are :func:`memtoc.tasks.memtoc.evaluate.evaluate_task`, :func:`activations.extract.extract` and
:func:`memtoc.tasks.memtoc.sweep.run_sweep`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm import tqdm

import memtoc
from memtoc.bench.benchmark import load_benchmark
from memtoc.tasks.memtoc.evaluate import (PROTOCOL_FIELDS, EvaluationConfig, EvaluationResult, _batches, _bind,
                             _generation_fields, closed_book_key, plan_episodes, resolve_protocol, run_identity,
                             score_episode, settings_identity)
from memtoc.scoring.metrics import metric_table
from memtoc.bench.protocol import fallback_warning, frame_fallback, header_lines, protocol_block
from memtoc.core.provenance import git_revision
from memtoc.runs.runstore import RunStore, refuse_if_written
from memtoc.scoring import memory_status
from memtoc.core.tasks import register_task
from memtoc.tasks.memtoc.validate import recorded_identity

__all__ = ["MemtocTask", "MemtocEvaluation", "MemtocExtraction", "MemtocSweep"]


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
        self.cfg = resolve_protocol(self.cfg)    # the protocol's settings where the user set nothing
        self.cfg.check()
        self.batch_size = self.cfg.effective_batch_size()
        self.bench = load_benchmark(self.cfg.benchmark)
        self.episodes = plan_episodes(self.cfg, self.bench)
        refuse_if_written(self.cfg.out)          # a live writer on --out: refuse before the model loads
        self.frame = self.episodes[0].frame if self.episodes else (
            self.bench.default_frame if self.cfg.frame == "auto" else self.cfg.frame)
        self.fallback = frame_fallback(self.cfg.frame, self.frame, self.bench.has_schemas, self.bench.name)
        self.cb_source = self._closed_book_source()
        values = {f: getattr(self.cfg, f) for f in PROTOCOL_FIELDS}
        values["frame"] = self.frame
        self.protocol = protocol_block(self.cfg.protocol, values, given=self.cfg.explicit or (),
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
            self.cfg.closed_book_from, closed_book=self.cfg.closed_book,
            prompt_version=load_prompt_set().prompt_version,
            formulations=sorted({ep.formulation for ep in self.episodes}), needed=needed,
            edits_closed_book=bool(self.edit_spec and self.edit_spec.get("apply_to_closed_book")))

    def header_lines(self) -> list[str]:
        """The run header: the protocol and every setting that differs from the paper; a frame fallback, loudly."""
        lines = header_lines(self.protocol)
        if self.fallback:
            lines.append(fallback_warning(self.fallback))
        return lines

    def settings(self) -> dict[str, Any]:
        identity = settings_identity(self.cfg, self.bench, self.frame, self.edit_spec,
                                     existing=recorded_identity(self.cfg.out))
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
        self.store = RunStore.open(cfg.out, identity=identity, run_info={
            "config": cfg.flat(), "provenance": provenance, "edit": self.edit_spec,
            "package_version": memtoc.__version__, "git": git_revision(), "seed": cfg.seed,
            "benchmark": {"name": bench.name, "files": bench.files}, **extra, "status": "running"})
        if any(self.store.run_info().get(k) != v for k, v in extra.items()):
            self.store.update_run_info(**extra)   # a resumed run: this invocation's protocol record
        return self.store.root

    def solve(self, backend: Any, edit: Any) -> int:
        """The closed-book pass (one answer per question and formulation), then the tool-conditioned pass."""
        cfg, store, gen_cfg, batch_size = self.cfg, self.store, self.cfg.generation, self.batch_size
        edit_closed_book = bool(self.edit_spec and self.edit_spec.get("apply_to_closed_book"))
        cb_needed: dict[str, Any] = {}
        for ep in self.episodes:
            cb_needed.setdefault(closed_book_key(ep.question.id, ep.formulation), ep)
        self.n_closed_book = len(cb_needed)
        cb_todo = [(k, ep) for k, ep in cb_needed.items() if k not in store.closed_book]
        todo = [ep for ep in self.episodes if ep.episode_id not in store.episodes]
        n_cb = n_ep = 0
        bar = tqdm(total=len(cb_todo) + len(todo), desc="evaluate", unit="prompt", disable=not cfg.progress,
                   file=sys.stderr)
        try:
            if self.cb_source is not None and cb_todo:   # the shared pass: copied, never re-elicited
                n_cb += store.closed_book.append(self.cb_source.answers([k for k, _ in cb_todo]))
                bar.update(len(cb_todo))
                cb_todo = []
            for batch in _batches(sorted(cb_todo, key=lambda kv: len(kv[1].closed_book_prompt)), batch_size):
                gens = backend.generate([ep.closed_book_prompt for _, ep in batch], gen_cfg,
                                        edit=_bind(edit, [ep for _, ep in batch], with_tool=False)
                                        if edit_closed_book else None)
                recs = []
                for (key, ep), gen in zip(batch, gens):
                    q = ep.question
                    mem = memory_status(gen.text, q.gold_answer, q.aliases)
                    recs.append({"key": key, "question_id": q.id, "formulation": ep.formulation,
                                 "closed_book_mode": cfg.closed_book, "prompt": ep.closed_book_prompt,
                                 **_generation_fields(gen), "memory_span": mem.span, "mem_absent": mem.mem_absent,
                                 "memory_correct": mem.memory_correct})
                n_cb += store.closed_book.append(recs)
                bar.update(len(batch))
            # Tool-conditioned pass, scored against the closed-book memory of the same formulation.
            for batch in _batches(sorted(todo, key=lambda e: len(e.prompt)), batch_size):
                gens = backend.generate([ep.prompt for ep in batch], gen_cfg, edit=_bind(edit, batch, with_tool=True))
                recs = []
                for ep, gen in zip(batch, gens):
                    mem = store.closed_book.get(closed_book_key(ep.question.id, ep.formulation))
                    rec = score_episode(ep, gen.text, mem)
                    rec.update(_generation_fields(gen))
                    rec["edit"] = self.edit_spec.get("name") if self.edit_spec else None
                    recs.append(rec)
                n_ep += store.episodes.append(recs)
                bar.update(len(batch))
        finally:
            bar.close()
        self.n_cb, self.n_ep = n_cb, n_ep
        return n_cb + n_ep

    def records(self) -> list[dict[str, Any]]:
        planned = {ep.episode_id for ep in self.episodes}
        return [r for r in self.store.episodes.records() if r["episode_id"] in planned]

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        self.table = metric_table(list(records), seed=self.cfg.seed)
        planned = {ep.episode_id for ep in self.episodes}
        extra = self.bench.summarize_records(list(records)) if self.bench.summarize_records else {}
        return {"n_episodes": {"planned": len(planned), "done": len(records)},
                "n_closed_book": self.n_closed_book, "metrics": self.table.to_dict(), **extra}

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> EvaluationResult:
        planned = {ep.episode_id for ep in self.episodes}
        self.store.update_run_info(status="complete" if len(records) == len(planned) else "partial")
        return EvaluationResult(store=self.store, n_closed_book_new=self.n_cb, n_episodes_new=self.n_ep,
                                table_text=self.table.format_text(), summary=summary, table=self.table)


class MemtocExtraction:
    """``memtoc extract``: the evaluator's episodes (same prompts), sorted by prompt length, labels of a run."""

    desc = "extract"
    done_text = "episodes already stored"

    def __init__(self, cfg: Any, selector: Any) -> None:
        from activations import ActivationStoreError
        from activations.extract import storage_dtype_for

        if cfg.batch_size < 1:
            raise ActivationStoreError(f"--batch-size must be at least 1, got {cfg.batch_size}")
        if cfg.store_dtype != "auto":
            storage_dtype_for(cfg.store_dtype, "float32")
        if cfg.compression not in (None, "none", "gzip", "lzf"):
            raise ActivationStoreError(f"unknown compression {cfg.compression!r}; choose gzip, lzf or none")
        if cfg.edit:
            raise ActivationStoreError("extract captures the untreated model; 'edit' is not an extract setting")
        if cfg.max_new_tokens < 1:
            raise ActivationStoreError(f"--max-new-tokens must be at least 1, got {cfg.max_new_tokens}")
        if cfg.compression_level is not None and not 0 <= cfg.compression_level <= 9:
            raise ActivationStoreError(f"--compression-level must be 0-9, got {cfg.compression_level}")
        self.cfg, self.selector = cfg, selector
        self.batch_size = cfg.batch_size
        self.writer_options = {"compression": None if cfg.compression in (None, "none") else cfg.compression,
                               "compression_opts": cfg.compression_level}
        self.bench = load_benchmark(cfg.benchmark)
        self.episodes = plan_episodes(cfg, self.bench)
        self.labels = self.label_source = None

    def settings(self, existing: Mapping[str, Any] | None) -> dict[str, Any]:
        from memtoc.bench.prompts import load_prompt_set, prompt_identity

        cfg = self.cfg
        self.prompts = prompts = load_prompt_set()
        frame = self.episodes[0].frame if self.episodes else cfg.frame
        self.templates = prompts.templates_sha256(frame=frame, intervention=cfg.prompt_intervention,
                                                  closed_book=cfg.closed_book)
        return {
            "benchmark_files": self.bench.files, "prompt_version": prompts.prompt_version,
            **prompt_identity(prompts, self.templates, existing, where=str(cfg.out)),
            "frame": frame, "prompt_intervention": cfg.prompt_intervention, "closed_book": cfg.closed_book,
            "positions": list(self.selector.kinds),
            "max_new_tokens": cfg.max_new_tokens if self.selector.needs_generation else None,
        }

    def bind(self, backend: Any, provenance: Mapping[str, Any]) -> None:
        from activations.extract import run_labels

        if self.cfg.run:
            self.labels, self.label_source = run_labels(self.cfg.run, self.episodes, provenance)

    def identity(self, prov: Mapping[str, Any], settings: Mapping[str, Any], sites: Sequence[int],
                 storage: str) -> dict[str, Any]:
        return {"model": (prov.get("weights") or {}).get("sha256") or prov.get("model"),
                "architecture": prov.get("architecture"), "model_dtype": prov.get("dtype"),
                "chat_template_sha256": prov.get("chat_template_sha256"),
                **settings, "sites": list(sites), "storage_dtype": storage}

    def store_provenance(self, prov: Mapping[str, Any], parts: Any) -> dict[str, Any]:
        import time

        return {
            "model_id": str(prov.get("model")), "model_source": str(prov.get("model_source")),
            "weights_sha256": str((prov.get("weights") or {}).get("sha256")), "weights": prov.get("weights"),
            "architecture": str(prov.get("architecture")), "model_dtype": str(prov.get("dtype")),
            "device": str(prov.get("device")), "n_layers": int(prov.get("n_layers") or parts.n_layers),
            "chat_template_sha256": str(prov.get("chat_template_sha256")), "tokenizer": str(prov.get("tokenizer")),
            "benchmark": self.bench.name, "benchmark_files": self.bench.files,
            "prompt_version": self.prompts.prompt_version, "prompts_sha256": self.prompts.sha256,
            "prompt_templates_sha256": self.templates,
            "package_version": memtoc.__version__, "git": git_revision(),
            "versions": prov.get("versions"), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": self.cfg.flat(), "positions": list(self.selector.kinds),
            "site_convention": "site 0 = embedding output (input of block 0); site s = output of block s-1; "
                               "the last site is the raw block output before the final norm",
        }

    def items(self) -> list[Any]:
        return sorted(self.episodes, key=lambda e: len(e.prompt))

    def key(self, item: Any) -> str:
        return item.episode_id

    def capture(self, backend: Any, batch: Sequence[Any], sites: Sequence[int], selector: Any) -> Any:
        from activations.extract import capture_batch

        return capture_batch(backend, batch, sites, selector, max_new_tokens=self.cfg.max_new_tokens,
                             labels=self.labels)

    def write_labels(self, writer: Any) -> int | None:
        return writer.write_labels(self.labels, source=self.label_source) if self.labels is not None else None


@dataclass
class MemtocSweep:
    """``memtoc sweep``: one MemToC evaluation per strength; metrics, flips and format integrity vs strength 0."""

    cfg: Any
    schema: str = "memtoc-sweep-v1"

    def direction(self, edit: Any) -> str:
        return self.cfg.direction

    def run_config(self, out: Path) -> EvaluationConfig:
        """The sweep's own pieces (hf or vllm: both apply edits), the edit passed as an object."""
        cfg = self.cfg
        return EvaluationConfig(model_spec=cfg.model_spec, selection=cfg.selection,
                                intervention=replace(cfg.intervention, edit=None), generation=cfg.generation,
                                job=replace(cfg.job, out=str(out)))

    def strength_row(self, strength: float, spec_strength: float, records: Sequence[Mapping[str, Any]],
                     base: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        from memtoc.tasks.memtoc.sweep import strength_row

        return strength_row(strength, spec_strength, records, base, n_boot=self.cfg.n_boot, n_perm=self.cfg.n_perm,
                            seed=self.cfg.seed, dev_per_direction=self.cfg.dev_per_direction or None)

    def title(self, edit: Any, direction: str) -> str:
        return f"{edit.name}: {edit.kind} toward {direction} ({edit.positions}, sites {list(edit.layers)})"

    def markdown(self, rows: Sequence[Mapping[str, Any]], title: str) -> str:
        from memtoc.tasks.memtoc.sweep import format_markdown

        return format_markdown(rows, title=title)

    def document(self) -> dict[str, Any]:
        from memtoc.tasks.memtoc.sweep import DEFINITIONS

        return {"config": self.cfg.flat(), "definitions": DEFINITIONS}

    def csv_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        from memtoc.tasks.memtoc.sweep import csv_rows

        return csv_rows(rows)

    def plot(self, rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
        from memtoc.core.plots import sweep_curves

        return sweep_curves(rows, title=title)


class MemtocTask:
    """The MemToC benchmark family (the default task of every job)."""

    name = "memtoc"

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> MemtocEvaluation:
        if options:
            raise TypeError(f"the memtoc task takes no evaluation options, got {', '.join(options)}")
        return MemtocEvaluation(cfg, edit)

    def extraction(self, cfg: Any, selector: Any, **options: Any) -> MemtocExtraction:
        if options:
            raise TypeError(f"the memtoc task takes no extraction options, got {', '.join(options)}")
        return MemtocExtraction(cfg, selector)

    def sweep(self, cfg: Any) -> MemtocSweep:
        return MemtocSweep(cfg)


register_task(MemtocTask())
