"""The agent loop (scripted fake backend, real sandbox), the run directory and resume, and the tiny-model CLI run."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from memtoc.backends.base import Generation
from memtoc.core.runtime import GenerationConfig
from memtoc.tasks.codeexec.agent import (
    TEXT_PROTOCOL_INSTRUCTION,
    AgentConfig,
    ChatFormatter,
    TrialSpec,
    detect_protocol,
    parse_tool_call,
    run_trials,
)
from memtoc.tasks.codeexec.conditions import corrupt_stdout, corrupted_gold
from memtoc.tasks.codeexec.problems import generate_problems
from memtoc.tasks.codeexec.prompts import final_answer_turn, system_prompt
from memtoc.jobs.codeexec import evaluate_codeexec
from memtoc.tasks.codeexec.run import CodeexecRunConfig
from memtoc.core.errors import RunStoreError
from memtoc.core.config import CodeexecTask, JobSettings

_OPS = {"add": "+", "mul": "*"}
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.fixture(scope="module")
def problems():
    ps = generate_problems(0)
    mul = next(p for p in ps if p.op == "mul" and p.split == "heldout")
    add = next(p for p in ps if p.op == "add" and p.split == "heldout")
    return {"mul": mul, "add": add}


def _code(problem) -> str:
    return f"from decimal import Decimal\nprint(Decimal('{problem.a}') {_OPS[problem.op]} Decimal('{problem.b}'))\n"


class FakeBackend:
    """Renders messages as JSON and answers from a script: ``reply(messages, tools) -> text``."""

    def __init__(self, reply, protocol: str = "text") -> None:
        self.reply = reply
        self.protocol = protocol
        self.batches: list[list[dict]] = []

    def format_messages(self, messages, *, tools):
        return json.dumps({"messages": list(messages), "tools": tools})

    def generate_formatted(self, texts, config, *, edit=None):
        assert isinstance(config, GenerationConfig)
        batch = [json.loads(t) for t in texts]
        self.batches.append(batch)
        return [Generation(text=self.reply(b["messages"], b["tools"]), n_prompt_tokens=len(t), n_new_tokens=3,
                           stop_reason="eos") for b, t in zip(batch, texts)]

    def provenance(self):
        return {"backend": "fake", "model": "fake", "weights": {"sha256": "0" * 64}}

    @property
    def n_calls(self) -> int:
        return sum(len(b) for b in self.batches)


def script(by_question):
    """Turn 1: a python block computing the answer; then: FINAL ANSWER = the last number the tool returned."""
    def reply(messages, tools):
        n_assistant = sum(m["role"] == "assistant" for m in messages)
        if n_assistant == 0:
            problem = by_question[messages[1]["content"]]
            return f"Let me compute it.\n```python\n{_code(problem)}```\nThe output will be shown."
        returns = [m["content"] for m in messages if m["role"] == "tool" or
                   (m["role"] == "user" and m["content"].startswith("python_executor output:"))]
        if not returns:
            return "I cannot tell.\nFINAL ANSWER: 0"
        value = _NUM.findall(returns[-1])[-1]
        return f"The tool says {value}.\nFINAL ANSWER: {value}"
    return reply


def _fake(problems, **kw):
    return FakeBackend(script({p.question: p for p in problems.values()}), **kw)


def test_p0_runs_the_code_and_p1_returns_corrupted_numbers(problems):
    mul = problems["mul"]
    backend = _fake(problems)
    specs = [TrialSpec(mul, "P0"), TrialSpec(mul, "P1+")]
    p0, p1 = run_trials(backend, specs)
    # Both trials went through the same batched calls (lockstep): two steps, two rows each.
    assert [len(b) for b in backend.batches] == [2, 2]
    assert all(b["tools"] for batch in backend.batches for b in batch)

    exact = Decimal(mul.a) * Decimal(mul.b)
    call = p0.turns[0]["tool_call"]
    assert call["code"] == _code(mul) and call["source"] == "fence"
    assert call["execution"]["ok"] and call["execution"]["stdout"] == f"{exact}\n"   # really executed
    assert call["tool_return"]["text"] == f"{exact}\n" and not call["tool_return"]["corrupted"]
    assert p0.messages[0]["content"] == f"{system_prompt('P0')} {TEXT_PROTOCOL_INSTRUCTION}"
    assert p0.messages[2] == {"role": "assistant", "content": f"Let me compute it.\n```python\n{_code(mul)}```"}
    assert p0.messages[3]["role"] == "user" and f"{exact}\n" in p0.messages[3]["content"]
    assert p0.tool_calls == 1 and not p0.forced_final and p0.corrupted_numbers == []
    assert p0.graded.correct and p0.graded.adopted is None

    expected = corrupt_stdout(f"{exact}\n", mul.factors.factor("P1+"))
    ret = p1.turns[0]["tool_call"]["tool_return"]
    assert ret["text"] == expected.text != f"{exact}\n" and ret["corrupted"]
    assert ret["factor"] == mul.factors.as_dict()["P1+"]
    assert p1.corrupted_numbers == [str(v) for v in expected.corrupted_values]
    assert expected.text in p1.messages[3]["content"]
    # The model repeated the corrupted number: adoption, not correct.
    assert not p1.graded.correct and p1.graded.adopted is True
    assert p1.graded.matched_corruption is not None
    assert abs(Decimal(p1.graded.answer) - corrupted_gold(mul, "P1+")) <= Decimal("0.001")
    rec = p1.to_record()
    assert rec["adopted"] is True and rec["tool_calls"] == 1 and rec["key"] == f"{mul.id}|P1+|Plain|0"
    json.dumps(rec)


def test_forced_final_turn_has_tools_disabled(problems):
    add = problems["add"]
    backend = _fake(problems)
    (res,) = run_trials(backend, [TrialSpec(add, "P0")], AgentConfig(max_tool_rounds=1))
    assert res.messages[4] == {"role": "user", "content": final_answer_turn()}
    assert res.turns[-1]["kind"] == "forced_final" and res.turns[-1]["tools_offered"] is False
    assert [b[0]["tools"] for b in backend.batches] == [True, False]
    assert res.forced_final and res.graded.correct and res.tool_calls == 1


def test_max_rounds_is_respected(problems):
    add = problems["add"]
    always_code = lambda messages, tools: f"```python\n{_code(add)}```"   # noqa: E731
    executed = []

    def executor(code, **kw):
        from memtoc.tasks.codeexec.sandbox import run_python
        executed.append(code)
        return run_python(code, **kw)

    backend = FakeBackend(always_code)
    (res,) = run_trials(backend, [TrialSpec(add, "P2-")], AgentConfig(max_tool_rounds=2), executor=executor)
    assert len(executed) == 2 and res.tool_calls == 2
    assert backend.n_calls == 3                               # two tool turns, then the forced answer turn
    assert [t["kind"] for t in res.turns] == ["model", "model", "forced_final"]
    assert res.turns[-1]["tool_call"] is None                 # the forced turn's code is not run
    assert len(res.corrupted_numbers) == 2                    # one corrupted sum per return


def test_no_tool_offers_no_tool(problems):
    mul = problems["mul"]
    backend = _fake(problems)

    def executor(code, **kw):  # pragma: no cover - must not be called
        raise AssertionError("no_tool must not execute code")

    (res,) = run_trials(backend, [TrialSpec(mul, "no_tool")], executor=executor)
    assert res.messages[0]["content"] == system_prompt("no_tool")
    assert all(not b["tools"] for batch in backend.batches for b in batch)
    assert res.tool_calls == 0 and res.turns[0]["tool_call"] is None and res.turns[0]["tools_offered"] is False
    # The code-only first turn had no FINAL ANSWER, so the answer was forced.
    assert res.forced_final and res.final_text.endswith("FINAL ANSWER: 0") and res.graded.adopted is None


def test_native_protocol_messages(problems):
    add = problems["add"]

    def reply(messages, tools):
        if messages[-1]["role"] == "tool":
            return f"FINAL ANSWER: {messages[-1]['content'].strip()}"
        return ('Computing.<tool_call>\n{"name": "python_executor", "arguments": {"code": '
                + json.dumps(_code(add)) + "}}\n</tool_call>")

    (res,) = run_trials(FakeBackend(reply, protocol="native"), [TrialSpec(add, "P0")])
    assert TEXT_PROTOCOL_INSTRUCTION not in res.messages[0]["content"]
    asst, tool = res.messages[2], res.messages[3]
    assert asst["content"] == "Computing." and asst["tool_calls"][0]["function"]["arguments"] == {"code": _code(add)}
    assert tool["role"] == "tool" and tool["name"] == "python_executor" and tool["content"].strip() == add.gold
    assert res.graded.correct and res.turns[0]["tool_call"]["source"] == "native"


def test_parse_tool_call_formats():
    code = "print(1)"
    for text in (f'<tool_call>{{"name": "python_executor", "arguments": {{"code": "{code}"}}}}</tool_call>',
                 f'{{"name": "python_executor", "parameters": {{"code": "{code}"}}}}',
                 f'[TOOL_CALLS][{{"name": "python_executor", "arguments": "{{\\"code\\": \\"{code}\\"}}"}}]'):
        call = parse_tool_call(text, "native")
        assert call is not None and call.code == code and call.source == "native" and call.content == ""
    fenced = parse_tool_call("x\n```python\nprint(2)\n```\nimagined output 2", "native")
    assert fenced.code == "print(2)\n" and fenced.source == "fence" and fenced.content == "x\n```python\nprint(2)\n```"
    assert parse_tool_call('{"name": "python_executor", "arguments": {"code": "1"}}', "text") is None
    assert parse_tool_call("```\nprint(3)\n```", "text") is None      # an untagged fence is not a call
    assert parse_tool_call("no code here", "native") is None


def test_detect_protocol(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert detect_protocol(tok) == "text"                     # the fixture's template ignores tools=
    tok.chat_template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }}{% endfor %}\n"
                         "{% endif %}" + tok.chat_template)
    assert detect_protocol(tok) == "native"
    fmt = ChatFormatter(tok)
    msgs = [{"role": "user", "content": "hi"}]
    assert "python_executor" in fmt.format_messages(msgs, tools=True)
    assert "python_executor" not in fmt.format_messages(msgs, tools=False)


def test_generate_formatted_matches_generate(tiny_backend):
    cfg = GenerationConfig(max_new_tokens=4, stop_at_final_line=False)
    prompts = ["What is 1 plus 2?", "Hi"]
    a = tiny_backend.generate(prompts, cfg)
    b = tiny_backend.generate_formatted([tiny_backend.format_prompt(p) for p in prompts], cfg)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and a[0].token_ids


def test_run_directory_and_resume(problems, tmp_path):
    backend = _fake(problems)
    # limit 1 of the held-out split is an add problem: give the fake its question.
    cfg = CodeexecRunConfig(
        job=JobSettings(out=str(tmp_path / "run"), n_boot=50, progress=False),
        task=CodeexecTask(conditions="no_tool,P0,P1-", limit=1))
    ps = [p for p in generate_problems(0) if p.split == "heldout"][:1]
    backend.reply = script({p.question: p for p in ps})
    first = evaluate_codeexec(cfg, backend)
    assert first.n_new == 3 and len(first.records) == 3
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["provenance"]["weights"] == {"sha256": "0" * 64} and run["conditions"] == ["no_tool", "P0", "P1-"]
    assert len(run["problems_sha256"]) == 64 and run["policy"] == "Plain" and run["package_version"]
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["condition"] for r in summary["rows"]] == ["no_tool", "P0", "P1-"]
    assert summary["rows"][2]["adoption"]["value"] == 1.0 and summary["rows"][1]["accuracy"]["value"] == 1.0

    calls = backend.n_calls
    again = evaluate_codeexec(cfg, backend)                   # everything finished: nothing runs
    assert again.n_new == 0 and backend.n_calls == calls
    (tmp_path / "run" / "trials.jsonl").write_text("\n".join(lines[:2]) + "\n")
    third = evaluate_codeexec(cfg, backend)                   # one trial lost: only it runs again
    assert third.n_new == 1 and third.records[2]["condition"] == "P1-"
    with pytest.raises(RunStoreError, match="agent"):
        evaluate_codeexec(CodeexecRunConfig(
            job=JobSettings(n_boot=2000, out=cfg.job.out, progress=False), task=CodeexecTask(conditions="P0", limit=1),
            agent=AgentConfig(max_tool_rounds=1)), backend)


def test_cli_end_to_end_on_tiny_model(tiny_model_dir, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "cx"
    rc = main(["codeexec", "evaluate", "--model", str(tiny_model_dir), "--conditions", "no_tool,P0,P1+",
               "--limit", "2", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--n-boot", "50",
               "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "P1+" in printed
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["condition"] for r in records} == {"no_tool", "P0", "P1+"}
    assert all(r["turns"] and r["messages"][0]["role"] == "system" for r in records)
    run = json.loads((out / "run.json").read_text())
    assert run["protocol"] == "text" and run["provenance"]["weights"]
    assert len(json.loads((out / "summary.json").read_text())["rows"]) == 3
