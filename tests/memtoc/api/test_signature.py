"""The Python API's names are the command line's: generated signatures, one word per concept.

Every keyword of a generated ``mt.*`` job is either one of the few API-only parameters (``backend``, ``edit``,
``out``, ...) or the public name of an option of the job's config, which is its flag without dashes; and for each
concept of ``docs/cli.md``'s vocabulary table, every API function whose config has the flag takes the flag's name.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from memtoc.api.signature import config_class
from memtoc.core.options import default_config, leaves

REPO = Path(__file__).resolve().parents[3]
API_ONLY = {"backend", "edit", "out", "log", "family", "run", "activations", "mining", "target", "base", "arms",
            "runs", "key", "label", "contrast", "strengths", "run_a", "run_b", "model", "layer", "judge_file",
            "wait"}   # mt.serve(wait=False): the running server back at once (a notebook's way; the command blocks)


def generated() -> dict[str, object]:
    from memtoc.api import jobs, study_jobs

    out = {}
    for module in (jobs, study_jobs):
        for name in getattr(module, "_GENERATED", {}):
            out[name] = getattr(module, name)
    return out


def vocabulary_flags() -> list[str]:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    table = text.split("| concept | flag | commands |", 1)[1].split("\n\n", 1)[0]
    return [m.group(1) for m in re.finditer(r"\| `(--[a-z-]+)", table)]


def _options(fn: object) -> list:
    cls = config_class(fn.__memtoc_config__)
    return list(leaves(cls, default_config(cls)))


@pytest.mark.parametrize("name", sorted(generated()))
def test_every_keyword_is_an_options_public_name(name) -> None:
    fn = generated()[name]
    publics = {leaf.spec.public for leaf in _options(fn)} | {leaf.field for leaf in _options(fn)}
    params = [p.name for p in inspect.signature(fn).parameters.values()]
    assert [p for p in params if p not in publics | API_ONLY] == []


def test_each_vocabulary_flag_is_the_same_word_in_the_api() -> None:
    flags = vocabulary_flags()
    assert "--position-kinds" in flags and "--score-layer" in flags     # the table was read
    missing = []
    for name, fn in generated().items():
        params = set(inspect.signature(fn).parameters)
        for leaf in _options(fn):
            if name == "load_episodes" and leaf.field == "out":
                continue                     # it returns the episodes where the command writes them
            if leaf.spec.option_string in flags and not leaf.spec.positional:
                word = leaf.spec.option_string[2:].replace("-", "_")
                if word not in params:
                    missing.append(f"mt.{name}: {leaf.spec.option_string} is not the keyword {word}")
    assert missing == []


def test_every_door_refuses_what_a_job_does_not_take(tmp_path, capsys) -> None:
    """One list (the config's ``NOT_TAKEN``): ``extract`` captures the loaded model as given, so ``adapter`` is refused by the
    command line, the Python API (not in its signature either) and a recipe step alike, each in one line."""
    import memtoc as mt
    import memtoc.jobs.catalog  # noqa: F401 - fills the registry
    from memtoc.cli import main
    from memtoc.jobs.registry import JOBS
    from memtoc.recipes.experiment import ExperimentError, load_recipe, validate_recipe

    not_taken = JOBS["extract"].config_class().NOT_TAKEN
    assert "adapter" in not_taken and "edit" in not_taken
    with pytest.raises(SystemExit) as exc:
        main(["extract", "--out", str(tmp_path / "a.h5"), "--adapter", "lora"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "unknown option --adapter" in err
    assert "adapter" not in inspect.signature(mt.extract).parameters
    with pytest.raises(mt.APIError, match=r"extract takes no option\(s\) adapter; it takes "):
        mt.extract(adapter="lora", out=tmp_path / "a.h5")
    assert not (tmp_path / "a.h5").exists()
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[steps]]\nname = "x"\ncommand = "extract"\nout = "a.h5"\nargs = { adapter = "lora" }\n',
                      encoding="utf-8")
    with pytest.raises(ExperimentError, match="has no option --adapter"):
        validate_recipe(load_recipe(recipe))
    for name, job in JOBS.items():            # each name left out is an option of the job's config (no stale name)
        cls = job.config_class()
        assert set(getattr(cls, "NOT_TAKEN", ())) <= {leaf.field for leaf in leaves(cls)}, name
