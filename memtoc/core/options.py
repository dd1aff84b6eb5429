"""The options of the job configs: one description of each (help, value kind, bounds, path role), read by every door.

A shared option is defined once in :data:`OPTIONS` and named by its fields (``field(metadata=option("limit"))``,
or implicitly by name in the pieces registered with :func:`register_piece`); a job's own option is declared on its
field (``field(metadata=opt("folds"))``). What a job says differently about its pieces' options is its config's
``OPTIONS_HERE`` (field -> :func:`here`), what it does not take of them its ``NOT_TAKEN``. The command line, the
API's signatures, recipes and the config builder all read them through :func:`option_leaves`. A leaf module: it
imports the vocabulary only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from memtoc.core import vocab
from memtoc.core.backend_kinds import BACKEND_NAMES

MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class Option:
    """One option as the parser, the API's signature, recipe keys and the config builder read it (``flag``
    defaults to ``--name-with-dashes``).

    ``negate``: a boolean field shown as a ``--no-...`` switch (the field is its negation); ``to_field`` maps the
    parsed value onto the field; ``positional``: no flag; ``repeat``: the flag may be given several times (a
    list).
    """

    name: str = ""
    help: str | None = None
    flag: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    switch: bool = False       # a plain ``--flag`` (store_true)
    metavar: str | None = None
    to_field: Callable[[Any], Any] | None = None
    off_flag: str | None = None  # a boolean field with two switches: ``flag`` sets True, ``off_flag`` False
    off_help: str | None = None
    positional: bool = False
    required: bool = False
    repeat: bool = False
    nargs: str | None = None   # a positional's count ("?", "+")
    path: bool = False         # the value names a file or directory (a number there is a mistake)
    role: str | None = None    # what the path is to the job (memtoc.core.paths.ROLES): input-run, output-dir, ...
    low: float | None = None   # a number's bounds (inclusive; ``above``: the lower bound is excluded)
    high: float | None = None
    above: bool = False

    @property
    def option_string(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def shown(self) -> str:
        """How messages name the option: its flag, or a positional's name in capitals (``RUNS``)."""
        return self.name.upper() if self.positional else self.option_string

    @property
    def dest(self) -> str:
        """The public name of the option: its flag without dashes (the Python API's keyword, a recipe's key)."""
        if self.positional:
            return self.name
        return self.option_string[2:].replace("-", "_")

    @property
    def public(self) -> str:
        """The option's name in the Python API and recipes: the flag's name (``position_kinds`` for
        ``--position-kinds``), or the field's where the flag names a switch (``progress`` for ``--no-progress``)."""
        if self.negate or self.off_flag:
            return self.name
        return self.dest


def opt(help: str | None = None, **kw: Any) -> dict[str, Any]:
    """Field metadata declaring a job's own option on its config field: ``field(default=5, metadata=opt("folds"))``.

    The option's name is the field's; an ``int``/``float`` annotation gives the value parser, and a ``bool`` field
    becomes a switch (``--name`` when it defaults to False, ``--no-name`` when it defaults to True)."""
    return {"option": Option(help=help, **kw)}


def _none_if(value: str) -> Callable[[Any], Any]:
    return lambda v: None if v == value else v


def _chat_field(value: Any) -> bool | None:
    """``--chat-template auto|on|off`` -> ``ModelSpec.chat_template`` (None: the template when the tokenizer has
    one)."""
    return {None: None, "auto": None, "on": True, "off": False}[value]


_MODEL_HELP = ("'default' (embedded SmolLM2-135M-Instruct GGUF), a .gguf file, a local model directory, or a hub "
               "id org/name (only then is a hub contacted; hub:org/name when org/ is also a local folder)")

#: ``--dtype`` of the jobs that take derivatives through the model (lens fit, rank table)
DERIVATIVE_DTYPE_HELP = "float32 (default: derivatives need it) | bfloat16 | float16 | float64 | auto"

