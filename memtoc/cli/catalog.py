"""The subcommands of ``memtoc``: each a job (:mod:`memtoc.jobs.catalog`) and the function that shows its result.

tyro parses each command's options from its job's config (:mod:`memtoc.cli.parse`); this table only says how each
result is printed and how a shared option's help reads on a command (what a job does not take is the job's
``exclude``, :mod:`memtoc.jobs.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from memtoc.core.vocab import POSITION_KINDS


@dataclass(frozen=True)
class Command:
    """One subcommand: the job it runs and how its result is shown.

    ``present(result, config)`` prints the result and returns the exit status (None: 0). ``helps`` sharpens an
    option's help for this command, ``choices`` narrows an option's choices, ``required`` makes an option
    required here (the options a job does not take are its ``Job.exclude``). ``config``/``run`` name a config and
    run function directly (``module:attr``) for a command that is not a registered job (``run-experiment``).
    """

    name: str
    present: Callable[[Any, Any], int | None] | None = None
    helps: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    config: str | None = None
    run: str | None = None
    help: str | None = None
    description: str | None = None

    def job(self) -> Any:
        from memtoc.jobs.catalog import job
        from memtoc.jobs.registry import Job

        if self.config is not None:
            return Job(self.name, self.config, self.run or "", self.help or "", self.description)
        return job(self.name)


def _present(ref: str) -> Any:
    """A presenter by ``module:function``, imported when the command runs (``memtoc --help`` imports none)."""
    module, _, name = ref.partition(":")

    def present(result: Any, cfg: Any) -> int | None:
        import importlib

        return getattr(importlib.import_module(module), name)(result, cfg)

    present.__qualname__ = ref
    return present


# fine-tuning: the wording of the model options
_FT_MODEL_HELPS = {"model": "'default', a .gguf file, a local model directory or a hub id",
                   "formulations": "comma list or all (training prompts)",
                   "device": "auto | cpu | cuda | cuda:N (GPU for 7-9B models)",
                   "dtype": "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16"}
#: --closed-book where --protocol fills it (None in the config, so the generator shows no default)
_CLOSED_BOOK_HELP = ("closed-book prompt that defines each question's memory (forced = the paper's primary) (default "
                     "forced; --protocol paper: forced)")
_CROSSFIT_HELPS = {**_FT_MODEL_HELPS, "conditions": "evaluation conditions", "closed_book": _CLOSED_BOOK_HELP,
                   "formulations": "comma list or all (training prompts) (default reference; --protocol paper: all)",
                   "question_set": "the questions results are computed on (the paper: analysis)",
                   "prompt_intervention": "also evaluate base with this prompt intervention (the prompting arm)",
                   "batch_size": "evaluation prompts per batch",
                   "out": "output directory (data/, adapters/, runs/ and arms/ inside)"}
_EXTRACT_HELPS = {
    "position_kinds": f"comma list of {', '.join(POSITION_KINDS)} (generated = greedy answer tokens)",
    "max_new_tokens": "generation budget for --position-kinds generated",
    "closed_book": "closed-book prompt used by no_tool episodes",
    "dtype": "model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16",
    "out": "HDF5 store (extended if it exists with the same settings)"}


#: the protocol-filled options' help on evaluate and episodes (their default depends on --protocol: the config's
#: field is None, which shows no default)
_PROTOCOL_HELPS = {
    "formulations": "comma list of reference,paraphrase_a,paraphrase_b, or all (default reference; --protocol paper: "
                    "all)",
    "question_set": "all | analysis | fold-A | fold-B (default all; --protocol paper: analysis)",
    "closed_book": _CLOSED_BOOK_HELP}

#: codeexec evaluate's run-protocol options (memtoc.tasks.codeexec.protocol; None in the config, so no default shown)
_CODEEXEC_PROTOCOL_HELPS = {
    "split": "problem split (default heldout; --protocol paper: all)",
    "repetitions": "runs per problem x condition (identical under greedy decoding; kept for sampled backends) "
                   "(default 1; --protocol paper: 3)",
    "max_tool_rounds": "tool calls the agent may make per trial (default 2; --protocol paper: 50)",
    "max_new_tokens": "generation budget per model turn (default 384; --protocol paper: 16000)",
    "first_call": "scripted: the first assistant turn of the tool conditions is the problem's scripted "
                  "python_executor call (really run), so every trial sees a tool return (default model; --protocol "
                  "paper: model)",
    "temperature": "sampling temperature of the model turns (0 = greedy; > 0 samples each turn with a seed from "
                   "--sample-seed, the trial and the turn; hf backend) (default 0.0; --protocol paper: 0.7)",
    "sample_seed": "seed of the sampled model turns (with --temperature > 0) (default 0; --protocol paper: 12345)",
    "max_total_new_tokens": "output budget of a whole trial, all turns together; a trial that spends it without a "
                            "final answer ends unanswered (default none; --protocol paper: 16000, the overreliance "
                            "paper's 16k)"}


_DERIVATIVE_DTYPE = "float32 (default: derivatives need it) | bfloat16 | float16 | float64 | auto"

_SWEEP_HELPS = {
    "edit": "edit spec (memtoc direction / mine-features output)",
    "direction": "steer toward memory or toward the tool (direction edits: the strength's sign; sae_clamp: swaps "
                 "the remove/add roles when the spec steers the other way); default: memory, or with memtoc "
                 "codeexec sweep the edit's own 'toward' (strength = spec strength)",
    "out": "sweep directory: one run directory per strength + sweep.*"}

COMMANDS: tuple[Command, ...] = (
    # --- evaluation and scoring ---------------------------------------------------------------------------
    Command("evaluate", _present("memtoc.cli.evaluation:present_evaluate"), required=("out",), helps={
                **_PROTOCOL_HELPS, "batch_size": "prompts per backend call (default 8 on hf, 256 on vllm)",
                "out": "run directory (resumed if it exists with the same settings)"}),
    Command("score", _present("memtoc.cli.evaluation:present_score")),
    Command("metrics", _present("memtoc.cli.evaluation:present_metrics")),
    Command("episodes", _present("memtoc.cli.evaluation:present_episodes"), helps={
        "formulations": "a formulation, a comma list, or all (default reference; --protocol paper: all)",
        "question_set": _PROTOCOL_HELPS["question_set"],
        "protocol": "paper: the analysis set and all three formulations unless given (memtoc.bench.protocol)"}),
    Command("compare", _present("memtoc.cli.evaluation:present_compare")),
    Command("switch", _present("memtoc.cli.evaluation:present_switch")),
    # --- activations, lenses, probes ----------------------------------------------------------------------
    Command("probe", _present("memtoc.cli.probes:present_probe")),
    Command("patch", _present("memtoc.cli.probes:present_patch")),
    Command("extract", _present("memtoc.cli.activations:present_extract"), required=("out",), helps=_EXTRACT_HELPS),
    # --- steering -------------------------------------------------------------------------------------------
    Command("features", _present("memtoc.cli.probes:present_features")),
    Command("lens fit", _present("memtoc.cli.probes:present_lens_fit"), helps={
        "model": "'default', a .gguf file, a local model directory or a hub id",
        "backend": "model runtime (hf: the fit needs gradients through the model's module tree)",
        "limit": "use only the first N corpus lines (default: 24 of the shipped default corpus, about 30 min for "
                 "the default model on 2 CPU cores; every line of any other corpus; 0 = all)",
        "dtype": _DERIVATIVE_DTYPE}),
    Command("rank-table", _present("memtoc.cli.probes:present_rank_table"), helps={
        "model": "the model that produced the run", "dtype": _DERIVATIVE_DTYPE}),
    Command("sae train", _present("memtoc.cli.mining:present_sae_train")),
    Command("sae fvu", _present("memtoc.cli.mining:present_sae_fvu")),
    Command("mine-features", _present("memtoc.cli.mining:present_mine_features")),
    # --- steering -------------------------------------------------------------------------------------------
    Command("direction", _present("memtoc.cli.steering:present_direction")),
    Command("sweep", _present("memtoc.cli.steering:present_sweep"), required=("edit", "out"), helps={
                **_SWEEP_HELPS, "max_new_tokens": "generation budget per answer"}),
    # --- serving --------------------------------------------------------------------------------------------
    Command("serve", _present("memtoc.cli.serve:present_serve"), helps={
        "max_new_tokens": "generation budget of a request that gives no max_tokens"}),
    # --- fine-tuning ----------------------------------------------------------------------------------------
    Command("finetune data", _present("memtoc.cli.finetune:present_data"), helps=_FT_MODEL_HELPS),
    Command("finetune train", _present("memtoc.cli.finetune:present_train"), helps=_FT_MODEL_HELPS),
    Command("finetune crossfit", _present("memtoc.cli.finetune:present_crossfit"), helps=_CROSSFIT_HELPS,
            required=("out",), choices={"question_set": ("all", "analysis")}),
    Command("finetune table", _present("memtoc.cli.finetune:present_table")),
    # --- the code-executor family and agent tasks -----------------------------------------------------------
    Command("codeexec evaluate", _present("memtoc.cli.codeexec:present_evaluate"), required=("out",), helps={
                "edit": "edit spec applied to every model turn (hf backend)",
                "model": "'default' (embedded SmolLM2-135M-Instruct), a .gguf file, a local model directory, or a "
                         "hub id",
                "limit": "first N problems of the split", "seed": "problem and corruption-factor seed",
                **_CODEEXEC_PROTOCOL_HELPS, "batch_size": "trials per backend call",
                "out": "run directory (resumed if it exists with the same settings)"}),
    Command("codeexec extract", _present("memtoc.cli.codeexec:present_extract"), required=("out",), helps={
                "run": "a 'codeexec evaluate' run directory: capture its own (model-initiated) trajectories after "
                       "each trial's first tool return, labelled in the outcome column (accepted / adopted / "
                       "rejected / no_answer / ambiguous) -- the overreliance paper's probe protocol; without it, "
                       "scripted first calls labelled by condition",
                "conditions": "comma list of P0,P1+,P1-,P2+,P2-",
                "limit": "first N problems of the split",
                "layers": "sites: all | last | N | N-M, comma separated (0 = embedding output)",
                "position_kinds": "last_input,tool_span,from_tool_return",
                "max_tool_rounds": "as in the runs the activations describe",
                "out": "HDF5 store (resumed if it exists with the same settings)"}),
    Command("codeexec table", _present("memtoc.cli.codeexec:present_table")),
    Command("codeexec policy-contrasts", _present("memtoc.cli.codeexec:present_policy_contrasts")),
    Command("agent evaluate", _present("memtoc.cli.agent:present_agent_evaluate"), required=("out",), helps={
                "run": "finished memtoc evaluate run whose memory labels define the slice (default: a closed-book "
                       "pass is made here)",
                "conditions": "conditions whose episodes are replayed (default tool_right)",
                "repetitions": "sampled repetitions per episode and protocol (needs --temperature > 0)",
                "max_new_tokens": "generation budget per agent turn",
                "out": "run directory (resumed if it exists with the same settings; another --protocol adds an "
                       "arm)"}),
    Command("codeexec sweep", _present("memtoc.cli.steering:present_sweep"), required=("edit", "out"),
            helps={**_SWEEP_HELPS, "max_new_tokens": "generation budget per model turn",
                   "limit": "first N problems of the split",
                   "first_call": "scripted (default here): every tool-condition trial starts with the problem's "
                                 "scripted, really executed tool call, so every trial has a first tool return to "
                                 "steer from"}),
    # --- judge, acknowledgment, annotation rounds -----------------------------------------------------------
    Command("judge", _present("memtoc.cli.judge:present_judge")),
    Command("ack car", _present("memtoc.cli.judge:present_ack_car")),
    Command("ack export", _present("memtoc.cli.judge:present_ack_export")),
    Command("ack import", _present("memtoc.cli.judge:present_ack_import")),
    Command("outcome-round export", _present("memtoc.cli.judge:present_outcome_export")),
    Command("outcome-round import", _present("memtoc.cli.judge:present_outcome_import")),
    # --- studies, merging, reports --------------------------------------------------------------------------
    Command("study", _present("memtoc.cli.study:present_study")),
    Command("transfer-table", _present("memtoc.cli.transfer:present_transfer_table")),
    Command("elicitation-agreement", _present("memtoc.cli.elicitation:present_elicitation_agreement")),
    Command("verify-release", _present("memtoc.cli.release:present_verify_release")),
    # run-experiment sits above the job layer: its config and run function are named here. The run is the command
    # line's wrapper of memtoc.recipes.experiment:run_experiment_job, lending the recipe runner this table's
    # presenters.
    Command("run-experiment", _present("memtoc.cli.recipes:present_experiment"),
            config="memtoc.recipes.experiment:ExperimentConfig", run="memtoc.cli.recipes:run_experiment_job",
            help="run a study recipe (experiments/*.toml): its memtoc commands in order, then memtoc report"),
    Command("merge", _present("memtoc.cli.merge:present_merge")),
    Command("merge-activations", _present("memtoc.cli.merge:present_merge_activations")),
    Command("report", _present("memtoc.cli.report:present_report")),
)
