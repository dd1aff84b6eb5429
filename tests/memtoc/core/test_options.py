"""Generated CLI options (``memtoc.core.options``) over the config pieces (``memtoc.core.config``).

``data/cli_options_frozen.json`` is the snapshot of every subcommand's options (flag, dest, default, choices,
type, action, required) taken from the hand-written parsers *before* the options were generated; the options each
command takes today (read from its config, as tyro parses them) must reproduce it, except for the changes listed
in ``INTENDED_CHANGES`` (an option or a command added since needs no entry).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from memtoc.cli.parse import commands as _cli_commands
from memtoc.cli.parse import command_leaves, parse_config, parse_options
from memtoc.core.config import EpisodeSelection
from memtoc.core.options import OPTIONS, field_option, leaves

COMMANDS = tuple(_cli_commands().values())

FROZEN = Path(__file__).parent / "data" / "cli_options_frozen.json"

#: (command, flag, key) -> (before, after): deliberate changes, each with its reason.
INTENDED_CHANGES = {
    # issue 47: the endpoint backend joins the registry, so every --backend offers it
    **{(cmd, "--backend", "choices"): (["hf", "vllm"], ["hf", "vllm", "openai"])
       for cmd in ("evaluate", "codeexec evaluate", "run-experiment")},
    # `direction --toward` defaults to the side the contrast names (issue 39): no fixed "memory" default.
    ("direction", "--toward", "default"): ("memory", None),
    # `rank-table --cell/--condition` are checked against the vocabulary (plus `all`) instead of matching nothing.
    ("rank-table", "--cell", "choices"): (None, ["agree", "arb", "tool_gold", "both_wrong", "mem_absent", "all"]),
    ("rank-table", "--condition", "choices"): (None, ["tool_right", "tool_wrong", "tool_error", "no_tool",
                                                      "no_conflict", "tool_wrong_far", "all"]),
    # `metrics RUN_DIR` (judged layer) takes a run directory instead of --input.
    ("metrics", "--input", "required"): (True, False),
    # `rank-table --lens NAME[=FILE]` is repeatable; the jacobian default is applied when none is given.
    ("rank-table", "--lens", "action"): ("_StoreAction", "_AppendAction"),
    # (issue 36) the default is the config's, RankTableJobConfig.lens = ("jacobian",), shown as the list it parses to
    ("rank-table", "--lens", "default"): ("jacobian", ["jacobian"]),
    # `lens fit --mode auto` (the default) times the estimators on this device and fits with the fastest;
    # `one_row` is the one-cotangent loop (it beat the batched estimators on a 2-core CPU).
    ("lens fit", "--mode", "choices"): (["replicate", "vmap"], ["auto", "replicate", "vmap", "one_row"]),
    ("lens fit", "--mode", "default"): ("replicate", "auto"),
    # `extract --compression`: the parser's default is the config's (None, which `none` means: no compression)
    ("extract", "--compression", "default"): ("none", None),
    # the one-sentence protocol ablation (paper section 5.3) is a prompt arm beside the inserted sentences
    **{(cmd, "--prompt-intervention", "choices"): (["none", "warn", "source-priority", "abstain-and-flag"],
                                                   ["none", "warn", "source-priority", "abstain-and-flag",
                                                    "no-protocol-sentence"])
       for cmd in ("episodes", "evaluate", "extract", "finetune crossfit", "sweep")},
    # MemToC App. C: the paper's cumulative-MI budget (0.7, its widening run) and its full-sequence FVU gate;
    # --edit-positions names the edit positions in a way no other recipe step takes (--set edit_positions=...).
    ("mine-features", "--budget", "default"): (0.07, 0.5),   # issue 28: K = 0.5, the headline run of App. C
    # issue 36: a generated option's default is its config's; the parser's None let the family pick its own
    # (memtoc codeexec sweep has its own config now, with its own defaults)
    ("sweep", "--direction", "default"): (None, "memory"),
    ("sweep", "--max-new-tokens", "default"): (None, 128),
    # codeexec evaluate's --protocol is its paper protocol (was --run-protocol); its old tool-call values still
    # parse, with a warning, into --call-format
    ("sae fvu", "--position-kinds", "default"): ("last_input", "all"),
    # issue 45: episodes' protocol-filled options default to None (not given), filled by the job
    ("episodes", "--formulation", "default"): ("reference", None),   # (the flag was --formulation then)
    ("episodes", "--question-set", "default"): ("all", None),
    # issue 45: so do evaluate's, the cross-fit's and codeexec evaluate's (the help says the default)
    **{(cmd, flag, "default"): (before, None) for cmd, flag, before in (
        ("evaluate", "--formulations", "reference"), ("evaluate", "--question-set", "all"),
        ("evaluate", "--closed-book", "forced"), ("evaluate", "--max-new-tokens", 128),
        ("finetune crossfit", "--formulations", "reference"), ("finetune crossfit", "--closed-book", "forced"),
        ("finetune crossfit", "--max-new-tokens", 128), ("codeexec evaluate", "--split", "heldout"),
        ("codeexec evaluate", "--repetitions", 1), ("codeexec evaluate", "--max-tool-rounds", 2),
        ("codeexec evaluate", "--max-new-tokens", 384), ("codeexec evaluate", "--first-call", "model"))},
    ("sae fvu", "--skip-first", "default"): (0, 1),
    # issue 36: the default is the config's own (CodeexecTask.conditions), spelled out: every condition, as "all"
    # meant
    ("codeexec evaluate", "--conditions", "default"): ("all", "no_tool,P0,P1,P2,P1+,P1-,P2+,P2-"),
    # issue 38: the overreliance paper's intervals use 2,000 bootstrap draws (seed 002 L111)
    ("codeexec evaluate", "--n-boot", "default"): (1000, 2000),
}

#: Flags no longer taken, each with its reason.
REMOVED_FLAGS = {
    # issue 36: the options of `sweep` are its config's (SweepConfig). The code-executor options were there for
    # `sweep --family codeexec`, which is now
    # `memtoc codeexec sweep`; on `sweep` they did nothing.
    *{("sweep", f) for f in ("--family", "--split", "--policy", "--first-call", "--max-tool-rounds", "--protocol")}}

def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def _parser_default(leaf: Any, required: bool) -> Any:
    """What a hand-written parser would have held as the default of ``leaf``'s option: a generated option is parsed
    with SUPPRESS (the namespace records what was given), its default being the config's."""
    spec = leaf.spec
    if required or spec.required or spec.positional:
        return None
    if spec.negate:
        return not leaf.default
    value = leaf.default
    if spec.repeat and not value:       # an append action holds None until the flag is given
        return None
    return ",".join(str(v) for v in value) if isinstance(value, tuple) and not spec.repeat else value


