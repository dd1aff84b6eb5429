"""``memtoc lens fit``: resumability, provenance checks, the shipped corpus, the CLI."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from probes.fit import default_corpus_path, fit_lens, read_corpus, state_path, tokenize_sequence
from probes.lens import JacobianLens
from probes.model import LensMismatchError, ProbeError

LINES = [
    "The small boat drifted on the still lake while the sun went down behind the pine trees.",
    "Water boils at a lower temperature on a high mountain than at sea level, because the pressure is lower.",
    "She had never driven on the left side of the road before, so the first hour was tense.",
    "Hi",
    "A good map tells you more than where the roads go: contour lines show how steep the ground is.",
    "The meeting started ten minutes late because the projector would not connect to anyone's computer.",
]
FIT = dict(max_seq_len=20, skip_first=2, batch_rows=8, mode="replicate")


@pytest.fixture()
def corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.txt"
    p.write_text("# test corpus\n" + "\n".join(LINES) + "\n", encoding="utf-8")
    return p


def test_interrupted_fit_resumes_to_the_uninterrupted_lens(tiny_backend, corpus, tmp_path):
    m, tok = tiny_backend.model, tiny_backend.tokenizer
    full = fit_lens(m, tok, tmp_path / "full.safetensors", corpus=corpus, **FIT)
    assert full.complete and full.n_done == len(LINES)
    assert full.n_used == len(LINES) - 1          # "Hi" leaves no valid position after skip_first


    out = tmp_path / "resumed.safetensors"
    part = fit_lens(m, tok, out, corpus=corpus, stop_after=2, **FIT)
    assert not part.complete and part.n_done == 2
    assert state_path(out).exists() and not out.exists()

    class Boom(RuntimeError):
        pass

    def explode(i, n):
        if i == 4:
            raise Boom("simulated crash")

    with pytest.raises(Boom):
        fit_lens(m, tok, out, corpus=corpus, on_sequence=explode, **FIT)
    assert not out.exists()
    done = fit_lens(m, tok, out, corpus=corpus, **FIT)
    assert done.complete and done.notes == ["resumed after 4 of 6 sequences"]
    assert not state_path(out).exists()
    a = JacobianLens.load(tmp_path / "full.safetensors", model=m)
    b = JacobianLens.load(out, model=m)
    assert a.sites == b.sites == [0, 1, 2]
    for s in a.sites:
        assert torch.equal(a.matrices[s], b.matrices[s])
        assert a.matrices[s].abs().max() > 0
    assert a.meta["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert a.meta["n_sequences"] == full.n_used and a.meta["complete"] is True
    # a finished fit is not redone
    again = fit_lens(m, tok, out, corpus=corpus, **FIT)
    assert again.complete and again.notes == ["already complete; nothing to do"]


def test_resume_with_another_corpus_is_refused(tiny_backend, corpus, tmp_path):
    m, tok = tiny_backend.model, tiny_backend.tokenizer
    out = tmp_path / "lens.safetensors"
    fit_lens(m, tok, out, corpus=corpus, stop_after=1, **FIT)
    other = tmp_path / "other.txt"
    other.write_text("\n".join(reversed(LINES)) + "\n", encoding="utf-8")
    with pytest.raises(LensMismatchError, match="corpus_sha256"):
        fit_lens(m, tok, out, corpus=other, **FIT)
    with pytest.raises(LensMismatchError, match="skip_first"):
        fit_lens(m, tok, out, corpus=corpus, **{**FIT, "skip_first": 3})


def test_lens_read_for_a_different_model_is_refused(tiny_backend, corpus, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    from memtoc.backends.hf import HFBackend

    out = tmp_path / "lens.safetensors"
    fit_lens(tiny_backend.model, tiny_backend.tokenizer, out, corpus=corpus, limit=2, **FIT)
    JacobianLens.load(out, model=tiny_backend.model)                      # the fitted model: accepted
    other = HFBackend.load(str(conf.build_tiny_model(tmp_path / "other", seed=7)), device="cpu", dtype="float32")
    with pytest.raises(LensMismatchError, match="fitted on another model"):
        JacobianLens.load(out, model=other.model)
    # the same weights loaded in float64 are the same model
    JacobianLens.load(out, model=tiny_backend.model.to(torch.float64))
    tiny_backend.model.to(torch.float32)
    # a fit's partial state is not a lens, and an unfinished fit is refused
    fit_lens(tiny_backend.model, tiny_backend.tokenizer, tmp_path / "p.safetensors", corpus=corpus, stop_after=1,
             **FIT)
    with pytest.raises(LensMismatchError, match="not a memtoc Jacobian lens"):
        JacobianLens.load(state_path(tmp_path / "p.safetensors"))
    with pytest.raises(ProbeError, match="not found"):
        JacobianLens.load(tmp_path / "missing.safetensors")
    # an existing lens of other settings is never overwritten
    with pytest.raises(ProbeError, match="exists and is not this fit"):
        fit_lens(tiny_backend.model, tiny_backend.tokenizer, out, corpus=corpus, limit=2, **{**FIT, "max_seq_len": 12})


def test_shipped_corpus(tiny_backend):
    seqs, sha, name = read_corpus(None)
    assert name == "lens_corpus.txt" and default_corpus_path().exists()
    assert len(seqs) >= 100 and len(set(seqs)) == len(seqs)
    assert sha == hashlib.sha256(default_corpus_path().read_bytes()).hexdigest()
    lengths = [len(tokenize_sequence(tiny_backend.tokenizer, s, max_seq_len=10_000, force_bos=True)) for s in seqs]
    assert min(lengths) > 16 + 2          # every line leaves valid positions after the attention-sink skip
    ids = tokenize_sequence(tiny_backend.tokenizer, seqs[0], max_seq_len=8, force_bos=True)
    assert len(ids) == 8 and ids[0] == tiny_backend.tokenizer.bos_token_id


def test_cli_lens_fit_and_resume(tiny_model_dir, corpus, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "cli.safetensors"
    args = ["lens", "fit", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out", str(out), "--device",
            "cpu", "--skip-first", "2", "--max-seq-len", "20", "--layers", "1-2", "--no-progress"]
    assert main(args + ["--stop-after", "3"]) == 0
    assert "re-run the same command to resume" in capsys.readouterr().out
    assert main(args) == 0
    assert "lens written to" in capsys.readouterr().out
    lens = JacobianLens.load(out)
    assert lens.sites == [1, 2] and lens.meta["model"] == str(tiny_model_dir)
    # --mode auto (the default) measured the three estimators here and recorded the choice
    cal = lens.meta["estimator_calibration"]
    assert set(cal["seconds_per_row"]) == {"replicate", "vmap", "one_row"}
    assert lens.meta["estimator_mode"] == min(cal["seconds_per_row"], key=cal["seconds_per_row"].get)
    assert main(["lens", "fit", "--model", str(tiny_model_dir), "--corpus", str(tmp_path / "nope.txt"), "--out",
                 str(tmp_path / "x.safetensors"), "--device", "cpu", "--no-progress"]) == 2


def test_lens_fit_default_band_is_the_rank_tables_default_band(tiny_model_dir, corpus, tmp_path, tiny_backend):
    """A lens fitted with --layers default covers exactly the sites rank-table reads by default."""
    from memtoc.cli import main
    from probes.rank_table import resolve_band

    out = tmp_path / "band.safetensors"
    assert main(["lens", "fit", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out", str(out),
                 "--device", "cpu", "--skip-first", "2", "--max-seq-len", "12", "--layers", "default", "--limit", "1",
                 "--mode", "one_row", "--no-progress"]) == 0
    parts = tiny_backend.parts
    want = [s for s in resolve_band("default", parts.model_type, parts.n_layers)[0] if s != parts.n_layers]
    assert JacobianLens.load(out).sites == want


def test_calibration_picks_the_estimator_measured_fastest(tiny_backend):
    from probes.fit import calibrate_estimator

    parts = tiny_backend.parts
    ids = torch.arange(3, 15)
    for timings, want in (({"replicate": 2.0, "vmap": 1.0, "one_row": 3.0}, "vmap"),
                          ({"replicate": 0.5, "vmap": 1.0, "one_row": 0.7}, "replicate"),
                          ({"replicate": 0.9, "vmap": 1.0, "one_row": 0.2}, "one_row")):
        seen = []

        def measure(c, _t=timings):
            seen.append(c.name)
            return _t[c.name]

        pick = calibrate_estimator(parts, ids, [0, 1], skip_first=2, batch_rows=8, measure=measure)
        assert pick.name == want and pick.seconds_per_row == timings
        assert sorted(set(seen)) == sorted(timings) and len(seen) == 2 * len(timings)   # 2 interleaved rounds
        assert (pick.mode, pick.batch_rows) == (("replicate", 1) if want == "one_row" else (want, 8))


def test_auto_fit_records_the_choice_and_gives_the_same_lens(tiny_backend, corpus, tmp_path):
    m, tok = tiny_backend.model, tiny_backend.tokenizer
    timings = {"replicate": 0.3, "vmap": 0.2, "one_row": 0.1}
    fit = {**FIT, "mode": "auto"}
    res = fit_lens(m, tok, tmp_path / "auto.safetensors", corpus=corpus, measure=lambda c: timings[c.name], **fit)
    meta = JacobianLens.load(res.path, model=m).meta
    assert meta["estimator_mode"] == "one_row" and meta["estimator_batch_rows"] == 1
    assert meta["estimator_calibration"]["seconds_per_row"] == timings
    assert meta["seconds_per_sequence"] > 0
    ref = fit_lens(m, tok, tmp_path / "rep.safetensors", corpus=corpus, **FIT)
    assert JacobianLens.load(ref.path).meta["estimator_mode"] == "replicate"
    assert JacobianLens.load(ref.path).meta["estimator_calibration"] is None
    a, b = JacobianLens.load(res.path), JacobianLens.load(ref.path)
    for s in a.sites:
        torch.testing.assert_close(a.matrices[s], b.matrices[s], atol=1e-6, rtol=1e-5)


def test_named_corpora_and_the_default_corpus_size(tiny_backend):
    from probes.fit import DEFAULT_CORPUS_LINES, resolve_limit

    quick, sha, name = read_corpus("quick")
    assert name == "lens_corpus_quick.txt" and len(quick) == 2
    assert sha == hashlib.sha256(default_corpus_path("quick").read_bytes()).hexdigest()
    assert read_corpus("default")[1] == read_corpus(None)[1]
    lengths = [len(tokenize_sequence(tiny_backend.tokenizer, s, max_seq_len=128, force_bos=True)) for s in quick]
    assert min(lengths) > 16 + 2          # the quick lines leave valid positions after the default skip
    assert resolve_limit(None, None) == resolve_limit("default", None) == DEFAULT_CORPUS_LINES
    assert resolve_limit("my.txt", None) is None and resolve_limit(None, 0) is None and resolve_limit(None, 3) == 3


def test_rank_table_recipe_fits_a_jacobian_lens_under_quick():
    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "experiments" / "rank_table.toml")
    steps = {st.name: st for st in recipe.steps}
    assert not steps["lens"].skip_quick and steps["lens"].quick["corpus"] == "quick"
    assert "lens" not in steps["rank_table"].quick                     # the Jacobian lens is read under --quick too
    assert "jacobian" in steps["rank_table"].args["lens"]


def test_the_fit_modes_of_the_command_are_the_estimators():
    """``lens fit --mode`` lists its choices without importing torch (memtoc.jobs.lens_fit.FIT_MODES): they are
    exactly the estimators of probes.fit."""
    from memtoc.jobs.lens_fit import FIT_MODES
    from probes.fit import MODES

    assert FIT_MODES == MODES


def test_calibration_is_its_own_phase_of_the_progress(tiny_backend, corpus, tmp_path, capsys):
    """The estimator's calibration (as long as a few corpus lines on a CPU) reports its own steps before the
    first line, so the progress moves while it runs instead of sitting at 0 lines."""
    m, tok = tiny_backend.model, tiny_backend.tokenizer
    events: list[tuple[str, int, int]] = []
    timings = {"replicate": 0.3, "vmap": 0.2, "one_row": 0.1}
    fit_lens(m, tok, tmp_path / "auto.safetensors", corpus=corpus, limit=2, progress=True,
             measure=lambda c: timings[c.name], on_calibration=lambda i, n: events.append(("calibration", i, n)),
             on_sequence=lambda i, n: events.append(("line", i, n)), **{**FIT, "mode": "auto"})
    calibration = [e for e in events if e[0] == "calibration"]
    assert calibration == [("calibration", i, 6) for i in range(1, 7)]        # 2 rounds x 3 estimators
    assert events[:6] == calibration and events[6:] == [("line", 1, 2), ("line", 2, 2)]
    err = capsys.readouterr().err
    assert "calibrating the estimator" in err and "6/6" in err, err
    from probes.fit import calibrate_estimator

    steps: list[tuple[int, int]] = []                     # timed for real: the warm-ups count too
    calibrate_estimator(tiny_backend.parts, torch.arange(3, 15), [0, 1], skip_first=2, batch_rows=4,
                        on_step=lambda i, n: steps.append((i, n)))
    assert steps == [(i, 9) for i in range(1, 10)]
