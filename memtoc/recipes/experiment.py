"""``memtoc run-experiment RECIPE.toml``: run a study's recipe as the sequence of ``memtoc`` commands a user would type.

A recipe (``experiments/*.toml``) is data::

    name = "baseline"
    description = "..."
    protocol = "paper"    # optional: --protocol paper on every step that takes the evaluation protocol
    [defaults]            # options given to every step whose subcommand accepts them (--model, --limit, ...)
    model = "default"
    [quick]               # overrides of [defaults] under --quick (a small run on one machine)
    limit = 4
    [[steps]]
    name = "standard"     # unique; ${standard} in any later value is this step's out path
    command = "evaluate"  # a memtoc subcommand ("sae train" for nested ones)
    out = "runs/standard" # passed as --out (relative to the experiment directory); omit for commands without it
    args = { prompt_intervention = "none" }   # the subcommand's options (a_b = --a-b; true = flag; "" = omit)
    positional = []       # positional arguments (e.g. the two runs of `memtoc compare`)
    quick = { }           # step options under --quick
    skip_quick = false    # leave the step out under --quick
    shards = { question_set = ["fold-A", "fold-B"] }   # run the step as shards (evaluate, extract), then merge
    after = ["judge_standard"]   # steps this one waits for without naming their output (e.g. a judge pass)

Every step runs through an executor (:mod:`memtoc.jobs.executor`; ``--executor local`` in this process, ``--executor
ray`` as Ray tasks). Consecutive steps that do not refer to each other (``${name}``) form a wave and run as
independent tasks; a step that refers to a step of the current wave starts the next wave. A step with
``shards`` becomes one task per shard (the product of the listed values; each writes ``OUT.<value>``, e.g.
``runs/standard.fold-A``), and when all of its shards finished they are merged into ``OUT`` by the existing
merge code (``memtoc merge`` / ``merge-activations``). A failed task fails its step; the wave's other steps
still run, later waves do not.

Every step runs in-process through the command vocabulary it is given (:class:`Commands`: which options each
command takes, and the entry that runs one command line; ``memtoc run-experiment`` passes the command line's,
:mod:`memtoc.cli.recipes`), with exactly the argv a user would type; the argv is recorded in
``OUT/experiment.json``. This module imports no parser and no command-line module. The recipe is checked whole
before any step runs (:func:`validate_recipe`): every key against its step's options, value types, references
(unknown, self and forward references), and output paths (inside the experiment directory unless the recipe
says ``outside_paths = true`` and the path is absolute); a step whose command is not registered is an error.
A re-run resumes: steps already finished with the same argv (and whose output exists) are skipped, and the
commands themselves resume (``evaluate``, ``extract``, ``sweep`` skip finished records). The last step is
``memtoc report OUT``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from memtoc.core.errors import MemtocError

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
    description: str = ""
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
    """What the runner needs to know of one ``--option`` of a command: a switch (no value), its choices, and the
    parser of its value (``int``, ``float``; checked before anything runs). ``listed``: False for a deprecated
    spelling (accepted, not offered in an error's list of options)."""

    switch: bool = False
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    listed: bool = True


class Commands(Protocol):
    """The command vocabulary a recipe runs in (the command line's: :class:`memtoc.cli.recipes.ParserCommands`)."""

    #: runs one command line (``["evaluate", "--out", ...]``) and returns its exit status; a module-level
    #: function, so that Ray can ship it to a worker
    entry: Callable[[Sequence[str]], int]

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        """``--flag`` -> :class:`OptionKind` of ``memtoc <command...>``, or None when it is not registered."""


#: the option that carries a run protocol on every command that takes one (``--protocol``; the code executor's
#: tool-call format is ``--call-format``)
PROTOCOL_KEYS = {"--protocol": "protocol"}


def protocol_key(opts: Mapping[str, OptionKind] | None, protocol: str) -> str | None:
    """The option key through which a step's command takes ``protocol`` (None: it takes none)."""
    for flag, key in PROTOCOL_KEYS.items():
        kind = opts.get(flag) if opts is not None else None
        if kind is not None and kind.choices is not None and protocol in kind.choices:
            return key
    return None


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
        after = s.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise ExperimentError(f"{where} ({name}): 'after' must be a list of step names")
        unknown_after = [a for a in after if a not in seen - {name}]
        if unknown_after:
            raise ExperimentError(f"{where} ({name}): 'after' names {', '.join(unknown_after)}, not an earlier step")
        steps.append(Step(name=name, command=s["command"].split(), out=s.get("out"),
                          args=_table(s.get("args"), f"{where} ({name}) args"), positional=[str(x) for x in pos],
                          quick=_table(s.get("quick"), f"{where} ({name}) quick"),
                          skip_quick=bool(s.get("skip_quick", False)), description=str(s.get("description", "")),
                          shards=shards, after=list(after)))
    return Recipe(path=path, name=str(data.get("name") or path.stem), description=str(data.get("description", "")),
                  defaults=_table(data.get("defaults"), f"{path}: [defaults]"),
                  quick=_table(data.get("quick"), f"{path}: [quick]"), steps=steps,
                  sha256=hashlib.sha256(raw_bytes).hexdigest(), protocol=protocol, outside_paths=outside)


def _check_value(recipe: Recipe, st: Step, key: str, value: Any, kind: OptionKind) -> None:
    """A value the step's option cannot take, refused before anything runs (one line: file, step, key)."""
    where = f"{recipe.path}: step {st.name}: {key}"
    if isinstance(value, str) and _REF.search(value):
        return                                   # a ${reference}: a path, known only when the step runs
    if kind.switch:
        if not isinstance(value, bool):
            raise ExperimentError(f"{where} is a switch: true or false, got {value!r}")
        return
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) and kind.parse in (int, float):
            raise ExperimentError(f"{where} must be a number, got {v!r}")
        if kind.parse in (int, float):
            try:
                kind.parse(str(v))
            except ValueError:
                raise ExperimentError(f"{where} must be {'a whole number' if kind.parse is int else 'a number'}, "
                                      f"got {v!r}") from None
        if kind.choices is not None and not isinstance(value, list) and str(v) not in kind.choices and v != "":
            raise ExperimentError(f"{where} must be one of {', '.join(kind.choices)}, got {v!r}")


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