#: Every generated option, defined once. Parsers may override a default or sharpen a help text per command.
OPTIONS: dict[str, Option] = {o.name: o for o in (
    # model (memtoc.core.runtime.ModelSpec)
    Option("model", _MODEL_HELP, path=True),
    Option("backend", "model runtime", choices=BACKEND_NAMES),  # type: ignore[arg-type] - a live view
    Option("device", "auto | cpu | cuda | cuda:N"),
    Option("dtype", "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16"),
    Option("chat_template", "auto: the chat template when the tokenizer has one; off: raw completion of the prompt "
                            "text (base models, the release's completion mode); on: require the template",
           choices=vocab.CHAT_TEMPLATE_MODES, to_field=_chat_field),
    Option("adapter", "LoRA adapter directory (memtoc finetune train/crossfit) applied to the whole model "
                      "(closed-book pass included); its hash joins the run identity", path=True),
    Option("tensor_parallel_size", "vllm: GPUs to shard the model over", parse=int, low=1),
    Option("pipeline_parallel_size", "vllm: pipeline stages to split the layers into (usually one per node; vLLM "
                                     "places them through Ray); GPUs used = tensor x pipeline", parse=int, low=1),
    Option("gpu_memory_utilization", "vllm: share of GPU memory to use", parse=float, low=0, above=True, high=1),
    Option("max_model_len", "vllm: context length to reserve", parse=int, low=1),
    Option("base_url", "openai: the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1 (the key is read from "
                       "MEMTOC_OPENAI_API_KEY or OPENAI_API_KEY; --model names the served model)", metavar="URL"),
    Option("concurrency", "openai: requests in flight at once", parse=int, low=1),
    Option("request_timeout", "openai: seconds one request may take (then it is retried)", parse=float, low=0,
           above=True),
    Option("request_retries", "openai: retries with backoff on connection errors, timeouts, 429 and 5xx", parse=int,
           low=0),
    # episode selection (memtoc.core.config.EpisodeSelection)
    Option("benchmark", "'demo', a MemToC release or mapping folder, or one file", path=True),
    Option("formulations", f"comma list of {','.join(vocab.FORMULATIONS)}, or all"),
    Option("conditions", f"comma list of {','.join(vocab.ALL_CONDITIONS)}, or all"),
    Option("question_set", " | ".join(vocab.QUESTION_SETS)),
    Option("limit", "first N questions of the set", parse=int, low=1),
    # generation (memtoc.backends.base.GenerationConfig)
    Option("max_new_tokens", "generation budget per answer (greedy; default 128, --protocol paper 512)",
           parse=int, low=1, high=1_048_576),
    Option("stop_at_final_line", "stop once the first FINAL: line is complete (the default without --protocol "
                                 "paper)", flag="--stop-at-final", off_flag="--generate-to-budget",
           off_help="generate to the budget (no stop at the first FINAL: line; the scorer takes the last marker, "
                    "as the release did; the default under --protocol paper)"),
    Option("batch_size", "prompts per backend call", parse=int, low=1, high=1_000_000),
    # intervention (memtoc.core.config.Intervention)
    Option("closed_book", "closed-book prompt that defines each question's memory (forced = the paper's primary)",
           choices=vocab.CLOSED_BOOK_MODES),
    Option("prompt_intervention", "prompt arm: a sentence inserted before the FINAL instruction (none = the "
           "standard prompt), or no-protocol-sentence (the protocol sentence removed; paper section 5.3)",
           choices=vocab.PROMPT_ARMS),
    Option("frame", "auto = 'tool' when the benchmark carries tool schemas, else 'tool-no-schema'",
           choices=vocab.FRAME_CHOICES),
    Option("edit", "edit spec (JSON from memtoc direction / mine-features) applied to the tool-conditioned pass",
           path=True),
    Option("protocol", "paper: the settings the MemToC paper fixes (analysis set, three formulations, forced "
                       "closed book, generation to a 512-token budget, last FINAL: marker); explicit options win and "
                       "every difference from the paper is printed and kept in run.json",
           choices=vocab.EVAL_PROTOCOLS),
    Option("closed_book_from", "reuse the closed-book answers of this run directory (same model, weights, chat "
                               "template, prompt version, closed-book mode; its formulations must cover this run's): "
                               "every arm then has identical cells", metavar="RUN_DIR", path=True),
    # run settings (memtoc.core.config.RunSettings)
    Option("out", path=True),
    Option("objective", "sft, dpo or both (matched settings)", choices=("sft", "dpo", "both")),
    Option("fold_pool", "the questions the cross-fitting folds are cut on and the adapters trained on: all = the "
                        "575-question construction pool (paper App. B: the 33 excluded questions are present in "
                        "training, excluded only when results are computed); analysis = the analysis set only",
           choices=("all", "analysis")),
    Option("train_formulations", "formulations of the training pairs (paper App. B: reference, two pairs per "
                                 "question, 574/576 per fold); the evaluation formulations are --formulations"),
    Option("seed", "seed of the bootstrap intervals", parse=int, low=0),
    Option("n_boot", "bootstrap resamples of the intervals", parse=int, low=1, high=1_000_000),
    Option("progress", "no progress bar", flag="--no-progress", negate=True),
    # executors (memtoc.core.config.ExecutorSettings, run by memtoc.jobs.executor): where the arms and shards of a
    # multi-arm command run
    Option("executor", "local (in this process, one task after another) or ray (one Ray task per arm or shard; "
                       "pip install 'memtoc-toolkit[ray]')"),
    Option("address", "ray: the cluster to join (ray start --head prints it; default $RAY_ADDRESS, else a new "
                      "local instance)"),
    Option("cpus_per_arm", "ray: CPUs reserved per task", parse=float, low=0),
    Option("gpus_per_arm", "ray: GPUs reserved per task (fractions share a GPU)", parse=float, low=0),
    Option("max_retries", "ray: re-runs of a task whose worker died or that raised; it resumes from what it wrote",
           parse=int, low=0),
    # the scorer layer a table reads (memtoc.core.config.ScoreLayer)
    Option("score_layer", "deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run)",
           choices=("deterministic", "judged")),
    Option("judge_file", "judge records file inside the run directory"),
    # sweeps (memtoc.core.config.SweepSettings)
    Option("strengths", "comma list; 0 (the baseline) is always run"),
    Option("direction", "steer toward memory or toward the tool (direction edits: the strength's sign; sae_clamp: "
                        "swaps the remove/add roles when the spec steers the other way); default: memory, or with "
                        "memtoc codeexec sweep the edit's own 'toward' (strength = spec strength)",
           choices=("memory", "tool")),
    Option("dev_per_direction", "per-direction flip denominators: at most N episodes that followed the tool (toward "
                                "memory) and N that kept memory (toward tool), seeded; 0 = all (paper: 40)",
           parse=int, low=0),
    Option("dev_labels", "the labelling run (evaluate directory) whose outcomes pick the per-direction dev sets, as "
                         "the paper did (App. C): the strength-0 rate on them is then measured and the flip is "
                         "treated - baseline; without it the dev sets are picked by strength 0 itself (baseline 0 "
                         "by construction)", metavar="RUN_DIR"),
    Option("plot", "do not draw sweep.png", flag="--no-plot", negate=True),
    # activation capture (memtoc.jobs.extract.ExtractConfig)
    Option("layers", "sites to store: all | last | N | N-M, comma separated; site 0 = embedding output, site s = "
                     "output of block s-1 (output_hidden_states numbering, pre final norm)"),
    Option("position_kinds"),
    Option("store_dtype", "auto (the model's dtype, lossless) | float32 | float16 | bfloat16 (stored as raw uint16 "
                          "bits)"),
    Option("compression", "HDF5 compression of the activation datasets (gzip: smaller, slower; lzf: fast)",
           choices=("none", "gzip", "lzf"), to_field=_none_if("none")),
    Option("compression_level", "gzip level 0-9 (default 4)", parse=int, low=0, high=9),
    Option("run", "evaluation run directory whose behaviour labels (followed_tool, kept_memory, outcome, cell) are "
                  "joined into the index by episode_id", path=True),
    # the code-executor family (memtoc.core.config.CodeexecTask, memtoc.tasks.codeexec.agent.AgentConfig)
    Option("codeexec_conditions", f"comma list of {','.join(vocab.CODEEXEC_CONDITIONS)}, or all",
           flag="--conditions"),
    Option("policy", "system-prompt policy of the agent", choices=vocab.CODEEXEC_POLICIES),
    Option("split", "problem split", choices=vocab.CODEEXEC_SPLIT_CHOICES),
    Option("repetitions", "runs per problem x condition (identical under greedy decoding; kept for sampled backends)",
           parse=int, low=1),
    Option("bootstrap_seed", "seed of the bootstrap intervals", parse=int, low=0),
    Option("max_tool_rounds", "tool calls the agent may make per trial", parse=int, low=0),
    Option("max_total_new_tokens", "output budget of a whole trial, all turns together (the overreliance paper: "
                                   "16k); a trial that spends it without a final answer ends unanswered",
           parse=int, low=1),
    Option("codeexec_protocol", "paper: the overreliance paper's main evaluation (3 repetitions, override on "
                                    "problems correct in 2 of 3 no-tool runs, 50 tool calls and 16k output tokens per "
                                    "run, the model's own calls, all 300 problems, sampled); options not given take "
                                    "the paper's value", flag="--protocol",
           choices=("none", "paper")),
    Option("call_format", "tool-call format: native chat-template tools, or ```python blocks (auto: detect)",
           choices=vocab.CODEEXEC_PROTOCOLS),
    Option("timeout_s", "sandbox wall-clock limit per execution", parse=float, low=0, above=True),
    Option("cpu_s", "sandbox CPU-time limit per execution", parse=int, low=1),
    Option("memory_mb", "sandbox address-space limit per execution", parse=int, low=1),
    Option("require_isolation", "refuse to run unless the sandbox's kernel isolation (Landlock, network namespace, "
                                "seccomp) is all in force here (see docs/sandbox.md)", switch=True),
    # the agent tasks (memtoc.tasks.agent.task.AgentSettings)
    Option("tool_choice", "tool-choice protocol(s), comma list of guided,auto,two-stage, or all (paper App. G: a1 "
                          "named schema-guided call, a2 free choice, a4 decide-then-call)"),
    Option("decoding", "call turns: auto (constrained for guided, free otherwise), free, or constrained to the tool's "
                       "schema (xgrammar on hf, vLLM guided decoding on vllm)",
           choices=("auto", "free", "constrained")),
    Option("tool_call_parser", "how call turns are parsed: memtoc (any JSON call object in the turn), or the name of "
                               "a vLLM tool-call parser (hermes, llama3_json, pythonic, ...: as vllm serve "
                               "--tool-call-parser reads a served model's calls; --backend vllm)"),
    Option("slice", "episodes replayed: the memory-right slice (closed-book answer correct) or all",
           choices=("memory-right", "all")),
    # sampled model turns (agent tasks, code-executor trials and their sweeps)
    Option("temperature", "sampling temperature of the model turns (0 = greedy; > 0 samples each turn with a seed "
                          "from --sample-seed, the trial and the turn; hf backend)", parse=float, low=0),
    Option("sample_seed", "seed of the sampled model turns (with --temperature > 0)", parse=int, low=0),
    Option("first_call", "scripted: the first assistant turn of the tool conditions is the problem's scripted "
                         "python_executor call (really run), so every trial sees a tool return",
           choices=vocab.CODEEXEC_FIRST_CALLS),
)}

