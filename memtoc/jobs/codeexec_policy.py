"""``memtoc codeexec policy-contrasts``: the overreliance paper's Verify / Compare / Disclose vs Plain contrasts
(seed 002 L117: 10,000 resamples, 20,000 permutations, seed 20260918, Holm inside the tool's family) from
``codeexec evaluate`` runs, one per policy. The draws and seed default to the declared family
``overreliance-policy`` (:data:`memtoc.jobs.study.families.DECLARED_FAMILIES`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt
from memtoc.jobs.study.families import DECLARED_FAMILIES

_N_BOOT, _N_PERM, _SEED = DECLARED_FAMILIES["overreliance-policy"].draws  # type: ignore[misc]


@dataclass
class PolicyContrastsConfig:
    """``memtoc codeexec policy-contrasts``: each policy run against the Plain run, paired by problem."""

    plain: str = field(default="", metadata=opt(
        "'codeexec evaluate' run of the Plain policy, or one per model as MODEL=RUN,MODEL=RUN (the paper's six "
        "models: the family's 42 contrasts and the pooled estimate)", required=True))
    arms: str = field(default="", metadata=opt(
        "policy runs as POLICY=RUN,POLICY=RUN (Verify, Compare, Disclose); with several models POLICY@MODEL=RUN",
        required=True))
    plain_main: str = field(default="", metadata=opt(
        "the main evaluation's run (three repetitions) whose Plain P1 trials replace the Plain run's P1, as the "
        "paper reuses them; RUN, or MODEL=RUN,MODEL=RUN; models without one keep their Plain run's P1"))
    out: str = field(default="policy", metadata=opt("output directory (policy_contrasts.json / .md)",
                                                    required=True, role="output-dir"))
    n_boot: int = field(default=_N_BOOT, metadata=opt("bootstrap resamples (paper: 10,000)"))
    n_perm: int = field(default=_N_PERM, metadata=opt("sign-flip permutations (paper: 20,000)"))
    seed: int = field(default=_SEED, metadata=opt("seed of the draws (paper: 20260918)"))


def _trials(path: str, policy: str | None = None) -> list[Any]:
    """The graded trials of a ``codeexec evaluate`` run: its ``trials.jsonl`` (what the evaluator writes)."""
    from memtoc.tasks.codeexec.run import trials_from_records
    from memtoc.tasks.codeexec.trajectories import read_trials

    recs = read_trials(path)
    if not recs:
        raise MemtocError(f"{path}: no graded runs")
    trials = trials_from_records(recs)
    if policy is not None and {t.policy for t in trials} != {policy}:
        raise MemtocError(f"{path}: a run of policy {sorted({t.policy for t in trials})}, given as {policy!r}")
    return trials


def _by_model(spec: str, flag: str) -> dict[str, str]:
    """``RUN`` (one model, named ``model``) or ``MODEL=RUN,MODEL=RUN``."""
    spec = spec.strip()
    if not spec:
        return {}
    if "=" not in spec:
        return {"model": spec}
    return _assignments(spec, flag, "RUN or MODEL=RUN,MODEL=RUN")


def _assignments(spec: str, flag: str, form: str) -> dict[str, str]:
    """``NAME=RUN,NAME=RUN`` -> name -> run; a malformed item is one line naming ``flag`` and the ``form``."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, path = part.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise MemtocError(f"{flag} {part!r}: give {form}")
        out[name.strip()] = path.strip()
    return out


def parse_model_arms(spec: str, models: list[str]) -> dict[str, dict[str, str]]:
    """``POLICY=RUN`` (the only model) or ``POLICY@MODEL=RUN`` -> model -> policy -> run."""
    arms = _assignments(spec, "--arms", "POLICY=RUN")
    if not arms:
        raise MemtocError("--arms: give at least one POLICY=RUN")
    out: dict[str, dict[str, str]] = {}
    for key, path in arms.items():
        policy, at, model = key.partition("@")
        if not at:
            if len(models) != 1:
                raise MemtocError(f"--arms {key}={path}: with several models give POLICY@MODEL=RUN")
            model = models[0]
        out.setdefault(model.strip(), {})[policy.strip()] = path
    return out


def _fmt(x: Any, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def format_markdown(rows: list[dict[str, Any]], cfg: PolicyContrastsConfig) -> str:
    size = rows[0]["family_size"] if rows else 42
    lines = ["# Policy contrasts (policy − Plain, paired by problem)", "",
             f"{cfg.n_boot} resamples, {cfg.n_perm} permutations, seed {cfg.seed}; family overreliance-policy: "
             f"{len(rows)} of {size} declared members present; Holm over these {len(rows)}"
             + ("" if len(rows) >= size else " (a partial family: its Holm p values are smaller than the paper's)")
             + ". Pooled: the unweighted mean of the models' paired differences, item draws shared.",
             "", "| model | policy | metric | n | Plain | policy | Δ [95% CI] | p | Holm p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['policy']} | {r['metric']} ({r['condition']}) | {r['n_items']} | "
                     f"{_fmt(r['value_plain'], '.3f')} | {_fmt(r['value_policy'], '.3f')} | "
                     f"{_fmt(r['delta'], '+.3f')} [{_fmt(r['ci_low'], '+.3f')}, {_fmt(r['ci_high'], '+.3f')}] | "
                     f"{_fmt(r['p'], '.4f')} | {_fmt(r['p_holm'], '.4f')} |")
    return "\n".join(lines) + "\n"


def run_policy_contrasts(cfg: PolicyContrastsConfig) -> dict[str, Any]:
    from memtoc.tasks.codeexec.policy_contrasts import FAMILY_SIZE, policy_contrasts_by_model

    plain_runs = _by_model(cfg.plain, "--plain")
    if not plain_runs:
        raise MemtocError("--plain: give the Plain run (RUN or MODEL=RUN,...)")
    arm_runs = parse_model_arms(cfg.arms, list(plain_runs))
    main_runs = _by_model(cfg.plain_main, "--plain-main")
    unknown = sorted(set(main_runs) - set(plain_runs))
    if unknown:
        raise MemtocError(f"--plain-main names model {unknown[0]!r}, which has no Plain run")
    plain = {m: _trials(p, "Plain") for m, p in plain_runs.items()}
    arms = {m: {name: _trials(path, name) for name, path in runs.items()} for m, runs in arm_runs.items()}
    main = {m: [t for t in _trials(p) if t.policy == "Plain"] for m, p in main_runs.items()}
    rows = policy_contrasts_by_model(plain, arms, n_boot=cfg.n_boot, n_perm=cfg.n_perm, seed=cfg.seed,
                                     plain_main=main)
    result = {"n_boot": cfg.n_boot, "n_perm": cfg.n_perm, "seed": cfg.seed, "family": "overreliance-policy",
              "family_members": len(rows), "family_size": FAMILY_SIZE, "models": list(plain),
              "contrasts": rows}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy_contrasts.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (out / "policy_contrasts.md").write_text(format_markdown(rows, cfg), encoding="utf-8")
    return result
