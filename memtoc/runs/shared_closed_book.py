"""A shared closed-book pass: ``evaluate --closed-book-from RUN_DIR`` reuses another run's closed-book answers.

The paper elicits the closed-book answer once per model and formulation and shares it across every arm (App. D),
so an arm's cells are identical to its base's; re-eliciting per run gives the same answers only while decoding is
bit-stable, which the paper found it is not across servers (App. G). A source is accepted only when it elicited
memory the way this run would: the same closed-book mode and prompt version, formulations covering this run's,
the same closed-book prompt for every question, an untreated closed book, and (once the model is loaded) the
same weights, chat template and adapter. Each refusal names the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.core.errors import RunStoreError
from memtoc.core.vocab import FORMULATIONS

__all__ = ["ClosedBookSource", "load_closed_book_source"]


def _refuse(path: Path, field: str, there: Any, here: Any, what: str = "") -> RunStoreError:
    return RunStoreError(f"--closed-book-from {path}: field {field} differs ({there!r} there, {here!r} here)"
                         f"{what}; a shared closed-book pass must come from the same model and prompts")


def _short(v: Any) -> Any:
    return v[:12] if isinstance(v, str) and len(v) == 64 else v


@dataclass
class ClosedBookSource:
    """A run whose closed-book answers this run reuses, checked against the settings known before loading."""

    path: Path
    identity: dict[str, Any]
    identity_sha256: str
    records: dict[str, dict[str, Any]]

    def record(self) -> dict[str, Any]:
        """What the run identity and ``run.json`` record: which source, by path and identity hash."""
        return {"kind": "shared", "path": str(self.path), "identity_sha256": self.identity_sha256}

    def check_model(self, identity: Mapping[str, Any]) -> None:
        """Refuse a source made by another model (weights hash; the model id when either has no hash), chat
        template or adapter than ``identity`` (this run's, known once the model is loaded)."""
        src = self.identity
        if src.get("weights_sha256") and identity.get("weights_sha256"):
            fields = ["weights_sha256"]
        else:
            fields = ["model"]
        fields += ["chat_template_sha256", "adapter_sha256", "dtype"]   # float32 and bfloat16 answers differ
        for f in fields:
            if src.get(f) != identity.get(f):
                raise _refuse(self.path, f, _short(src.get(f)), _short(identity.get(f)))

    def answers(self, keys: Sequence[str]) -> list[dict[str, Any]]:
        """The source's closed-book records for ``keys``, marked with where they came from."""
        return [{**self.records[k], "closed_book_source": str(self.path)} for k in keys]


def _formulations(config: Mapping[str, Any]) -> tuple[str, ...]:
    spec = config.get("formulations")
    if spec is None or spec == "all":
        return FORMULATIONS
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return tuple(s.strip() for s in items if s.strip())


def load_closed_book_source(path: str | Path, *, closed_book: str, prompt_version: Any,
                            formulations: Sequence[str], needed: Mapping[str, str], edits_closed_book: bool,
                            max_new_tokens: int | None = None, dtype: str = "auto") -> ClosedBookSource:
    """Read and check a closed-book source before the model loads. ``needed``: closed-book key -> the prompt
    this run would send for it. ``max_new_tokens``: this run's budget (a source with another budget is
    refused when that budget shaped its spans); ``dtype``: this run's, refused early when given explicitly."""
    from memtoc.runs.runstore import RunStore

    p = Path(path).resolve()
    if not p.is_dir():
        raise RunStoreError(f"--closed-book-from {path}: not a run directory")
    store = RunStore.read(p, warn=None)
    info = store.run_info()
    ident = info.get("identity") or {}
    if edits_closed_book:
        raise RunStoreError(f"--closed-book-from {path}: this run's edit applies to the closed-book pass "
                            "(apply_to_closed_book), so its memory cannot come from another run")
    if (info.get("edit") or {}).get("apply_to_closed_book"):
        raise RunStoreError(f"--closed-book-from {path}: field edit: that run's closed-book pass was edited "
                            "(apply_to_closed_book); share an untreated run's closed book")
    if ident.get("closed_book") != closed_book:
        raise _refuse(p, "closed_book", ident.get("closed_book"), closed_book)
    if ident.get("prompt_version") != prompt_version:
        raise _refuse(p, "prompt_version", ident.get("prompt_version"), prompt_version)
    have = _formulations(info.get("config") or {})
    missing = [f for f in formulations if f not in have]
    if missing:
        raise _refuse(p, "formulations", ",".join(have), ",".join(formulations),
                      f" (it has no closed-book pass for {', '.join(missing)})")
    records = {r["key"]: r for r in store.closed_book.records()}
    absent = [k for k in needed if k not in records]
    if absent:
        raise RunStoreError(f"--closed-book-from {path}: field key: no closed-book answer for {len(absent)} of the "
                            f"{len(needed)} (question, formulation) pairs this run needs, e.g. {absent[0]}; run the "
                            "source with the same question set and at least this --limit (or let it finish)")
    for k, prompt in needed.items():
        if records[k].get("prompt") != prompt:
            raise RunStoreError(f"--closed-book-from {path}: field prompt: the closed-book prompt of {k} differs "
                                "from this run's (another benchmark or prompt file)")
    if dtype != "auto" and ident.get("dtype") not in (None, dtype):
        raise _refuse(p, "dtype", ident.get("dtype"), dtype)
    budget = ident.get("max_new_tokens")
    if max_new_tokens is not None and budget is not None and budget != max_new_tokens:
        cut = [k for k in needed if records[k].get("stop_reason") == "max_tokens"
               or int(records[k].get("n_new_tokens") or 0) > max_new_tokens]
        if cut:
            raise _refuse(p, "max_new_tokens", budget, max_new_tokens,
                          f" and the budget shaped {len(cut)} of its {len(needed)} closed-book answers (e.g. {cut[0]}: "
                          "stopped at the budget, or longer than this run's)")
    return ClosedBookSource(path=p, identity=dict(ident), identity_sha256=str(info.get("identity_sha256")),
                            records={k: records[k] for k in needed})
