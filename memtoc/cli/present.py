"""How each command shows its job's result: one function per command, registered under the command's name.

``present(result, config)`` prints the result and returns the exit status. The job does the work and returns
the result object; the Python API returns the same object instead of printing it.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

Presenter = Callable[[Any, Any], int]

#: command name -> how its result is shown (every command has one: ``tests/memtoc/cli/test_present.py``)
PRESENTERS: dict[str, Presenter] = {}


def present(command: str, result: Any, cfg: Any) -> int:
    """Print the job's result as ``command`` shows it; the exit status."""
    return int(PRESENTERS[command](result, cfg) or 0)


def presents(*commands: str) -> Callable[[Presenter], Presenter]:
    def register(fn: Presenter) -> Presenter:
        PRESENTERS.update(dict.fromkeys(commands, fn))
        return fn
    return register


def _written(files: Any) -> str:
    return "written: " + ", ".join(str(p) for p in files.values())


# --- evaluation and scoring ---------------------------------------------------------------------------------
@presents("evaluate")
def evaluate(result: Any, cfg: Any) -> int:
    """The metric table, then the run directory and how many episodes are done."""
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({result.summary['n_episodes']['done']}/"
          f"{result.summary['n_episodes']['planned']} episodes; {result.n_episodes_new} new)")
    return 0


@presents("score")
def score(result: Any, cfg: Any) -> int:
    print(f"scored {len(result.records)} records -> {result.out}  outcomes: " +
          ", ".join(f"{k}={v}" for k, v in sorted(result.counts.items())))
    return 0


@presents("metrics")
def metrics(result: Any, cfg: Any) -> int:
    """The table of the layer asked for; the judged layer adds the judge, its changes and the CAR table; both
    layers are shown side by side with the difference."""
    if result.layer == "deterministic":
        print(result.tables["deterministic"].format_text())
        return 0
    from memtoc.scoring.judge.ack import format_car_table

    judged = result.judged
    if result.layer == "judged":
        print(result.tables["judged"].format_text())
    print(f"\njudge: {judged.judge.get('model')} (prompts {judged.judge.get('prompt_version')}); "
          f"changes: {json.dumps(judged.changes)}")
    if judged.partial_text is not None:
        print(f"PARTIAL judge pass (--allow-partial): {judged.partial_text}; unjudged episodes keep the "
              "scorer's labels")
    print(format_car_table(judged.car))
    if result.layer == "both":
        from memtoc.scoring.judge.sidebyside import side_by_side_text

        print()
        print(side_by_side_text(result.tables["deterministic"], result.tables["judged"]))
    return 0


@presents("episodes")
def episodes(result: Any, cfg: Any) -> int:
    eps = result.episodes
    counts = Counter((e.formulation, e.arm) for e in eps)
    print(f"{len(eps)} episodes from {len({e.question.id for e in eps})} questions (frame {result.frame}, question "
          f"set {result.question_set}, protocol {cfg.protocol}) -> {cfg.out}")
    for (f, arm), n in sorted(counts.items()):
        print(f"  {f:13s} {arm:15s} {n}")
    return 0


@presents("compare")
def compare(result: Any, cfg: Any) -> int:
    print(result.format_text())
    return 0


@presents("switch")
def switch(summary: Any, cfg: Any) -> int:
    print(summary["table_text"])
    sw = summary["switch"]
    print(f"\nswitch ({sw['gate']} gate, knob {sw['knob']}): fired on {sw['n_fired']} of "
          f"{summary['n_episodes']['done']} episodes -> {cfg.out}")
    return 0


# --- activations, lenses, probes ----------------------------------------------------------------------------
@presents("extract")
def extract(result: Any, cfg: Any) -> int:
    """One line: the store, how many planned episodes it holds, what this run added; exit 1 when incomplete."""
    state = "complete" if result.complete else "INCOMPLETE"
    print(f"{result.path}: {result.n_done}/{result.n_planned} planned episodes stored ({state}); "
          f"{result.n_new_episodes} new episodes, {result.n_new_rows} new rows"
          + (f"; labels joined for {result.n_labelled} episodes" if result.n_labelled is not None else ""))
    return 0 if result.complete else 1


