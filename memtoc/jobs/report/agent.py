"""Report section of an agent run (``memtoc agent evaluate``): Table 7's columns (answer agreement per
tool-choice protocol, n) with the execution rate, the mechanism counts and the paired protocol contrasts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from memtoc.jobs.report.document import Links, Para, Section, Table, anchor_id, read_json, rel_path

PROTOCOL_COLUMNS = (("guided", "Guided"), ("auto", "Auto"), ("two-stage", "Two-stage"))


def is_agent_run_dir(p: Path) -> bool:
    return (p / "run.json").is_file() and (p / "agent_episodes.jsonl").is_file()


def _cell(e: Mapping[str, Any] | None) -> str:
    if not e or e.get("value") is None:
        return "–"
    return f"{e['value']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"


def agent_run_section(run: Path, base: Path, *, level: int = 2) -> Section:
    src = rel_path(run, base)
    info = read_json(run / "run.json") or {}
    summary = read_json(run / "summary.json") or {}
    ident = info.get("identity") or {}
    arms = {a["protocol"]: a for a in summary.get("arms") or []}
    sec = Section(f"Agent run {src}", anchor_id("agent-run", src), level, f"{src}/summary.json")
    sec.blocks.append(Para(f"model {info.get('model_spec')}, slice {ident.get('slice')}, tool protocol "
                           f"{ident.get('tool_protocol')}, decoding {ident.get('decoding')}, temperature "
                           f"{ident.get('temperature')}; answer agreement = final answer matches the executed "
                           "return (scorer's followed_tool); execution rate = a call validated and was executed"))
    n = max((a["n"] for a in arms.values()), default=0)
    rows = [[str(info.get("model_spec")), *[_cell((arms.get(p) or {}).get("agreement")) for p, _ in PROTOCOL_COLUMNS],
             str(n)],
            ["execution rate", *[_cell((arms.get(p) or {}).get("execution_rate")) for p, _ in PROTOCOL_COLUMNS], ""]]
    sec.blocks.append(Table(["Model", *[c for _, c in PROTOCOL_COLUMNS], "n"], rows, source=f"{src}/summary.json",
                            caption="Table 7 columns: answer agreement [95% question-bootstrap CI]; second row: "
                                    "tool-execution rate"))
    mech = [[p, *[str((arms[p].get("mechanisms") or {}).get(m, 0)) for m in ("T1", "T2", "T3", "T4", "schema",
                                                                              "wrong_tool")],
             str(arms[p].get("stringified_type_errors", 0))] for p, _ in PROTOCOL_COLUMNS if p in arms]
    sec.blocks.append(Table(["protocol", "T1", "T2", "T3", "T4", "schema", "wrong tool", "stringified"], mech,
                            source=f"{src}/summary.json", caption="episodes that executed no call, by mechanism"))
    contrasts = [[f"{c['b']} − {c['a']}", str(c["n_common"]),
                  f"{c['agreement']['delta']:+.3f} [{c['agreement']['ci_low']:+.3f}, {c['agreement']['ci_high']:+.3f}]",
                  f"{c['execution_rate']['delta']:+.3f} [{c['execution_rate']['ci_low']:+.3f}, "
                  f"{c['execution_rate']['ci_high']:+.3f}]"] for c in summary.get("contrasts") or []]
    if contrasts:
        sec.blocks.append(Table(["contrast", "common n", "Δ agreement", "Δ execution"], contrasts,
                                source=f"{src}/summary.json", caption="paired on common support, question clusters"))
    sec.blocks.append(Links([(f, f"{src}/{f}") for f in ("agent_episodes.jsonl", "run.json", "summary.json")
                             if (run / f).is_file()]))
    return sec
