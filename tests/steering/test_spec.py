"""Edit spec validation (errors name the file and the field), the FVU gate, round trips and copies."""

from __future__ import annotations

import json
import re

import pytest
import torch

from memtoc.core.errors import MemtocError
from steering import DirectionEdit, EditSpecError, SAEClampEdit, load_edit
from steering.kinds.direction import save_direction_edit
from steering.spec import save_spec, validate_spec


def _direction_spec(**kw):
    spec = {"schema_version": "memtoc-edit-v1", "name": "d", "kind": "direction", "layers": [2, 1],
            "positions": "last_input", "strength": 1.0, "vectors": "d.safetensors",
            "scale": {"1": 2.0, "2": 3.0}}
    spec.update(kw)
    return spec


def _clamp_spec(**kw):
    spec = {"schema_version": "memtoc-edit-v1", "name": "c", "kind": "sae_clamp", "layers": [3],
            "positions": "last_input", "strength": 2.0, "sae": {"3": {"release": "r", "sae_id": "i"}},
            "features": {"3": {"remove": [1, 2], "remove_targets": [0.5, 0.7], "add": [5], "add_targets": [1.0]}},
            "steer_toward": "memory", "fvu": {"3": 0.2}}
    spec.update(kw)
    return spec


def _write(tmp_path, spec, name="edit.json"):
    p = tmp_path / name
    p.write_text(json.dumps(spec))
    return p


@pytest.mark.parametrize("change, field", [
    ({"schema_version": "v0"}, "schema_version"),
    ({"name": ""}, "name"),
    ({"kind": "lora"}, "kind"),
    ({"layers": []}, "layers"),
    ({"layers": [1, "2"]}, "layers"),
    ({"positions": "everywhere"}, "positions"),
    ({"strength": "big"}, "strength"),
    ({"strength": float("nan")}, "strength"),
    ({"apply_to_closed_book": "yes"}, "apply_to_closed_book"),
    ({"scale": {"1": 2.0}}, "scale"),
    ({"scale": {"1": 2.0, "2": None}}, "scale.2"),
    ({"scale": {"1": 2.0, "2": 1.0, "7": 1.0}}, "scale"),
    ({"toward": "left"}, "toward"),
    ({"vectors": None}, "vectors"),
])
def test_direction_spec_errors_name_file_and_field(tmp_path, change, field):
    p = _write(tmp_path, _direction_spec(**change))
    with pytest.raises(EditSpecError) as ei:
        load_edit(p)
    msg = str(ei.value)
    assert str(p) in msg and f"field '{field}'" in msg, msg
    assert isinstance(ei.value, MemtocError) and ei.value.field == field


@pytest.mark.parametrize("change, field", [
    ({"sae": {"3": {"release": "r"}}}, "sae.3.sae_id"),
    ({"sae": {"3": {"path": "x", "release": "r", "sae_id": "i"}}}, "sae.3"),
    ({"sae": {"4": {"path": "x"}}}, "sae"),
    ({"features": {"3": {"remove": [1], "remove_targets": [], "add": [], "add_targets": []}}},
     "features.3.remove_targets"),
    ({"features": {"3": {"remove": [-1], "remove_targets": [1.0], "add": [], "add_targets": []}}}, "features.3.remove"),
    ({"features": {"3": {"remove": [1], "remove_targets": [1.0], "add": [1], "add_targets": [1.0]}}}, "features.3"),
    ({"features": {"3": {"remove": [], "remove_targets": [], "add": [], "add_targets": []}}}, "features"),
    ({"features": {"3": {"remove": [1], "remove_targets": [-2.0], "add": [], "add_targets": []}}},
     "features.3.remove_targets"),
    ({"features": {"3": {"remove": [1], "remove_targets": [1.0], "adds": [2]}}}, "features.3.adds"),
    ({"steer_toward": "both"}, "steer_toward"),
    ({"fvu": {"3": -1}}, "fvu.3"),
    ({"fvu_threshold": "high"}, "fvu_threshold"),
    ({"force": 1}, "force"),
    ({"vectors": "x.safetensors"}, "vectors"),
])
def test_sae_clamp_spec_errors_name_the_field(tmp_path, change, field):
    p = _write(tmp_path, _clamp_spec(**change))
    with pytest.raises(EditSpecError) as ei:
        load_edit(p)
    assert ei.value.field == field, str(ei.value)
    assert str(p) in str(ei.value)


