"""``memtoc finetune crossfit``: a fold pair of LoRA arms, evaluated held out, merged, compared with base.

For each objective (SFT, DPO, or both, identical but for the objective): train on fold A and evaluate on fold B,
then the reverse. Evaluation is :func:`memtoc.jobs.evaluate.evaluate` with the adapter applied, so closed-book
answers are re-elicited by the adapted model and cells recomputed from them; the untreated base model is evaluated
on the same questions. The two held-out halves are merged into one run directory per arm and compared with base on
the units whose cell agrees in both, with the support drift beside every change.

Directory layout::

    OUT/crossfit.json                      config, splits, data and adapter hashes, run directories
    OUT/data/train<F>.jsonl(.meta.json)    pairs of fold F (shared by the matched SFT and DPO adapters)
    OUT/adapters/<obj>-train<F>/           adapter trained on fold F
    OUT/runs/base, OUT/runs/prompt-<X>     untreated (and optionally prompted) base model, all questions
    OUT/runs/<obj>-train<F>-eval<G>/       adapter of fold F evaluated on fold G
    OUT/arms/<obj>/                        merged held-out records of both halves
    OUT/compare/<obj>.{json,txt}           paired comparison with base on common cells
    OUT/table.{md,json}                    side by side
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.runtime import GenerationConfig
from memtoc.backends.factory import load_backend, require_inspectable
from memtoc.bench.benchmark import Benchmark, load_benchmark
from memtoc.core.config import (MODEL_AS_GIVEN, EpisodeSelection, Intervention, JobSettings, ModelSpec, flat_record,
                                with_fields)
from memtoc.core.errors import MemtocError
from memtoc.bench.episodes import parse_formulations, plan_episodes
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig, closed_book_key, resolve_protocol
from memtoc.core.fileio import write_json_atomic
from memtoc.jobs.finetune.compare import compare_on_common_support, merge_held_out
from memtoc.jobs.finetune.data import build_pairs, make_pair_set, write_pair_set
from memtoc.jobs.finetune.folds import FoldSplit, crossfit_splits
from memtoc.jobs.finetune.table import ArmInput, side_by_side, write_table
from memtoc.jobs.finetune.jobs import TRAINING_DTYPE_HELP, TRAINING_PROMPTS_HELP, TrainSettings
from memtoc.jobs.finetune.train_config import TrainConfig
from memtoc.core.config import ExecutorSettings
from memtoc.jobs.executor import WorkUnit, executor_of, run_waves
from memtoc.bench.protocol import paper_helps
from memtoc.core.options import here, opt, option
from memtoc.runs.runstore import RunStore, read_run_info

CROSSFIT_SCHEMA = "memtoc-crossfit-v1"


@dataclass
class CrossfitConfig:
    """One fold pair: the evaluator's pieces plus the training settings shared by the matched SFT and DPO adapters.

    ``selection.question_set`` is all or analysis (then split by the benchmark's folds); ``formulations`` are
    the training and evaluation formulations; ``intervention.prompt_intervention`` other than none adds a
    prompting arm (base evaluated with it); ``generation.batch_size`` is the evaluation batch.
    """
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-dir", "adapter": "input-dir", "edit": "input"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = ("backend", *MODEL_AS_GIVEN, "edit", "stop_at_final_line",
                                             "temperature", "n_boot")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        **paper_helps("closed_book", formulations=TRAINING_PROMPTS_HELP), "dtype": here(TRAINING_DTYPE_HELP),
        "conditions": here("evaluation conditions"),
        "question_set": here("the questions results are computed on (the paper: analysis)",
                             choices=("all", "analysis")),
        "prompt_intervention": here("also evaluate base with this prompt intervention (the prompting arm)"),
        "batch_size": here("evaluation prompts per batch"),
        "out": here("output directory (data/, adapters/, runs/ and arms/ inside)", required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    # the fields a protocol fills are None (not given), resolved at the job's start (resolve_protocol); the
    # question set is the cross-fit's own (its folds): no protocol fills it
    selection: EpisodeSelection = field(default_factory=lambda: EpisodeSelection(formulations=None))
    intervention: Intervention = field(default_factory=lambda: Intervention(closed_book=None))
    generation: GenerationConfig = field(
        default_factory=lambda: GenerationConfig(max_new_tokens=None, stop_at_final_line=None))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/finetune"))
    objective: str = field(default="both", metadata=opt("sft, dpo or both (matched settings)",
                                                        choices=("sft", "dpo", "both")))
    #: the training options (--r, --lr, ...); ``train`` is made from them unless given whole (Python callers)
    training: TrainSettings = field(default_factory=TrainSettings)
    train: TrainConfig | None = None
    #: the paper's construction: folds cut on the 575-question pool, pairs on the Reference formulation only
    fold_pool: str = field(default="all", metadata=opt(
        "the questions the cross-fitting folds are cut on and the adapters trained on: all = the 575-question "
        "construction pool (paper App. B: the 33 excluded questions are present in training, excluded only when "
        "results are computed); analysis = the analysis set only", choices=("all", "analysis")))
    train_formulations: str = field(default="reference", metadata=opt(
        "formulations of the training pairs (paper App. B: reference, two pairs per question, 574/576 per fold); the "
        "evaluation formulations are --formulations"))
    #: the evaluation protocol of every evaluation of the cross-fit (memtoc.bench.protocol; paper = App. B's runner)
    protocol: str = field(default="none", metadata=option("protocol"))
    #: where the pieces run (--executor ray: one Ray task per piece, then the usual merge)
    execution: ExecutorSettings = field(default_factory=ExecutorSettings)

    def __post_init__(self) -> None:
        if self.train is None:
            self.train = self.training.train_config("sft")

    def objectives(self) -> tuple[str, ...]:
        if self.objective == "both":
            return ("sft", "dpo")
        if self.objective in ("sft", "dpo"):
            return (self.objective,)
        raise MemtocError(f"unknown objective {self.objective!r}; choose sft, dpo or both")

    def to_dict(self) -> dict[str, Any]:
        """The cross-fit's record (crossfit.json): ``train`` stands for the training options, and where the
        pieces ran is not part of it."""
        skip = {f.name for f in fields(TrainSettings)} | {f.name for f in fields(ExecutorSettings)}
        return {k: v for k, v in flat_record(self).items() if k not in skip}


@dataclass
class CrossfitResult:
    out: Path
    manifest: dict[str, Any]
    table_markdown: str


def _eval_cfg(cfg: CrossfitConfig, out: Path, **kw: Any) -> EvaluationConfig:
    """An evaluation of this cross-fit (``cfg`` resolved: :func:`resolve_protocol`): its pieces on the hf backend,
    untreated unless ``kw`` (fields by name: ``limit``, ``adapter``, ...) says otherwise."""
    return with_fields(EvaluationConfig(
        model_spec=replace(cfg.model_spec, backend="hf"), selection=cfg.selection,
        intervention=replace(cfg.intervention, prompt_intervention="none", edit=None), generation=cfg.generation,
        job=replace(cfg.job, out=str(out)), protocol=cfg.protocol), kw)


def _fold_slice(bench: Benchmark, split: FoldSplit) -> tuple[str, int]:
    """The ``fold-G`` question set and the limit that covers every held-out question of ``split``.

    Folds keep benchmark order, so the first N questions of the selection that fall in fold G are a prefix
    of fold G when the selection is "all"; with "analysis" a few excluded questions may fall inside the
    prefix and are dropped again when the halves are merged.
    """
    order = {q.id: i for i, q in enumerate(bench.fold(split.eval_fold))}
    return f"fold-{split.eval_fold}", max(order[qid] for qid in split.eval_ids) + 1


@dataclass(frozen=True)
class EvaluatedRun:
    """A run directory and its records restricted to this plan (a resumed directory may hold more)."""

    path: Path
    episodes: list[dict[str, Any]]
    closed_book: list[dict[str, Any]]


def _write_merged_arm(root: Path, runs: list[tuple[EvaluatedRun, set[str]]], identity: dict[str, Any]) -> list[dict]:
    records = merge_held_out([(r.episodes, held) for r, held in runs])
    closed = merge_held_out([(r.closed_book, held) for r, held in runs])
    if root.exists():  # derived data: rebuilt from the halves every time, never mixed with an older plan
        shutil.rmtree(root)
    store = RunStore.open(root, identity=identity, run_info={"status": "complete", "kind": "crossfit-merged-arm"})
    store.closed_book.append(closed)
    store.episodes.append(records)
    return [dict(r) for r in records]


def fold_pool_splits(bench: Benchmark, fold_pool: str, question_set: str, limit: int | None = None
                     ) -> tuple[list[Any], list[FoldSplit]]:
    """The paper's cross-fitting (App. B): folds cut on ``fold_pool`` (the 575-question construction pool), each
    adapter trained on its whole training fold, evaluated on the held-out fold's questions of ``question_set``
    (the 542-question analysis set): the excluded questions are in training, never in results.

    Returns the evaluated questions and the two splits (their ``train`` from the pool, ``eval`` from the set).
    """
    for name, value in (("--fold-pool", fold_pool), ("--question-set", question_set)):
        if value not in ("all", "analysis"):
            raise MemtocError(f"crossfit splits the questions by fold itself; {name} must be all or analysis, "
                              f"not {value!r}")
    if fold_pool == "analysis" and question_set == "all":
        raise MemtocError("--question-set all with --fold-pool analysis evaluates questions outside the folds")
    pool = bench.select(fold_pool, limit)
    splits = crossfit_splits(bench, pool)          # raises on any question or chain overlap
    keep = {q.id for q in bench.select(question_set)}
    splits = [replace(s, eval=tuple(q for q in s.eval if q.id in keep)) for s in splits]
    empty = [s.name for s in splits if not s.eval]
    if empty:
        raise MemtocError(f"split(s) {', '.join(empty)} evaluate no question of the {question_set} set; raise --limit")
    return [q for q in pool if q.id in keep], splits


def _plan(cfg: CrossfitConfig) -> tuple[Path, Benchmark, list[Any], list[FoldSplit], str, tuple[str, ...]]:
    bench = load_benchmark(cfg.selection.benchmark)
    questions, splits = fold_pool_splits(bench, cfg.fold_pool, cfg.selection.question_set, cfg.selection.limit)
    frame = bench.default_frame if cfg.intervention.frame == "auto" else cfg.intervention.frame
    return Path(cfg.job.out), bench, questions, splits, frame, parse_formulations(cfg.train_formulations)


def crossfit_arms(cfg: CrossfitConfig) -> list[tuple[str, str | None]]:
    """The independent pieces of a cross-fit, as (arm, split): ``("base", None)``, ``("prompt", None)`` when a
    prompting arm is asked for, and one ``(objective, split name)`` per fold; an executor runs each as one task
    (:func:`crossfit_task`)."""
    _, _, _, splits, _, _ = _plan(cfg)
    arms: list[tuple[str, str | None]] = [("base", None)]
    if cfg.intervention.prompt_intervention and cfg.intervention.prompt_intervention != "none":
        arms.append(("prompt", None))
    return arms + [(obj, s.name) for obj in cfg.objectives() for s in splits]


def _pair_set(cfg: CrossfitConfig, bench: Benchmark, s: FoldSplit, backend: Any, frame: str,
              formulations: tuple[str, ...]) -> Any:
    return make_pair_set(build_pairs(s.train, backend.format_prompt, formulations=formulations, frame=frame),
                         benchmark=bench.name, benchmark_files=bench.files, fold=s.train_fold, frame=frame,
                         formulations=list(formulations), question_set=cfg.fold_pool, limit=cfg.selection.limit)


def _train(cfg: CrossfitConfig, obj: str, s: FoldSplit, pair_set: Any, backend: Any, out: Path,
           log: Callable[[str], None]) -> tuple[Path, Any]:
    """The ``obj`` adapter of ``s``'s training fold (resumed from its last checkpoint), its directory and result."""
    from memtoc.jobs.finetune.train import train_adapter

    adir = out / "adapters" / f"{obj}-train{s.train_fold}"
    fold = {"train": s.train_fold, "eval": s.eval_fold, "eval_question_ids": s.eval_ids}
    return adir, train_adapter(pair_set, backend, adir, cfg.train.matched(obj), log=log, extra_meta={"fold": fold})


def _evaluate_arm(cfg: CrossfitConfig, arm: str, out: Path, bench: Benchmark, backend: Any,
                  log: Callable[[str], None], s: Any = None, adapter: Path | None = None) -> EvaluatedRun:
    """One arm evaluated into its run directory (base or prompt on every question, else the ``arm`` adapter on
    ``s``'s held-out fold), with its records restricted to this plan."""
    if arm == "base":
        ecfg = _eval_cfg(cfg, out / "runs" / "base")
    elif arm == "prompt":
        pi = cfg.intervention.prompt_intervention
        ecfg = _eval_cfg(cfg, out / "runs" / f"prompt-{pi}", prompt_intervention=pi)
    else:   # the adapter as a view (the base stays untouched for later arms), as evaluate --adapter applies it
        qset, lim = _fold_slice(bench, s)
        ecfg = _eval_cfg(cfg, out / "runs" / f"{arm}-{s.name}", question_set=qset, limit=lim, adapter=str(adapter))
        backend = require_inspectable(backend, "an adapter").with_adapter(adapter)
    evaluate(ecfg, backend=backend, log=log)
    planned = plan_episodes(ecfg, bench)
    ids = {ep.episode_id for ep in planned}
    keys = {closed_book_key(ep.question.id, ep.formulation) for ep in planned}
    store = RunStore.read(ecfg.job.out)
    return EvaluatedRun(path=Path(ecfg.job.out),
                        episodes=[r for r in store.episodes.records() if r["episode_id"] in ids],
                        closed_book=[r for r in store.closed_book.records() if r["key"] in keys])


def crossfit_task(cfg: CrossfitConfig, arm: str, split: str | None = None) -> int:
    """One piece of :func:`crossfit_arms` into the same directories :func:`run_crossfit` uses (resumable: an
    adapter continues from its last checkpoint, an evaluation from its last batch). Returns an exit status; a
    user error is one line on stderr (status 2)."""
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)  # noqa: E731
    cfg = resolve_protocol(cfg)      # the protocol's settings where the user set nothing
    try:
        out, bench, _, splits, frame, formulations = _plan(cfg)
        backend = load_backend(replace(cfg.model_spec, backend="hf"))
        if arm in ("base", "prompt"):
            _evaluate_arm(cfg, arm, out, bench, backend, log)
            return 0
        s = next((x for x in splits if x.name == split), None)
        if s is None or arm not in cfg.objectives():
            raise MemtocError(f"no cross-fit piece {arm} {split}; pieces: {crossfit_arms(cfg)}")
        adir, _ = _train(cfg, arm, s, _pair_set(cfg, bench, s, backend, frame, formulations), backend, out, log)
        _evaluate_arm(cfg, arm, out, bench, backend, log, s, adir)
    except MemtocError as exc:
        print(f"memtoc finetune crossfit: error: {arm} {split or ''}: {exc}", file=sys.stderr)
        return 2
    return 0


