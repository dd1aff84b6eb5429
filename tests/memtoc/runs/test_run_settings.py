"""``memtoc compare`` warns on every generation / selection setting that differs between its two runs
(``memtoc.runs.run_settings``), and ``memtoc evaluate --benchmark demo`` runs on the demo set's own schemas: no frame
fallback. Tiny random model, through the command line."""

from __future__ import annotations

import json

from memtoc.cli import main
from memtoc.runs.run_settings import differing_settings, settings_warning


def _evaluate(model, out, *extra):
    return main(["evaluate", "--model", str(model), "--benchmark", "demo", "--formulations", "reference",
                 "--conditions", "tool_wrong,tool_right", "--device", "cpu", "--dtype", "float32", "--no-progress",
                 "--out", str(out), *extra])


def test_demo_evaluate_has_no_frame_fallback_and_compare_names_differing_settings(tiny_model_dir, tmp_path,
                                                                                 capsys) -> None:
    assert _evaluate(tiny_model_dir, tmp_path / "a", "--limit", "2", "--max-new-tokens", "6") == 0
    out = capsys.readouterr()
    assert "FRAME FALLBACK" not in out.out + out.err
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["frame_fallback"] is None and info["identity"]["frame"] == "tool"
    assert _evaluate(tiny_model_dir, tmp_path / "b", "--limit", "1", "--max-new-tokens", "8") == 0
    assert _evaluate(tiny_model_dir, tmp_path / "c", "--limit", "2", "--max-new-tokens", "6", "--seed", "0") == 0
    capsys.readouterr()
    assert differing_settings(tmp_path / "a", tmp_path / "b") == {"max_new_tokens": (6, 8), "limit": (2, 1)}
    assert settings_warning(tmp_path / "a", tmp_path / "c") is None
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "max_new_tokens 6 vs 8" in err and "limit 2 vs 1" in err
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 0
    assert "differ in generation" not in capsys.readouterr().err


def test_a_run_recorded_before_the_field_renames_compares_under_todays_names(tmp_path) -> None:
    """``run.json`` ``config`` keys written before a field took its flag's name (``chat`` of ``--chat-template``)
    are read as today's: the same setting compares equal, and a differing one is named as today's field."""
    for name, config in (("old", {"chat": False, "limit": 2}), ("new", {"chat_template": False, "limit": 2}),
                         ("other", {"chat_template": None, "limit": 2})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    assert differing_settings(tmp_path / "old", tmp_path / "new") == {}
    assert differing_settings(tmp_path / "old", tmp_path / "other") == {"chat_template": (False, None)}
