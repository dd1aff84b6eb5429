"""The one input/output contract (memtoc.core.paths): roles declared on config fields, one rule for all jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt
from memtoc.core.paths import HDF5_SIGNATURE, check_paths, check_plan, path_fields


@dataclass
class Job:
    store: str = field(default="", metadata=opt("store", role="input-store"))
    run: str | None = field(default=None, metadata=opt("run", role="input-run"))
    table: str | None = field(default=None, metadata=opt("file", role="input"))
    out: str = field(default="out", metadata=opt("out", role="output-dir"))
    sheet: str | None = field(default=None, metadata=opt("sheet", role="output"))


@pytest.fixture()
def world(tmp_path: Path) -> dict[str, Path]:
    store = tmp_path / "acts.h5"
    store.write_bytes(HDF5_SIGNATURE + b"\0" * 64)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}", encoding="utf-8")
    (run / "episodes.jsonl").write_text("", encoding="utf-8")
    table = tmp_path / "table.json"
    table.write_text("{}", encoding="utf-8")
    return {"store": store, "run": run, "table": table, "root": tmp_path}


def bytes_of(paths: dict[str, Path]) -> dict[str, bytes]:
    return {k: p.read_bytes() for k, p in paths.items() if p.is_file()}


def test_a_valid_config_passes_and_lists_its_paths(world) -> None:
    cfg = Job(store=str(world["store"]), run=str(world["run"]), out=str(world["root"] / "o"))
    roles = {f.role for f in check_paths(cfg)}
    assert roles == {"input-store", "input-run", "output-dir"}


@pytest.mark.parametrize("make, message", [
    (lambda w: Job(store=str(w["store"]), out=str(w["store"])), "is the input"),                   # equal
    (lambda w: Job(store=str(w["store"]), run=str(w["run"]), out=str(w["run"] / "x")), "inside the input"),
    (lambda w: Job(store=str(w["store"]), out=str(w["root"])), "holds the input"),                  # holding
    (lambda w: Job(store=str(w["store"]), sheet=str(w["store"]), out=str(w["root"] / "o")), "is the input"),
    (lambda w: Job(store=str(w["store"]), run=str(w["run"]), sheet=str(w["run"] / "summary.json"),
                   out=str(w["root"] / "o")), "inside the input"),
    (lambda w: Job(store=str(w["store"]), out=str(w["root"] / "o"), sheet=str(w["root"] / "o")), "also"),
    (lambda w: Job(store=str(w["store"]), table=str(w["store"]), out=str(w["root"] / "o")), "given twice"),
    (lambda w: Job(store=str(w["table"]), out=str(w["root"] / "o")), "not an activation store"),
    (lambda w: Job(store=str(w["root"] / "missing.h5"), out=str(w["root"] / "o")), "no such file"),
    (lambda w: Job(store=str(w["store"]), run=str(w["root"]), out=str(w["root"] / "o")), "not a run directory"),
    (lambda w: Job(store=str(w["store"]), out=str(w["table"])), "is a file"),
    (lambda w: Job(store=str(w["store"]), out=str(w["run"])), "is a run directory"),
])
def test_each_violation_is_refused_in_one_line_and_no_input_changes(world, make, message) -> None:
    before = bytes_of({"store": world["store"], "table": world["table"], "run": world["run"] / "run.json"})
    with pytest.raises(MemtocError) as exc:
        check_paths(make(world))
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert bytes_of({"store": world["store"], "table": world["table"], "run": world["run"] / "run.json"}) == before


def test_an_existing_store_is_no_output_file(world, tmp_path) -> None:
    other = tmp_path / "other.h5"
    other.write_bytes(HDF5_SIGNATURE)
    with pytest.raises(MemtocError, match="is an activation store"):
        check_paths(Job(store=str(world["store"]), sheet=str(other), out=str(tmp_path / "o")))


def test_a_plan_may_not_write_one_path_twice(world) -> None:
    a = Job(store=str(world["store"]), out=str(world["root"] / "o"))
    b = Job(store=str(world["store"]), out=str(world["root"] / "o"))
    with pytest.raises(MemtocError, match="also written by step a"):
        check_plan([("a", a), ("b", b)])
    check_plan([("a", a), ("b", Job(store=str(world["store"]), out=str(world["root"] / "p")))])


def test_path_fields_reads_the_declared_roles() -> None:
    fields = path_fields(Job(store="s.h5", run="r", out="o"))
    assert [(f.name, f.role) for f in fields] == [("store", "input-store"), ("run", "input-run"),
                                                   ("out", "output-dir")]
