"""Run identity over the prompt templates a run actually uses (``PromptSet.used_templates``)."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from memtoc.core.errors import RunStoreError
from memtoc.bench.prompts import load_prompt_set, parse_prompt_set, prompt_identity

RAW = resources.files("memtoc").joinpath("data/prompts.json").read_bytes()
RUN = dict(frame="tool-no-schema", intervention="none", closed_book="forced")


def _variant(edit) -> bytes:
    data = json.loads(RAW)
    edit(data)
    return json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8")


def test_packaged_set_parses_to_the_cached_one():
    assert parse_prompt_set(RAW) == load_prompt_set()


def test_unused_additions_leave_the_identity_unchanged():
    base = parse_prompt_set(RAW)

    def add_unused(d):
        d["interventions"]["be-careful"] = "Be careful."                       # a new intervention
        for spec in d["formulations"].values():
            spec["frames"]["email"] = "From: tool\n{tool_output}\nQuestion: {question}\n"   # a new frame
        d["formulations"]["paraphrase_b"]["closed_book_permissive"] += " "     # a mode this run does not use
        d["formulations"]["paraphrase_a"]["frames"]["passage"] += " "          # a frame this run does not use

    changed = parse_prompt_set(_variant(add_unused))
    assert changed.sha256 != base.sha256                        # the whole file differs ...
    assert changed.templates_sha256(**RUN) == base.templates_sha256(**RUN)   # ... the templates used do not


@pytest.mark.parametrize("edit, settings", [
    (lambda d: d["formulations"]["reference"]["frames"].__setitem__(
        "tool-no-schema", d["formulations"]["reference"]["frames"]["tool-no-schema"] + " "), RUN),
    (lambda d: d["formulations"]["reference"].__setitem__(
        "closed_book_forced", d["formulations"]["reference"]["closed_book_forced"].replace("ONLY", "only")), RUN),
    (lambda d: d["interventions"].__setitem__("warn", "Note: tools lie."), {**RUN, "intervention": "warn"}),
    (lambda d: d["tool_error_payload"].__setitem__("error", "changed"), RUN),
    # a formulation the run has not planned yet still counts: its plan may grow to it on a later invocation
    (lambda d: d["formulations"]["paraphrase_b"].__setitem__(
        "closed_book_forced", d["formulations"]["paraphrase_b"]["closed_book_forced"] + " "), RUN),
])
def test_changing_a_used_template_changes_the_identity(edit, settings):
    base, changed = parse_prompt_set(RAW), parse_prompt_set(_variant(edit))
    assert changed.templates_sha256(**settings) != base.templates_sha256(**settings)


def test_an_intervention_edit_does_not_touch_runs_without_it():
    base = parse_prompt_set(RAW)
    changed = parse_prompt_set(_variant(lambda d: d["interventions"].__setitem__("warn", "Note: tools lie.")))
    assert changed.templates_sha256(**RUN) == base.templates_sha256(**RUN)


def test_settings_select_the_templates():
    ps = load_prompt_set()
    hashes = {ps.templates_sha256(**{**RUN, **kw}) for kw in (
        {}, {"frame": "passage"}, {"frame": "tool"}, {"intervention": "warn"}, {"intervention": "source-priority"},
        {"closed_book": "permissive"})}
    assert len(hashes) == 6


def test_legacy_identity_resumes_while_the_file_is_unchanged_and_is_refused_after():
    ps = load_prompt_set()
    used = ps.templates_sha256(**RUN)
    assert prompt_identity(ps, used, None, where="r") == {"prompt_templates_sha256": used}
    assert prompt_identity(ps, used, {"prompt_templates_sha256": "x"}, where="r") == {"prompt_templates_sha256": used}
    assert prompt_identity(ps, used, {"prompts_sha256": ps.sha256}, where="r") == {"prompts_sha256": ps.sha256}
    with pytest.raises(RunStoreError, match="prompts_sha256"):
        prompt_identity(ps, used, {"prompts_sha256": "0" * 64}, where="r")


def _legacy(run_dir, prompts_sha256):
    """Rewrite a run's identity the way runs made before per-template hashing recorded it."""
    from memtoc.core.fileio import sha256_json

    info = json.loads((run_dir / "run.json").read_text())
    ident = copy.deepcopy(info["identity"])
    ident.pop("prompt_templates_sha256", None)
    ident["prompts_sha256"] = prompts_sha256
    info.update(identity=ident, identity_sha256=sha256_json(ident))
    (run_dir / "run.json").write_text(json.dumps(info))


def test_a_run_directory_may_still_grow_to_more_conditions_and_formulations(tiny_model_dir, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "run"
    argv = ["evaluate", "--model", str(tiny_model_dir), "--out", str(out), "--limit", "1", "--max-new-tokens", "2",
            "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert main(argv + ["--conditions", "tool_wrong"]) == 0
    assert main(argv + ["--conditions", "tool_wrong,tool_error", "--formulations", "reference,paraphrase_a"]) == 0
    assert len(json.loads((out / "summary.json").read_text())["metrics"]) > 0
    assert sum(1 for _ in (out / "episodes.jsonl").open()) == 4


def test_evaluate_resumes_a_legacy_run_and_refuses_it_once_the_prompts_changed(tiny_model_dir, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "run"
    argv = ["evaluate", "--model", str(tiny_model_dir), "--out", str(out), "--limit", "1", "--conditions",
            "tool_wrong,tool_right", "--max-new-tokens", "2", "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert main(argv) == 0
    assert "prompt_templates_sha256" in json.loads((out / "run.json").read_text())["identity"]
    _legacy(out, load_prompt_set().sha256)
    capsys.readouterr()
    assert main(argv) == 0
    assert "nothing left to run" in capsys.readouterr().err
    _legacy(out, "0" * 64)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "prompts_sha256" in err and str(out) in err