def test_fvu_gate_refuses_unless_forced(tmp_path):
    bad = _clamp_spec(layers=[3, 5], sae={"3": {"release": "r", "sae_id": "a"}, "5": {"release": "r", "sae_id": "b"}},
                      features={"3": {"remove": [1], "remove_targets": [1.0], "add": [], "add_targets": []},
                                "5": {"remove": [], "remove_targets": [], "add": [2], "add_targets": [1.0]}},
                      fvu={"3": 0.2, "5": 0.61})
    with pytest.raises(EditSpecError, match=re.escape("field 'fvu.5'") + ".*0.610 > fvu_threshold 0.500"):
        load_edit(_write(tmp_path, bad))
    # a higher threshold or force lets it through; a missing FVU is refused too unless forced
    assert load_edit(_write(tmp_path, {**bad, "fvu_threshold": 0.7}, "a.json")).spec["fvu"]["5"] == 0.61
    forced = load_edit(_write(tmp_path, {**bad, "force": True}, "b.json"))
    assert isinstance(forced, SAEClampEdit) and forced.spec["force"] is True
    no_fvu = {k: v for k, v in bad.items() if k != "fvu"}
    with pytest.raises(EditSpecError, match="field 'fvu'"):
        load_edit(_write(tmp_path, no_fvu, "c.json"))
    assert load_edit(_write(tmp_path, {**no_fvu, "force": True}, "d.json")).spec["fvu"] is None
    # the gate also guards edits built in memory
    with pytest.raises(EditSpecError, match="fvu.5"):
        SAEClampEdit(bad, saes={})


def test_direction_spec_round_trip_and_copies(tmp_path):
    vecs = {1: torch.tensor([0.6, 0.8, 0.0]), 2: torch.tensor([0.0, 0.0, 1.0])}
    edit = DirectionEdit.build(name="rt", layers=[1, 2], vectors=vecs, scale={1: 2.0, 2: -1.5},
                               positions="tool_span", strength=0.5, toward="tool", source={"note": "x"})
    path = save_direction_edit(tmp_path / "sub" / "rt.json", edit)
    assert (tmp_path / "sub" / "rt.safetensors").is_file()
    assert not list((tmp_path / "sub").glob("*.tmp"))
    loaded = load_edit(path)
    assert isinstance(loaded, DirectionEdit)
    spec = loaded.spec
    assert spec["vectors"] == "rt.safetensors" and spec["layers"] == [1, 2] and spec["source"] == {"note": "x"}
    assert spec["apply_to_closed_book"] is False and spec["toward"] == "tool"
    torch.testing.assert_close(loaded.delta(2), 0.5 * -1.5 * vecs[2])
    # with_strength copies; the original is unchanged; spec is a copy
    s3 = loaded.with_strength(3)
    assert s3.strength == 3.0 and loaded.strength == 0.5 and s3.vectors is loaded.vectors
    loaded.spec["strength"] = 99
    assert loaded.strength == 0.5
    # steer: toward the spec's side keeps the sign, the other side negates it
    assert loaded.steer("tool", 2).strength == 2.0 and loaded.steer("memory", 2).strength == -2.0
    assert loaded.steer("memory", 0).strength == 0.0
    # a changed vectors file no longer matches the spec's hash
    (tmp_path / "sub" / "rt.safetensors").write_bytes((tmp_path / "sub" / "rt.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(EditSpecError, match="vectors_sha256"):
        load_edit(path)


def test_non_unit_vectors_and_missing_files_are_refused(tmp_path):
    with pytest.raises(EditSpecError, match="unit vector"):
        DirectionEdit.build(name="n", layers=[1], vectors={1: torch.tensor([3.0, 4.0])}, scale={1: 1.0})
    p = _write(tmp_path, _direction_spec())
    with pytest.raises(EditSpecError, match="field 'vectors'.*does not exist"):
        load_edit(p)
    with pytest.raises(EditSpecError, match="no such edit spec file"):
        load_edit(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(EditSpecError, match="not valid JSON"):
        load_edit(tmp_path / "broken.json")


def test_save_spec_validates_and_normalises(tmp_path):
    with pytest.raises(EditSpecError, match="field 'kind'"):
        save_spec(tmp_path / "x.json", {**_clamp_spec(), "kind": "nope"})
    assert not (tmp_path / "x.json").exists()
    p = save_spec(tmp_path / "c.json", _clamp_spec())
    doc = json.loads(p.read_text())
    assert doc["fvu_threshold"] == 0.5 and doc["force"] is False and doc["apply_to_closed_book"] is False
    assert validate_spec(doc) == doc