#: Piece classes whose fields take the option of the same name without metadata (their modules sit below
#: this one and stay free of CLI concerns): ``ModelSpec``, ``GenerationConfig``, ``AgentConfig``.
_IMPLICIT: set[type] = set()


def register_piece(*classes: type) -> None:
    _IMPLICIT.update(classes)


_HERE = {"help", "choices", "required", "role", "low", "high", "above"}


def option(name: str, **this_job: Any) -> dict[str, Any]:
    """Field metadata: ``field(default=..., metadata=option("limit"))``. ``this_job`` sets what the shared option is
    to this config only: its help, narrower choices, path role (``option("out", role="output-run")``), bounds, or
    that the command line requires it."""
    if name not in OPTIONS:
        raise KeyError(f"no option {name!r} in memtoc.core.options.OPTIONS")
    bad = sorted(set(this_job) - _HERE)
    if bad:
        raise TypeError(f"option({name!r}): a shared option's {', '.join(bad)} is set in OPTIONS, not per config")
    return {"option": dataclasses.replace(OPTIONS[name], **this_job) if this_job else name}


def here(help: str | None = None, **this_job: Any) -> dict[str, Any]:
    """What a shared option of a config's pieces is to this job (an entry of the config's ``OPTIONS_HERE``): its
    help, narrower choices, or that the command line requires it (the keys :func:`option` takes)."""
    bad = sorted(set(this_job) - _HERE)
    if bad:
        raise TypeError(f"here(): {', '.join(bad)} cannot be set per job")
    return {"help": help, **this_job} if help is not None else this_job


