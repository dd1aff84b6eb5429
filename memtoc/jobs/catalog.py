"""Every job of the toolkit, by command name (the table of :mod:`memtoc.jobs.registry`).

One line per job: its command path, its config, its run function and a one-line help. Adding a job is a line
here plus its module; the command line, the Python API and recipes pick it up from this table.
"""

from __future__ import annotations

from memtoc.jobs.registry import Job, lookup, register_job

__all__ = ["job"]


def job(name: str) -> Job:
    """The job named ``name`` (this module's table is filled on import), or an error listing the jobs."""
    return lookup(name)


# --- evaluation and scoring ---------------------------------------------------------------------------------

# --- activations, lenses, probes ----------------------------------------------------------------------------
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
