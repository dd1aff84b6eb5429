"""Resolve a benchmark spec ("demo", a MemToC release or mapping folder, or one file) into questions.

A ``Benchmark`` is what every job starts from: the questions (with distractors, aliases and, where the
release files are present, ToolHop tool schemas), the analysis-set exclusions, the cross-fitting folds, and
the sha256 of every file read, for provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import sha256_file
from memtoc.bench.questions import (Question, ReleaseEpisodeFile, read_data_json, apply_repair_overlay, load_mapping,
                              load_release_episodes)
from memtoc.core.vocab import FORMULATIONS, QUESTION_SETS


@dataclass
class Benchmark:
    """Questions plus the lists that select among them, and the hashes of the files they came from."""

    name: str
    questions: list[Question]
    files: dict[str, str] = field(default_factory=dict)
    analysis_exclude_qkeys: frozenset[str] | None = None
    folds: dict[str, str] | None = None          # question id -> fold name
    release_files: dict[str, ReleaseEpisodeFile] = field(default_factory=dict)  # formulation -> file
    #: extra summary of a finished run's scored records, for families with more to say than the metrics (the
    #: transfer set's multiple-choice reading); written into ``summary.json`` under its returned keys
    summarize_records: Callable[[Sequence[dict[str, Any]]], dict[str, Any]] | None = None
    #: a family's own scorer (``memory_status(question, text)``, ``rescore(record)``): the transfer set's MC
    #: matcher (memtoc.bench.transfer.TransferScorer); None = the string matcher
    scorer: Any = None

    @property
    def has_schemas(self) -> bool:
        return all(q.tool_schema is not None for q in self.questions)

    @property
    def default_frame(self) -> str:
        """The release frame (with schema) when every question has its schema, else the no-schema frame."""
        return "tool" if self.has_schemas else "tool-no-schema"

    def analysis_set(self) -> list[Question]:
        if self.analysis_exclude_qkeys is None:
            raise BenchmarkDataError(f"benchmark {self.name!r} has no analysis-set list (analysis_set_lists.json)",
                                     field="analysis_set")
        return [q for q in self.questions if q.qkey not in self.analysis_exclude_qkeys]

    def fold(self, name: str) -> list[Question]:
        if self.folds is None:
            raise BenchmarkDataError(f"benchmark {self.name!r} has no cross-fitting folds", field="folds")
        names = sorted(set(self.folds.values()))
        if name not in names:
            raise BenchmarkDataError(f"unknown fold {name!r}; folds are {', '.join(names)}", field="folds")
        return [q for q in self.questions if self.folds.get(q.id) == name]

    def select(self, question_set: str = "all", limit: int | None = None) -> list[Question]:
        """Questions of a named set ("all", "analysis", "fold-A", ...), the first ``limit`` of them."""
        if question_set == "all":
            qs = list(self.questions)
        elif question_set == "analysis":
            qs = self.analysis_set()
        elif question_set.startswith("fold-"):
            qs = self.fold(question_set[len("fold-"):])
        else:
            raise BenchmarkDataError(f"unknown question set {question_set!r}; choose from {', '.join(QUESTION_SETS)}",
                                     field="question_set")
        if limit is not None:
            if limit < 1:
                raise BenchmarkDataError(f"--limit must be at least 1, got {limit}", field="limit")
            qs = qs[:limit]
        return qs


def load_benchmark(spec: str | Path) -> Benchmark:
    """``"demo"`` -> the packaged demo set; a folder -> MemToC release or mapping folder; a file -> that file;
    ``transfer[:FRAME[:FILE]]`` -> the App. F.1 transfer set (:mod:`memtoc.bench.transfer`; FRAME value|passage,
    FILE default the packaged developer sample)."""
    if str(spec) == "demo":
        return _load_demo()
    if str(spec) == "transfer" or str(spec).startswith("transfer:"):
        return _load_transfer(str(spec))
    path = Path(spec)
    if not path.exists():
        where = ""
        if not path.is_absolute():   # a relative path is read from the current directory, not the checkout
            where = f" (relative paths resolve from the current directory: {path.resolve()})"
        raise BenchmarkDataError(f"benchmark path not found{where}; use 'demo', a MemToC release/mapping folder, a "
                                 "mapping .jsonl or a release episode .json", path=path)
    if path.is_file():
        return _load_single_file(path)
    return _load_folder(path)


def _load_demo() -> Benchmark:
    root = resources.files("memtoc").joinpath("data/demo")
    qpath = Path(str(root.joinpath("questions.jsonl")))
    fpath = Path(str(root.joinpath("folds.json")))
    spath = Path(str(root.joinpath("tool_schemas.json")))
    questions = load_mapping(qpath)
    folds_doc = read_data_json(fpath)
    folds = {qid: name for name, ids in folds_doc["folds"].items() for qid in ids}
    # The demo set's own authored tool schemas (ToolHop style, as the release's): every arm gets the paper's schema
    # frame, with no fallback. A question without one would be a packaging error, named here.
    schemas = read_data_json(spath).get("schemas") or {}
    missing = [q.id for q in questions if q.id not in schemas]
    if missing:
        raise BenchmarkDataError(f"question {missing[0]} has no tool schema", path=spath, field="schemas")
    questions = [replace(q, tool_schema=schemas[q.id]) for q in questions]
    return Benchmark(name="demo", questions=questions,
                     files={"demo/questions.jsonl": sha256_file(qpath), "demo/folds.json": sha256_file(fpath),
                            "demo/tool_schemas.json": sha256_file(spath)},
                     folds=folds)


def _load_transfer(spec: str) -> Benchmark:
    from memtoc.bench.transfer import SAMPLE, TransferScorer, load_transfer, mc_by_condition, to_questions

    parts = spec.split(":", 2)
    frame = parts[1] if len(parts) > 1 and parts[1] else "value"
    path = Path(parts[2]) if len(parts) > 2 else SAMPLE
    items = load_transfer(path)
    return Benchmark(name=f"transfer-{frame}", questions=to_questions(items, frame),
                     files={f"transfer/{path.name}": sha256_file(path), "transfer/frame": frame},
                     summarize_records=lambda recs: {"transfer_mc": mc_by_condition(recs, items)},
                     scorer=TransferScorer(tuple(items)))


def _load_single_file(path: Path) -> Benchmark:
    if path.suffix == ".jsonl":
        return Benchmark(name=path.stem, questions=load_mapping(path), files={path.name: sha256_file(path)})
    release = load_release_episodes(path)
    formulation = FORMULATIONS[release.prompt_variant]
    return Benchmark(name=path.stem, questions=list(release.questions.values()),
                     files={path.name: sha256_file(path)}, release_files={formulation: release})


def _first_existing(*candidates: Path) -> Path | None:
    return next((c for c in candidates if c.exists()), None)


def _load_folder(root: Path) -> Benchmark:
    files: dict[str, str] = {}

    def note(p: Path) -> Path:
        files[str(p.relative_to(root))] = sha256_file(p)
        return p

    mapping = _first_existing(root / "mapping_575.jsonl", root / "distractor_mapping_575.jsonl")
    releases: dict[str, ReleaseEpisodeFile] = {}
    for formulation in FORMULATIONS:
        rp = _first_existing(root / "benchmark" / f"{formulation}.json", root / f"{formulation}.json")
        if rp is not None:
            releases[formulation] = load_release_episodes(note(rp))
    if mapping is None and not releases:
        raise BenchmarkDataError("no benchmark found: expected mapping_575.jsonl or benchmark/reference.json "
                                 "(and paraphrase_a.json, paraphrase_b.json)", path=root)
    if mapping is not None:
        questions = load_mapping(note(mapping))
        if releases:
            # Release files carry the repaired near values and the tool schemas.
            questions = _merge_release(questions, next(iter(releases.values())))
        else:
            overlay = _first_existing(root / "repair_overlay_reference.json",
                                      root / "benchmark" / "repair_overlay" / "repair_overlay_reference.json",
                                      root / "benchmark" / "repair_overlay" / "reference.json")
            if overlay is not None:
                questions = apply_repair_overlay(questions, load_release_episodes(note(overlay)))
            # Without release files only some questions would have schemas; keep all on one frame.
            questions = [replace(q, tool_schema=None) for q in questions]
    else:
        questions = list(next(iter(releases.values())).questions.values())
    exclude = None
    lists = _first_existing(root / "analysis_set_lists.json")
    if lists is not None:
        doc = read_data_json(note(lists))
        if not isinstance(doc.get("exclude_qkeys"), list):
            raise BenchmarkDataError("expected a list", path=lists, field="exclude_qkeys")
        exclude = frozenset(doc["exclude_qkeys"])
        unknown = exclude - {q.qkey for q in questions}
        if unknown:
            raise BenchmarkDataError(f"{len(unknown)} qkeys not in the benchmark, e.g. {sorted(unknown)[0]!r}",
                                     path=lists, field="exclude_qkeys")
    folds = None
    fpath = _first_existing(root / "crossfit_folds.json")
    if fpath is not None:
        doc = read_data_json(note(fpath))
        folds = {}
        for i, row in enumerate(doc.get("rows") or []):
            if "id" not in row or "fold" not in row:
                raise BenchmarkDataError("row needs 'id' and 'fold'", path=fpath, row=i, field="rows")
            folds[row["id"]] = row["fold"]
    return Benchmark(name=root.name, questions=questions, files=files, analysis_exclude_qkeys=exclude,
                     folds=folds, release_files=releases)


def _merge_release(questions: list[Question], release: ReleaseEpisodeFile) -> list[Question]:
    out = []
    for q in questions:
        rq = release.questions.get(q.id)
        if rq is None:
            raise BenchmarkDataError(f"question {q.id} is in the mapping but not in the release file",
                                     path=release.path, row=q.id, field="instance_id")
        if rq.question != q.question or rq.gold_answer != q.gold_answer:
            raise BenchmarkDataError(f"question {q.id}: text or gold answer differs from the mapping",
                                     path=release.path, row=q.id, field="question")
        out.append(replace(q, near=rq.near or q.near, repaired=bool(rq.near and rq.near != q.near),
                           tool_schema=rq.tool_schema))
    return out
