"""``memtoc study --base RUN [--base RUN ...] --arm [LABEL=]RUN ... --holm-family arm|model|model×arm|none|CUSTOM``."""

from __future__ import annotations

import argparse

from memtoc.scoring.metrics import COMPARISON_METRICS


def _csv(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def cmd_study(args: argparse.Namespace) -> int:
    from memtoc.jobs.study.output import format_markdown
    from memtoc.jobs.study.run import run_study_dirs

    for _layer, study, out, paths in run_study_dirs(
            args.base, args.arm or [], layer=args.layer, judge_file=args.judge_file, out=args.out,
            family=args.family, metrics=_csv(args.metrics) or COMPARISON_METRICS, holm_metrics=_csv(args.holm_metrics),
            model_metrics=_csv(args.model_metrics) or None, alpha=args.alpha, n_boot=args.n_boot, n_perm=args.n_perm,
            seed=args.seed, model_pairs=tuple(args.model_pair or ())):
        print(format_markdown(study))
        if out:
            print(f"wrote {len(paths)} files to {out}")
    return 0


def add_study_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="the paper's statistics over a base run and several arms (and models): "
                       "Holm families, criterion per formulation, near vs far, z tests, stability rule")
    p.add_argument("--base", action="append", required=True,
                   help="base run directory of one model (repeat once per model; the model is read from run.json)")
    p.add_argument("--arm", action="append", help="arm run directory, or LABEL=DIR (repeat); compared with the "
                   "base run of the same model")
    p.add_argument("--holm-family", dest="family", default="arm",
                   help="Holm family: arm (one per arm label, across models), model "
                   "(one per model), model×arm (alias model-arm: all contrasts), none, or written out as "
                   "NAME=model/arm,model/arm;NAME2=... or @family.json")
    p.add_argument("--metrics", default=",".join(COMPARISON_METRICS), help="paired metrics (comma list)")
    p.add_argument("--holm-metrics", default="retention", help="metrics Holm-adjusted inside the families")
    p.add_argument("--model-metrics", default="retention,correct_tool_following,incorrect_tool_following,"
                   "tool_error_abstention", help="metrics of the cross-model z tests and the stability rule")
    p.add_argument("--score-layer", dest="layer", choices=("judged", "deterministic", "both"), default="judged",
                   help="scoring layer: judged (the paper's, App. B; needs judge.jsonl beside every run, from "
                   "`memtoc judge RUN`), deterministic (the scorer's labels), or both (judged to --out, "
                   "deterministic to OUT/deterministic)")
    p.add_argument("--judge-file", default=None, help="judge records file inside each run directory "
                   "(default judge.jsonl)")
    p.add_argument("--model-pair", action="append", help="A:B (base runs' model names): a paired cross-model "
                   "contrast on common support, e.g. the pre-registered base vs instruction-tuned pair "
                   "Llama-3.1-8B:Llama-3.1-8B-Instruct (repeat; Holm over the pairs)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of the Holm-corrected tests")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap draws for the intervals")
    p.add_argument("--n-perm", type=int, default=10000, help="sign-flip permutations for the p-values")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the permutations")
    p.add_argument("--out", help="directory for study.md, study.json and one CSV per table")
    p.set_defaults(func=cmd_study)
