"""The subcommands of ``memtoc``: one per job of :mod:`memtoc.jobs.catalog`, plus ``run-experiment``.

tyro parses each command's options from its job's config (:mod:`memtoc.cli.parse`) and
:data:`memtoc.cli.present.PRESENTERS` shows its result. This table holds only what the command line says
differently: an option's help sharpened for one command, an option required or its choices narrowed here (what a
job does not take is the job's ``exclude``, :mod:`memtoc.jobs.catalog`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from memtoc.core.vocab import POSITION_KINDS


@dataclass(frozen=True)
class Command:
    """One subcommand: the job it runs and what its command line says differently from the job's config.

    ``helps`` sharpens an option's help for this command, ``choices`` narrows an option's choices, ``required``
    makes an option required here. ``config``/``run`` name a config and run function directly (``module:attr``)
    for a command that is not a registered job (``run-experiment``).
    """

    name: str
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

    def present(self, result: Any, cfg: Any) -> int:
        """Print the job's result as this command shows it; the exit status."""
        from memtoc.cli.present import PRESENTERS

        return int(PRESENTERS[self.name](result, cfg) or 0)


# fine-tuning: the wording of the model options
_FT_MODEL_HELPS = {"formulations": "comma list or all (training prompts)",
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

_OVERRIDES: tuple[Command, ...] = (
    Command("evaluate", required=("out",), helps={
                **_PROTOCOL_HELPS, "batch_size": "prompts per backend call (default 8 on hf, 256 on vllm)",
                "out": "run directory (resumed if it exists with the same settings)"}),
    Command("episodes", helps={
        "formulations": "a formulation, a comma list, or all (default reference; --protocol paper: all)",
        "question_set": _PROTOCOL_HELPS["question_set"],
        "protocol": "paper: the analysis set and all three formulations unless given (memtoc.bench.protocol)"}),
    Command("extract", required=("out",), helps=_EXTRACT_HELPS),
    Command("lens fit", helps={
        "backend": "model runtime (hf: the fit needs gradients through the model's module tree)",
        "limit": "use only the first N corpus lines (default: 24 of the shipped default corpus, about 30 min for "
                 "the default model on 2 CPU cores; every line of any other corpus; 0 = all)",
        "dtype": _DERIVATIVE_DTYPE}),
    Command("rank-table", helps={
        "model": "the model that produced the run", "dtype": _DERIVATIVE_DTYPE}),
    Command("sweep", required=("edit", "out"), helps={
                **_SWEEP_HELPS, "max_new_tokens": "generation budget per answer"}),
    Command("serve", helps={
        "max_new_tokens": "generation budget of a request that gives no max_tokens"}),
    Command("finetune data", helps=_FT_MODEL_HELPS),
    Command("finetune train", helps=_FT_MODEL_HELPS),
    Command("finetune crossfit", helps=_CROSSFIT_HELPS,
            required=("out",), choices={"question_set": ("all", "analysis")}),
    Command("codeexec evaluate", required=("out",), helps={
                "edit": "edit spec applied to every model turn (hf backend)",
                "limit": "first N problems of the split", "seed": "problem and corruption-factor seed",
                **_CODEEXEC_PROTOCOL_HELPS, "batch_size": "trials per backend call",
                "out": "run directory (resumed if it exists with the same settings)"}),
    Command("codeexec extract", required=("out",), helps={
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
    Command("agent evaluate", required=("out",), helps={
                "run": "finished memtoc evaluate run whose memory labels define the slice (default: a closed-book "
                       "pass is made here)",
                "conditions": "conditions whose episodes are replayed (default tool_right)",
                "repetitions": "sampled repetitions per episode and protocol (needs --temperature > 0)",
                "max_new_tokens": "generation budget per agent turn",
                "out": "run directory (resumed if it exists with the same settings; another --protocol adds an "
                       "arm)"}),
    Command("codeexec sweep", required=("edit", "out"),
            helps={**_SWEEP_HELPS, "max_new_tokens": "generation budget per model turn",
                   "limit": "first N problems of the split",
                   "first_call": "scripted (default here): every tool-condition trial starts with the problem's "
                                 "scripted, really executed tool call, so every trial has a first tool return to "
                                 "steer from"}),
    # above the job layer: the command line's wrapper of memtoc.recipes.experiment:run_experiment_job, whose
    # steps it shows with this package's presenters
    Command("run-experiment", config="memtoc.recipes.experiment:ExperimentConfig",
            run="memtoc.cli.recipes:run_experiment_job",
            help="run a study recipe (experiments/*.toml): its memtoc commands in order, then memtoc report"),
)


def _commands() -> tuple[Command, ...]:
    """Every job's command in the job table's order (``run-experiment`` before ``merge``), with its overrides."""
    import memtoc.jobs.catalog  # noqa: F401 - fills the job table
    from memtoc.jobs.registry import JOBS

    overrides = {c.name: c for c in _OVERRIDES}
    names = list(JOBS)
    names.insert(names.index("merge"), "run-experiment")
    return tuple(overrides.get(n) or Command(n) for n in names)


COMMANDS: tuple[Command, ...] = _commands()
