"""One run-result type: MemToC, the code executor and the agent task all return a ``RunResult`` from the one
evaluate job, and the Python API's ``Run`` reads any family's run directory (records, summary, metric table)
as the job returned it."""

from __future__ import annotations

import json
import re

import pytest

import memtoc as mt
from memtoc.backends.base import Generation
from memtoc.core.backend_kinds import GENERATE, GUIDED
from memtoc.core.errors import RunStoreError
from memtoc.core.values import build_config
from memtoc.runs.result import RUN_FILES, RunResult, read_records, run_family
from memtoc.tasks.agent.task import AgentRunConfig, evaluate_agent
from memtoc.tasks.codeexec.problems import generate_problems
from memtoc.jobs.codeexec import evaluate_codeexec
from memtoc.tasks.codeexec.run import CodeexecRunConfig
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from tests.memtoc.tasks.codeexec.test_agent import FakeBackend, script

MEMTOC = {"benchmark": "demo", "limit": 1, "max_new_tokens": 4, "conditions": "tool_wrong,tool_right",
          "progress": False}
CODEEXEC = {"conditions": "no_tool,P0,P1-", "limit": 1, "n_boot": 50, "progress": False}
AGENT = {"limit": 25, "slice": "all", "n_boot": 50, "question_set": "all"}


def _codeexec_backend() -> FakeBackend:
    ps = [p for p in generate_problems(0) if p.split == "heldout"][:1]
    return FakeBackend(script({p.question: p for p in ps}))


