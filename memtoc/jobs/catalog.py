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

# --- judge, acknowledgment, annotation rounds --------------------------------------------------------------

# --- studies, merging, reports ------------------------------------------------------------------------------