def protocol_help(name: str, default: Any, paper: Any, help: str | None = None) -> dict[str, Any]:
    """:func:`here` for an option a ``--protocol`` fills (None in the config, so no default is shown): its help
    says the ordinary default and the paper protocol's value."""
    show = lambda v: "none" if v is None else str(v)  # noqa: E731
    return here(f"{help or OPTIONS[name].help} (default {show(default)}; --protocol paper: {show(paper)})")


def field_option(cls: type, f: dataclasses.Field) -> Option | None:
    """The option a dataclass field is set by, or None when it is not a command-line option."""
    ref = f.metadata.get("option")
    if ref is None and cls in _IMPLICIT and f.name in OPTIONS:
        ref = f.name
    if ref is None:
        return None
    if isinstance(ref, str):
        return OPTIONS[ref]
    return _inline(cls, f, ref)


def _base_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in typing.get_args(hint) else hint


def _inline(cls: type, f: dataclasses.Field, o: Option) -> Option:
    """An option declared on its field, completed from the field: name, value parser, switch kind."""
    kind = _base_type(type_hints(cls).get(f.name))
    changes: dict[str, Any] = {"name": o.name or f.name}
    if o.parse is None and kind in (int, float) and kind is not bool:
        changes["parse"] = kind
    if kind is bool and not (o.negate or o.switch or o.off_flag):
        if f.default is True:
            changes["negate"] = True
            changes["flag"] = o.flag or "--no-" + f.name.replace("_", "-")
        else:
            changes["switch"] = True
    return dataclasses.replace(o, **changes)


