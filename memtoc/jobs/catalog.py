"""Every job of the toolkit, by command name (the table of :mod:`memtoc.jobs.registry`).

One line per job: its command path, its config, its run function and a one-line help. Adding a job is a line
here plus its module; the command line, the Python API and recipes pick it up from this table.
"""

from __future__ import annotations

from memtoc.jobs.registry import lookup as job, register_job

__all__ = ["job"]        # the job named ``name`` (this module fills the table on import), or an error listing them


# --- evaluation and scoring ---------------------------------------------------------------------------------
register_job("evaluate", "memtoc.jobs.evaluate:EvaluationConfig", "memtoc.jobs.evaluate:run_evaluate",
             "run a model on the benchmark: closed-book pass, tool pass, scores, metrics")
register_job("score", "memtoc.jobs.score:ScoreConfig", "memtoc.jobs.score:run_score",
             "re-score per-episode responses offline with the one scorer")
register_job("metrics", "memtoc.jobs.metrics:MetricsConfig", "memtoc.jobs.metrics:run_metrics",
             "metric table (per formulation and pooled, with intervals) of scored records")
register_job("episodes", "memtoc.jobs.episodes:EpisodesConfig", "memtoc.jobs.episodes:run_episodes",
             "export the built episodes with their exact prompt strings")
register_job("compare", "memtoc.jobs.compare:CompareConfig", "memtoc.jobs.compare:run_compare",
             "paired comparison of two runs on common support, with the criterion")
register_job("switch", "memtoc.jobs.switch:SwitchConfig", "memtoc.jobs.switch:run_switch",
             "compose a prompt switch (paper App. E): per episode, the knob arm's answer where the gate fires, else "
             "the standard arm's; written as a run directory")

# --- activations, lenses, probes ----------------------------------------------------------------------------
register_job("extract", "memtoc.jobs.extract:ExtractConfig", "memtoc.jobs.extract:run_extract",
             "capture residual-stream activations of benchmark episodes into an HDF5 store",
             "Run the model over the planned episodes (the prompts of `memtoc evaluate`) and store the residual "
             "stream at the chosen sites and positions. Re-running the same command resumes: only episodes missing "
             "from --out are run. Schema: docs/activations.md.")
register_job("probe", "memtoc.jobs.probe:ProbeConfig", "memtoc.jobs.probe:run_probe",
             "grouped cross-validated linear probes (AUROC per layer) on stored activations")
register_job("patch", "memtoc.jobs.patch:PatchConfig", "memtoc.jobs.patch:run_patch",
             "activation patching of a clean/corrupt condition pair: which block, component and position decide")

# --- lenses and SAE features ----------------------------------------------------------------------------------
register_job("features", "memtoc.jobs.features:FeaturesConfig", "memtoc.jobs.features:run_features",
             "a dashboard of mined SAE features: top contexts, activation by condition and span, MI (features.html)")
register_job("lens fit", "memtoc.jobs.lens_fit:LensFitConfig", "memtoc.jobs.lens_fit:run_lens_fit",
             "fit the averaged Jacobian lens on a text corpus (resumable)")
register_job("rank-table", "memtoc.jobs.rank_table:RankTableJobConfig", "memtoc.jobs.rank_table:run_rank_table",
             "rank of the memory answer's token at the final input position, per lens")
register_job("sae train", "memtoc.jobs.mining:SaeTrainConfig", "memtoc.jobs.mining:run_sae_train",
             "train one SAE per site on an activation store (sae-lens SAETrainer)",
             "Train a TopK (or standard ReLU+L1) SAE with sae-lens on the store's rows of the given position kinds "
             "(default: full prompt sequences, kind 'all'). One layer writes --out itself; several write "
             "--out/site_SSS. See docs/sae_mining.md.")