def describe(command: Any) -> dict[str, Any]:
    """Each option of a command as the snapshot's hand-written parser described it (argparse's action kinds)."""
    opts: dict[str, Any] = {}
    for leaf in command_leaves(command):
        spec = leaf.spec
        required = spec.required
        choices = spec.choices
        base = {"dest": spec.name if spec.positional else spec.option_string[2:].replace("-", "_"), "default": _jsonable(_parser_default(leaf, required)),
                "choices": _jsonable(list(choices)) if choices is not None else None,
                "type": getattr(spec.parse, "__name__", None), "required": bool(required and not spec.positional)}
        if spec.off_flag:           # two switches of one field
            for flag in (spec.option_string, spec.off_flag):
                opts[flag] = {**base, "flags": [flag], "dest": spec.name, "default": None, "action": "_StoreConstAction",
                              "nargs": 0}
            continue
        if spec.positional:
            action, nargs, key = "_StoreAction", spec.nargs, spec.name
            base["required"] = spec.nargs != "?"
        elif spec.negate or spec.switch:
            action, nargs, key = "_StoreTrueAction", 0, spec.option_string
        else:
            action, nargs, key = ("_AppendAction" if spec.repeat else "_StoreAction"), None, spec.option_string
        opts[key] = {**base, "flags": [] if spec.positional else [spec.option_string], "action": action,
                     "nargs": _jsonable(nargs)}
    return opts


#: (old spelling, new spelling, commands) of every flag renamed since the snapshot (one concept, one flag:
#: docs/cli.md); the old spellings are no longer taken
RENAMES = (
    ("--output", "--out", ("score", "metrics", "episodes", "compare", "sae fvu", "judge", "ack car", "ack import",
                           "outcome-round import")),
    ("--layer", "--score-layer", ("metrics", "compare", "sweep", "study", "ack export", "outcome-round export")),
    ("--position-kind", "--position-kinds", ("probe", "mine-features", "direction")),
    ("--formulation", "--formulations", ("episodes",)),
    ("--positions", "--position-kinds", ("extract", "codeexec extract")),
    ("--positions", "--edit-positions", ("direction", "mine-features")),
    ("--run-protocol", "--protocol", ("codeexec evaluate",)),
    ("--protocol", "--call-format", ("codeexec evaluate", "codeexec extract", "codeexec sweep")),
    ("--protocol", "--tool-choice", ("agent evaluate",)),
    ("--family", "--holm-family", ("study",)),
)


