"""``--protocol paper``, the shared closed-book pass (``--closed-book-from``), generation to the budget with the
last FINAL: marker, and the loud no-schema frame fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.backends.base import cut_at_final_line
from memtoc.cli import main
from memtoc.cli.parse import parse_config
from memtoc.core.errors import RunStoreError
from memtoc.jobs.evaluate import evaluate, resolve_evaluation
from memtoc.tasks.memtoc.evaluation import EvaluationConfig, given_protocol_fields, resolve_protocol
from memtoc.bench.protocol import PAPER_MAX_NEW_TOKENS, protocol_block
from memtoc.scoring import extract_span, score_response
from memtoc.core.vocab import FORMULATIONS
from memtoc.core.config import flat_record, with_fields
from memtoc.core.values import build_config


def _cfg(model_dir, out, bench, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark=str(bench), out=str(out), conditions="tool_right,tool_wrong,no_tool",
                limit=2, batch_size=8, max_new_tokens=8, device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return with_fields(EvaluationConfig(), base)      # made in Python: no record of given fields


class CountingBackend:
    """A backend view that records every prompt it is asked to answer."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, config, *, edit=None):
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, config, edit=edit)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- the protocol's settings --------------------------------------------------------------------------------

def test_paper_protocol_fills_what_the_user_did_not_set():
    given = build_config(EvaluationConfig, {"protocol": "paper", "limit": 5})
    assert given.selection.formulations is None and given.generation.max_new_tokens is None   # not given
    cfg = resolve_protocol(given)
    assert (cfg.selection.question_set, cfg.selection.formulations, cfg.intervention.closed_book) == \
        ("analysis", "all", "forced")
    assert cfg.generation.stop_at_final_line is False and cfg.generation.max_new_tokens == PAPER_MAX_NEW_TOKENS
    assert cfg.selection.limit == 5 and given_protocol_fields(given) == ["limit"]
    # explicit values win; resolving twice changes nothing
    cfg = resolve_protocol(build_config(EvaluationConfig, {"protocol": "paper", "formulations": "paraphrase_a",
                                                           "max_new_tokens": 64}))
    assert (cfg.selection.formulations, cfg.generation.max_new_tokens, cfg.selection.question_set) == \
        ("paraphrase_a", 64, "analysis")
    assert resolve_protocol(cfg) is cfg
    plain = resolve_protocol(EvaluationConfig())
    assert (plain.selection.question_set, plain.selection.formulations, plain.generation.max_new_tokens,
            plain.generation.stop_at_final_line, plain.intervention.closed_book) == \
        ("all", "reference", 128, True, "forced")
    # the resolved config is what run.json records: no None left where the protocol fills
    assert None not in [flat_record(plain)[k] for k in ("question_set", "formulations", "max_new_tokens",
                                                        "stop_at_final_line", "closed_book")]


def test_an_option_given_at_its_default_value_is_given():
    """With None as "not given", a value equal to the ordinary default still wins over the protocol."""
    cfg = resolve_protocol(build_config(EvaluationConfig, {
        "protocol": "paper", "max_new_tokens": 128, "formulations": "reference", "stop_at_final_line": True,
        "question_set": "all"}))
    assert (cfg.generation.max_new_tokens, cfg.selection.formulations, cfg.generation.stop_at_final_line,
            cfg.selection.question_set) == (128, "reference", True, "all")
    assert PAPER_MAX_NEW_TOKENS != 128                                              # the test can fail


def evaluation_config(argv) -> EvaluationConfig:
    """``memtoc evaluate``'s config as the command builds it (an option not typed keeps the config's default:
    None for a protocol-filled one), with its protocol resolved as the job resolves it."""
    return resolve_evaluation(parse_config(argv)[1])