register_job("sae fvu", "memtoc.jobs.mining:SaeFvuConfig", "memtoc.jobs.mining:run_sae_fvu",
             "fraction of variance unexplained of an SAE on the episodes' activations",
             "FVU = sum ||x - x_hat||^2 / sum ||x - mean x||^2 per site; exit status 1 when a site fails the gate.")
register_job("mine-features", "memtoc.jobs.mining:MineFeaturesConfig", "memtoc.jobs.mining:run_mine_features",
             "SpARE feature mining: SAE latents that separate kept-memory from followed-tool episodes",
             "Rank SAE latents by mutual information with the behaviour on tool_wrong episodes of the fit fold, "
             "cross-check with frequency separation, select by a cumulative-MI budget and write a sae_clamp edit "
             "spec plus a feature table. See docs/sae_mining.md.")

# --- steering -------------------------------------------------------------------------------------------------
register_job("direction", "memtoc.jobs.direction:DirectionConfig", "memtoc.jobs.direction:run_direction",
             "mean-difference steering direction from stored activations -> edit spec")
register_job("sweep", "memtoc.tasks.memtoc.sweep:SweepConfig", "memtoc.jobs.sweep:run_sweep",
             "evaluate an edit at several strengths: flip tables, paired changes, plot")

# --- serving ----------------------------------------------------------------------------------------------------
register_job("serve", "memtoc.jobs.serve:ServeConfig", "memtoc.jobs.serve:run_serve",
             "answer steered / edited generation requests over HTTP (POST /v1/generate) on any backend",
             "Load the model once and answer JSON requests on --host:--port (127.0.0.1:8000 by default; --port 0 "
             "picks a free port): a prompt or chat messages, a token budget, and optionally an edit given with "
             "--edits, by its name, at a strength. Concurrent requests share engine passes (a strength per request). "
             "Stop with Ctrl-C. See docs/backends.md.")

# --- fine-tuning ----------------------------------------------------------------------------------------------
register_job("finetune data", "memtoc.jobs.finetune.jobs:FinetuneDataConfig",
             "memtoc.jobs.finetune.jobs:run_finetune_data",
             "write preference / SFT pairs (tool_wrong and tool_right, near distractors)")
register_job("finetune train", "memtoc.jobs.finetune.jobs:FinetuneTrainConfig",
             "memtoc.jobs.finetune.jobs:run_finetune_train", "train one LoRA adapter (SFT or DPO), resumable")
register_job("finetune crossfit", "memtoc.jobs.finetune.crossfit:CrossfitConfig",
             "memtoc.jobs.finetune.crossfit:run_crossfit",
             "train A->eval B and B->eval A, merge held-out halves, compare with base")
register_job("finetune table", "memtoc.jobs.finetune.jobs:FinetuneTableConfig",
             "memtoc.jobs.finetune.jobs:run_finetune_table",
             "paired changes vs base: prompting, SFT, DPO, best steering edit")

# --- the code-executor family and agent tasks ---------------------------------------------------------------
register_job("codeexec evaluate", "memtoc.tasks.codeexec.run:CodeexecRunConfig", "memtoc.jobs.evaluate:run_evaluate",
             "run the agent loop over problems x conditions; writes run.json, trials.jsonl, summary.json (resumable)")
register_job("codeexec extract", "memtoc.tasks.codeexec.capture:CodeexecExtractConfig",
             "memtoc.jobs.codeexec:run_codeexec_extract",
             "residual stream at the final prompt token after the (scripted) first tool return -> HDF5 activation "
             "store (for memtoc probe / memtoc direction)")
register_job("codeexec table", "memtoc.jobs.codeexec:CodeexecTableConfig", "memtoc.jobs.codeexec:run_codeexec_table",
             "the overreliance paper's table (adoption / override, probe AUROC per layer band, steering per alpha) "
             "from a study's outputs, the paper's numbers beside them")
register_job("agent evaluate", "memtoc.tasks.agent.task:AgentRunConfig", "memtoc.jobs.evaluate:run_evaluate",
             "replay a slice through the agent loop; writes run.json, agent_episodes.jsonl (traces), summary.json "
             "(resumable)")