def renamed(cmd: str) -> dict[str, str]:
    """Old spelling -> new spelling of ``cmd``'s renamed flags."""
    return {old: new for old, new, commands in RENAMES if cmd in commands}


def snapshot() -> dict[str, Any]:
    """``{"evaluate": {...}, "lens fit": {...}, ...}`` for every command and command group."""
    out: dict[str, Any] = {c.name: describe(c) for c in COMMANDS}
    out.update({c.name.split()[0]: {} for c in COMMANDS if " " in c.name})
    return out


def test_generated_parsers_keep_every_flag_default_and_choice():
    frozen = json.loads(FROZEN.read_text(encoding="utf-8"))
    now = snapshot()
    assert set(frozen) <= set(now)      # (a command or an option added since needs no entry here)
    diffs = {}
    for cmd, opts in frozen.items():
        names = renamed(cmd)
        new_name = lambda f: names.get(f, f)  # noqa: E731
        for flag, desc in opts.items():
            if (cmd, flag) in REMOVED_FLAGS:
                assert new_name(flag) not in now[cmd], (cmd, flag)
                continue
            after_desc = now[cmd][new_name(flag)]
            if flag in names:   # renamed: one new spelling; the field it fills may take the new name too
                assert after_desc["flags"] == [names[flag]], (cmd, flag)
            for key, before in desc.items():
                after = after_desc[key]
                if after != before and not (flag in names and key in ("flags", "dest")):
                    diffs[(cmd, flag, key)] = (before, after)
    assert diffs == INTENDED_CHANGES


def _job_configs() -> list[type]:
    from memtoc.jobs.extract import ExtractConfig
    from memtoc.tasks.agent.task import AgentRunConfig
    from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
    from memtoc.tasks.codeexec.run import CodeexecRunConfig
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig
    from memtoc.jobs.finetune.crossfit import CrossfitConfig
    from memtoc.tasks.memtoc.sweep import SweepConfig

    return [EvaluationConfig, ExtractConfig, SweepConfig, CrossfitConfig, CodeexecRunConfig, CodeexecExtractConfig,
            CodeexecSweepConfig, AgentRunConfig]


@pytest.mark.parametrize("cls", _job_configs(), ids=lambda c: c.__name__)
def test_each_option_has_one_field_in_a_job_config(cls):
    """Within a job config every option is set by exactly one field (of one piece, or of the job itself)."""
    found: dict[str, list[tuple[str, ...]]] = {}
    for leaf in leaves(cls):
        found.setdefault(leaf.option, []).append(leaf.path)
    twice = {k: v for k, v in found.items() if len(v) > 1}
    assert not twice, f"{cls.__name__}: options defined by more than one field: {twice}"
    names = [leaf.path[-1] for leaf in leaves(cls)]
    assert len(names) == len(set(names))


#: Options the two benchmark families spell alike but define for their own unit (each once per family):
#: --limit counts questions (EpisodeSelection) or problems (CodeexecTask); --batch-size and --max-new-tokens
#: are per prompt (GenerationConfig) or per agent turn (AgentConfig, part of a code-executor run's identity).
#: --repetitions counts code-executor trials (CodeexecTask) or sampled agent episodes (AgentSettings); --run is a
#: finished evaluation run whose labels extract joins (ExtractConfig), whose recorded trajectories are captured
#: (CodeexecExtractConfig) or whose memory defines the agent slice (AgentSettings); --temperature is per backend
#: call (GenerationConfig, which the agent tasks use too) or per code-executor agent turn (AgentConfig).
PER_FAMILY = {"limit": {"EpisodeSelection", "CodeexecTask"}, "batch_size": {"GenerationConfig", "AgentConfig"},
              "max_new_tokens": {"GenerationConfig", "AgentConfig"}, "repetitions": {"CodeexecTask", "AgentSettings"},
              "run": {"ExtractConfig", "CodeexecExtractConfig", "AgentSettings"},
              "temperature": {"GenerationConfig", "AgentConfig"},
              "sample_seed": {"AgentConfig", "AgentSettings"},
              # the evaluation protocol is a job's own option: evaluate's, and the cross-fit's for its evaluations
              "protocol": {"EvaluationConfig", "CrossfitConfig"},
              # the edit spec: part of MemToC's Intervention piece; a field of the code-executor run itself, whose
              # prompts take none of that piece's other settings (issue 36: the config holds every option)
              "edit": {"Intervention", "CodeexecRunConfig"}}


