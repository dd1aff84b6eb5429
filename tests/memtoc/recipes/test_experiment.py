"""``memtoc run-experiment``: recipes parse and validate; the baseline recipe runs end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.cli.recipes import run_experiment, validate_recipe
from memtoc.recipes.experiment import ExperimentError, load_recipe

REPO = Path(__file__).resolve().parents[3]
RECIPES = sorted((REPO / "experiments").glob("*.toml"))


def test_every_shipped_recipe_parses_and_validates():
    names = {p.stem for p in RECIPES}
    assert {"baseline", "rank_table", "sae_steering", "probe_and_steer"} <= names
    for path in RECIPES:
        recipe = load_recipe(path)
        assert recipe.steps and recipe.description
        validate_recipe(recipe)        # every key is an option of its subcommand (unregistered ones are noted)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "r.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_unknown_keys_are_named(tmp_path):
    with pytest.raises(ExperimentError, match="unknown top-level key.*colour"):
        load_recipe(_write(tmp_path, 'colour = "red"\n[[steps]]\nname = "a"\ncommand = "evaluate"\n'))
    with pytest.raises(ExperimentError, match="unknown key.*outt"):
        load_recipe(_write(tmp_path, '[[steps]]\nname = "a"\ncommand = "evaluate"\noutt = "x"\n'))
    r = load_recipe(_write(tmp_path, '[[steps]]\nname = "a"\ncommand = "evaluate"\nout = "x"\n'
                                     'args = { max_new_token = 3 }\n'))
    with pytest.raises(ExperimentError, match="--max-new-token.*max_new_token"):
        validate_recipe(r)
    r = load_recipe(_write(tmp_path, '[defaults]\nwidth = 3\n[[steps]]\nname = "a"\ncommand = "evaluate"\nout = "x"\n'))
    with pytest.raises(ExperimentError, match="width"):
        validate_recipe(r)
    with pytest.raises(ExperimentError, match="used twice"):
        load_recipe(_write(tmp_path, '[[steps]]\nname = "a"\ncommand = "evaluate"\n'
                                     '[[steps]]\nname = "a"\ncommand = "evaluate"\n'))
    assert main(["run-experiment", str(tmp_path / "missing.toml")]) == 2


def test_unregistered_subcommand_is_an_error_before_anything_runs(tmp_path, capsys):
    p = _write(tmp_path, '[[steps]]\nname = "ok"\ncommand = "evaluate"\nout = "a"\n'
                         '[[steps]]\nname = "future"\ncommand = "no-such-command"\nout = "x"\n')
    with pytest.raises(ExperimentError, match=r"r.toml: step future: command = 'no-such-command' is not a memtoc"):
        run_experiment(p, out=tmp_path / "exp", report=False, log=lambda s: None)
    assert not (tmp_path / "exp" / "a").exists()          # nothing ran
    assert main(["run-experiment", str(p), "--out", str(tmp_path / "exp2"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step future" in err[0] and "no-such-command" in err[0]


@pytest.mark.parametrize("step, match", [
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { limit = "three" }', r"step a: limit must be a whole number"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { limit = 2.7 }', r"step a: limit must be a whole number"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { no_progress = "yes" }', r"step a: no_progress is a switch"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { frame = "nope" }', r"step a: frame must be one of"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { closed_book_from = "${a}" }', r"step a: refers to itself"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { closed_book_from = "${b}" }', r"step a: refers to a later step"),
    ('name = "a"\ncommand = "evaluate"\nout = "a"\nargs = { closed_book_from = "${zz}" }', r"step a: unknown reference"),
    ('name = "a"\ncommand = "evaluate"\nout = "../escape"', r"step a: out = '../escape' leaves the experiment"),
    ('name = "a"\ncommand = "evaluate"\nout = "/tmp/elsewhere"', r"step a: out = '/tmp/elsewhere' is outside"),
    ('name = "a/b"\ncommand = "evaluate"\nout = "a"', r"step name 'a/b' may use"),
])
def test_recipes_are_checked_whole_before_any_step_runs(tmp_path, step, match):
    p = _write(tmp_path, f'[[steps]]\n{step}\n[[steps]]\nname = "b"\ncommand = "evaluate"\nout = "b"\n')
    with pytest.raises(ExperimentError, match=match):
        run_experiment(p, out=tmp_path / "exp", report=False, log=lambda s: None)
    assert not (tmp_path / "exp" / "a").exists() and not (tmp_path / "exp" / "b").exists()


def test_an_absolute_out_needs_outside_paths(tmp_path):
    p = _write(tmp_path, f'outside_paths = true\n[[steps]]\nname = "a"\ncommand = "evaluate"\n'
                         f'out = "{tmp_path / "abs"}"\n')
    assert validate_recipe(load_recipe(p)) == []


def test_baseline_quick_end_to_end_on_tiny_model(tmp_path, tiny_model_dir):
    out = tmp_path / "baseline"
    argv = ["run-experiment", str(REPO / "experiments" / "baseline.toml"), "--quick", "--model", str(tiny_model_dir),
            "--set", "max_new_tokens=6", "--set", "limit=2", "--out", str(out)]
    assert main(argv) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and [s["status"] for s in state["steps"]] == ["ok"] * 9
    ev = state["steps"][1]["argv"]
    assert ev[:2] == ["memtoc", "evaluate"] and "--prompt-intervention" in ev and str(tiny_model_dir) in ev
    assert ev[ev.index("--limit") + 1] == "2" and ev[ev.index("--formulations") + 1] == "reference"
    for arm in ("standard", "warn", "source-priority", "abstain-and-flag", "passage"):
        run = out / "runs" / arm
        assert (run / "summary.json").exists() and (run / "episodes.jsonl").stat().st_size > 0, arm
    info = json.loads((out / "runs" / "passage" / "run.json").read_text())
    assert info["identity"]["frame"] == "passage"
    assert len(state["comparisons"]) == 4
    for c in state["comparisons"]:
        assert "verdict" in c and "retention" in c["comparisons"]
    assert len(list((out / "comparisons").glob("*_vs_standard.json"))) == 4
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Experiment baseline" in html and "runs/warn" in html and (out / "report.md").exists()
    # a re-run resumes: the evaluations are not run again
    assert main(argv) == 0
    state2 = json.loads((out / "experiment.json").read_text())
    assert all(s.get("resumed") for s in state2["steps"] if s["command"] == "evaluate")


def test_recipe_protocol_key_reaches_the_steps_that_take_it(tmp_path, shared_memtoc):
    from memtoc.cli.recipes import COMMANDS
    from memtoc.recipes.experiment import takes_protocol

    text = (f'protocol = "paper"\n[defaults]\nbenchmark = "{shared_memtoc}"\nlimit = 2\nconditions = "tool_right"\n'
            '[[steps]]\nname = "paper"\ncommand = "episodes"\nargs = { out = "${out}/paper.jsonl" }\n'
            '[[steps]]\nname = "plain"\ncommand = "episodes"\nargs = { out = "${out}/plain.jsonl", '
            'protocol = "none" }\n')
    res = run_experiment(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None)
    assert res.ok
    argv = {s["name"]: s["argv"] for s in res.steps}
    assert argv["paper"][argv["paper"].index("--protocol") + 1] == "paper"
    assert argv["plain"][argv["plain"].index("--protocol") + 1] == "none"    # a step's own args win
    forms = lambda f: {json.loads(x)["formulation"] for x in (tmp_path / "exp" / f).read_text().splitlines()}  # noqa: E731
    assert forms("paper.jsonl") == {"reference", "paraphrase_a", "paraphrase_b"} and forms("plain.jsonl") == {"reference"}
    assert json.loads((tmp_path / "exp" / "experiment.json").read_text())["protocol"] == "paper"
    # the code executor takes the run protocol as --protocol too (its tool-call format is --call-format)
    from memtoc.recipes.experiment import protocol_key

    opts = lambda *cmd: COMMANDS.options(list(cmd))  # noqa: E731
    assert takes_protocol(opts("evaluate"), "paper")
    assert protocol_key(opts("evaluate"), "paper") == "protocol"
    assert protocol_key(opts("codeexec", "evaluate"), "paper") == "protocol"
    assert protocol_key(opts("finetune", "crossfit"), "paper") == "protocol"
    assert protocol_key(opts("codeexec", "extract"), "paper") is None
    with pytest.raises(ExperimentError, match="protocol = 'papers' is not a protocol"):
        load_recipe(_write(tmp_path, 'protocol = "papers"\n[[steps]]\nname = "a"\ncommand = "evaluate"\n'))
    r = load_recipe(_write(tmp_path, 'outside_paths = true\nprotocol = "paper"\n[[steps]]\nname = "a"\ncommand = "score"\n'
                                     'args = { input = "x", out = "y" }\n'))
    with pytest.raises(ExperimentError, match="no step's command takes an evaluation protocol"):
        validate_recipe(r)


_FIRST = '[[steps]]\nname = "first"\ncommand = "episodes"\nout = "e1.jsonl"\n'


@pytest.mark.parametrize("step, match", [
    # an output named through the ${out} alias that climbs out of the experiment directory
    ('name = "two"\ncommand = "episodes"\nargs = { out = "${out}/../escape.jsonl" }',
     r"step two: --out '.*/exp/\.\./escape\.jsonl' resolves to .*escape\.jsonl, outside the experiment directory"),
    ('name = "two"\ncommand = "episodes"\nargs = { out = "${first}.d/../../escape.jsonl" }',
     r"step two: --out .* outside the experiment directory"),
    # an input outside the experiment directory and the recipe's folder
    ('name = "two"\ncommand = "direction"\nout = "d.json"\n'
     'args = { activations = "/etc/shadow", contrast = "tool_wrong:tool_right", all_questions = true }',
     r"step two: --activations '/etc/shadow' resolves to /etc/shadow, outside the experiment directory .* and the "
     r"recipe's folder"),
    ('name = "two"\ncommand = "direction"\nout = "d.json"\n'
     'args = { activations = "${out}/../../../../../../../../etc/passwd", contrast = "tool_wrong:tool_right", '
     'all_questions = true }', r"step two: --activations .* resolves to /etc/passwd, outside"),
    # a string where skip_quick wants a boolean
    ('name = "two"\ncommand = "episodes"\nout = "e2.jsonl"\nskip_quick = "no"',
     r"step 2 \(two\): skip_quick must be true or false, got 'no'"),
])
def test_paths_outside_the_recipe_and_a_string_skip_quick_are_refused_before_any_step(tmp_path, capsys, step,
                                                                                        match):
    p = _write(tmp_path, f'name = "r"\n{_FIRST}[[steps]]\n{step}\n')
    with pytest.raises(ExperimentError, match=match):
        run_experiment(p, out=tmp_path / "exp", report=False, log=lambda s: None)
    assert main(["run-experiment", str(p), "--out", str(tmp_path / "exp"), "--no-report"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step" in err and "two" in err, err
    assert not (tmp_path / "exp" / "e1.jsonl").exists() and not (tmp_path / "escape.jsonl").exists()


def test_an_output_through_a_link_out_of_the_experiment_directory_is_refused(tmp_path):
    """``out = "link/e.jsonl"`` where ``link`` points out of the experiment directory: refused before any step."""
    exp, elsewhere = tmp_path / "exp", tmp_path / "elsewhere"
    exp.mkdir()
    elsewhere.mkdir()
    (exp / "link").symlink_to(elsewhere, target_is_directory=True)
    p = _write(tmp_path, f'{_FIRST}[[steps]]\nname = "two"\ncommand = "episodes"\nout = "link/e2.jsonl"\n')
    with pytest.raises(ExperimentError, match=r"step two: --out .*link/e2\.jsonl' resolves to .*elsewhere/e2\.jsonl"):
        run_experiment(p, out=exp, report=False, log=lambda s: None)
    assert list(elsewhere.iterdir()) == [] and not (exp / "e1.jsonl").exists()


def test_inside_paths_an_input_beside_the_recipe_and_the_command_line_are_accepted(tmp_path):
    """What stays allowed: outputs inside the experiment directory, an input in the recipe's folder, a path given
    with --set (the user's own), and anything under outside_paths = true."""
    (tmp_path / "q.txt").write_text("q1\n", encoding="utf-8")
    text = ('[[steps]]\nname = "a"\ncommand = "episodes"\nargs = { out = "${out}/sub/e.jsonl" }\n'
            '[[steps]]\nname = "d"\ncommand = "direction"\nout = "d.json"\n'
            'args = { activations = "${out}/acts.h5", contrast = "tool_wrong:tool_right", '
            f'split_questions = "{tmp_path / "q.txt"}" }}\n')
    recipe = load_recipe(_write(tmp_path, text))
    validate_recipe(recipe)
    from memtoc.recipes.experiment import validate_recipe as validate

    validate(recipe, out=tmp_path / "exp")
    shadow = load_recipe(_write(tmp_path, text.replace(str(tmp_path / "q.txt"), "/etc/shadow")))
    with pytest.raises(ExperimentError, match="/etc/shadow"):
        validate(shadow, out=tmp_path / "exp")
    validate(shadow, out=tmp_path / "exp", extra={"d.split_questions": "/etc/shadow"})
    outside = load_recipe(_write(tmp_path, "outside_paths = true\n" + text.replace(str(tmp_path / "q.txt"),
                                                                                    "/etc/shadow")))
    validate(outside, out=tmp_path / "exp")