register_job("codeexec policy-contrasts", "memtoc.jobs.codeexec_policy:PolicyContrastsConfig",
             "memtoc.jobs.codeexec_policy:run_policy_contrasts",
             "the overreliance paper's Verify / Compare / Disclose vs Plain contrasts (10,000 / 20,000 draws, seed "
             "20260918, Holm inside the tool)")
register_job("codeexec sweep", "memtoc.tasks.codeexec.sweep:CodeexecSweepConfig", "memtoc.jobs.sweep:run_sweep",
             "evaluate an edit at several strengths over the agent runs: flip tables, paired changes, plot (the one "
             "sweep job, as memtoc sweep)")

# --- judge, acknowledgment, annotation rounds --------------------------------------------------------------
register_job("judge", "memtoc.jobs.judge:JudgeConfig", "memtoc.jobs.judge:run_judge",
             "run the release's judge requests (extract / ack) of a finished run")
register_job("ack car", "memtoc.jobs.ack:AckCarConfig", "memtoc.jobs.ack:run_ack_car",
             "CAR by arm and cell (judge, regex, proxy)")
register_job("ack export", "memtoc.jobs.ack:AckExportConfig", "memtoc.jobs.ack:run_ack_export",
             "blinded, flag-stratified annotation sheet (CSV) plus its key")
register_job("ack import", "memtoc.jobs.ack:AckImportConfig", "memtoc.jobs.ack:run_ack_import",
             "labels back: kappa, detector precision/recall, two-stage prevalence")
register_job("outcome-round export", "memtoc.jobs.outcome_round:OutcomeExportConfig",
             "memtoc.jobs.outcome_round:run_outcome_export",
             "blinded sheet stratified by the scorer's class, plus its key")
register_job("outcome-round import", "memtoc.jobs.outcome_round:OutcomeImportConfig",
             "memtoc.jobs.outcome_round:run_outcome_import",
             "labels back: scorer-vs-human kappa, per-class recall, confusion table")

# --- studies, merging, reports ------------------------------------------------------------------------------
register_job("study", "memtoc.jobs.study.run:StudyConfig", "memtoc.jobs.study.run:run_study",
             "the paper's statistics over a base run and several arms (and models): Holm families, criterion per "
             "formulation, near vs far, z tests, stability rule")
register_job("transfer-table", "memtoc.jobs.transfer_table:TransferTableConfig",
             "memtoc.jobs.transfer_table:run_transfer_table",
             "App. F.1 Table 6: value / passage frame kept memory, unanswerable abstention, closed-book retention "
             "vs the ±0.03 band (arm vs base transfer runs)")
register_job("elicitation-agreement", "memtoc.jobs.elicitation:ElicitationAgreementConfig",
             "memtoc.jobs.elicitation:run_elicitation_agreement",
             "App. D: forced vs permissive closed book of one model: the UNKNOWN rate and the protocols' agreement "
             "on shared questions")
register_job("verify-release", "memtoc.jobs.release_verify:VerifyReleaseConfig",
             "memtoc.jobs.release_verify:run_verify_release",
             "recompute the paper's Ret./Tool/Wrong/Err. columns from a MemToC release checkout and flag "
             "differences from its stored summaries (exit 0: all match, 1: differences flagged, 2: could not "
             "verify)")
register_job("merge", "memtoc.jobs.merge:MergeConfig", "memtoc.jobs.merge:run_merge",
             "merge run directories of the same settings (shards) into one run directory")
register_job("merge-activations", "memtoc.jobs.merge:MergeActivationsConfig", "memtoc.jobs.merge:run_merge_activations",
             "merge HDF5 activation stores of the same settings into one")
register_job("report", "memtoc.jobs.report.job:ReportConfig", "memtoc.jobs.report.job:run_report",
             "one self-contained HTML page (and Markdown) for a run or experiment directory")
