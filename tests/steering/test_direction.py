"""Mean-difference directions from an activation store: within-question pairing, training split, CLI."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock
from memtoc.bench.benchmark import load_benchmark
from memtoc.cli import main
from steering import DirectionEdit, EditSpecError, load_edit
from steering.direction import estimate_directions

D = 8
SITES = (1, 3)


def _write_store(path, rows):
    """rows: (question_id, formulation, condition, position_kind, {site: vector}) -> one episode each."""
    with ActivationWriter.open(path, identity={"synthetic": True}, provenance={"config": {"benchmark": "demo"},
                                                                                 "model_id": "synthetic"},
                               sites=SITES, d_model=D, storage_dtype="float32") as w:
        eps, index, acts = [], {k: [] for k in ("episode_id", "question_id", "condition", "formulation",
                                                "position_kind", "token_index")}, {s: [] for s in SITES}
        for i, (q, f, cond, kind, vec) in enumerate(rows):
            eps.append({"episode_id": f"{q}-{f}-{cond}-{i}", "n_rows": 1})
            for k, v in (("episode_id", eps[-1]["episode_id"]), ("question_id", q), ("condition", cond),
                         ("formulation", f), ("position_kind", kind), ("token_index", 0)):
                index[k].append(v)
            for s in SITES:
                acts[s].append(vec[s])
        w.append(RowBlock(episodes=eps, index=index, acts={s: np.stack(acts[s]).astype(np.float32) for s in SITES}))
        w.finish(planned=[e["episode_id"] for e in eps])       # writes the store file (hashed by directions)


@pytest.fixture()
def synthetic(tmp_path):
    """Question offsets dominate; tool_wrong = offset + true direction; unpaired questions carry a confound."""
    rng = np.random.default_rng(0)
    qids = [q.id for q in load_benchmark("demo").questions[:8]]      # demo ids, so --fold works
    true = {s: rng.standard_normal(D) for s in SITES}
    rows = []
    for qi, q in enumerate(qids):
        for f in ("reference", "paraphrase_a"):
            off = {s: 10 * rng.standard_normal(D) for s in SITES}
            conds = ("tool_wrong", "tool_right")
            if qi == 0:
                conds = ("tool_wrong",)       # no pair: must not enter (its large offset would bias a pooled mean)
            for cond in conds:
                vec = {s: off[s] + (true[s] if cond == "tool_wrong" else 0) + 0.1 * rng.standard_normal(D)
                       for s in SITES}
                rows.append((q, f, cond, "last_input", vec))
            # another position kind with a different signal must be ignored
            rows.append((q, f, "tool_wrong", "tool_span", {s: -100 * true[s] for s in SITES}))
    path = tmp_path / "acts.h5"
    _write_store(path, rows)
    return path, rows, qids


def _manual(rows, site, train):
    groups = {}
    for q, f, cond, kind, vec in rows:
        if kind != "last_input" or q not in train:
            continue
        groups.setdefault((q, f), {}).setdefault(cond, []).append(vec[site].astype(np.float64))
    pairs = [g for g in groups.values() if "tool_wrong" in g and "tool_right" in g]
    d = np.mean([np.mean(np.asarray(g["tool_wrong"], dtype=np.float32).astype(np.float64), 0)
                 - np.mean(np.asarray(g["tool_right"], dtype=np.float32).astype(np.float64), 0) for g in pairs], 0)
    u = d / np.linalg.norm(d)
    xa = np.concatenate([np.asarray(g["tool_wrong"], dtype=np.float32) for g in pairs]).astype(np.float64)
    xb = np.concatenate([np.asarray(g["tool_right"], dtype=np.float32) for g in pairs]).astype(np.float64)
    return u, float((xa @ u).mean() - (xb @ u).mean()), len(pairs)


def test_within_question_mean_difference(synthetic):
    path, rows, qids = synthetic
    train = set(qids[:6])
    res = estimate_directions(path, contrast="tool_wrong:tool_right", layers=None, position_kind="last_input",
                              train_questions=train)
    assert sorted(res.fits) == list(SITES)
    for s in SITES:
        u, gap, n = _manual(rows, s, train)
        fit = res.fits[s]
        assert fit.n_groups == n == 10                         # 5 paired questions x 2 formulations
        np.testing.assert_allclose(fit.unit, u, rtol=0, atol=1e-6)
        assert abs(float(np.linalg.norm(fit.unit)) - 1) < 1e-6
        assert fit.scale == pytest.approx(gap, rel=1e-9)
        assert fit.scale == pytest.approx(fit.norm, rel=1e-6)   # one row per side per group: gap = ||d||
    # a pooled (unpaired) mean difference would be far off: the question offsets are large
    idx_rows = [r for r in rows if r[3] == "last_input" and r[0] in train]
    pooled = (np.mean([r[4][1] for r in idx_rows if r[2] == "tool_wrong"], 0)
              - np.mean([r[4][1] for r in idx_rows if r[2] == "tool_right"], 0))
    assert abs(float(pooled / np.linalg.norm(pooled) @ res.fits[1].unit)) < 0.99


def test_contrast_errors(synthetic):
    path, _, qids = synthetic
    with pytest.raises(EditSpecError, match="contrast"):
        estimate_directions(path, contrast="tool_wrong", layers=None, train_questions=None)
    with pytest.raises(EditSpecError, match="groups have rows on both sides"):
        estimate_directions(path, contrast="tool_wrong:no_tool", layers=None, train_questions=None)
    with pytest.raises(EditSpecError, match="not in"):
        estimate_directions(path, contrast="tool_wrong:tool_right", layers=[2], train_questions=None)
    with pytest.raises(EditSpecError, match="position kind"):
        estimate_directions(path, contrast="tool_wrong:tool_right", layers=None, position_kind="generated",
                            train_questions=None)
    a = estimate_directions(path, contrast="tool_wrong:tool_right", layers=[1], train_questions=None)
    b = estimate_directions(path, contrast="condition=tool_wrong,formulation=reference:"
                                           "condition=tool_right,formulation=reference", layers=[1],
                            train_questions=None)
    assert b.fits[1].n_groups == a.fits[1].n_groups // 2          # index filters: reference formulation only
    # a side may pool values of a column: both formulations = no filter; an absent alternative changes nothing
    c = estimate_directions(path, contrast="formulation=reference|paraphrase_a,condition=tool_wrong:"
                                           "condition=tool_right", layers=[1], train_questions=None)
    d = estimate_directions(path, contrast="condition=tool_wrong|no_tool:tool_right", layers=[1],
                            train_questions=None)
    for r in (c, d):
        np.testing.assert_array_equal(r.fits[1].unit, a.fits[1].unit)
        assert r.fits[1].n_rows_a == a.fits[1].n_rows_a
    # |gap| (the overreliance paper's scale): the flipped contrast has the negated unit and the same |scale|
    flip = estimate_directions(path, contrast="tool_right:tool_wrong", layers=[1], train_questions=None,
                               absolute_scale=True)
    np.testing.assert_allclose(flip.fits[1].unit, -a.fits[1].unit, atol=1e-6)
    assert flip.fits[1].scale == pytest.approx(abs(a.fits[1].scale)) and flip.source["scale"] == "|projection gap|"
    with pytest.raises(EditSpecError, match="no index column 'colour'"):
        estimate_directions(path, contrast="colour=red:tool_right", layers=None, train_questions=None)
    with pytest.raises(EditSpecError, match="training split"):
        estimate_directions(path, contrast="tool_wrong:tool_right", layers=None, train_questions={"nope"})


def test_direction_cli_writes_a_loadable_edit(synthetic, tmp_path, capsys):
    path, rows, qids = synthetic
    split = tmp_path / "train.txt"
    split.write_text("\n".join(qids[:6]) + "\n")
    out = tmp_path / "edits" / "dir.json"
    rc = main(["direction", "--activations", str(path), "--contrast", "tool_wrong:tool_right", "--layers", "1,3",
               "--split-questions", str(split), "--strength", "2", "--edit-positions", "from_tool_return",
               "--out", str(out)])
    assert rc == 0
    edit = load_edit(out)
    assert isinstance(edit, DirectionEdit) and edit.layers == (1, 3) and edit.strength == 2.0
    assert edit.positions == "from_tool_return" and edit.spec["toward"] == "memory"
    u, gap, _ = _manual(rows, 3, set(qids[:6]))
    np.testing.assert_allclose(edit.vectors[3].numpy(), u, atol=1e-6)
    assert edit.spec["scale"]["3"] == pytest.approx(gap, rel=1e-6)
    torch.testing.assert_close(edit.delta(3), (2.0 * gap * torch.from_numpy(u)).float(), rtol=1e-5, atol=1e-5)
    src = edit.spec["source"]
    assert src["contrast"] == "tool_wrong:tool_right" and src["n_groups"]["3"] == 10
    # --fold A: the demo fold's questions among the stored ones
    fold_a = {q.id for q in load_benchmark("demo").fold("A")}
    rc = main(["direction", "--activations", str(path), "--contrast", "tool_wrong:tool_right", "--fold", "A",
               "--out", str(tmp_path / "fold.json")])
    assert rc == 0
    fold_edit = load_edit(tmp_path / "fold.json")
    _, _, n = _manual(rows, 1, fold_a)
    assert fold_edit.spec["source"]["n_groups"]["1"] == n > 0
    # errors are one line naming the field, exit code 2
    rc = main(["direction", "--activations", str(path), "--contrast", "a:b:c", "--all-questions",
               "--out", str(tmp_path / "x.json")])
    assert rc == 2 and "contrast" in capsys.readouterr().err


def test_a_misspelt_condition_is_unknown_with_a_did_you_mean(synthetic, tmp_path, capsys):
    path, _, _ = synthetic
    rc = main(["direction", "--activations", str(path), "--contrast", "tool_wrong:tool_rigth", "--all-questions",
               "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "unknown condition 'tool_rigth'" in err and "did you mean 'tool_right'?" in err
    assert not (tmp_path / "x.json").exists()
    # a real condition the store lacks is not "unknown": the group count names it
    with pytest.raises(EditSpecError, match="groups have rows on both sides"):
        estimate_directions(path, contrast="tool_wrong:no_tool", layers=None, train_questions=None)


@pytest.mark.parametrize("contrast, toward", [
    ("tool_wrong:tool_right", "memory"),             # side A: the condition in which memory is the right source
    ("tool_right:tool_wrong", "tool"),
    ("tool_wrong_far:tool_right", "memory"),
    ("condition=tool_wrong,outcome=followed_tool:condition=tool_wrong,outcome=kept_memory", "tool"),  # outcome first
    ("outcome=kept_memory:outcome=followed_tool", "memory"),
    ("tool_wrong:tool_error", None),                 # both sides memory-right or side-less: nothing to derive
    ("tool_wrong:tool_wrong_far", None),
    ("condition=P1|P2:P0", None),
])
def test_the_behaviour_a_direction_pushes_toward_is_derived_only_where_the_sides_say(contrast, toward):
    from steering.direction import derive_toward

    got, basis = derive_toward(contrast)
    assert got == toward, basis
    assert ("derived" in basis) == (toward is not None)


def test_a_written_direction_names_its_sides_and_the_basis_of_its_behaviour(synthetic, tmp_path, capsys):
    """``tool_wrong:tool_right`` used to be written ``"toward": "memory"`` with nothing saying why: the spec now
    names what the vector points toward in the contrast's own terms, and where the memory/tool label comes from."""
    import json

    path, _, _ = synthetic
    common = ["direction", "--activations", str(path), "--layers", "1", "--all-questions"]
    assert main([*common, "--contrast", "tool_wrong:tool_right", "--out", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    spec = json.loads((tmp_path / "a.json").read_text())
    assert spec["contrast"] == {"toward": "tool_wrong", "from": "tool_right"}
    assert spec["toward"] == "memory" and spec["toward_basis"].startswith("derived from the contrast")
    assert "points from tool_right toward tool_wrong" in out
    # reversed: the other side, the other behaviour (and the vector negated)
    assert main([*common, "--contrast", "tool_right:tool_wrong", "--out", str(tmp_path / "b.json")]) == 0
    rev = json.loads((tmp_path / "b.json").read_text())
    assert rev["contrast"] == {"toward": "tool_right", "from": "tool_wrong"} and rev["toward"] == "tool"


def test_a_direction_without_a_side_records_none_and_cannot_be_steered_by_side(synthetic, tmp_path):
    """Sides without a memory/tool reading (the synthetic store has no tool_error rows: its fit is relabelled)."""
    import json

    from steering.direction import direction_edit
    from steering.kinds.direction import save_direction_edit

    path, _, _ = synthetic
    res = estimate_directions(path, contrast="tool_wrong:tool_right", layers=[1], train_questions=None)
    res.source.update(side_a="tool_wrong", side_b="tool_error")
    edit = direction_edit(res, name="x", toward=None, toward_basis="not derivable")
    assert edit.toward is None and edit.spec["contrast"] == {"toward": "tool_wrong", "from": "tool_error"}
    with pytest.raises(EditSpecError, match="--toward"):
        edit.steer("memory", 2.0)
    saved = tmp_path / "n.json"
    save_direction_edit(saved, edit)
    assert json.loads(saved.read_text())["toward"] is None and load_edit(saved).toward is None
    # a given --toward wins and says so
    given = main(["direction", "--activations", str(path), "--layers", "1", "--all-questions", "--contrast",
                  "tool_wrong:tool_right", "--toward", "tool", "--out", str(tmp_path / "g.json")])
    spec = json.loads((tmp_path / "g.json").read_text())
    assert given == 0 and spec["toward"] == "tool" and spec["toward_basis"] == "given"


def test_an_older_spec_without_the_new_fields_still_reads_as_memory(synthetic, tmp_path):
    """Specs written before ``contrast``/``toward_basis`` (and those without ``toward``) load as they did."""
    import json

    path, _, _ = synthetic
    assert main(["direction", "--activations", str(path), "--layers", "1", "--all-questions", "--contrast",
                 "tool_wrong:tool_right", "--out", str(tmp_path / "old.json")]) == 0
    spec = json.loads((tmp_path / "old.json").read_text())
    for key in ("contrast", "toward_basis", "toward"):
        spec.pop(key)
    (tmp_path / "old.json").write_text(json.dumps(spec))
    edit = load_edit(tmp_path / "old.json")
    assert edit.toward == "memory" and edit.steer("tool", 2.0).strength == -2.0