def validate_recipe(recipe: Recipe, commands: Commands, *, extra_defaults: Sequence[str] = ()) -> list[str]:
    """Check the recipe whole against the command vocabulary before anything runs: every key against its
    step's options, value types, references and output paths. Returns notes (steps whose command is not
    registered); a problem is an :class:`ExperimentError` naming the file, the step and the key."""
    notes = []
    found: dict[str, Mapping[str, OptionKind] | None] = {}
    _check_refs(recipe)
    for st in recipe.steps:
        opts = commands.options(st.command)
        found[st.name] = opts
        _check_out(recipe, st)
        if opts is None:
            raise ExperimentError(f"{recipe.path}: step {st.name}: command = {' '.join(st.command)!r} is not a memtoc "
                                  "command")
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
    registered = [p for p in found.values() if p is not None]
    if recipe.protocol is not None and registered and not any(takes_protocol(p, recipe.protocol) for p in registered):
        raise ExperimentError(f"{recipe.path}: protocol = {recipe.protocol!r}: no step's command takes an evaluation "
                              "protocol (memtoc evaluate, memtoc episodes, finetune crossfit, codeexec evaluate)")
    for table, label in ((recipe.defaults, "[defaults]"), (recipe.quick, "[quick]")):
        for k in list(table) + ([] if label == "[quick]" else list(extra_defaults)):
            if registered and not any(_flag(k) in p for p in registered):
                raise ExperimentError(f"{recipe.path}: {label} key {k!r} ({_flag(k)}) is not an option of any step's "
                                      "command")
        for k, v in table.items():
            for st in recipe.steps:
                opts = found[st.name]
                if opts is not None and _flag(k) in opts and k not in st.args:
                    _check_value(recipe, st, k, v, opts[_flag(k)])
    return notes


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


def step_argv(st: Step, opts: Mapping[str, OptionKind], options: Mapping[str, Any], refs: Mapping[str, str],
              out: str | None = None) -> list[str]:
    """The argv of one step: ``command``, positional arguments, then the options this subcommand accepts."""
    argv = list(st.command)
    for p in st.positional:
        argv.append(_subst(p, refs, f"step {st.name}"))
    for k, v in options.items():
        flag = _flag(k)
        if flag not in opts:
            continue
        action = opts[flag]
        if isinstance(v, bool):
            if action.switch:
                if v:
                    argv.append(flag)
                continue
            v = str(v).lower()
        if v is None or v == "":
            continue
        value = _subst(_argv_value(v), refs, f"step {st.name}")
        # "--strengths=-4,0,4": a value that starts with "-" would be read as an option
        argv += [f"{flag}={value}"] if value.startswith("-") else [flag, value]
    if st.out is not None:
        argv += ["--out", out or refs[st.name]]
    return argv


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

    res = merge_activation_stores(shards, out, overwrite=True, log=lambda s: None)
    return f"merged {len(shards)} stores ({getattr(res, 'status', 'done')})"


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
    """One step of a wave: its record in experiment.json and its tasks' argvs (several when sharded)."""

    step: Step
    rec: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    argvs: list[list[str]] = field(default_factory=list)
    task_names: list[str] = field(default_factory=list)
    shard_outs: list[str] = field(default_factory=list)