@presents("probe")
def probe(res: Any, cfg: Any) -> int:
    """The table, the best site, the files written."""
    print(res.files["markdown"].read_text(encoding="utf-8").rstrip())
    b = res.report.best()
    print(f"\nbest site {b.site}: AUROC {b.auroc_pooled:.3f} [{b.ci_low:.3f}, {b.ci_high:.3f}]")
    print(_written(res.files))
    return 0


@presents("patch")
def patch(res: Any, cfg: Any) -> int:
    """The top cells, the agreement, the files written."""
    from memtoc.jobs.patch import to_markdown

    print(to_markdown(res).rstrip())
    print(_written(res.files))
    return 0


@presents("features")
def features(res: Any, cfg: Any) -> int:
    print(f"{len(res.views)} latents -> {res.files['html']} (and {res.files['json']})")
    return 0


@presents("lens fit")
def lens_fit(res: Any, cfg: Any) -> int:
    """The fit's notes, then where the lens (or the resumable state) is."""
    for note in res.notes:
        print(note)
    if res.complete:
        print(f"lens written to {res.path}: {res.n_used} sequences used of {res.n_planned} "
              f"({res.seconds:.1f} s this call)")
        return 0
    print(f"stopped after {res.n_done} of {res.n_planned} sequences; state in {res.path}.partial -- re-run the "
          "same command to resume")
    return 0


@presents("rank-table")
def rank_table(res: Any, cfg: Any) -> int:
    """The summary tables (not the per-episode rows), the files written."""
    from probes.rank_table import to_markdown

    print(to_markdown(res.table).split("## Episodes")[0].rstrip())
    print("\n" + _written(res.files))
    return 0


@presents("sae train")
def sae_train(paths: Any, cfg: Any) -> int:
    """The ``--sae`` value that mines with the SAEs just trained."""
    print("use with mine-features: --sae " + ",".join(f"{s}={p}" for s, p in paths))
    return 0


@presents("sae fvu")
def sae_fvu(res: Any, cfg: Any) -> int:
    """One line per site with the gate's verdict; exit status 1 when a site fails the gate."""
    print(f"{'site':>4}  {'FVU':>8}  {'L0':>7}  {'rows':>6}  gate (FVU <= {res.threshold})  SAE")
    for site, r in sorted(res.report.items()):
        gate = "pass" if r["fvu"] <= res.threshold else "FAIL"
        print(f"{site:>4}  {r['fvu']:>8.4f}  {r['l0']:>7.1f}  {r['n_rows']:>6}  {gate:<20}  {r['sae']}")
    return 1 if res.failed else 0


@presents("mine-features")
def mine_features(res: Any, cfg: Any) -> int:
    """The feature table's summary and the edit spec written."""
    print((Path(cfg.out) / "features.md").read_text(encoding="utf-8").split("\n| site | feature")[0].rstrip())
    print(f"\nedit spec: {res.spec_path}\n" + json.dumps({k: res.spec[k] for k in ("name", "layers", "positions",
                                                                                   "steer_toward", "fvu")}))
    return 0


# --- steering and serving -------------------------------------------------------------------------------------
@presents("direction")
def direction(res: Any, cfg: Any) -> int:
    """The spec written and each site's fit."""
    print(f"direction edit -> {res.path}")
    spec = json.loads(res.path.read_text(encoding="utf-8"))
    sides = spec.get("contrast") or {}
    side = f"toward {spec['toward']}" if spec.get("toward") else "no memory/tool side recorded"
    print(f"  points from {sides.get('from')} toward {sides.get('toward')}; a positive strength: {side} "
          f"({spec.get('toward_basis')})")
    for s, f in sorted(res.result.fits.items()):
        print(f"  site {s}: {f.n_groups} question groups ({f.n_rows_a} / {f.n_rows_b} rows), ||mean diff|| "
              f"{f.norm:.4g}, projection gap (scale) {f.scale:.4g}")
    return 0