@functools.cache
def type_hints(cls: type) -> Mapping[str, Any]:
    """``cls``'s resolved annotations, once per class: resolving them compiles every string annotation again, and
    each command walks its config's fields several times (most of a command line's parse time before this cache)."""
    try:
        return types.MappingProxyType(typing.get_type_hints(cls))
    except Exception:  # noqa: BLE001 - unresolvable annotations: no nested pieces then
        return types.MappingProxyType({})


def piece_type(cls: type, f: dataclasses.Field) -> type | None:
    """The dataclass type of a field that holds a config piece, else None."""
    t = type_hints(cls).get(f.name)
    return t if isinstance(t, type) and dataclasses.is_dataclass(t) else None


@dataclass(frozen=True)
class Leaf:
    """One option-carrying field of a (composed) config: its path, the option name and the config's default."""

    path: tuple[str, ...]
    option: str
    default: Any
    owner: type
    spec: Option | None = None

    @property
    def field(self) -> str:
        return self.path[-1]


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def leaves(cls: type, instance: Any = None) -> Iterator[Leaf]:
    """Every option field of ``cls``, nested pieces included, with its default in ``instance`` (or the class), as
    this config has it: its ``OPTIONS_HERE`` (field -> :func:`here`) applied to its pieces' shared options."""
    changes = getattr(cls, "OPTIONS_HERE", {})
    for leaf in _leaves(cls, instance, ()):
        change = changes.get(leaf.field)
        yield dataclasses.replace(leaf, spec=dataclasses.replace(leaf.spec, **change)) if change else leaf


def _leaves(cls: type, instance: Any, path: tuple[str, ...]) -> Iterator[Leaf]:
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name) if instance is not None else field_default(f)
        sub = piece_type(cls, f)
        if sub is not None:
            yield from _leaves(sub, value if value is not MISSING else None, path + (f.name,))
            continue
        spec = field_option(cls, f)
        if spec is not None:
            yield Leaf(path + (f.name,), spec.name, value, cls, spec)


def option_leaves(cls: type, exclude: Sequence[str] = ()) -> list[Leaf]:
    """The options job config ``cls`` takes: its leaves less its ``NOT_TAKEN`` (its pieces' options that do
    nothing in its job) and ``exclude``, each with the config's own default (its default pieces' values, where
    the class can be built without arguments). Every door reads this one list."""
    left_out = {*getattr(cls, "NOT_TAKEN", ()), *exclude}
    return [leaf for leaf in leaves(cls, default_config(cls)) if leaf.field not in left_out]


def default_config(cls: type) -> Any:
    """``cls()``, or None for a config with a required field or a required choice among its fields (its fields' own
    defaults then count)."""
    try:
        return cls()
    except (TypeError, ValueError):
        return None