def run_experiment(recipe_path: str | Path, *, out: str | Path | None = None, quick: bool = False,
                   model: str | None = None, backend: str | None = None, overrides: Sequence[str] = (),
                   report: bool = True, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                   executor: Any = "local", resources: Any = None, address: str | None = None,
                   commands: Commands, entry: Callable[[Sequence[str]], int] | None = None) -> ExperimentResult:
    """Run a recipe's steps wave by wave on ``executor`` (``local``, ``ray`` or an open :class:`Executor`).

    ``commands``: the command vocabulary (:class:`Commands`); ``entry`` is what each task calls with its argv
    (default ``commands.entry``, the command line's own entry point; tests pass a
    wrapper that injects a fault).
    """
    from memtoc.jobs.executor import Executor, WorkUnit, make_executor
    from memtoc.core.fileio import write_json_atomic

    recipe = load_recipe(recipe_path)
    extra = _parse_set(overrides)
    if model:
        extra["model"] = model
    if backend:
        extra["backend"] = backend
    notes = validate_recipe(recipe, commands, extra_defaults=[k for k in extra if k not in ("model", "backend")])
    entry = entry or commands.entry
    ex = executor if isinstance(executor, Executor) else make_executor(executor, resources=resources, address=address)
    out_dir = Path(out) if out else Path("experiments_out") / (recipe.name + ("-quick" if quick else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    refs = {"out": str(out_dir)}
    for st in recipe.steps:
        refs[st.name] = str(out_dir / st.out) if st.out is not None else str(out_dir)
    state_path = out_dir / "experiment.json"
    previous = {}
    if state_path.exists():
        try:
            previous = {s["name"]: s for s in json.loads(state_path.read_text(encoding="utf-8")).get("steps", [])}
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            previous = {}
    for n in notes:
        log(f"run-experiment: {n}")
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
        parser = commands.options(st.command)
        if parser is None:
            rec["status"] = "skipped (subcommand not registered)"
            log(f"run-experiment: step {st.name}: `memtoc {' '.join(st.command)}` is not registered; skipped")
            return None
        options = dict(recipe.defaults)
        key = protocol_key(parser, recipe.protocol) if recipe.protocol is not None else None
        if key is not None:
            options = {key: recipe.protocol, **options}   # a step's own args may still set another
        if quick:
            options.update(recipe.quick)
        options.update(st.args)
        if quick:
            options.update(st.quick)
        options.update(extra)               # command-line overrides win
        p = _Planned(st, rec, options)
        argv = step_argv(st, parser, options, refs)
        rec["argv"] = ["memtoc", *argv]
        if st.shards:
            keys = list(st.shards)
            for values in itertools.product(*(st.shards[k] for k in keys)):
                shard_out = f"{refs[st.name]}.{_shard_suffix(values)}"
                p.argvs.append(step_argv(st, parser, {**options, **dict(zip(keys, values))}, refs, out=shard_out))
                p.shard_outs.append(shard_out)
                p.task_names.append(f"{st.name}.{_shard_suffix(values)}")
            rec["shards"] = [["memtoc", *a] for a in p.argvs]
        else:
            p.argvs.append(argv)
            p.task_names.append(st.name)
        for a in p.argvs:
            for flag in ("--out", "--out"):   # an output file's folder is made here (commands write files)
                if flag in a[:-1]:
                    Path(a[a.index(flag) + 1]).parent.mkdir(parents=True, exist_ok=True)
        prev = previous.get(st.name)
        if (prev and prev.get("status") == "ok" and prev.get("argv") == rec["argv"]
                and prev.get("shards") == rec.get("shards")
                and (rec["out"] is None or Path(rec["out"]).exists()) and st.command[0] != "compare"):
            rec.update(status="ok", rc=0, seconds=0.0, resumed=True)
            log(f"run-experiment: step {st.name}: already done (same command); skipped")
            return None
        for a in p.argvs:
            log(f"run-experiment: step {st.name}: memtoc {' '.join(a)}")
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
            out_json = p.options.get("out", p.options.get("output"))   # output: the spelling before --out
            if out_json:
                path = Path(_subst(str(out_json), refs, f"step {st.name}"))
                if path.exists():
                    state["comparisons"].append({**json.loads(path.read_text(encoding="utf-8")), "source": str(path)})

    try:
        for wave in waves(recipe.steps):
            planned = [p for p in (plan(st) for st in wave) if p is not None]
            save()
            tasks = [WorkUnit(name=n, arm=p.step.name, fn=entry, args=(a,))
                     for p in planned for n, a in zip(p.task_names, p.argvs)]
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
        rc = commands.entry(["report", str(out_dir)])
        if rc != 0:
            result.ok = False
    return result
