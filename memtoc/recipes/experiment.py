"""``memtoc run-experiment RECIPE.toml``: run a study's recipe as the sequence of ``memtoc`` commands a user would type.

A recipe (``experiments/*.toml``; its format in ``experiments/README.md``) is data: ``[defaults]``, ``[quick]``
and ``[[steps]]``, each step a job's command with its options (``args``, ``positional``, ``out``), ``shards``
(run as one task per value combination, each writing ``OUT.<value>``, then merged into ``OUT`` by ``memtoc
merge`` / ``merge-activations``) and ``after`` (steps it waits for without naming their output).

Every step runs through an executor (:mod:`memtoc.jobs.executor`; ``--executor local`` or ``ray``). Consecutive
steps that do not refer to each other (``${name}``) form a wave of independent tasks; a failed task fails its
step, the wave's other steps still run, later waves do not (docs/scale-out.md).

A step runs in-process as the job of its command (:mod:`memtoc.jobs.registry`): its keys are the job config's
options (a flag without dashes, ``no_progress = true``, or a public name, ``progress = false``), built into the
config by the one config builder (:func:`memtoc.core.values.build_config`); no parser is involved. The values are
recorded in ``OUT/experiment.json`` (``config``) beside the equivalent command line (``argv``). The recipe is
checked whole before any step runs (:func:`validate_recipe`). A re-run resumes: steps already finished with the
same options (and whose output exists) are skipped. The last step is ``memtoc report OUT``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from memtoc.core.backend_kinds import BACKEND_NAMES
from memtoc.core.errors import MemtocError
from memtoc.core.config import ExecutorSettings
from memtoc.core.options import opt

TOP_KEYS = {"name", "description", "protocol", "defaults", "quick", "steps", "outside_paths"}
STEP_KEYS = {"name", "command", "out", "args", "positional", "quick", "skip_quick", "description", "shards",
             "after"}
_REF = re.compile(r"\$\{([A-Za-z0-9_.\-]+)\}")


class ExperimentError(MemtocError):
    """A recipe that cannot be run as written (unknown key, unknown step reference, bad value)."""


@dataclass
class Step:
    name: str
    command: list[str]
    out: str | None
    args: dict[str, Any]
    positional: list[str]
    quick: dict[str, Any]
    skip_quick: bool
    shards: dict[str, list[Any]] = field(default_factory=dict)
    after: list[str] = field(default_factory=list)   # steps to wait for (besides those ${referenced})


@dataclass
class Recipe:
    path: Path
    name: str
    description: str
    defaults: dict[str, Any]
    quick: dict[str, Any]
    steps: list[Step]
    sha256: str = ""
    protocol: str | None = None    # the evaluation protocol (memtoc.bench.protocol) of every step that takes one
    outside_paths: bool = False    # absolute output paths outside the experiment directory are allowed


@dataclass(frozen=True)
class OptionKind:
    """One recipe key (``--flag`` spelling) of a job: ``leaf`` is the config field it sets
    (:class:`memtoc.core.options.Leaf`). A ``switch`` sets it to ``on`` when true (``no_progress = true``:
    ``progress`` False) and leaves it unset when false; a ``boolean`` key (the field's own name, ``progress =
    false``) sets the field to the value. ``listed``: False for a second name of an option (accepted, not offered
    in an error's list of options)."""

    leaf: Any
    switch: bool = False
    choices: tuple[str, ...] | None = None
    listed: bool = True
    on: Any = True
    boolean: bool = False

    @property
    def field(self) -> str:
        return self.leaf.field


class Commands(Protocol):
    """The command vocabulary a recipe runs in (the command line's: :class:`memtoc.cli.recipes.ParserCommands`;
    without one, :class:`JobCommands`: every registered job with all of its config's options)."""

    #: runs one job step, ``step(command, values)`` -> exit status (default :func:`run_job_step`); module-level
    step: Callable[[str, Mapping[str, Any]], int]

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        """``--flag`` -> :class:`OptionKind` of ``memtoc <command...>``, or None when it is not registered."""


def job_options(command: Sequence[str]) -> dict[str, OptionKind] | None:
    """The recipe keys of registered job ``command`` (None: no such job), as ``--flag`` -> :class:`OptionKind`.

    Read from the job's config (:func:`memtoc.core.options.option_leaves`): each option's flag (``--no-progress``,
    ``--generate-to-budget``), its public name and its field name; the options the job does not take
    (its config's ``NOT_TAKEN``) are left off.
    """
    from memtoc.core.options import option_leaves
    from memtoc.jobs.catalog import job

    try:
        entry = job(" ".join(command))
    except MemtocError:
        return None
    out: dict[str, OptionKind] = {}
    named: dict[str, OptionKind] = {}
    for leaf in option_leaves(entry.config_class()):
        spec = leaf.spec
        choices = tuple(spec.choices) if spec.choices is not None else None
        boolean = bool(spec.negate or spec.switch or spec.off_flag or isinstance(leaf.default, bool))
        if spec.positional:
            out[_flag(spec.name)] = OptionKind(leaf, choices=choices)
            continue
        if spec.off_flag:
            out[spec.option_string] = OptionKind(leaf, switch=True, on=True)
            out[spec.off_flag] = OptionKind(leaf, switch=True, on=False)
        elif spec.negate or spec.switch:
            out[spec.option_string] = OptionKind(leaf, switch=True, on=not spec.negate)
        else:
            out[spec.option_string] = OptionKind(leaf, choices=choices)
        for name in (spec.public, leaf.field):       # the API's keyword and the field: the same option
            flag = _flag(name)
            if flag not in out and flag not in named:
                named[flag] = OptionKind(leaf, boolean=True) if boolean else OptionKind(leaf, choices=choices)
    for flag, kind in named.items():
        out.setdefault(flag, kind if flag == _flag(kind.leaf.spec.public) else replace(kind, listed=False))
    return out


def run_job_step(command: str, values: Mapping[str, Any]) -> int:
    """One recipe step: the config of job ``command`` built from ``values`` (field names), the job run, one line
    said. A user error is one line on stderr and exit status 2, as on the command line. Module-level, so that Ray
    can ship it (with its JSON values) to a worker."""
    from memtoc.core.config import field_value
    from memtoc.core.exits import reported
    from memtoc.jobs.catalog import job

    def step() -> int:
        entry = job(command)
        cfg = entry.build(values)
        entry.run_checked(cfg)
        out = field_value(cfg, "out", None)
        print(f"memtoc {command}: done" + (f" -> {out}" if out else ""), flush=True)
        return 0

    return reported(command, step)


class JobCommands:
    """The job registry as a recipe's vocabulary (every option of each job's config)."""

    step = staticmethod(run_job_step)

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        return job_options(command)


def protocol_key(opts: Mapping[str, OptionKind] | None, protocol: str) -> str | None:
    """The option key through which a step's command takes ``protocol`` (None: it takes none; the code executor's
    tool-call format is ``--call-format``, not ``--protocol``)."""
    kind = opts.get("--protocol") if opts is not None else None
    return "protocol" if kind is not None and kind.choices is not None and protocol in kind.choices else None


def takes_protocol(opts: Mapping[str, OptionKind] | None, protocol: str) -> bool:
    """Whether a step's command takes the run protocol (evaluate, episodes, finetune crossfit, codeexec evaluate:
    ``--protocol``)."""
    return protocol_key(opts, protocol) is not None


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _table(obj: Any, where: str) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ExperimentError(f"{where} must be a table, got {type(obj).__name__}")
    return dict(obj)


def load_recipe(path: str | Path) -> Recipe:
    """Parse and structurally validate a recipe (unknown keys are errors)."""
    path = Path(path)
    try:
        raw_bytes = path.read_bytes()
        data = tomllib.loads(raw_bytes.decode("utf-8"))
    except FileNotFoundError:
        raise ExperimentError(f"{path}: recipe not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ExperimentError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; allowed: "
                              f"{', '.join(sorted(TOP_KEYS))}")
    protocol = data.get("protocol")
    if protocol is not None:
        from memtoc.core.vocab import EVAL_PROTOCOLS

        if protocol not in EVAL_PROTOCOLS:
            raise ExperimentError(f"{path}: protocol = {protocol!r} is not a protocol; choose from "
                                  f"{', '.join(EVAL_PROTOCOLS)}")
    outside = data.get("outside_paths", False)
    if not isinstance(outside, bool):
        raise ExperimentError(f"{path}: outside_paths must be true or false, got {outside!r}")
    steps_raw = data.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise ExperimentError(f"{path}: needs at least one [[steps]] table")
    steps, seen = [], set()
    for i, s in enumerate(steps_raw, 1):
        where = f"{path}: step {i}"
        if not isinstance(s, dict):
            raise ExperimentError(f"{where} must be a table")
        bad = sorted(set(s) - STEP_KEYS)
        if bad:
            raise ExperimentError(f"{where} ({s.get('name', '?')}): unknown key(s) {', '.join(bad)}; allowed: "
                                  f"{', '.join(sorted(STEP_KEYS))}")
        for k in ("name", "command"):
            if not isinstance(s.get(k), str) or not s[k].strip():
                raise ExperimentError(f"{where}: '{k}' (a non-empty string) is required")
        name = s["name"]
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name in (".", ".."):
            raise ExperimentError(f"{where}: step name {name!r} may use letters, digits, _ . - only (it names "
                                  "files and ${references})")
        if name in seen or name == "out":
            raise ExperimentError(f"{where}: step name {name!r} is {'reserved' if name == 'out' else 'used twice'}")
        seen.add(name)
        shards = _table(s.get("shards"), f"{where} ({name}) shards")
        for k, v in shards.items():
            if not isinstance(v, list) or not v:
                raise ExperimentError(f"{where} ({name}): shards.{k} must be a non-empty list of values, got {v!r}")
        pos = s.get("positional", [])
        if not isinstance(pos, list):
            raise ExperimentError(f"{where} ({name}): 'positional' must be a list")
        skip_quick = s.get("skip_quick", False)
        if not isinstance(skip_quick, bool):
            raise ExperimentError(f"{where} ({name}): skip_quick must be true or false, got {skip_quick!r}")
        after = s.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise ExperimentError(f"{where} ({name}): 'after' must be a list of step names")
        unknown_after = [a for a in after if a not in seen - {name}]
        if unknown_after:
            raise ExperimentError(f"{where} ({name}): 'after' names {', '.join(unknown_after)}, not an earlier step")
        steps.append(Step(name=name, command=s["command"].split(), out=s.get("out"),
                          args=_table(s.get("args"), f"{where} ({name}) args"), positional=[str(x) for x in pos],
                          quick=_table(s.get("quick"), f"{where} ({name}) quick"),
                          skip_quick=skip_quick, shards=shards, after=list(after)))
    return Recipe(path=path, name=str(data.get("name") or path.stem), description=str(data.get("description", "")),
                  defaults=_table(data.get("defaults"), f"{path}: [defaults]"),
                  quick=_table(data.get("quick"), f"{path}: [quick]"), steps=steps,
                  sha256=hashlib.sha256(raw_bytes).hexdigest(), protocol=protocol, outside_paths=outside)


def _has_ref(value: Any) -> bool:
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, str) and _REF.search(v) for v in items)


