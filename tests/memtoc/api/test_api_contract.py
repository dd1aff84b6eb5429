"""The one input/output contract, walked over every Python API job (``mt.*``), generated from the same job
configs and the same case generator as the command-line walk (tests/contract_walk.py).

Each job function is called with keywords (the configs' public names): an output pointed at each input (equal,
inside, holding) raises a :class:`MemtocError` of one line naming the output, and leaves the input's bytes as they
were; each input missing or of the wrong kind, and each numeric option out of range or of the wrong kind, raises one
line naming the option. The model loader is replaced by a failure: no case reaches it.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import memtoc.api as api
from memtoc.api.signature import config_class
from memtoc.core.errors import MemtocError
from memtoc.core.paths import declared_roles
from tests.contract_walk import (digest, input_cases, numeric_cases, option_leaves, path_cases, setup_path_case,
                                 stand_in_values, wrong_input)

#: the API's job functions (memtoc.api.jobs and memtoc.api.study_jobs), each generated from its job's config
JOBS = sorted(name for name, module in api._LAZY.items()  # noqa: SLF001 - the API's own table of job functions
              if module in ("memtoc.api.jobs", "memtoc.api.study_jobs") and name != "load_benchmark")
#: a config field the function takes under another keyword (the judged run is the function's positional ``run``)
KEYWORD_OF = {("judge", "run_dir"): "run"}
#: what the walk counts (the note of issue 37 reports them)
WALKED: dict[str, int] = {}


def _fn(name: str) -> Any:
    return getattr(api, name)


def _cls(name: str) -> type:
    return config_class(_fn(name).__memtoc_config__)


def _keywords(name: str) -> dict[str, str]:
    """config field -> the keyword the API function takes it by (only the fields it takes)."""
    params = inspect.signature(_fn(name)).parameters
    out = {}
    for leaf in option_leaves(_cls(name)):
        key = KEYWORD_OF.get((name, leaf.field), leaf.spec.public)
        if key in params:
            out[leaf.field] = key
    return out


def _flag(name: str, field: str) -> str:
    """How a path error names the field: the option's flag, as on the command line (one message for both)."""
    spec = next(leaf.spec for leaf in option_leaves(_cls(name)) if leaf.field == field)
    return spec.option_string if not spec.positional else spec.name.upper()


def _call(name: str, values: dict[str, str], tmp: Path) -> Any:
    """``mt.NAME(...)`` with ``values`` (field -> value) and a stand-in for every other required keyword."""
    keywords = _keywords(name)
    params = inspect.signature(_fn(name)).parameters
    required = [f for f, k in keywords.items() if params[k].default is inspect.Parameter.empty]
    full = stand_in_values(_cls(name), values, tmp, required=required)
    kwargs = {keywords[f]: v for f, v in full.items() if f in keywords}
    for key, p in params.items():            # a required keyword of the function's own (a label, a contrast)
        if p.default is inspect.Parameter.empty and key not in kwargs and p.kind is not p.VAR_KEYWORD:
            kwargs[key] = "x:y" if key == "contrast" else "x"
    return _fn(name)(**kwargs)



def _one_line(exc: BaseException, *needles: str) -> None:
    text = str(exc)
    assert isinstance(exc, MemtocError), repr(exc)
    assert len(text.strip().splitlines()) == 1, text
    for n in needles:
        assert n in text, (n, text)


def _path_cases() -> list[tuple[str, str, str, str]]:
    return [(name, o, i, case) for name in JOBS for o, i, case in path_cases(_cls(name), _keywords(name))]


@pytest.mark.parametrize("name, out_field, in_field, case", _path_cases())
def test_an_output_on_an_input_is_refused_in_the_api(name, out_field, in_field, case, tmp_path, no_model) -> None:
    made = setup_path_case(tmp_path, declared_roles(_cls(name)), in_field, case)
    if made is None:
        pytest.skip("a file input holds nothing")
    inp, target = made
    before = digest(inp)
    with pytest.raises(Exception) as info:
        _call(name, {in_field: str(inp), out_field: str(target)}, tmp_path)
    _one_line(info.value, _flag(name, out_field))
    assert digest(inp) == before
    assert not (case == "inside" and (inp / "inner").exists())


def _input_cases() -> list[tuple[str, str, str]]:
    return [(name, f, case) for name in JOBS for f, case in input_cases(_cls(name), _keywords(name))]


@pytest.mark.parametrize("name, field, case", _input_cases())
def test_a_missing_or_wrong_kind_input_is_refused_in_the_api(name, field, case, tmp_path, no_model) -> None:
    value = wrong_input(tmp_path, declared_roles(_cls(name))[field], case)
    if value is None:
        pytest.skip("a file or a directory: no wrong kind")
    with pytest.raises(Exception) as info:
        _call(name, {field: str(value)}, tmp_path)
    _one_line(info.value, value.name)


def _numeric_cases() -> list[tuple[str, str, str]]:
    out = []
    for name in JOBS:
        keywords = _keywords(name)
        out += [(name, f, v) for f, v in numeric_cases(_cls(name)) if f in keywords]
    return out


NUMERIC = _numeric_cases()


@pytest.mark.parametrize("name, field, value", NUMERIC)
def test_every_numeric_keyword_out_of_range_or_of_the_wrong_kind_is_refused_in_the_api(name, field, value,
                                                                                        tmp_path, no_model) -> None:
    with pytest.raises(Exception) as info:
        _call(name, {field: value}, tmp_path)
    _one_line(info.value, f": {_keywords(name)[field]}")


def test_the_api_walk_covers_every_job_function() -> None:
    """Every job function of the API is walked, and each with a declared output has output/input cases."""
    walked = {c[0] for c in _path_cases()} | {c[0] for c in _input_cases()} | {c[0] for c in NUMERIC}
    assert walked == set(JOBS), set(JOBS) - walked
    WALKED.update(jobs=len(JOBS), path_cases=len(_path_cases()), input_cases=len(_input_cases()),
                  numeric_cases=len(NUMERIC))
    assert WALKED["path_cases"] > 50 and WALKED["numeric_cases"] > 100
