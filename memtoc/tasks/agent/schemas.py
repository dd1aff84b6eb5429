"""The tool schema of every question of a benchmark: the release's ToolHop schemas where the episode files carry
them, else the authored schemas shipped with the demo set (``data/demo/tool_schemas.json``).

The demo schemas are kept out of :class:`memtoc.bench.questions.Question` on purpose: attaching them there would
switch the demo's ``evaluate`` prompts to the schema frame (``Benchmark.default_frame``) and change every
existing demo run's identity. Only the agent tasks read them.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from memtoc.tasks.agent.calls import check_schema
from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import sha256_json

__all__ = ["DEMO_SCHEMAS", "load_demo_schemas", "tool_schemas"]

DEMO_SCHEMAS = "data/demo/tool_schemas.json"
_SCHEMA_VERSION = "memtoc-demo-tool-schemas-v1"


def load_demo_schemas(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Question id -> tool schema, every schema checked (file/row/field named on a malformed one)."""
    p = Path(path) if path is not None else Path(str(resources.files("memtoc").joinpath(DEMO_SCHEMAS)))
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchmarkDataError(f"cannot read tool schemas: {exc}", path=p) from None
    if not isinstance(doc, dict) or doc.get("schema_version") != _SCHEMA_VERSION:
        raise BenchmarkDataError(f"expected schema_version {_SCHEMA_VERSION!r}", path=p, field="schema_version")
    schemas = doc.get("schemas")
    if not isinstance(schemas, dict):
        raise BenchmarkDataError("expected an object of question id -> schema", path=p, field="schemas")
    for qid, schema in schemas.items():
        check_schema(schema, path=str(p), row=qid)
    return schemas


def tool_schemas(bench: Any, question_ids: Any) -> tuple[dict[str, Mapping[str, Any]], str]:
    """Schemas of ``question_ids`` (a question's own schema first, then the demo file), and the hash of every
    schema the benchmark has (not only the selected ones, so a larger ``--limit`` keeps a run's identity).

    A selected question without a schema is refused, naming it: an agent episode without a tool cannot run.
    """
    demo = load_demo_schemas() if bench.name == "demo" else {}
    every = {q.id: q.tool_schema or demo.get(q.id) for q in bench.questions}
    out: dict[str, Mapping[str, Any]] = {}
    for qid in question_ids:
        schema = every.get(qid)
        if schema is None:
            raise BenchmarkDataError(f"question {qid} has no tool schema (the agent tasks need one per question)",
                                     path=bench.name, row=qid, field="tool_schema")
        out[qid] = schema
    return out, sha256_json({k: v for k, v in every.items() if v is not None})