def test_cli_flags_given_explicitly_override_the_protocol_even_at_their_default_value():
    cfg = evaluation_config((["evaluate", "--out", "x", "--protocol", "paper"]))
    assert (cfg.selection.question_set, cfg.selection.formulations, cfg.generation.max_new_tokens,
            cfg.generation.stop_at_final_line) == \
        ("analysis", "all", PAPER_MAX_NEW_TOKENS, False)
    argv = ["evaluate", "--out", "x", "--protocol", "paper", "--formulations", "reference", "--question-set", "all",
            "--max-new-tokens", "128", "--stop-at-final"]
    cfg = evaluation_config(argv)
    assert (cfg.selection.question_set, cfg.selection.formulations, cfg.generation.max_new_tokens,
            cfg.generation.stop_at_final_line) == \
        ("all", "reference", 128, True)
    assert set(given_protocol_fields(parse_config(argv)[1])) == {"question_set", "formulations", "max_new_tokens",
                                                                  "stop_at_final_line"}
    cfg = evaluation_config((["evaluate", "--out", "x", "--generate-to-budget"]))
    assert cfg.generation.stop_at_final_line is False and cfg.selection.formulations == "reference"
    assert cfg.protocol == "none"
    cfg = evaluation_config((["evaluate", "--out", "x", "--chat-template", "off"]))
    assert cfg.model_spec.chat_template is False
    assert evaluation_config((["evaluate", "--out", "x"])).model_spec.chat_template is None


def test_protocol_block_names_every_difference_from_the_paper():
    values = {"question_set": "analysis", "limit": 20, "formulations": "paraphrase_b,reference,paraphrase_a",
              "closed_book": "permissive", "stop_at_final_line": False, "max_new_tokens": PAPER_MAX_NEW_TOKENS,
              "frame": "tool"}
    block = protocol_block("paper", values, given=["closed_book", "limit"])
    assert block["differs_from_paper"] == ["closed_book", "limit"]   # a reordered full formulation list is "all"
    assert block["settings"]["closed_book"] == {"paper": "forced", "run": "permissive", "differs": True,
                                                "source": block["settings"]["closed_book"]["source"]}
    assert block["explicit"] == ["closed_book", "limit"] and block["closed_book_source"] == {"kind": "own pass"}


# -- generation to the budget, the last marker ----------------------------------------------------------------

REVISED = ("The tool says Moor Park.\nFINAL: Moor Park\nWait — I know this one: the park is in Blackpool and it "
           "is Stanley Park.\nFINAL: Stanley Park\n")


def test_last_final_marker_is_the_answer_of_a_model_that_revises_itself():
    assert extract_span(REVISED) == "Stanley Park"
    cut, was_cut = cut_at_final_line(REVISED)   # what stopping at the first FINAL line keeps
    assert was_cut and extract_span(cut) == "Moor Park"
    full = score_response(REVISED, gold="Stanley Park, Blackpool", tool_value="Moor Park, Blackpool",
                          memory_span="Stanley Park", aliases=(), tool_conditioned=True)
    first = score_response(cut, gold="Stanley Park, Blackpool", tool_value="Moor Park, Blackpool",
                           memory_span="Stanley Park", aliases=(), tool_conditioned=True)
    assert full.outcome == "kept_memory" and full.final_correct
    assert first.outcome == "followed_tool" and not first.final_correct
    # a quoted mention of the instruction after the answer is not a marker
    assert extract_span("FINAL: Rome\nQ: ... starts with 'FINAL: ' and then your answer.") == "Rome"


# -- runs: the protocol in run.json, the shared closed-book pass ----------------------------------------------

def test_paper_protocol_run_records_every_setting(tiny_backend, tiny_model_dir, shared_memtoc, tmp_path):
    logs: list[str] = []
    evaluate(_cfg(tiny_model_dir, tmp_path / "a", shared_memtoc, protocol="paper"), backend=tiny_backend,
             log=logs.append)
    info = json.loads((tmp_path / "a" / "run.json").read_text(encoding="utf-8"))
    block = info["protocol"]
    assert block["name"] == "paper"
    s = block["settings"]
    assert set(s) == {"question_set", "limit", "formulations", "closed_book", "stop_at_final_line",
                      "max_new_tokens", "frame"}
    assert s["question_set"]["run"] == "analysis" and s["formulations"]["run"] == "all"
    assert s["stop_at_final_line"]["run"] is False and s["closed_book"]["run"] == "forced"
    assert block["differs_from_paper"] == ["frame", "limit", "max_new_tokens"]
    assert block["closed_book_source"] == {"kind": "own pass"}
    assert info["identity"]["stop_at_final_line"] is False
    # the mapping-only data falls back to the no-schema frame: loudly, and on record
    assert info["frame_fallback"]["used"] == "tool-no-schema" and block["frame_fallback"] == info["frame_fallback"]
    assert any("FRAME FALLBACK" in line for line in logs)
    assert any(line.startswith("protocol paper:") and "max_new_tokens 8 (paper: 512)" in line for line in logs)
    # the analysis set, three formulations, one closed-book answer per question and formulation
    cb = _lines(tmp_path / "a" / "closed_book.jsonl")
    assert sorted({r["formulation"] for r in cb}) == sorted(FORMULATIONS) and len(cb) == 2 * 3
    excluded = set(json.loads((shared_memtoc / "analysis_set_lists.json").read_text())["exclude_qkeys"])
    assert not {r["qkey"] for r in _lines(tmp_path / "a" / "episodes.jsonl")} & excluded
    # the report shows the fallback as an alert and the protocol line in the provenance table
    assert main(["report", str(tmp_path / "a")]) == 0
    page = (tmp_path / "a" / "report.html").read_text(encoding="utf-8")
    assert "frame fallback: the benchmark has no tool schemas" in page
    assert "paper; own closed-book pass; differs: limit 2 (paper None)" in page


