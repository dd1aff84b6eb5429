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

# --- steering -------------------------------------------------------------------------------------------------

# --- fine-tuning ----------------------------------------------------------------------------------------------

# --- the code-executor family and agent tasks ---------------------------------------------------------------
register_job("codeexec policy-contrasts", "memtoc.jobs.codeexec_policy:PolicyContrastsConfig",
             "memtoc.jobs.codeexec_policy:run_policy_contrasts",
             "the overreliance paper's Verify / Compare / Disclose vs Plain contrasts (10,000 / 20,000 draws, seed "
             "20260918, Holm inside the tool)")

# --- judge, acknowledgment, annotation rounds --------------------------------------------------------------

# --- studies, merging, reports ------------------------------------------------------------------------------
