"""The contract walk's case generator, shared by the command-line walk (tests/memtoc/cli/test_contract.py) and the
Python API walk (tests/memtoc/api/test_api_contract.py): both read the same job configs, so both walk the same
fields with the same cases.

- :func:`path_cases`: for every output and input path a config declares (memtoc.core.paths), the output pointed
  at the input (``equal``), inside it (``inside``) and at the folder holding it (``holding``);
- :func:`input_cases`: every declared input missing, and of the wrong kind;
- :func:`numeric_values`: for every numeric option, a value of the wrong kind, a non-finite one and one past each
  declared bound;
- :func:`stand_in_values`: the given values plus a stand-in for every other option the job requires (a made
  input for a required input path, a fresh path for an output, a choice or ``1`` or ``x`` for the rest).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable, Sequence

from memtoc.core.options import option_leaves
from memtoc.core.paths import HDF5_SIGNATURE, INPUT_ROLES, OUTPUT_ROLES, declared_roles

CASES = ("equal", "inside", "holding")


def make_input(path: Path, role: str) -> Path:
    """A stand-in input of ``role`` at ``path``: a run directory, a folder, an HDF5-signed store or a JSON file."""
    if role in ("input-run", "input-dir"):
        path.mkdir(parents=True)
        if role == "input-run":                  # a finished run's files (their content is not read first)
            (path / "run.json").write_text("{}", encoding="utf-8")
            (path / "episodes.jsonl").write_text("", encoding="utf-8")
        else:
            (path / "data.txt").write_text("x", encoding="utf-8")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(HDF5_SIGNATURE + b"\0" * 32 if role == "input-store" else b'{"a": 1}\n')
    return path


def digest(path: Path) -> str:
    """The names and bytes of a file or a folder's files (the input "unchanged" check)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    for p in files:
        h.update(str(p.relative_to(path.parent)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def dummy(leaf: Any) -> str:
    """A stand-in value of a required non-path option."""
    spec = leaf.spec
    if spec.choices:
        return str(spec.choices[0])
    if spec.parse in (int, float):
        return "1"
    return "x:y" if leaf.field == "contrast" else "x"


def stand_in_values(cls: type, values: dict[str, str], tmp: Path, *, exclude: Sequence[str] = (),
                    required: Iterable[str] = ()) -> dict[str, str]:
    """field -> value: ``values``, then a stand-in for every option that is required (by the option, by
    ``required``, as a positional, or the first of the config's ``TRAINING_SPLIT`` when no given value fills it)."""
    roles = declared_roles(cls)
    required = set(required)
    group = getattr(cls, "TRAINING_SPLIT", ())          # options of which the config's own check needs one
    if group and not set(group) & set(values):
        required.add(group[0])
    found = option_leaves(cls, exclude)
    out: dict[str, str] = {}
    for leaf in found:
        spec = leaf.spec
        value = values.get(leaf.field)
        need = spec.required or leaf.field in required or (spec.positional and spec.nargs not in ("?", "*"))
        if value is None and not need:
            continue
        if value is None:
            role = roles.get(leaf.field)
            if role in INPUT_ROLES:
                value = str(make_input(tmp / f"other_{leaf.field}", role))
            elif role in OUTPUT_ROLES:
                value = str(tmp / f"out_{leaf.field}")
            else:
                value = dummy(leaf)
        out[leaf.field] = value
    return out


def path_cases(cls: type, shown: Iterable[str]) -> list[tuple[str, str, str]]:
    """(output field, input field, case) of every output/input pair ``cls`` declares among the ``shown`` fields."""
    shown = set(shown)
    roles = declared_roles(cls)
    ins = [f for f, r in roles.items() if r in INPUT_ROLES and f in shown]
    outs = [f for f, r in roles.items() if r in OUTPUT_ROLES and f in shown]
    return [(o, i, case) for o in outs for i in ins for case in CASES]


def input_cases(cls: type, shown: Iterable[str]) -> list[tuple[str, str]]:
    """(input field, ``missing`` | ``wrong kind``) of every input ``cls`` declares among the ``shown`` fields."""
    shown = set(shown)
    return [(f, case) for f, r in declared_roles(cls).items() if r in INPUT_ROLES and f in shown
            for case in ("missing", "wrong kind")]


def setup_path_case(tmp: Path, roles: dict[str, str], in_field: str, case: str) -> tuple[Path, Path] | None:
    """(the input made for ``in_field``, the output path of ``case``); None where the case does not exist (a
    file input holds nothing)."""
    holder = tmp / "holder"
    inp = make_input(holder / "input", roles[in_field])
    if case == "inside" and not inp.is_dir():
        return None
    return inp, {"equal": inp, "inside": inp / "inner", "holding": holder}[case]


def wrong_input(tmp: Path, role: str, case: str) -> Path | None:
    """A missing path, or a path of the wrong kind for ``role`` (None: ``input-path`` takes either kind)."""
    if case == "missing":
        return tmp / "nowhere" / "missing"
    if role == "input-path":
        return None
    if role in ("input-run", "input-dir"):
        return make_input(tmp / "a_file.json", "input")
    return make_input(tmp / "a_dir", "input-dir")


def numeric_values(spec: Any) -> list[str]:
    """Values a numeric option must refuse: not a number, not finite (floats), just past each declared bound."""
    values = ["abc"]
    if spec.parse is float:
        values.append("nan")
    if spec.low is not None:
        values.append(str(spec.low if spec.above else spec.low - 1))
    if spec.high is not None:
        values.append(str(int(spec.high * 10)) if spec.parse is int else str(spec.high * 10))
    return values


def numeric_cases(cls: type, exclude: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(field, value) of every non-positional numeric option of ``cls`` and each of its refused values."""
    return [(leaf.field, v) for leaf in option_leaves(cls, exclude)
            if leaf.spec.parse in (int, float) and not leaf.spec.positional for v in numeric_values(leaf.spec)]