def _check_value(recipe: Recipe, st: Step, key: str, value: Any, kind: OptionKind) -> None:
    """A value the step's option cannot take, refused before anything runs (one line: file, step, key), by the
    config builder's own check (:func:`memtoc.core.values.coerce_value`)."""
    where = f"{recipe.path}: step {st.name}: {key}"
    if _has_ref(value):
        return                                   # a ${reference}: a path, known only when the step runs
    if kind.switch or kind.boolean:
        if not isinstance(value, bool):
            raise ExperimentError(f"{where} is a switch: true or false, got {value!r}" if kind.switch else
                                  f"{where} must be true or false, got {value!r}")
        return
    if value is None or value == "":
        return                                   # "" = not given
    from memtoc.core.values import coerce_value

    try:
        coerce_value(kind.leaf, key, value, f"{recipe.path}: step {st.name}: ")
    except MemtocError as exc:
        raise ExperimentError(str(exc)) from None


def _check_out(recipe: Recipe, st: Step) -> None:
    """A step's ``out`` stays inside the experiment directory; an absolute path only with ``outside_paths``."""
    if st.out is None:
        return
    where = f"{recipe.path}: step {st.name}: out"
    if not isinstance(st.out, str) or not st.out.strip():
        raise ExperimentError(f"{where} must be a non-empty path string, got {st.out!r}")
    p = Path(st.out)
    if p.is_absolute():
        if not recipe.outside_paths:
            raise ExperimentError(f"{where} = {st.out!r} is outside the experiment directory; give a relative path, "
                                  "or set outside_paths = true at the top of the recipe")
        return
    if ".." in p.parts:
        raise ExperimentError(f"{where} = {st.out!r} leaves the experiment directory ('..'); give a path inside it")


