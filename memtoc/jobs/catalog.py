"""Every job of the toolkit, by command name (the table of :mod:`memtoc.jobs.registry`).

One line per job: its command path, its config, its run function and a one-line help. Adding a job is a line
here plus its module; the command line, the Python API and recipes pick it up from this table.
"""

from __future__ import annotations

from memtoc.jobs.registry import register_job

# --- evaluation and scoring ---------------------------------------------------------------------------------

# --- activations, lenses, probes ----------------------------------------------------------------------------
register_job("probe", "memtoc.jobs.probe:ProbeConfig", "memtoc.jobs.probe:run_probe",
             "grouped cross-validated linear probes (AUROC per layer) on stored activations")
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
register_job("sweep", "memtoc.jobs.sweep:SweepConfig", "memtoc.jobs.sweep:run_sweep",
             "evaluate an edit at several strengths: flip tables, paired changes, plot")

# --- fine-tuning ----------------------------------------------------------------------------------------------

# --- the code-executor family and agent tasks ---------------------------------------------------------------
register_job("codeexec sweep", "memtoc.tasks.codeexec.sweep:CodeexecSweepConfig", "memtoc.jobs.sweep:run_sweep",
             "evaluate an edit at several strengths over the agent runs: flip tables, paired changes, plot (the one "
             "sweep job, as memtoc sweep)")

# --- judge, acknowledgment, annotation rounds --------------------------------------------------------------

# --- studies, merging, reports ------------------------------------------------------------------------------
