"""Every job of the toolkit, by command name (the table of :mod:`memtoc.jobs.registry`).

One line per job: its command path, its config, its run function and a one-line help. Adding a job is a line
here plus its module; the command line, the Python API and recipes pick it up from this table.
"""

from __future__ import annotations

from memtoc.jobs.registry import register_job

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

# --- steering -------------------------------------------------------------------------------------------------
register_job("features", "memtoc.jobs.features:FeaturesConfig", "memtoc.jobs.features:run_features",
             "a dashboard of mined SAE features: top contexts, activation by condition and span, MI (features.html)")

# --- fine-tuning ----------------------------------------------------------------------------------------------

# --- the code-executor family and agent tasks ---------------------------------------------------------------

# --- judge, acknowledgment, annotation rounds --------------------------------------------------------------

# --- studies, merging, reports ------------------------------------------------------------------------------
register_job("merge", "memtoc.jobs.merge:MergeConfig", "memtoc.jobs.merge:run_merge",
             "merge run directories of the same settings (shards) into one run directory")
register_job("merge-activations", "memtoc.jobs.merge:MergeActivationsConfig", "memtoc.jobs.merge:run_merge_activations",
             "merge HDF5 activation stores of the same settings into one")
register_job("report", "memtoc.jobs.report.job:ReportConfig", "memtoc.jobs.report.job:run_report",
             "one self-contained HTML page (and Markdown) for a run or experiment directory")