def default_out(recipe: Recipe, quick: bool) -> Path:
    """The experiment directory when ``--out`` is not given: ``experiments_out/<name>[-quick]``."""
    return Path("experiments_out") / (recipe.name + ("-quick" if quick else ""))


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _check_inside(recipe: Recipe, st: Step, opts: Mapping[str, OptionKind], options: Mapping[str, Any],
                  extra: Mapping[str, Any] | None, out_dir: Path) -> None:
    """The paths a recipe names itself stay inside: each output of a step in the experiment directory, each
    input there or in the recipe's own folder, after ``${references}`` are replaced and symlinks resolved (a
    relative path is read from the current directory, as the job reads it). A recipe is data that may come from
    elsewhere: it must not read ``/etc/shadow`` or write through a link out of its folder. Paths given on the
    command line (``--set``) are the user's own; ``outside_paths = true`` lifts the rule."""
    if recipe.outside_paths:
        return
    from memtoc.core.paths import INPUT_ROLES, declared_roles
    from memtoc.jobs.catalog import job

    roles = declared_roles(job(" ".join(st.command)).config_class())
    given = set(_cli_overrides(extra, st.name))
    refs = _step_refs(recipe, out_dir)
    own = {k: v for k, v in options.items() if k not in given}
    values = step_values(st, opts, own, refs)
    flags = {k.field: k.leaf.spec.shown for k in opts.values()}
    exp_root = Path(os.path.realpath(out_dir))
    recipe_root = Path(os.path.realpath(recipe.path.parent))
    for name, value in values.items():
        role = roles.get(name)
        if role is None:
            continue
        for p in value if isinstance(value, (list, tuple)) else [value]:
            if p in (None, ""):
                continue
            real = Path(os.path.realpath(os.path.expanduser(str(p))))
            where = f"{recipe.path}: step {st.name}: {flags.get(name, name)} {str(p)!r} resolves to {real}"
            if role in INPUT_ROLES:
                if not _inside(real, [exp_root, recipe_root]):
                    raise ExperimentError(f"{where}, outside the experiment directory {out_dir} and the recipe's "
                                          "folder; a recipe reads only there: give the path on the command line "
                                          f"(--set {st.name}.{name}=PATH) or set outside_paths = true at the top")
            elif not _inside(real, [exp_root]):
                raise ExperimentError(f"{where}, outside the experiment directory {out_dir}; a recipe writes only "
                                      "inside it (or set outside_paths = true at the top)")


def _step_refs(recipe: Recipe, out_dir: Path) -> dict[str, str]:
    """What each ``${name}`` stands for: ``out`` the experiment directory, a step its out path (or that folder)."""
    return {"out": str(out_dir), **{s.name: str(out_dir / s.out) if s.out is not None else str(out_dir)
                                    for s in recipe.steps}}


def _check_refs(recipe: Recipe) -> None:
    """Every ``${name}`` names ``out`` or an earlier step (so no step refers to itself or to a later one, and the
    references cannot form a cycle)."""
    earlier = {"out"}
    names = {st.name for st in recipe.steps}
    for st in recipe.steps:
        for ref in sorted(_refs_of(st)):
            where = f"{recipe.path}: step {st.name}"
            if ref == st.name:
                raise ExperimentError(f"{where}: refers to itself (${{{ref}}})")
            if ref in names and ref not in earlier:
                raise ExperimentError(f"{where}: refers to a later step (${{{ref}}}); steps run in recipe order")
            if ref not in earlier:
                raise ExperimentError(f"{where}: unknown reference ${{{ref}}}; known: {', '.join(sorted(earlier))}")
        earlier.add(st.name)


