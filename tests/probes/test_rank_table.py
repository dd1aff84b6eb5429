"""The memory-answer rank table, end to end on the tiny model and (briefly) on the default model."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
import torch

from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.runs.runstore import RunStore
from probes.answer import answer_token
from probes.lens import JacobianLens
from probes.model import ModelParts, ProbeError, token_ranks
from probes.rank_table import RankTableConfig, build_rank_table, select_episodes, write_rank_table
from memtoc.core.values import build_config


def _cfg(model, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model), benchmark="demo", out=str(out), formulations="reference", conditions="tool_wrong",
                limit=4, batch_size=4, max_new_tokens=12, device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def _rewrite(path: Path, fn) -> None:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("".join(json.dumps(fn(r), ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")


def test_rank_table_runs_on_a_real_tiny_run(tiny_backend, tiny_run, tiny_lens, tmp_path):
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(tiny_run), lens=["jacobian"],
                                                           lens_file=str(tiny_lens)))
    n_arb = len(select_episodes(RunStore.read(tiny_run), "tool_wrong", "arb"))
    assert table.meta["n_episodes"] == n_arb            # whatever the random model's cells are
    every = select_episodes(RunStore.read(tiny_run), "tool_wrong", "all")   # cell "all" is every cell
    assert len(every) == sum(r["condition"] == "tool_wrong" for r in RunStore.read(tiny_run).episodes.records())
    assert len(every) > 0 and len(select_episodes(RunStore.read(tiny_run), "all", "all")) >= len(every)
    paths = write_rank_table(table, tmp_path / "out")
    assert all(p.exists() for p in paths.values())
    # the 3-sequence lens is labelled a smoke fit beside the paper's rows, never a plain "this run" row
    assert table.meta["lens_metas"]["jacobian"]["n_sequences"] == 3
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "| this run, jacobian lens (SMOKE FIT: 3-sequence corpus" in md and "| this run, jacobian lens |" not in md


def test_table8_labels_a_lens_by_its_corpus_size():
    from probes.fit import DEFAULT_CORPUS_LINES
    from probes.rank_table import RankTable, table8_markdown

    def rows(n):
        meta = {"top_k": 20, "lenses": ["logit", "jacobian"],
                "lens_metas": {"jacobian": {"n_sequences": n, "corpus": "/x/lens_corpus_quick.txt"}}}
        return [line for line in table8_markdown(RankTable(meta=meta, episodes=[])) if line.startswith("| this run")]

    smoke = rows(2)
    assert smoke[0].startswith("| this run, logit lens |")
    assert smoke[1].startswith("| this run, jacobian lens (SMOKE FIT: 2-sequence corpus `lens_corpus_quick.txt`")
    assert "not comparable with the paper's rows" in smoke[1]
    full = rows(DEFAULT_CORPUS_LINES)
    assert full[1].startswith(f"| this run, jacobian lens ({DEFAULT_CORPUS_LINES}-sequence corpus") and \
        "SMOKE" not in full[1]


def test_rank_table_numbers_match_an_independent_computation(tiny_backend, arb_run, tiny_lens, tmp_path):
    cfg = RankTableConfig(run=str(arb_run), lens=["jacobian", "detached", "jvp"], lens_file=str(tiny_lens),
                          batch_size=1, layers="depth")
    table = build_rank_table(tiny_backend, cfg)
    parts = ModelParts.of(tiny_backend.model, len(tiny_backend.tokenizer))
    L = parts.n_layers
    sites = table.meta["sites"]
    assert sites == [1, 2, 3] and table.meta["lenses"] == ["logit", "jacobian", "detached", "jvp"]
    lens = JacobianLens.load(tiny_lens)
    store = RunStore.read(arb_run)
    eps = {r["episode_id"]: r for r in store.episodes.records()}
    assert len(table.episodes) == len(eps) == 4
    tok = tiny_backend.tokenizer
    for row in table.episodes:
        ep = eps[row["episode_id"]]
        # the answer token is the first token covering the answer's first character (with its leading space when
        # the tokenizer merges it; the tiny BPE often keeps the space as a token of its own)
        assert row["answer_token_id"] is not None and row["prompt_prefix_ok"]
        dec = tok.decode([row["answer_token_id"]])
        assert dec.strip() and (" " + ep["memory_span"]).startswith(dec) or ep["memory_span"].startswith(dec)
        # independent forward: one unpadded prompt through the model with output_hidden_states
        batch = tiny_backend.encode([ep["prompt"]])
        with torch.no_grad():
            out = tiny_backend.model(**batch, output_hidden_states=True)
        hs = out.hidden_states
        for s in sites:
            x = hs[s][0, -1] if s < L else None
            if s == L:   # hidden_states[L] is final-normed: the logit lens there is the model's own output
                logit_logits = out.logits[0, -1]
                jac_logits = logit_logits
            else:
                logit_logits = tiny_backend.model.lm_head(tiny_backend.model.model.norm(x))
                jac_logits = tiny_backend.model.lm_head(tiny_backend.model.model.norm(lens.matrices[s] @ x))
            for kind, z in (("logit", logit_logits), ("jacobian", jac_logits)):
                want = 1 + int((z[:len(tok)] > z[row["answer_token_id"]]).sum())
                assert row["lenses"][kind]["ranks_by_site"][str(s)] == want, (kind, s)
        for kind in table.meta["lenses"]:
            d = row["lenses"][kind]
            by_site = {int(k): v for k, v in d["ranks_by_site"].items()}
            assert d["rank"] == min(by_site.values()) and by_site[d["best_site"]] == d["rank"]
            assert d["rank_variant"] <= d["rank"]
            # every lens reads the model's own output at the last site
            assert by_site[L] == row["lenses"]["logit"]["ranks_by_site"][str(L)]
        assert row["n_controls"] >= 1
    # behaviours and the in-prompt split come from the records
    behaviours = sorted(r["behaviour"] for r in table.episodes)
    assert behaviours == ["followed_tool", "followed_tool", "kept_memory", "other"]
    assert sum(r["answer_in_prompt"] for r in table.episodes) >= 1
    # summary = medians / top-k counts of the per-episode numbers
    for s in table.summary:
        sel = [r for r in table.episodes if (s["behaviour"] == "all" or r["behaviour"] == s["behaviour"])
               and (s["split"] == "all" or r["answer_in_prompt"] == (s["split"] == "in_prompt"))]
        ranks = [r["lenses"][s["lens"]]["rank"] for r in sel]
        assert s["n"] == len(sel)
        assert s["median_rank"] == (statistics.median(ranks) if ranks else None)
        assert s["top20"] == sum(x <= 20 for x in ranks)
        ctrl = [r["lenses"][s["lens"]]["control_median"] for r in sel]
        assert s["control_median"] == (statistics.median(ctrl) if ctrl else None)


def test_control_ranks_are_other_questions_answers(tiny_backend, arb_run):
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["logit"], batch_size=4))
    store = RunStore.read(arb_run)
    cb = store.closed_book.records()
    row = table.episodes[0]
    others = sorted({answer_token(tiny_backend, r["prompt"], r["memory_span"]).token_id for r in cb
                     if r["question_id"] != row["question_id"]} - {row["answer_token_id"]})
    assert row["n_controls"] == len(others) >= 1
    ep = next(r for r in store.episodes.records() if r["episode_id"] == row["episode_id"])
    parts = ModelParts.of(tiny_backend.model, len(tiny_backend.tokenizer))
    with torch.no_grad():
        out = tiny_backend.model(**tiny_backend.encode([ep["prompt"]]), output_hidden_states=True)
    z = torch.stack([parts.unembed(out.hidden_states[s][0, -1]) for s in table.meta["sites"][:-1]]
                    + [out.logits[0, -1].float()])
    band_min = token_ranks(z, others, parts.n_vocab).min(0).values.tolist()
    assert row["lenses"]["logit"]["control_median"] == statistics.median(band_min)


def test_rank_table_is_reproducible_and_written_in_three_formats(tiny_backend, arb_run, tiny_lens, tmp_path):
    cfg = RankTableConfig(run=str(arb_run), lens=["jacobian", "detached"], lens_file=str(tiny_lens), batch_size=3)
    a = build_rank_table(tiny_backend, cfg)
    b = build_rank_table(tiny_backend, cfg)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    paths = write_rank_table(a, tmp_path / "out")
    rows = list(csv.DictReader(paths["csv"].open(encoding="utf-8")))
    assert len(rows) == 4 and int(rows[0]["jacobian_rank"]) == a.episodes[0]["lenses"]["jacobian"]["rank"]
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "## jacobian lens" in md and "## logit lens" in md and "control median" in md
    saved = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert saved["episodes"][0]["lenses"]["detached"]["ranks_by_site"] == \
        a.episodes[0]["lenses"]["detached"]["ranks_by_site"]
    assert list(csv.DictReader(paths["summary_csv"].open()))[0]["lens"] == "logit"


def test_rank_table_refusals(tiny_backend, arb_run, tiny_lens, tmp_path):
    with pytest.raises(ProbeError, match="needs --lens-file"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["jacobian"]))
    with pytest.raises(ProbeError, match="unknown lens"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["tuned"]))
    lens = JacobianLens.load(tiny_lens)
    lens.matrices.pop(2)
    lens.save(tmp_path / "holes.safetensors")
    with pytest.raises(ProbeError, match="no matrices for sites"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["jacobian"],
                                                       lens_file=str(tmp_path / "holes.safetensors")))


def test_cli_rank_table(tiny_model_dir, arb_run, tiny_lens, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "rt"
    assert main(["rank-table", "--model", str(tiny_model_dir), "--run", str(arb_run), "--layers", "2-3", "--lens",
                 "jacobian,detached", "--lens-file", str(tiny_lens), "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "## jacobian lens" in printed and "rank_table.csv" in printed
    saved = json.loads((out / "rank_table.json").read_text())
    assert saved["meta"]["sites"] == [2, 3] and saved["meta"]["n_episodes"] == 4


@pytest.mark.real_model
def test_rank_table_on_the_default_model(default_backend, tmp_path):
    run = tmp_path / "run"
    evaluate(_cfg("default", run, limit=2, max_new_tokens=40), backend=default_backend, log=lambda s: None)
    # whatever the short generations' cells are, read every tool_wrong episode with a memory answer as "arb"
    _rewrite(run / "episodes.jsonl", lambda r: {**r, "cell": "arb" if (r["memory_span"] or "").strip() else r["cell"]})
    cfg = RankTableConfig(run=str(run), lens=["detached"], cell="arb")
    a = build_rank_table(default_backend, cfg)
    b = build_rank_table(default_backend, cfg)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    # the paper's Llama band (blocks 8-28 of 32) on SmolLM2's 30 blocks: blocks 8-26 = sites 9-27
    assert a.meta["sites"] == list(range(9, 28)) and a.meta["n_vocab"] == 49152
    assert a.episodes
    for row in a.episodes:
        assert row["prompt_prefix_ok"]
        dec = default_backend.tokenizer.decode([row["answer_token_id"]])
        assert dec.startswith(" ") and (" " + row["answer_text"]).startswith(dec)   # byte-level BPE: 'ĠParis'-style
        for kind in ("logit", "detached"):
            assert 1 <= row["lenses"][kind]["rank"] <= 49152
    write_rank_table(a, tmp_path / "out")


def test_gold_answer_mode(tiny_backend, arb_run):
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["logit"], answer="gold"))
    eps = {r["episode_id"]: r for r in RunStore.read(arb_run).episodes.records()}
    for row in table.episodes:
        assert row["answer_text"] == eps[row["episode_id"]]["gold_answer"]
        want = answer_token(tiny_backend, eps[row["episode_id"]]["prompt"], row["answer_text"]).token_id
        assert row["answer_token_id"] == want
    assert table.meta["answer"] == "gold"
    with pytest.raises(ProbeError, match="unknown --answer"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["logit"], answer="tool"))


def test_paper_band_per_family_in_block_numbering():
    from memtoc.bench.paper_protocol import lens_sites, sae_sites
    from probes.rank_table import resolve_band

    # the paper's own models: blocks as printed, sites = block + 1
    assert lens_sites("llama", 32) == tuple(range(9, 30))          # blocks 8-28
    assert lens_sites("gemma2", 42) == tuple(range(11, 40))        # blocks 10-38
    assert lens_sites("qwen2", 28) == tuple(range(8, 26))          # blocks 7-24
    assert sae_sites("LlamaForCausalLM", 32) == (13, 14, 15, 16)   # Llama Scope 12-15
    assert sae_sites("llama", 32, "goodfire") == (20,)
    assert sae_sites("gemma2", 42) == (24, 25, 26, 27) and sae_sites("gemma2", 42, "gemmascope_it") == (10, 21)
    # another depth: rescaled (SmolLM2-135M, 30 blocks: 8*30/32 = 7.5 -> 8, 28*30/32 = 26.25 -> 26)
    assert lens_sites("llama", 30) == tuple(range(9, 28))
    assert resolve_band("default", "llama", 32)[0] == tuple(range(9, 30))
    assert resolve_band("depth", "llama", 32)[0] == tuple(range(8, 30))     # round(0.25 L)..round(0.9 L)
    assert resolve_band("default", "mistral", 32)[1].startswith("depth")   # not a paper family
    with pytest.raises(ProbeError):
        resolve_band("paper", "mistral", 32)


def test_all_subtoken_rank_and_table8_columns(tiny_backend, arb_run, tmp_path):
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["logit"], batch_size=2))
    store = RunStore.read(arb_run)
    eps = {r["episode_id"]: r for r in store.episodes.records()}
    parts = ModelParts.of(tiny_backend.model, len(tiny_backend.tokenizer))
    tok = tiny_backend.tokenizer
    sites = table.meta["sites"]
    for row in table.episodes:
        ep = eps[row["episode_id"]]
        # the answer span's tokens, independently: tokenize the formatted prompt + "FINAL: " + answer
        formatted = tiny_backend.format_prompt(ep["prompt"])
        start = len(formatted) + len("FINAL: ")
        enc = tok(formatted + "FINAL: " + ep["memory_span"].strip(), add_special_tokens=False,
                  return_offsets_mapping=True)
        subs = {t for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if b > a and b > start}
        # punctuation / whitespace pieces are not answer evidence (kept only when nothing else is left)
        subs = ({t for t in subs if re.search(r"[^\W_]", tok.decode([t]))} or subs) | {row["answer_token_id"]}
        assert set(row["answer_subtoken_ids"]) == subs and row["answer_token_id"] in subs
        with torch.no_grad():
            out = tiny_backend.model(**tiny_backend.encode([ep["prompt"]]), output_hidden_states=True)
        z = torch.stack([parts.unembed(out.hidden_states[s][0, -1]) if s < parts.n_layers
                         else out.logits[0, -1].float() for s in sites])
        want = min(int(1 + (z[i, :len(tok)] > z[i, t]).sum()) for i in range(len(sites)) for t in subs)
        d = row["lenses"]["logit"]
        assert d["rank_subtoken"] == want <= d["rank"]
    md = write_rank_table(table, tmp_path / "o")["markdown"].read_text(encoding="utf-8")
    assert "## Table 8" in md and "paper: gemma-2-9b-it" in md and "answer not in prompt" in md
    from probes.rank_table import table8_rows
    r8 = table8_rows(table)[0]
    fol = [r["lenses"]["logit"]["rank"] for r in table.episodes if r["behaviour"] == "followed_tool"]
    assert r8["followed_median"] == statistics.median(fol)
    assert r8["followed_top"] == f"{sum(x <= 20 for x in fol)}/{len(fol)}"
    nip = [r["lenses"]["logit"]["rank"] for r in table.episodes
           if r["behaviour"] == "kept_memory" and not r["answer_in_prompt"]]
    assert r8["kept_top_not_in_prompt"] == f"{sum(x <= 20 for x in nip)}/{len(nip)}"


def test_content_subtokens_drop_punctuation_and_whitespace_pieces(tiny_backend):
    from probes.answer import content_subtokens

    tok = tiny_backend.tokenizer
    ids = tok("Rome, Italy.", add_special_tokens=False)["input_ids"]
    kept = content_subtokens(tok, ids)
    assert kept and all(re.search(r"[^\W_]", tok.decode([t])) for t in kept)
    assert [t for t in ids if not re.search(r"[^\W_]", tok.decode([t]))]       # the input had such pieces
    only_punct = tok(" .,", add_special_tokens=False)["input_ids"]
    assert content_subtokens(tok, only_punct) == only_punct                     # nothing else: all kept
