"""The options of the job configs: one description of each (help, value kind, bounds, path role), read by every door.

An option is declared on the config field that takes it (``field(metadata=opt("help", low=1))``); one that fields
of several configs take is defined once in :data:`OPTIONS` and named by them (``field(metadata=option("limit"))``).
What a job says differently about its pieces' options is its config's ``OPTIONS_HERE`` (field -> :func:`here`),
what it does not take of them its ``NOT_TAKEN``. The command line, the API's signatures, recipes and the config
builder all read them through :func:`option_leaves`. A leaf module: it imports the vocabulary only.
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
    def public(self) -> str:
        """The option's name in the Python API and recipes: the flag's name (``position_kinds`` for
        ``--position-kinds``), or the field's where the flag names a switch (``progress`` for ``--no-progress``)
        and for a positional."""
        if self.negate or self.off_flag or self.positional:
            return self.name
        return self.option_string[2:].replace("-", "_")


def opt(help: str | None = None, **kw: Any) -> dict[str, Any]:
    """Field metadata declaring a job's own option on its config field: ``field(default=5, metadata=opt("folds"))``.

    The option's name is the field's; an ``int``/``float`` annotation gives the value parser, and a ``bool`` field
    becomes a switch (``--name`` when it defaults to False, ``--no-name`` when it defaults to True)."""
    return {"option": Option(help=help, **kw)}


_MODEL_HELP = ("'default' (embedded SmolLM2-135M-Instruct GGUF), a .gguf file, a local model directory, or a hub "
               "id org/name (only then is a hub contacted; hub:org/name when org/ is also a local folder)")

#: ``--dtype`` of the jobs that take derivatives through the model (lens fit, rank table)
DERIVATIVE_DTYPE_HELP = "float32 (default: derivatives need it) | bfloat16 | float16 | float64 | auto"

#: The options that fields of several configs take, each defined once (a job may sharpen its help: :func:`here`).
OPTIONS: dict[str, Option] = {o.name: o for o in (
    # model (memtoc.core.runtime.ModelSpec)
    Option("model", _MODEL_HELP, path=True),
    Option("backend", "model runtime", choices=BACKEND_NAMES),  # type: ignore[arg-type] - a live view
    Option("device", "auto | cpu | cuda | cuda:N"),
    Option("dtype", "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16"),
    # episode selection (memtoc.core.config.EpisodeSelection)
    Option("benchmark", "'demo', a MemToC release or mapping folder, or one file", path=True),
    Option("formulations", f"comma list of {','.join(vocab.FORMULATIONS)}, or all"),
    Option("conditions", f"comma list of {','.join(vocab.ALL_CONDITIONS)}, or all"),
    Option("limit", "first N questions of the set", parse=int, low=1),
    # generation (memtoc.core.runtime.GenerationConfig)
    Option("max_new_tokens", "generation budget per answer (greedy; default 128, --protocol paper 512)",
           parse=int, low=1, high=1_048_576),
    Option("batch_size", "prompts per backend call", parse=int, low=1, high=1_000_000),
    # intervention (memtoc.core.config.Intervention)
    Option("frame", "auto = 'tool' when the benchmark carries tool schemas, else 'tool-no-schema'",
           choices=vocab.FRAME_CHOICES),
    Option("edit", "edit spec (JSON from memtoc direction / mine-features) applied to the tool-conditioned pass",
           path=True),
    Option("protocol", "paper: the settings the MemToC paper fixes (analysis set, three formulations, forced "
                       "closed book, generation to a 512-token budget, last FINAL: marker); explicit options win and "
                       "every difference from the paper is printed and kept in run.json",
           choices=vocab.EVAL_PROTOCOLS),
    # run settings (memtoc.core.config.JobSettings)
    Option("out", path=True),
    Option("seed", "seed of the bootstrap intervals", parse=int, low=0),
    Option("n_boot", "bootstrap resamples of the intervals", parse=int, low=1, high=1_000_000),
    Option("progress", "no progress bar", flag="--no-progress", negate=True),
    Option("run", "evaluation run directory whose behaviour labels (followed_tool, kept_memory, outcome, cell) are "
                  "joined into the index by episode_id", path=True),
    Option("repetitions", "runs per problem x condition (identical under greedy decoding; kept for sampled backends)",
           parse=int, low=1),
    # sampled model turns (agent tasks, code-executor trials and their sweeps)
    Option("temperature", "sampling temperature of the model turns (0 = greedy; > 0 samples each turn with a seed "
                          "from --sample-seed, the trial and the turn; hf backend)", parse=float, low=0),
    Option("sample_seed", "seed of the sampled model turns (with --temperature > 0)", parse=int, low=0),
)}

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


def protocol_help(pieces: Sequence[type], name: str, paper: Any, help: str | None = None) -> dict[str, Any]:
    """:func:`here` for field ``name`` of one of ``pieces`` that a ``--protocol`` fills (None in the config, so no
    default is shown): its help says the piece's default and the paper protocol's value."""
    cls, f = next((c, f) for c in pieces for f in dataclasses.fields(c) if f.name == name)
    show = lambda v: "none" if v is None else str(v)  # noqa: E731
    text = help or field_option(cls, f).help  # type: ignore[union-attr]
    return here(f"{text} (default {show(field_default(f))}; --protocol paper: {show(paper)})")


def field_option(cls: type, f: dataclasses.Field) -> Option | None:
    """The option a dataclass field is set by, or None when it is not a command-line option."""
    ref = f.metadata.get("option")
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
    if kind is bool and o.choices is None and not (o.negate or o.switch or o.off_flag):
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