def step_options(recipe: Recipe, st: Step, opts: Mapping[str, OptionKind] | None, *, quick: bool = False,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options one step runs with: the run protocol, ``[defaults]``, ``[quick]`` under --quick, the step's
    ``args`` (and its ``quick``), then the command line's overrides (``--set``, ``--model``, ``--backend``)."""
    options = dict(recipe.defaults)
    key = protocol_key(opts, recipe.protocol) if recipe.protocol is not None else None
    if key is not None:
        options = {key: recipe.protocol, **options}   # a step's own args may still set another
    if quick:
        options.update(recipe.quick)
    options.update(st.args)
    if quick:
        options.update(st.quick)
    cli = _cli_overrides(extra, st.name)
    options.update(cli)                         # command-line overrides win
    given = set(st.args) | set(cli)
    if quick:
        given |= set(recipe.quick) | set(st.quick)
    return _without_other_backends_defaults(options, given)


def _without_other_backends_defaults(options: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """Drop a ``[defaults]`` setting of another backend kind than the one the step runs on (``--quick`` moves a
    vLLM recipe onto hf: its ``max_model_len`` goes with the backend; the step's printed argv shows what ran). A
    key ``given`` by the step, ``[quick]`` or the command line stays, and the backend refuses it in one line."""
    from memtoc.core.backend_kinds import BACKEND_NAMES, backend_kind

    backend = options.get("backend")
    if backend not in BACKEND_NAMES:
        return options
    own = set(backend_kind(backend).spec_fields)
    other = {f for name in BACKEND_NAMES if name != backend for f in backend_kind(name).spec_fields} - own
    return {k: v for k, v in options.items() if k in given or k not in other}


def _split_scoped(key: str) -> tuple[str, str] | None:
    """``STEP.KEY`` -> ``(STEP, KEY)`` (an option key never holds a dot; a step name may); else None."""
    step, dot, key = key.rpartition(".")
    return (step, key) if dot and step and key else None


def _cli_overrides(extra: Mapping[str, Any] | None, step: str) -> dict[str, Any]:
    """The command line's overrides of one step: ``--set KEY=VALUE`` (every step taking KEY), then ``--set
    STEP.KEY=VALUE`` (this step only: e.g. the training data of one step while the others read the benchmark)."""
    out = {k: v for k, v in (extra or {}).items() if _split_scoped(k) is None}
    for k, v in (extra or {}).items():
        scoped = _split_scoped(k)
        if scoped is not None and scoped[0] == step:
            out[scoped[1]] = v
    return out


def validate_recipe(recipe: Recipe, commands: Commands | None = None, *, extra_defaults: Sequence[str] = (),
                    quick: bool = False, extra: Mapping[str, Any] | None = None,
                    out: str | Path | None = None) -> list[str]:
    """Check the recipe whole before anything runs: every key against its step's options, every value by the
    config builder (then the whole config, where no value waits for a ``${reference}``), references and paths.
    A problem is an :class:`ExperimentError` naming the file, the step and the key; returns ``[]`` (no notes).
    ``commands``: default :class:`JobCommands`; ``out``: the experiment directory (default :func:`default_out`),
    which the recipe's own paths must stay inside (:func:`_check_inside`)."""
    commands = commands or JobCommands()
    found: dict[str, Mapping[str, OptionKind]] = {}
    _check_refs(recipe)
    for st in recipe.steps:
        opts = commands.options(st.command)
        _check_out(recipe, st)
        if opts is None:
            raise ExperimentError(f"{recipe.path}: step {st.name}: command = {' '.join(st.command)!r} is not a memtoc "
                                  "command")
        found[st.name] = opts
        if st.shards:
            if st.command[0] not in SHARD_MERGES or len(st.command) != 1:
                raise ExperimentError(f"{recipe.path}: step {st.name}: shards need a command whose outputs merge "
                                      f"({', '.join(sorted(SHARD_MERGES))}), not `memtoc {' '.join(st.command)}`")
            if st.out is None:
                raise ExperimentError(f"{recipe.path}: step {st.name}: shards need 'out' (the merged output)")
        for table, label in ((st.args, "args"), (st.quick, "quick"), (st.shards, "shards")):
            for k, v in table.items():
                if _flag(k) not in opts:
                    listed = ", ".join(sorted(o for o, kind in opts.items() if kind.listed))
                    raise ExperimentError(
                        f"{recipe.path}: step {st.name} ({label}): `memtoc {' '.join(st.command)}` has no option "
                        f"{_flag(k)} (key {k!r}); its options: {listed}")
                for one in (v if label == "shards" else [v]):
                    _check_value(recipe, st, k, one, opts[_flag(k)])
        if st.out is not None and "--out" not in opts:
            raise ExperimentError(f"{recipe.path}: step {st.name}: `memtoc {' '.join(st.command)}` takes no --out; "
                                  "drop 'out' and pass the output option in args")
        for table, label in ((st.args, "args"), (st.quick, "quick")):
            if st.out is not None and any(_flag(k) == "--out" for k in table):
                raise ExperimentError(f"{recipe.path}: step {st.name}: out is given twice (the step's out = and "
                                      f"{label}.out); a step's output is its out = inside the experiment directory")
        _positional_values(st, opts, None)              # the positional arguments fit the command's
        _check_inside(recipe, st, opts, step_options(recipe, st, opts, quick=quick, extra=extra), extra,
                      Path(out) if out is not None else default_out(recipe, quick))
    if recipe.protocol is not None and not any(takes_protocol(p, recipe.protocol) for p in found.values()):
        raise ExperimentError(f"{recipe.path}: protocol = {recipe.protocol!r}: no step's command takes an evaluation "
                              "protocol (memtoc evaluate, memtoc episodes, finetune crossfit, codeexec evaluate)")
    for k in extra_defaults:                             # --set STEP.KEY=VALUE: that step must take KEY
        scoped = _split_scoped(k)
        if scoped is None:
            continue
        if scoped[0] not in found:
            raise ExperimentError(f"{recipe.path}: --set {k}: no step named {scoped[0]!r}; steps: {', '.join(found)}")
        if _flag(scoped[1]) not in found[scoped[0]]:
            command = next(" ".join(st.command) for st in recipe.steps if st.name == scoped[0])
            raise ExperimentError(f"{recipe.path}: --set {k}: step {scoped[0]} (`memtoc {command}`) has no option "
                                  f"{_flag(scoped[1])}")
    _check_model_override(recipe, extra, quick)
    extra_defaults = [k for k in extra_defaults if _split_scoped(k) is None]
    for table, label in ((recipe.defaults, "[defaults]"), (recipe.quick, "[quick]")):
        for k in list(table) + ([] if label == "[quick]" else list(extra_defaults)):
            if not any(_flag(k) in p for p in found.values()):
                raise ExperimentError(f"{recipe.path}: {label} key {k!r} ({_flag(k)}) is not an option of any step's "
                                      "command")
        for k, v in table.items():
            for st in recipe.steps:
                opts = found[st.name]
                if _flag(k) in opts and k not in st.args:
                    _check_value(recipe, st, k, v, opts[_flag(k)])
    built: list[tuple[str, Any]] = []
    for st in recipe.steps:                              # each job's whole config, as the step will build it
        opts = found[st.name]
        if not (quick and st.skip_quick):
            built += _check_config(recipe, st, opts, step_options(recipe, st, opts, quick=quick, extra=extra))
    from memtoc.core.paths import check_plan

    try:
        check_plan(built)                                # no two steps write one path; no step writes its input
    except MemtocError as exc:
        raise ExperimentError(f"{recipe.path}: {exc}") from None
    return []


def _check_model_override(recipe: Recipe, extra: Mapping[str, Any] | None, quick: bool = False) -> None:
    """A whole-recipe model (``--model`` / ``--set model=``) would replace the model of every step: in a recipe
    whose steps name their own models (a cross-model comparison) that collapses them into one, so it is refused.
    A step left out under ``--quick`` runs nothing there, so its own model is no conflict."""
    if "model" not in (extra or {}):
        return
    own = [st.name for st in recipe.steps if ("model" in st.args or "model" in st.quick)
           and not (quick and st.skip_quick)]
    if own:
        raise ExperimentError(f"{recipe.path}: --model {extra['model']} would give one model to steps "
                              f"{', '.join(own)}, which each name their own; set each with --set STEP.model=VALUE")


def _check_config(recipe: Recipe, st: Step, opts: Mapping[str, OptionKind], options: Mapping[str, Any]
                  ) -> list[tuple[str, Any]]:
    """The step's config built by the one config builder (a value waiting for a ``${reference}`` is checked
    alone, above: the path it names exists only once the earlier steps ran); returns ``(step, config)``s."""
    from memtoc.jobs.catalog import job

    used = [v for k, v in options.items() if _flag(k) in opts] + list(st.positional)
    if any(_has_ref(v) for v in used) or (st.shards and any(_has_ref(v) for v in st.shards.values())):
        return []
    where = f"{recipe.path}: step {st.name}: "
    built = []
    for values in _shard_values(st, opts, options, None) or [step_values(st, opts, options, None)]:
        try:
            built.append((st.name, job(" ".join(st.command)).build(values, where=where)))
        except MemtocError as exc:
            text = str(exc)
            raise ExperimentError(text if text.startswith(where) else f"{where}{text}") from None
    return built


def _subst_value(v: Any, refs: Mapping[str, str] | None, where: str) -> Any:
    if refs is None:
        return v
    if isinstance(v, str):
        return _subst(v, refs, where)
    if isinstance(v, (list, tuple)):
        return [_subst(x, refs, where) if isinstance(x, str) else x for x in v]
    return v


def _positional_values(st: Step, opts: Mapping[str, OptionKind], refs: Mapping[str, str] | None) -> dict[str, Any]:
    """A job step's ``positional`` list as config values: ``--flag value`` pairs name an option (a repeatable one
    collects a list), the other items fill the command's positional arguments in order."""
    where = f"step {st.name}"
    tokens = [_subst_value(p, refs, where) for p in st.positional]
    values: dict[str, Any] = {}
    free: list[str] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        i += 1
        if not t.startswith("--"):
            free.append(t)
            continue
        flag, eq, value = t.partition("=")
        kind = opts.get(flag)
        if kind is None:
            raise ExperimentError(f"{where}: positional {t!r}: `memtoc {' '.join(st.command)}` has no option {flag}")
        if kind.switch:
            values[kind.field] = kind.on
            continue
        if not eq:
            if i >= len(tokens):
                raise ExperimentError(f"{where}: positional {t!r} needs a value after it")
            value, i = tokens[i], i + 1
        if kind.leaf.spec.repeat:
            values.setdefault(kind.field, []).append(value)
        else:
            values[kind.field] = value
    slots = [k for k in opts.values() if k.leaf.spec.positional and k.listed]
    for kind in slots:
        if not free:
            break
        if kind.leaf.spec.nargs in ("+", "*"):
            values[kind.field], free = free, []
        else:
            values[kind.field] = free.pop(0)
    if free:
        raise ExperimentError(f"{where}: `memtoc {' '.join(st.command)}` takes {len(slots)} positional argument(s); "
                              f"{', '.join(map(repr, free))} left over")
    return values


_POSITIONS = {"position_kind": "position_kinds", "positions": "edit_positions"}
_SCORE_LAYER = {"layer": "score_layer"}
_OUT = {"output": "out"}
#: field names a recipe's state file may hold from before each field took its flag's name, per command (a step
#: recorded then is still the same step)
_RENAMED_FIELDS: dict[str, dict[str, str]] = {
    "extract": {"positions": "position_kinds"},
    "codeexec extract": {"positions": "position_kinds", "protocol": "call_format"},
    "direction": _POSITIONS, "mine-features": _POSITIONS, "probe": _POSITIONS,
    "codeexec evaluate": {"protocol": "call_format", "run_protocol": "protocol"},
    "codeexec sweep": {"protocol": "call_format"},
    "agent evaluate": {"protocols": "tool_choice", "call_parser": "tool_call_parser"},
    "study": {**_SCORE_LAYER, "arms": "arm", "family": "holm_family", "model_pairs": "model_pair",
              "experiments": "experiment", "partial_families": "partial_family"},
    "compare": _SCORE_LAYER, "metrics": _SCORE_LAYER, "sweep": _SCORE_LAYER, "ack export": _SCORE_LAYER,
    "outcome-round export": _SCORE_LAYER,
    "judge": _OUT, "ack car": _OUT, "ack import": _OUT, "outcome-round import": _OUT,
}


def current_fields(job: str, config: Any) -> Any:
    """A recorded step's config with the field names it was recorded under read as today's."""
    if not isinstance(config, dict):
        return config
    renamed = {"chat": "chat_template", **_RENAMED_FIELDS.get(job, {})}
    return {renamed.get(k, k): v for k, v in config.items()}


def step_values(st: Step, opts: Mapping[str, OptionKind], options: Mapping[str, Any],
                refs: Mapping[str, str] | None, out: str | None = None) -> dict[str, Any]:
    """A job step's config values by field name: positional arguments, then the options its command takes
    (a switch given as true sets its field; ``""`` leaves an option unset), then ``out``. ``refs``: the
    ``${name}`` paths (None: left as written, for checks before the paths exist)."""
    where = f"step {st.name}"
    values = _positional_values(st, opts, refs)
    for k, v in options.items():
        kind = opts.get(_flag(k))
        if kind is None:
            continue
        if kind.switch:
            if v is True:
                values[kind.field] = kind.on
            continue
        if v is None or v == "":
            continue
        values[kind.field] = _subst_value(v, refs, where)
    if st.out is not None:
        values[opts["--out"].field] = out or (refs[st.name] if refs is not None else st.out)
    return values


def _shard_values(st: Step, opts: Mapping[str, OptionKind], options: Mapping[str, Any],
                  refs: Mapping[str, str] | None) -> list[dict[str, Any]]:
    keys = list(st.shards)
    base = refs[st.name] if refs is not None else st.out
    return [step_values(st, opts, {**options, **dict(zip(keys, values))}, refs, out=f"{base}.{_shard_suffix(values)}")
            for values in itertools.product(*(st.shards[k] for k in keys))]


def job_argv(st: Step, opts: Mapping[str, OptionKind], values: Mapping[str, Any]) -> list[str]:
    """The command line that runs the same job step (what experiment.json shows; the step itself runs from its
    values)."""
    leaves = {k.field: k.leaf for k in opts.values()}
    argv, tail = list(st.command), []
    for name, value in values.items():
        spec = leaves[name].spec
        if spec.positional:
            argv += [str(v) for v in value] if isinstance(value, list) else [str(value)]
        elif spec.off_flag:
            tail.append(spec.option_string if value else spec.off_flag)
        elif spec.negate or spec.switch:
            if value is (not spec.negate):
                tail.append(spec.option_string)
        else:
            for v in (value if spec.repeat and isinstance(value, list) else [value]):
                text = _argv_value(v)
                tail += [f"{spec.option_string}={text}"] if text.startswith("-") else [spec.option_string, text]
    return argv + tail


def _argv_value(v: Any) -> str | None:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def _subst(text: str, refs: Mapping[str, str], where: str) -> str:
    def rep(m: re.Match) -> str:
        key = m.group(1)
        if key not in refs:
            raise ExperimentError(f"{where}: unknown reference ${{{key}}}; known: {', '.join(sorted(refs))}")
        return refs[key]

    return _REF.sub(rep, text)


@dataclass
class ExperimentResult:
    out: Path
    steps: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = True


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        if "=" not in it:
            raise ExperimentError(f"--set takes KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        if k.strip().replace("-", "_") in ("out", "output"):
            raise ExperimentError(f"--set {it}: a step's output is its recipe out = inside the experiment directory; "
                                  "choose the experiment directory with --out")
        try:
            out[k.strip()] = tomllib.loads(f"x = {v}")["x"]
        except tomllib.TOMLDecodeError:
            out[k.strip()] = v
    return out



def _merge_run_shards(shards: Sequence[str], out: str, options: Mapping[str, Any]) -> str:
    from memtoc.jobs.merge import merge_runs

    seed = options.get("seed")
    res = merge_runs(shards, out, seed=None if seed in (None, "") else int(seed), overwrite=True, log=lambda s: None)
    return f"{res.n_episodes} episodes, {res.n_closed_book} closed-book records ({res.status})"


def _merge_store_shards(shards: Sequence[str], out: str, options: Mapping[str, Any]) -> str:
    from memtoc.jobs.merge import merge_activation_stores

    merge_activation_stores(shards, out, overwrite=True, log=lambda s: None)
    return f"merged {len(shards)} stores (done)"


#: command -> how its shards' outputs are joined (the existing merge code); a sharded step needs one
SHARD_MERGES: dict[str, Callable[[Sequence[str], str, Mapping[str, Any]], str]] = {
    "evaluate": _merge_run_shards, "extract": _merge_store_shards}


def _shard_suffix(values: Sequence[Any]) -> str:
    return ".".join(re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(v)) for v in values)


def _refs_of(st: Step) -> set[str]:
    """The step names this step's values refer to (``${name}``): it must wait for them."""
    texts = list(st.positional)
    for table in (st.args, st.quick):
        texts += [str(v) for v in table.values()]
    return {m.group(1) for t in texts for m in _REF.finditer(t)} | set(st.after)


def waves(steps: Sequence[Step]) -> list[list[Step]]:
    """Consecutive steps that do not refer to one another, in recipe order (each wave runs as parallel tasks)."""
    out: list[list[Step]] = []
    current: list[Step] = []
    for st in steps:
        if current and _refs_of(st) & {s.name for s in current}:
            out.append(current)
            current = []
        current.append(st)
    if current:
        out.append(current)
    return out


@dataclass
class _Planned:
    """One step of a wave: its record in experiment.json and its tasks (several when sharded), each the job's
    config values."""

    step: Step
    rec: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    calls: list[Any] = field(default_factory=list)      # per task: the job's config values
    task_names: list[str] = field(default_factory=list)
    shard_outs: list[str] = field(default_factory=list)


def run_experiment(recipe_path: str | Path, *, out: str | Path | None = None, quick: bool = False,
                   model: str | None = None, backend: str | None = None, overrides: Sequence[str] = (),
                   report: bool = True, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                   executor: Any = "local", resources: Any = None, address: str | None = None,
                   commands: Commands | None = None,
                   step: Callable[[str, Mapping[str, Any]], int] | None = None) -> ExperimentResult:
    """Run a recipe's steps wave by wave on ``executor`` (``local``, ``ray`` or an open :class:`Executor`).

    ``commands``: the command vocabulary (:class:`Commands`; default the job registry). Each job step's task is
    ``step(command, values)`` (default ``commands.step``: the job run from its config values). Tests pass wrappers
    that inject a fault.
    """
    from memtoc.jobs.executor import Executor, WorkUnit, make_executor
    from memtoc.core.fileio import write_json_atomic

    commands = commands or JobCommands()
    recipe = load_recipe(recipe_path)
    extra = _parse_set(overrides)
    extra.update({k: v for k, v in (("model", model), ("backend", backend)) if v})
    out_dir = Path(out) if out else default_out(recipe, quick)
    validate_recipe(recipe, commands, extra_defaults=[k for k in extra if k not in ("model", "backend")],
                    quick=quick, extra=extra, out=out_dir)
    step = step or getattr(commands, "step", run_job_step)
    ex = executor if isinstance(executor, Executor) else make_executor(executor, resources=resources, address=address)
    out_dir.mkdir(parents=True, exist_ok=True)
    refs = _step_refs(recipe, out_dir)
    state_path = out_dir / "experiment.json"
    previous = {}
    if state_path.exists():
        try:
            previous = {s["name"]: s for s in json.loads(state_path.read_text(encoding="utf-8")).get("steps", [])}
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            previous = {}
    state: dict[str, Any] = {"schema_version": "memtoc-experiment-v1", "name": recipe.name,
                             "description": recipe.description, "recipe": str(recipe.path),
                             "recipe_sha256": recipe.sha256, "protocol": recipe.protocol, "quick": quick,
                             "overrides": extra, "executor": getattr(ex, "name", str(executor)),
                             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "steps": [], "comparisons": []}
    result = ExperimentResult(out=out_dir)

    def save() -> None:
        write_json_atomic(state_path, state)

    def plan(st: Step) -> _Planned | None:
        rec: dict[str, Any] = {"name": st.name, "command": " ".join(st.command), "argv": None, "status": None,
                               "seconds": None, "rc": None, "out": refs[st.name] if st.out is not None else None}
        state["steps"].append(rec)
        if quick and st.skip_quick:
            rec["status"] = "skipped (quick)"
            log(f"run-experiment: step {st.name}: left out under --quick")
            return None
        opts = commands.options(st.command)       # validated: every step's command is a job
        options = step_options(recipe, st, opts, quick=quick, extra=extra)
        p = _Planned(st, rec, options)
        values = step_values(st, opts, options, refs)
        rec["argv"], rec["config"] = ["memtoc", *job_argv(st, opts, values)], values
        shards = _shard_values(st, opts, options, refs) if st.shards else []
        argvs = [job_argv(st, opts, v) for v in shards]
        p.calls = shards or [values]
        outs = [v.get(opts["--out"].field) for v in p.calls] if "--out" in opts else []
        if st.shards:
            for values in itertools.product(*st.shards.values()):
                p.shard_outs.append(f"{refs[st.name]}.{_shard_suffix(values)}")
                p.task_names.append(f"{st.name}.{_shard_suffix(values)}")
            rec["shards"] = [["memtoc", *a] for a in argvs]
        else:
            p.task_names.append(st.name)
        for o in outs:                           # an output file's folder is made here (commands write files)
            if o:
                Path(o).parent.mkdir(parents=True, exist_ok=True)
        prev = previous.get(st.name)
        if (prev and prev.get("status") == "ok" and prev.get("argv") == rec["argv"]
                and current_fields(rec["command"], prev.get("config")) == rec.get("config")
                and prev.get("shards") == rec.get("shards")
                and (rec["out"] is None or Path(rec["out"]).exists()) and st.command[0] != "compare"):
            rec.update(status="ok", rc=0, seconds=0.0, resumed=True)
            log(f"run-experiment: step {st.name}: already done (same command); skipped")
            return None
        for a in (rec.get("shards") or [rec["argv"]]):
            log(f"run-experiment: step {st.name}: {' '.join(a)}")
        return p

    def finish(p: _Planned, results: Sequence[Any]) -> None:
        st, rec = p.step, p.rec
        bad = [r for r in results if not r.ok]
        rec["seconds"] = round(sum(r.seconds for r in results), 2)
        rec["rc"] = bad[0].rc if bad else 0
        if bad:
            rec["error"] = bad[-1].error
        if p.shard_outs:
            rec["tasks"] = [{"name": r.name, "rc": r.rc, "seconds": r.seconds, "error": r.error} for r in results]
            if not bad:
                try:
                    rec["merged"] = SHARD_MERGES[st.command[0]](p.shard_outs, refs[st.name], p.options)
                except MemtocError as exc:
                    rec["rc"], rec["error"] = 2, f"merge: {exc}"
        rec["status"] = "ok" if rec["rc"] == 0 else "failed"
        if st.command[0] == "compare" and rec["status"] == "ok":
            out_json = p.options.get("out")
            if out_json:
                path = Path(_subst(str(out_json), refs, f"step {st.name}"))
                if path.exists():
                    state["comparisons"].append({**json.loads(path.read_text(encoding="utf-8")), "source": str(path)})

    def task(p: _Planned, name: str, call: Any) -> Any:
        return WorkUnit(name=name, arm=p.step.name, fn=step, args=(" ".join(p.step.command), call))

    try:
        for wave in waves(recipe.steps):
            planned = [p for p in (plan(st) for st in wave) if p is not None]
            save()
            tasks = [task(p, n, c) for p in planned for n, c in zip(p.task_names, p.calls)]
            execution = ex.run(tasks, log=log, label="run-experiment") if tasks else None
            for p in planned:
                finish(p, [r for r in execution.results if r.arm == p.step.name] if execution else [])
            save()
            failed = [p.rec for p in planned if p.rec["status"] == "failed"]
            if failed:
                result.ok = False
                for rec in failed:
                    log(f"run-experiment: step {rec['name']} failed (exit {rec['rc']}): {rec.get('error')}")
                log("run-experiment: later steps not run. Fix and re-run the same command to resume.")
                break
    finally:
        if ex is not executor:
            ex.close()
    state["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    state["ok"] = result.ok
    save()
    result.steps = state["steps"]
    if report:
        opts = commands.options(["report"])
        if opts is None:
            raise ExperimentError("`memtoc report` is not a job")
        closing = Step(name="report", command=["report"], out=None, args={}, positional=[str(out_dir)], quick={},
                       skip_quick=False)
        if step("report", _positional_values(closing, opts, {})) != 0:
            result.ok = False
    return result


# -- ``memtoc run-experiment`` as a job above the job layer ----------------------------------------------------

@dataclass
class ExperimentConfig:
    """``memtoc run-experiment``: a recipe, how to run it (``--quick``, overrides), where, and on which executor."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"recipe": "input", "out": "output-dir"}

    recipe: str = field(default="", metadata=opt("recipe file, e.g. experiments/baseline.toml", positional=True,
                                                 required=True, path=True))
    quick: bool = field(default=False, metadata=opt("apply the recipe's [quick] settings (a small run)"))
    model: str | None = field(default=None, metadata=opt("override the model of every step that takes --model",
                                                         path=True))
    backend: str | None = field(default=None, metadata=opt("override the backend of every step that takes --backend",
                                                           choices=BACKEND_NAMES))
    set: tuple[str, ...] = field(default=(), metadata=opt(
        "override a [defaults] option for every step that takes it (repeatable), e.g. --set limit=2; STEP.KEY=VALUE "
        "overrides one step's option only, e.g. --set train.benchmark=transfer:value:FILE", repeat=True,
        metavar="KEY=VALUE"))
    out: str | None = field(default=None, metadata=opt("experiment directory (default experiments_out/<name>"
                                                       "[-quick])", path=True))
    report: bool = field(default=True, metadata=opt("skip the final memtoc report"))
    execution: ExecutorSettings = field(default_factory=ExecutorSettings)


def run_experiment_job(cfg: ExperimentConfig, *, commands: Commands | None = None) -> ExperimentResult:
    """Run the recipe of ``cfg`` (:func:`run_experiment`); the executor settings are checked before anything runs.
    ``commands``: the adapter's vocabulary (default: the job registry)."""
    from memtoc.jobs.executor import executor_of

    executor, resources, address = executor_of(cfg.execution)
    return run_experiment(cfg.recipe, out=cfg.out, quick=cfg.quick, model=cfg.model, backend=cfg.backend,
                          overrides=cfg.set, report=cfg.report, executor=executor, resources=resources,
                          address=address, commands=commands)