@presents("sweep", "codeexec sweep")
def sweep(res: Any, cfg: Any) -> int:
    print(res.markdown)
    for kind, p in res.files.items():
        print(f"{kind}: {p}")
    return 0


@presents("serve")
def serve(res: Any, cfg: Any) -> int:
    """The engine passes the server ran and the requests they answered (it printed its URL once listening)."""
    s = res.stats
    passes = f"{s.passes} engine pass" + ("" if s.passes == 1 else "es")
    requests = f"{s.rows_asked} request" + ("" if s.rows_asked == 1 else "s")
    print(f"memtoc serve: stopped ({res.url}); {passes} answered {requests}")
    return 0


# --- fine-tuning ----------------------------------------------------------------------------------------------
@presents("finetune data")
def finetune_data(res: Any, cfg: Any) -> int:
    ps = res.pair_set
    print(f"{len(ps.pairs)} pairs from {ps.meta['n_questions']} questions -> {res.path}  (sha256 {ps.sha256[:12]})")
    return 0


@presents("finetune train")
def finetune_train(res: Any, cfg: Any) -> int:
    state = "complete" if res.completed else f"stopped at {res.steps_done}/{res.total_steps} (re-run to resume)"
    print(f"{cfg.objective} adapter {state}: {res.path}" + (f"  sha256 {res.adapter_sha256}" if
                                                             res.adapter_sha256 else ""))
    return 0


@presents("finetune crossfit")
def finetune_crossfit(res: Any, cfg: Any) -> int:
    print(res.table_markdown)
    print(f"cross-fit directory: {res.out}  (table: {res.manifest['table']['markdown']})")
    return 0


@presents("finetune table")
def finetune_table(res: Any, cfg: Any) -> int:
    print(res.table.markdown())
    if res.files:
        print(f"-> {res.files['markdown']}, {res.files['json']}", file=sys.stderr)
    return 0


# --- the code-executor family and agent tasks -------------------------------------------------------------------
@presents("codeexec evaluate")
def codeexec_evaluate(result: Any, cfg: Any) -> int:
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({len(result.records)} trials; {result.n_new} new)")
    return 0


@presents("codeexec extract")
def codeexec_extract(res: Any, cfg: Any) -> int:
    state = "complete" if res.complete else "incomplete"
    print(f"{res.path}: {res.n_done} of {res.n_planned} prompts stored ({res.n_new_episodes} new; {state})")
    return 0


@presents("codeexec table")
def codeexec_table(res: Any, cfg: Any) -> int:
    print(res.paths["markdown"].read_text(encoding="utf-8").rstrip())
    print("\n" + _written(res.paths))
    return 0


@presents("codeexec policy-contrasts")
def codeexec_policy_contrasts(res: Any, cfg: Any) -> int:
    print((Path(cfg.out) / "policy_contrasts.md").read_text(encoding="utf-8").rstrip())
    return 0


@presents("agent evaluate")
def agent_evaluate(result: Any, cfg: Any) -> int:
    """The table, each contrast's agreement change, the run directory."""
    print(result.table_text)
    for c in result.summary.get("contrasts", []):
        ag = c["agreement"]
        print(f"{c['b']} - {c['a']}: agreement {ag['delta']:+.3f} [{ag['ci_low']:+.3f}, {ag['ci_high']:+.3f}] "
              f"on {c['n_common']} common episodes")
    print(f"\nrun directory: {result.root}  ({len(result.records)} agent episodes; {result.n_new} new)")
    return 0


# --- judge, acknowledgment, annotation rounds -------------------------------------------------------------------
@presents("judge")
def judge(res: Any, cfg: Any) -> int:
    """The requests, the verdicts by kind and status."""
    from memtoc.scoring.judge.store import read_judge_records

    status: Counter[str] = Counter()
    for r in read_judge_records(res.path).values():
        v = r["verdict"]
        said = v["status"] if "status" in v else {True: "yes", False: "no", None: "none"}[v["ack"]]
        status[f"{r['kind']}:{said}"] += 1
    print(f"{res.path}: {res.n_requests} requests ({', '.join(f'{k} {v}' for k, v in res.counts.items())}); "
          f"{res.n_new} judged now")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(status.items())))
    return 0