class AgentBackend:
    """A text backend for the agent loop: "Paris" closed-book, one capital-tool call per episode, then Tokyo."""

    name, chat, tokenizer = "scripted", False, None
    capabilities = frozenset({GENERATE, GUIDED})
    CALL = "<tool_call>" + json.dumps({"name": "country_capital_lookup", "arguments": {"country": "X"}}) + "</tool_call>"

    def _gen(self, texts, cfg, *rest, **kw):
        out = []
        for t in texts:
            last = t.rsplit("\n\n", 2)[-2]
            r = ("CALL" if "Reply with exactly one word" in last else "FINAL: Tokyo"
                 if last.startswith("User: Tool result:") or "Give your final answer now" in last else self.CALL)
            out.append(Generation(text=r, n_prompt_tokens=len(t), n_new_tokens=len(r), stop_reason="eos"))
        return out

    generate_formatted = generate_guided = _gen

    def generate(self, prompts, cfg, edit=None):
        return [Generation(text="FINAL: Paris", n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")
                for _ in prompts]

    def provenance(self):
        return {"backend": "scripted", "model": "scripted", "weights": {"sha256": "0"}, "dtype": "float32",
                "chat_template_sha256": None}


def _agent_backend() -> AgentBackend:
    return AgentBackend()


def _masked(records: list[dict]) -> list[str]:
    """Records as JSON with the sandbox's wall-clock durations masked (they differ run to run)."""
    return [re.sub(r'"duration_s": [0-9.e-]+', '"duration_s": 0', json.dumps(r, sort_keys=True)) for r in records]


@pytest.fixture(scope="module")
def runs(tiny_backend, tmp_path_factory) -> dict[str, RunResult]:
    root = tmp_path_factory.mktemp("families")
    return {
        "memtoc": evaluate(build_config(EvaluationConfig, {**MEMTOC, "out": str(root / "memtoc")}),
                           backend=tiny_backend, log=lambda s: None),
        "codeexec": evaluate_codeexec(build_config(CodeexecRunConfig, {**CODEEXEC, "out": str(root / "codeexec")}),
                                      _codeexec_backend()),
        "agent": evaluate_agent(build_config(AgentRunConfig, {**AGENT, "out": str(root / "agent")}),
                                backend=_agent_backend()),
    }


def test_the_three_families_return_the_same_type(runs) -> None:
    assert {type(r) for r in runs.values()} == {RunResult}
    for family, res in runs.items():
        assert res.family == family and run_family(res.root) == family
        assert res.records and res.n_new == len(res.records) + res.new.get("closed_book", 0)
        assert res.table_text and res.summary == json.loads((res.root / "summary.json").read_text())
    m, cx, ag = runs["memtoc"], runs["codeexec"], runs["agent"]
    # MemToC's two parts, under their old names too; its store; its metric table behind the text
    assert m.new == {"closed_book": 1, "episodes": 2} and (m.n_closed_book_new, m.n_episodes_new) == (1, 2)
    assert m.store.root == m.root and m.table.format_text() == m.table_text
    assert m.summary["metrics"] == m.table.to_dict()
    assert cx.new == {"trials": 3} and cx.store is None and [r.to_dict() for r in cx.table] == cx.summary["rows"]
    assert ag.new == {"agent_episodes": 25} and ag.store is None and ag.table is None
    assert (cx.n_closed_book_new, cx.n_episodes_new) == (0, 0)


def test_run_reads_every_familys_run_directory(runs) -> None:
    for family, res in runs.items():
        opened = mt.Run.open(res.root)
        assert opened.result is None and opened.family == family
        assert sorted(_masked(opened.records)) == sorted(_masked(res.records))
        assert opened.records == read_records(res.root) and opened.summary == res.summary
        assert str(opened.metrics) == res.table_text
        assert len(opened.to_pandas()) == len(res.records)
        # the job's own result, viewed the same way
        view = mt.Run(res.root, res)
        assert view.family == family and view.records is res.records and view.summary is res.summary
        assert opened.metrics.to_dict() == view.metrics.to_dict()
        assert list(opened.metrics.to_pandas().columns) == list(view.metrics.to_pandas().columns)
    m, cx, ag = (mt.Run.open(runs[f].root) for f in ("memtoc", "codeexec", "agent"))
    assert m.metrics.to_dict() == runs["memtoc"].summary["metrics"]
    assert cx.metrics.to_dict() == {"rows": runs["codeexec"].summary["rows"]}
    assert ag.metrics.to_dict() == {"arms": runs["agent"].summary["arms"]}
    df = cx.metrics.to_pandas()
    p1 = df[(df.condition == "P1-") & (df.metric == "adoption")].iloc[0]
    assert p1.value == runs["codeexec"].summary["rows"][2]["adoption"]["value"] == 1.0
    df = ag.metrics.to_pandas()
    assert set(df.metric) == {"agreement", "execution_rate"} and set(df.protocol) == {"auto"}


def test_read_run_gives_the_jobs_result_back(runs) -> None:
    from memtoc.core.tasks import get_task

    for family, res in runs.items():
        back = get_task(family).read_run(res.root)
        assert isinstance(back, RunResult) and back.n_new == 0 and back.family == family
        assert back.table_text == res.table_text and back.summary == res.summary
        assert set(back.new) == set(res.new) and not any(back.new.values())


def test_the_api_evaluates_every_family_into_a_run(runs, tiny_backend, tmp_path) -> None:
    m = mt.evaluate(backend=tiny_backend, out=tmp_path / "m", log=lambda s: None, **MEMTOC)
    cx = mt.evaluate(family="codeexec", backend=_codeexec_backend(), out=tmp_path / "cx", log=lambda s: None,
                     **CODEEXEC)
    ag = mt.evaluate(family="agent", backend=_agent_backend(), out=tmp_path / "ag", log=lambda s: None, **AGENT)
    for family, run in (("memtoc", m), ("codeexec", cx), ("agent", ag)):
        assert isinstance(run, mt.Run) and isinstance(run.result, RunResult) and run.family == family
        assert _masked(run.records) == _masked(runs[family].records)
        _, name, _ = RUN_FILES[family]
        assert (run.path / name).is_file()
    assert m.records == runs["memtoc"].records
    assert (ag.path / "agent_episodes.jsonl").read_bytes() == (runs["agent"].root / "agent_episodes.jsonl").read_bytes()
    assert cx.metrics.to_dict() == {"rows": runs["codeexec"].summary["rows"]}
    with pytest.raises(mt.APIError, match="family must be memtoc, codeexec or agent"):
        mt.evaluate(family="nope")
    with pytest.raises(mt.APIError, match="policy"):
        mt.evaluate(family="codeexec", policy="Nope", out=tmp_path / "bad")


def test_each_familys_run_json_names_its_schema(runs, tmp_path) -> None:
    from memtoc.runs.runstore import RUN_SCHEMA
    from memtoc.tasks.codeexec.run import RUN_SCHEMA as CODEEXEC_SCHEMA

    assert RUN_FILES["memtoc"][0] == RUN_SCHEMA and RUN_FILES["codeexec"][0] == CODEEXEC_SCHEMA
    for family, res in runs.items():
        assert json.loads((res.root / "run.json").read_text())["schema_version"] == RUN_FILES[family][0]
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(RunStoreError, match="not an evaluation run directory"):
        run_family(tmp_path)


def test_opening_what_is_no_run_directory_fails_at_open_in_one_line(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    for path, says in ((tmp_path / "missing", "no such run directory"),
                       (tmp_path / "empty", "is not a run directory (no run.json)"),
                       (tmp_path / "file.txt", "is not a run directory")):
        with pytest.raises(RunStoreError) as err:
            mt.Run.open(path)
        assert str(path) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)