def test_shared_options_come_from_the_same_piece_in_every_job():
    """An option (model, limit, frame, out, layers, ...) is one field of one class across all job configs: the
    pieces are shared, never copied (the code-executor configs reuse ModelSpec, JobSettings, CaptureSettings,
    SweepSettings, Intervention)."""
    owner: dict[str, set[str]] = {}
    for cls in _job_configs():
        for leaf in leaves(cls):
            owner.setdefault(leaf.option, set()).add(leaf.owner.__name__)
    assert {k: v for k, v in owner.items() if len(v) > 1} == PER_FAMILY


def test_every_field_option_is_defined_once_in_the_table():
    for cls in _job_configs():
        for leaf in leaves(cls):
            # a shared option is the table's own entry (a config may set only its help, narrower choices, path role,
            # bounds and requirement: option(name, role=...), OPTIONS_HERE); a job's own option (declared on its
            # config field, e.g. the cross-fit's training options) has a name no shared option has, so it cannot
            # shadow one
            shared = OPTIONS.get(leaf.option)
            per_job = {"help": None, "choices": None, "role": None, "low": None, "high": None, "above": False,
                       "required": False}
            assert (shared is not None and dataclasses.replace(leaf.spec, **per_job) == dataclasses.replace(
                shared, **per_job)) or leaf.option not in OPTIONS, (cls.__name__, leaf.path)
            if shared is not None and shared.choices is not None:
                assert set(leaf.spec.choices) <= set(shared.choices), (cls.__name__, leaf.path)
    options_of_flag: dict[str, set[str]] = {}
    for cls in _job_configs():
        for leaf in leaves(cls):
            options_of_flag.setdefault(leaf.spec.option_string, set()).add(leaf.option)
    # --conditions is one flag with two vocabularies (MemToC conditions, code-executor conditions); --protocol is
    # the evaluation protocol on evaluate and the code executor's run protocol there (one meaning per command)
    assert {f: names for f, names in options_of_flag.items() if len(names) > 1} == {
        "--conditions": {"conditions", "codeexec_conditions"}, "--protocol": {"protocol", "codeexec_protocol"}}


def test_config_from_args_matches_the_parsed_command():
    from memtoc.tasks.codeexec.run import resolve_run_protocol

    _, cfg = parse_config(["extract", "--out", "a.h5", "--limit", "3", "--compression", "none", "--no-progress",
                           "--batch-size", "2", "--frame", "passage"])
    assert (cfg.job.out, cfg.selection.limit, cfg.compression, cfg.job.progress, cfg.generation.batch_size,
            cfg.intervention.frame) == ("a.h5", 3, None, False, 2, "passage")
    # what was not typed is absent from the parsed options; the config's default fills it
    assert "--batch-size" not in parse_options(["extract", "--out", "o"])[1]
    assert parse_config(["extract", "--out", "o"])[1].generation.batch_size == 8
    _, cfg = parse_config(["codeexec", "evaluate", "--out", "r", "--conditions", "P0,P1+", "--memory-mb", "128",
                           "--seed", "3"])
    assert cfg.task.conditions == ("P0", "P1+") and cfg.agent.memory_mb == 128 and cfg.job.seed == 3
    assert cfg.agent.max_new_tokens is None and cfg.task.policy == "Plain"     # not given: the job resolves it
    assert resolve_run_protocol(cfg).agent.max_new_tokens == 384


def test_every_field_of_a_piece_names_its_option():
    for f in dataclasses.fields(EpisodeSelection):
        assert field_option(EpisodeSelection, f).name == f.name


def test_every_option_of_every_command_has_help_text() -> None:
    """``memtoc X --help`` explains every option (and positional) it takes."""
    missing = [f"memtoc {c.name} {leaf.spec.shown}" for c in COMMANDS for leaf in command_leaves(c)
               if not leaf.spec.help]
    assert missing == []