def run_crossfit(cfg: CrossfitConfig, *, backend: Any = None,
                 log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> CrossfitResult:
    """Train, evaluate held out, merge and compare; every step resumes from what ``cfg.out`` already holds (so
    after an executor ran the pieces, :func:`crossfit_arms`, this only merges, compares and writes the table)."""
    cfg = resolve_protocol(cfg)      # the protocol's settings where the user set nothing: crossfit.json records them
    if executor_of(cfg.execution)[0] != "local" and backend is None:   # the settings are checked before any work
        run_waves(cfg.execution, lambda slots: [[WorkUnit(name=f"{arm}-{split}" if split else arm, arm=arm,
                                                          fn=crossfit_task, args=(cfg, arm, split))
                                                 for arm, split in crossfit_arms(cfg)]],
                  label="crossfit", kept="finished pieces")
    objectives = cfg.objectives()
    out, bench, questions, splits, frame, formulations = _plan(cfg)
    if backend is None:
        backend = load_backend(replace(cfg.model_spec, backend="hf"))
    manifest: dict[str, Any] = {"schema_version": CROSSFIT_SCHEMA, "config": cfg.to_dict(),
                                "benchmark": {"name": bench.name, "files": bench.files},
                                "n_questions": len(questions), "frame": frame,
                                "splits": [{"name": s.name, "train_fold": s.train_fold, "eval_fold": s.eval_fold,
                                            "train_question_ids": s.train_ids, "eval_question_ids": s.eval_ids}
                                           for s in splits],
                                "matched_settings": cfg.train.identity() | {"objective": list(objectives)},
                                "data": {}, "adapters": {}, "runs": {}, "arms": {}, "comparisons": {}}

    # 1. Untreated base (and prompted base) on every selected question.
    log(f"crossfit: base model on {len(questions)} questions -> {out / 'runs' / 'base'}")
    base_run = _evaluate_arm(cfg, "base", out, bench, backend, log)
    manifest["runs"]["base"] = str(base_run.path)
    prompt_run = None
    if cfg.intervention.prompt_intervention and cfg.intervention.prompt_intervention != "none":
        log(f"crossfit: prompting arm ({cfg.intervention.prompt_intervention}) -> "
            f"{out / 'runs' / f'prompt-{cfg.intervention.prompt_intervention}'}")
        prompt_run = _evaluate_arm(cfg, "prompt", out, bench, backend, log)
        manifest["runs"]["prompt"] = str(prompt_run.path)

    # 2. Pairs per training fold (shared by the matched objectives).
    pair_sets = {}
    for s in splits:
        ps = _pair_set(cfg, bench, s, backend, frame, formulations)
        path = write_pair_set(out / "data" / f"train{s.train_fold}.jsonl", ps)
        pair_sets[s.train_fold] = ps
        manifest["data"][s.train_fold] = {"path": str(path), "sha256": ps.sha256, "n_pairs": len(ps.pairs)}

    # 3. Train and evaluate each direction for each objective.
    merged: dict[str, list[dict[str, Any]]] = {}
    for obj in objectives:
        halves: list[tuple[EvaluatedRun, set[str]]] = []
        for s in splits:
            adir, res = _train(cfg, obj, s, pair_sets[s.train_fold], backend, out, log)
            manifest["adapters"][f"{obj}-train{s.train_fold}"] = {"path": str(adir), "sha256": res.adapter_sha256,
                                                                  "steps": res.steps_done}
            log(f"crossfit: {obj} adapter of fold {s.train_fold} on fold {s.eval_fold} ({len(s.eval)} questions)")
            run = _evaluate_arm(cfg, obj, out, bench, backend, log, s, adir)
            manifest["runs"][f"{obj}-{s.name}"] = str(run.path)
            halves.append((run, set(s.eval_ids)))
        arm_dir = out / "arms" / obj
        # the halves' model (an adapter is a view of it), so a study pairs the arm with the base run of its model
        models = {(read_run_info(r.path).get("identity") or {}).get("model") for r, _ in halves}
        if len(models) != 1:
            raise MemtocError(f"{arm_dir}: the held-out halves were made with different models "
                              f"({sorted(map(str, models))})")
        identity = {"kind": "crossfit-merged-arm", "objective": obj, "model": models.pop(),
                    "adapters": {k: v["sha256"] for k, v in manifest["adapters"].items() if k.startswith(obj + "-")},
                    "runs": {str(r.path): sorted(h) for r, h in halves}}
        merged[obj] = _write_merged_arm(arm_dir, halves, identity)
        manifest["arms"][obj] = str(arm_dir)

    # 4. Compare each arm with base on common cells, then the side-by-side table.
    base_records = base_run.episodes
    arms: list[ArmInput] = []
    if prompt_run is not None:
        arms.append(ArmInput("prompt", f"prompting ({cfg.intervention.prompt_intervention})", prompt_run.episodes,
                             str(prompt_run.path)))
    (out / "compare").mkdir(parents=True, exist_ok=True)
    for obj in objectives:
        recs = merged[obj]
        comp = compare_on_common_support(base_records, recs, label=obj.upper(), seed=cfg.job.seed)
        write_json_atomic(out / "compare" / f"{obj}.json", comp.to_dict())
        text = (comp.comparison.format_text() + f"\nsupport: {comp.drift.n_same_cell} units kept, "
                f"{comp.drift.n_changed_cell} changed cell {comp.drift.transitions}\n")
        (out / "compare" / f"{obj}.txt").write_text(text, encoding="utf-8")
        manifest["comparisons"][obj] = {"verdict": comp.comparison.verdict.to_dict(),
                                        "support_drift": comp.drift.to_dict()}
        arms.append(ArmInput(obj, f"LoRA {obj.upper()} (cross-fitted)", recs, manifest["arms"][obj]))
    table = side_by_side(base_records, arms, seed=cfg.job.seed)
    files = write_table(table, out / "table")
    manifest["table"] = {k: str(v) for k, v in files.items()}
    write_json_atomic(out / "crossfit.json", manifest)
    return CrossfitResult(out=out, manifest=manifest, table_markdown=table.markdown())