@presents("ack car")
def ack_car(rows: Any, cfg: Any) -> int:
    from memtoc.scoring.judge.ack import format_car_table

    print(format_car_table(rows))
    return 0


@presents("ack export")
def ack_export(info: Any, cfg: Any) -> int:
    print(f"{info['n_items']} items -> {cfg.sheet} (blinded; fill the 'ack' column with yes/no); key -> {info['key']}")
    for arm, c in info["screen"].items():
        print(f"  {arm}: {c['k']} of {c['n']} flagged by the {cfg.detector} detector")
    return 0


@presents("outcome-round export")
def outcome_export(info: Any, cfg: Any) -> int:
    print(f"{info['n_items']} items -> {cfg.sheet} (blinded; fill the 'outcome' column with followed_tool, "
          f"kept_memory, both, abstain or other); key -> {info['key']}")
    print("scorer classes in the population: " + ", ".join(f"{k} {v}" for k, v in info["population"].items()))
    return 0


@presents("ack import", "outcome-round import")
def as_json(res: Any, cfg: Any) -> int:
    print(json.dumps(res, indent=1))
    return 0


# --- studies, recipes, merging, reports ---------------------------------------------------------------------------
@presents("study")
def study(res: Any, cfg: Any) -> int:
    """Each layer's study as Markdown, then where it was written."""
    from memtoc.jobs.study.output import format_markdown

    for one in res.layers:
        print(format_markdown(one.study))
        if one.out:
            print(f"wrote {len(one.paths)} files to {one.out}")
    return 0


@presents("transfer-table", "elicitation-agreement")
def markdown(res: Any, cfg: Any) -> int:
    print(res.markdown)
    return 0


@presents("verify-release")
def verify_release(rep: Any, cfg: Any) -> int:
    """The report; the exit status says whether every value matched (0), some differ (1) or none compared (2)."""
    from memtoc.jobs.release_verify import exit_status, format_report

    print(format_report(rep))
    return exit_status(rep)


@presents("run-experiment")
def run_experiment(res: Any, cfg: Any) -> int:
    """The steps' statuses, the failed ones' errors, the experiment directory."""
    for s in res.steps:
        print(f"  {s['name']:24s} {str(s['status']):36s} {'' if s['seconds'] is None else s['seconds']}")
    failed = [s for s in res.steps if s["status"] == "failed"]
    if failed:
        print(f"{len(failed)} step(s) failed:")
        for s in failed:
            print(f"  FAILED {s['name']}: exit {s['rc']}: {s.get('error') or 'no error message'}")
    print(f"experiment directory: {res.out}" + ("" if res.ok else "  (INCOMPLETE: a step failed)"))
    return 0 if res.ok else 1


@presents("merge")
def merge(res: Any, cfg: Any) -> int:
    print(res.table_text)
    print(f"\nmerged run directory: {res.out}  ({res.n_episodes} episodes, {res.n_closed_book} closed-book records "
          f"from {res.n_sources} runs; {res.n_duplicates} duplicate records dropped; status {res.status})")
    return 0


@presents("merge-activations")
def merge_activations(res: Any, cfg: Any) -> int:
    print(f"{res.out}: {res.n_episodes} episodes, {res.n_rows} rows from {res.n_sources} stores "
          f"({res.n_duplicates} duplicate episodes dropped; {'complete' if res.complete else 'INCOMPLETE'})")
    return 0 if res.complete else 1


@presents("report")
def report(res: Any, cfg: Any) -> int:
    from memtoc.runs.runstore import print_warning

    for w in res.warnings:
        print_warning(w)
    print(f"report written: {res.html} and {res.markdown} ({res.n_sections} sections)")
    return 0