def test_shared_closed_book_pass_gives_identical_cells_across_arms(tiny_backend, tiny_model_dir, tmp_path):
    kw = dict(formulations="all", max_new_tokens=6)
    evaluate(_cfg(tiny_model_dir, tmp_path / "base", "demo", **kw), backend=tiny_backend, log=lambda s: None)
    counting = CountingBackend(tiny_backend)
    # the same budget: the base's 6-token spans hit it, so a larger budget is refused
    arm = _cfg(tiny_model_dir, tmp_path / "warn", "demo", prompt_intervention="warn", max_new_tokens=6,
               closed_book_from=str(tmp_path / "base"), formulations="all")
    evaluate(arm, backend=counting, log=lambda s: None)
    base_cb = {r["key"]: r for r in _lines(tmp_path / "base" / "closed_book.jsonl")}
    arm_cb = {r["key"]: r for r in _lines(tmp_path / "warn" / "closed_book.jsonl")}
    assert set(arm_cb) == set(base_cb)
    for k, r in arm_cb.items():
        for f in ("response", "memory_span", "memory_correct", "mem_absent", "prompt"):
            assert r[f] == base_cb[k][f]
    # not one closed-book prompt was sent for the arm (no_tool episodes answer the closed-book prompt once each)
    closed = {r["prompt"] for r in base_cb.values()}
    n_no_tool = len([r for r in _lines(tmp_path / "warn" / "episodes.jsonl") if r["condition"] == "no_tool"])
    assert sum(p in closed for p in counting.prompts) == n_no_tool
    cells = lambda run: {r["episode_id"]: r["cell"] for r in _lines(tmp_path / run / "episodes.jsonl")}  # noqa: E731
    assert cells("warn") == cells("base")
    info = json.loads((tmp_path / "warn" / "run.json").read_text(encoding="utf-8"))
    src = json.loads((tmp_path / "base" / "run.json").read_text(encoding="utf-8"))
    assert info["identity"]["closed_book_source"] == {"kind": "shared", "path": str((tmp_path / "base").resolve()),
                                                      "identity_sha256": src["identity_sha256"]}
    assert info["protocol"]["closed_book_source"] == info["identity"]["closed_book_source"]
    # re-running the arm is a no-op; changing the source is a different run
    again = evaluate(arm, backend=tiny_backend, log=lambda s: None)
    assert again.n_closed_book_new == 0 and again.n_episodes_new == 0


