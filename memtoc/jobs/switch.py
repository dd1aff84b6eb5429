"""Switch compositions (paper Appendix E): an arm made per episode from two scored arms of the same model.

A *prompt switch* answers each episode with the knob arm (a prompting arm, e.g. ``source-priority``) when its
gate fires and with the standard arm otherwise. Nothing is generated: the composed run is a selection of the two
arms' scored records, so its metrics, comparisons and report rows come from the same code as any run's.

Gates (what the switch may look at before answering):

- ``oracle``: fires when the tool returned a wrong factual value: the ceiling of what the knob can buy.
- ``observable``: fires when the model's own closed-book answer exists and disagrees with the tool value (the
  scorer's matcher): everything it reads is available at run time. Its blind spot is a conflict where no elicited
  memory disagrees with the tool; it never fires on the agree cell (memory and tool both right).

Tool errors and no-tool episodes carry no tool value, so no gate fires there. The two arms must share their
closed-book answers (as the paper's arms do); otherwise their cells differ and the composition is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt, option
from memtoc.scoring.metrics import MetricDef, Selector, default_metrics
from memtoc.scoring import match

#: gate name -> does it fire on this record (the standard arm's record; the knob's shares its memory and tool)
GATES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "oracle": lambda r: r.get("tool_value") is not None and r.get("tool_correct") is False,
    "observable": lambda r: (r.get("tool_value") is not None and not r.get("mem_absent")
                             and bool(str(r.get("memory_span") or "").strip())
                             and not match(r.get("memory_span"), r.get("tool_value"))),
}

_CONFLICT = Selector("tool_wrong", ("arb", "both_wrong"), "near")
#: Read only on composed runs (other runs' records have no ``switch_fired``).
SWITCH_METRICS: tuple[MetricDef, ...] = (
    MetricDef("switch_false_fire_agree", "Switch fires agree", (Selector("tool_right", ("agree",)),), "switch_fired",
              description="switch fires on tool_right ∩ agree (memory and tool both right): false fires; the "
                          "paper's safety property is zero"),
    MetricDef("switch_fire_conflict", "Switch fires conflict", (_CONFLICT,), "switch_fired",
              description="switch fires on tool_wrong (near) ∩ arb/both_wrong; 1 - this is the gate's blind spot "
                          "(conflicts it cannot see)"),
    MetricDef("switch_fire_arb", "Switch fires arb", (Selector("tool_wrong", ("arb",), "near"),), "switch_fired",
              description="switch fires on tool_wrong (near) ∩ arb (the arbitration case)"),
)


@dataclass
class SwitchConfig:
    """``memtoc switch``: the standard arm, the knob arm, the gate and the composed run directory."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"base": "input-run", "knob": "input-run", "out": "output-run"}

    base: str = field(default="", metadata=opt("standard-arm run directory", positional=True, required=True,
                                               path=True))
    knob: str = field(default="", metadata=opt(
        "knob-arm run directory (same model and closed-book pass, e.g. source-priority)", positional=True,
        required=True, path=True))
    gate: str = field(default="", metadata=opt(
        "oracle: fire where the tool value is wrong; observable: fire where the model's closed-book answer "
        "disagrees with the tool value", required=True, choices=tuple(GATES)))
    out: str = field(default="", metadata=opt("run directory of the composed arm", required=True, path=True))
    seed: int = field(default=0, metadata=option("seed"))
    n_boot: int = field(default=1000, metadata=option("n_boot"))


def run_switch(cfg: SwitchConfig) -> dict[str, Any]:
    """Compose ``cfg``'s two arms into ``cfg.out`` (:func:`write_switch_run`); returns its summary."""
    return write_switch_run(cfg.base, cfg.knob, cfg.gate, cfg.out, seed=cfg.seed, n_boot=cfg.n_boot)


class SwitchError(MemtocError):
    """Two arms that cannot be composed (different closed-book answers, no common episodes, unknown gate)."""


@dataclass
class Composition:
    records: list[dict[str, Any]]
    gate: str
    n_fired: int
    n_dropped_base: int      # standard-arm episodes the knob arm lacks (left out)
    n_dropped_knob: int


def compose_switch(base: Sequence[Mapping[str, Any]], knob: Sequence[Mapping[str, Any]], gate: str, *,
                   knob_label: str = "knob") -> Composition:
    """Per episode (``episode_id``), the knob arm's record where ``gate`` fires, else the standard arm's.

    Each output record is the chosen record plus ``switch_gate``, ``switch_fired`` and ``switch_source``
    (``base`` or the knob label). Episodes that only one arm has are left out (counted).
    """
    if gate not in GATES:
        raise SwitchError(f"unknown switch gate {gate!r}; choose from {', '.join(GATES)}")
    fires = GATES[gate]
    by_id = {str(r.get("episode_id")): r for r in knob}
    out: list[dict[str, Any]] = []
    n_fired = 0
    for row, b in enumerate(base, start=1):
        eid = str(b.get("episode_id"))
        k = by_id.get(eid)
        if k is None:
            continue
        for key in ("memory_span", "memory_correct", "mem_absent", "cell", "tool_value", "condition"):
            if b.get(key) != k.get(key):
                raise SwitchError(f"episode {eid} (standard arm row {row}): field '{key}' differs between the arms "
                                  f"({b.get(key)!r} vs {k.get(key)!r}); a switch composes arms that share one "
                                  "closed-book pass (run both with the same model and closed-book prompt)")
        fired = bool(fires(b))
        n_fired += fired
        chosen = k if fired else b
        out.append({**chosen, "switch_gate": gate, "switch_fired": fired,
                    "switch_source": knob_label if fired else "base"})
    if not out:
        raise SwitchError("the two arms have no episode in common (compare their --conditions, --formulations and "
                          "--limit)")
    common = {r["episode_id"] for r in out}
    return Composition(records=out, gate=gate, n_fired=n_fired,
                       n_dropped_base=sum(str(b.get("episode_id")) not in common for b in base),
                       n_dropped_knob=sum(str(k.get("episode_id")) not in common for k in knob))


def composition_metrics() -> tuple[MetricDef, ...]:
    """The metric table of a composed run: every default metric, plus the switch's own fire rates."""
    return (*default_metrics(), *SWITCH_METRICS)


def write_switch_run(base_dir: str, knob_dir: str, gate: str, out: str, *, seed: int = 0,
                     n_boot: int = 1000) -> dict[str, Any]:
    """Compose two run directories into a run directory ``out`` that compare, study and report read as a run.
    Its identity is the standard arm's plus the composition (gate, both arms' identity hashes), so re-running the
    same command resumes and another composition is refused."""
    import memtoc
    from memtoc.scoring.metrics import metric_table
    from memtoc.core.provenance import git_revision
    from memtoc.runs.runstore import RunStore

    from memtoc.core.fileio import check_output_path

    from memtoc.core.checks import check_n_boot

    check_output_path(out, [base_dir, knob_dir], flag="--out", output_is_dir=True)  # before the lock is taken
    check_n_boot(n_boot)
    stores = {"base": RunStore.read(base_dir), "knob": RunStore.read(knob_dir)}
    infos = {k: s.run_info() for k, s in stores.items()}
    ident_b, ident_k = (infos[k].get("identity") or {} for k in ("base", "knob"))
    for key in ("model", "weights_sha256", "closed_book", "frame"):
        if ident_b.get(key) != ident_k.get(key):
            raise SwitchError(f"{knob_dir}: field 'identity.{key}' is {ident_k.get(key)!r}, the standard arm "
                              f"{base_dir} has {ident_b.get(key)!r}; a switch composes arms of one model and "
                              "one closed-book pass")
    knob_label = str(ident_k.get("prompt_intervention") or "knob")
    comp = compose_switch(stores["base"].episodes.records(), stores["knob"].episodes.records(), gate,
                          knob_label=knob_label)
    if comp.n_dropped_base or comp.n_dropped_knob:
        n_common = len(comp.records)
        raise SwitchError(f"{base_dir} has {n_common + comp.n_dropped_base} episodes, {knob_dir} has "
                          f"{n_common + comp.n_dropped_knob}, {n_common} in common: a switch composes two arms of the "
                          "same episodes (run both with the same --conditions, --formulations and --limit)")
    identity = {**{k: v for k, v in ident_b.items() if k != "prompt_intervention"},
                "prompt_intervention": f"switch:{gate}:{knob_label}",
                "composition": {"kind": "switch", "gate": gate,
                                "base_identity_sha256": infos["base"].get("identity_sha256"),
                                "knob_identity_sha256": infos["knob"].get("identity_sha256")}}
    store = RunStore.open(out, identity=identity, run_info={
        "composed_from": {"base": str(base_dir), "knob": str(knob_dir), "knob_prompt_intervention": knob_label,
                          "gate": gate, "n_fired": comp.n_fired, "n_episodes": len(comp.records),
                          "n_dropped_base": comp.n_dropped_base, "n_dropped_knob": comp.n_dropped_knob},
        "package_version": memtoc.__version__, "git": git_revision(), "seed": seed, "status": "running"})
    try:
        store.closed_book.append(stores["base"].closed_book.records())
        store.episodes.append(comp.records)
        table = metric_table(comp.records, metrics=composition_metrics(), n_boot=n_boot, seed=seed)
        summary = {"n_episodes": {"planned": len(comp.records), "done": len(comp.records)},
                   "switch": {"gate": gate, "knob": knob_label, "n_fired": comp.n_fired},
                   "metrics": table.to_dict()}
        store.write_summary(summary)
        store.update_run_info(status="complete")
    finally:
        store.close()
    summary["table_text"] = table.format_text()
    return summary