def test_closed_book_source_is_refused_naming_the_field(tiny_backend, tiny_model_dir, tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    try:
        from conftest import build_tiny_model
    finally:
        sys.path.pop(0)
    from memtoc.backends.hf import HFBackend

    evaluate(_cfg(tiny_model_dir, tmp_path / "base", "demo"), backend=tiny_backend, log=lambda s: None)
    src = str(tmp_path / "base")

    def refused(match, **kw):
        with pytest.raises(RunStoreError, match=match):
            evaluate(_cfg(tiny_model_dir, tmp_path / "arm", "demo", closed_book_from=src, **kw),
                     backend=tiny_backend, log=lambda s: None)
        assert not (tmp_path / "arm").exists()   # refused before anything was written

    refused(r"field closed_book differs \('forced' there, 'permissive' here\)", closed_book="permissive")
    refused(r"field formulations differs .*no closed-book pass for paraphrase_a", formulations="reference,paraphrase_a")
    refused(r"field key: no closed-book answer for 1 of the 3", limit=3)
    # another model: refused once its weights are known, before the run directory is written
    other_dir = build_tiny_model(tmp_path / "other", seed=1)
    other = HFBackend.load(str(other_dir), device="cpu", dtype="float32")
    with pytest.raises(RunStoreError, match=r"field weights_sha256 differs"):
        evaluate(_cfg(other_dir, tmp_path / "arm", "demo", closed_book_from=src), backend=other, log=lambda s: None)
    assert not (tmp_path / "arm" / "run.json").exists()
    # another prompt version
    info = json.loads((tmp_path / "base" / "run.json").read_text(encoding="utf-8"))
    info["identity"]["prompt_version"] = "v0"
    (tmp_path / "base" / "run.json").write_text(json.dumps(info), encoding="utf-8")
    refused(r"field prompt_version differs \('v0' there")


def test_cli_refusal_is_one_line_naming_the_field(tiny_backend, tiny_model_dir, tmp_path, capsys):
    evaluate(_cfg(tiny_model_dir, tmp_path / "base", "demo"), backend=tiny_backend, log=lambda s: None)
    rc = main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "demo", "--limit", "2", "--out",
               str(tmp_path / "arm"), "--closed-book", "permissive", "--closed-book-from", str(tmp_path / "base"),
               "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "field closed_book differs" in err and "Traceback" not in err
    rc = main(["evaluate", "--benchmark", "demo", "--out", str(tmp_path / "arm"), "--closed-book-from",
               str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert rc == 2 and "nowhere: no such directory" in err and "Traceback" not in err   # the path contract


def test_generate_to_budget_keeps_text_after_the_first_final_line(tiny_backend, tiny_model_dir, tmp_path):
    run = evaluate(_cfg(tiny_model_dir, tmp_path / "r", "demo", stop_at_final_line=False, max_new_tokens=5),
                   backend=tiny_backend, log=lambda s: None)
    assert run.summary["n_episodes"]["done"] > 0
    recs = _lines(tmp_path / "r" / "episodes.jsonl")
    assert all(r["stop_reason"] != "final_line" for r in recs)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["identity"]["stop_at_final_line"] is False


def test_episodes_command_takes_the_protocol(shared_memtoc, tmp_path, capsys):
    out = tmp_path / "ep.jsonl"
    assert main(["episodes", "--benchmark", str(shared_memtoc), "--protocol", "paper", "--limit", "2",
                 "--conditions", "tool_right", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    eps = _lines(out)
    assert sorted({e["formulation"] for e in eps}) == sorted(FORMULATIONS) and len(eps) == 6
    assert "question set analysis" in captured.out and "FRAME FALLBACK" in captured.err
    assert main(["episodes", "--benchmark", str(shared_memtoc), "--protocol", "paper", "--limit", "2",
                 "--conditions", "tool_right", "--formulations", "reference", "--out", str(out)]) == 0
    assert {e["formulation"] for e in _lines(out)} == {"reference"}


def test_raw_completion_mode_from_the_cli(tiny_backend, tiny_model_dir, tmp_path):
    """``--chat-template off``: the prompt text itself is the model's input (base models); the run says so, and a
    closed-book pass made through the chat template is not shared with it."""
    evaluate(_cfg(tiny_model_dir, tmp_path / "chat", "demo"), backend=tiny_backend, log=lambda s: None)
    common = ["--model", str(tiny_model_dir), "--benchmark", "demo", "--limit", "2", "--conditions", "tool_right",
              "--max-new-tokens", "4", "--device", "cpu", "--dtype", "float32", "--no-progress", "--chat-template", "off"]
    assert main(["evaluate", *common, "--out", str(tmp_path / "raw")]) == 0
    info = json.loads((tmp_path / "raw" / "run.json").read_text())
    assert info["provenance"]["chat_template"] is False and info["identity"]["chat_template_sha256"] is None
    chat_info = json.loads((tmp_path / "chat" / "run.json").read_text())
    assert chat_info["identity"]["chat_template_sha256"]
    from memtoc.backends.hf import HFBackend

    raw = HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32", chat=False)
    assert raw.format_prompt("Q: x\n") == "Q: x\n" and tiny_backend.format_prompt("Q: x\n") != "Q: x\n"
    with pytest.raises(RunStoreError, match="field chat_template_sha256 differs"):
        evaluate(_cfg(tiny_model_dir, tmp_path / "arm", "demo", chat_template=False,
                      closed_book_from=str(tmp_path / "chat")), backend=raw, log=lambda s: None)
