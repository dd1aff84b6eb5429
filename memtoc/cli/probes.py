"""``memtoc lens fit``, ``memtoc rank-table`` and ``memtoc probe``: thin layers over the library functions."""

from __future__ import annotations

import argparse
from typing import Any

from memtoc.core.vocab import ALL_CONDITIONS, CELLS


def _dtype_arg(p: argparse.ArgumentParser) -> None:
    from memtoc.core.options import add_option

    add_option(p, "device", default="auto")
    add_option(p, "dtype", default="float32", help="float32 (default: derivatives need it) | bfloat16 | float16 | "
               "float64 | auto")


def _lens_names() -> list[str]:
    from probes.lenses import lens_names

    return list(lens_names())


def _fit_modes() -> tuple[str, ...]:
    from probes.fit import MODES

    return MODES


def cmd_lens_fit(args: argparse.Namespace) -> int:
    from memtoc.jobs.lens_fit import run_lens_fit

    res = run_lens_fit(args.out, model=args.model, backend_name=getattr(args, "backend", "hf"), device=args.device,
                       dtype=args.dtype, layers=args.layers,
                       corpus=args.corpus, limit=args.limit, save_dtype=args.save_dtype, max_seq_len=args.max_seq_len,
                       skip_first=args.skip_first, force_bos=not args.no_bos, batch_rows=args.batch_rows,
                       mode=args.mode, stop_after=args.stop_after, checkpoint_seconds=args.checkpoint_seconds,
                       progress=not args.no_progress)
    for note in res.notes:
        print(note)
    if res.complete:
        print(f"lens written to {res.path}: {res.n_used} sequences used of {res.n_planned} "
              f"({res.seconds:.1f} s this call)")
        return 0
    print(f"stopped after {res.n_done} of {res.n_planned} sequences; state in {res.path}.partial -- re-run the "
          "same command to resume")
    return 0


def rank_table_from_args(args: argparse.Namespace, *, backend: Any = None) -> tuple[Any, dict[str, Any]]:
    """``memtoc rank-table``: the job's config from the parsed options, run by :func:`run_rank_table`."""
    from memtoc.jobs.rank_table import run_rank_table

    res = run_rank_table(rank_table_config(args), backend=backend)
    return res.table, res.files


def rank_table_config(args: argparse.Namespace) -> Any:
    from memtoc.jobs.rank_table import RankTableJobConfig

    return RankTableJobConfig(
        run=args.run, out=args.out, model=args.model, backend=getattr(args, "backend", "hf"), device=args.device,
        dtype=args.dtype, layers=args.layers,
        lens=tuple(args.lens or ["jacobian"]), lens_file=args.lens_file, batch_size=args.batch_size,
        top_k=args.top_k, condition=args.condition, cell=args.cell, answer=args.answer,
        controls=not args.no_controls, check_model=not args.allow_other_model, progress=not args.no_progress)


def cmd_rank_table(args: argparse.Namespace) -> int:
    from probes.rank_table import to_markdown

    table, paths = rank_table_from_args(args)
    md = to_markdown(table)
    print(md.split("## Episodes")[0].rstrip())
    print("\nwritten: " + ", ".join(str(p) for p in paths.values()))
    return 0


def present_probe(res: Any, cfg: Any) -> int:
    """``memtoc probe``'s console output: the table, the best site, the files written."""
    report, paths = res.report, res.files
    print(paths["markdown"].read_text(encoding="utf-8").rstrip())
    b = report.best()
    print(f"\nbest site {b.site}: AUROC {b.auroc_pooled:.3f} [{b.ci_low:.3f}, {b.ci_high:.3f}]")
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def present_patch(res: Any, cfg: Any) -> int:
    """``memtoc patch``'s console output: the top cells, the agreement, the files written."""
    from memtoc.jobs.patch import to_markdown

    print(to_markdown(res).rstrip())
    print("written: " + ", ".join(str(p) for p in res.files.values()))
    return 0


def present_features(res: Any, cfg: Any) -> int:
    """``memtoc features``: where the page is and what it shows."""
    print(f"{len(res.views)} latents -> {res.files['html']} (and {res.files['json']})")
    return 0


def add_probe_parsers(sub: Any) -> None:
    """Register ``lens`` (``lens fit``), ``rank-table`` and ``probe`` on the ``memtoc`` subparsers."""
    from memtoc.core.options import add_option

    p = sub.add_parser("lens", help="Jacobian lens artifacts (fit the averaged lens of a model)")
    lens_sub = p.add_subparsers(dest="lens_command", required=True)
    f = lens_sub.add_parser("fit", help="fit the averaged Jacobian lens on a text corpus (resumable)")
    add_option(f, "model", default="default", help="'default', a .gguf file, a local model directory or a hub id")
    add_option(f, "backend", help="hf (vllm is refused: the fit needs gradients through the blocks)")
    f.add_argument("--corpus", default=None, help="text file, one sequence per line, or a shipped corpus: default "
                   "(probes/data/lens_corpus.txt, the default) or quick (two short lines, for smoke runs)")
    f.add_argument("--out", required=True, help="lens file (.safetensors); OUT.partial holds a resumable state")
    f.add_argument("--layers", default="all", help="source sites: all | default (rank-table's default band: the "
                   "paper's band for the model's family) | depth | N | N-M, comma lists; s = output of block s-1, "
                   "0 = embedding output; the last site is the identity and never fitted")
    f.add_argument("--max-seq-len", type=int, default=128, help="tokens per corpus sequence (longer lines are cut)")
    f.add_argument("--skip-first", type=int, default=16, help="positions left out at the start (attention sink)")
    f.add_argument("--no-bos", action="store_true", help="do not force a BOS token in front of each sequence")
    f.add_argument("--batch-rows", type=int, default=32, help="cotangents (output rows) per backward pass")
    f.add_argument("--mode", choices=_fit_modes(), default="auto",
                   help="estimator: auto (time a few rows of each on this device and fit with the fastest; the "
                   "choice is recorded in the lens metadata), replicate (the forward replicated per cotangent, "
                   "upstream jlens), vmap (one forward's backward vmapped over the cotangents) or one_row")
    add_option(f, "limit", help="use only the first N corpus lines (default: 24 of the shipped default corpus, "
               "about 30 min for the default model on 2 CPU cores; every line of any other corpus; 0 = all)")
    f.add_argument("--stop-after", type=int, default=None, help="process at most N lines in this call, then save "
                   "the state (re-run to resume)")
    f.add_argument("--checkpoint-seconds", type=float, default=60.0,
                   help="save the partial fit every N seconds, so an interrupted fit resumes")
    f.add_argument("--save-dtype", choices=("float32", "float16"), default="float32",
                   help="dtype of the saved lens matrices")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    _dtype_arg(f)
    f.set_defaults(func=cmd_lens_fit)

    p = sub.add_parser("rank-table", help="rank of the memory answer's token at the final input position, per lens")
    add_option(p, "model", default="default", help="the model that produced the run")
    add_option(p, "backend", help="hf (vllm is refused: the lenses read the model's parts)")
    p.add_argument("--run", required=True, help="run directory (memtoc evaluate --out)")
    p.add_argument("--layers", default="default", help="site band (default: the MemToC paper's band of the "
                   "model's family -- blocks 8-28 Llama, 10-38 gemma, 7-24 Qwen, as sites = block + 1 -- else "
                   "'depth' = round(0.25 L)..round(0.9 L)); s = output of block s-1")
    p.add_argument("--lens", action="append", default=None, metavar="NAME[=FILE]",
                   help="a lens to read, with its fitted file where it needs one (repeatable, or a comma list; "
                   "default jacobian): " + ", ".join(_lens_names()) + " (the logit lens is always added as the "
                   "baseline)")
    p.add_argument("--lens-file", default=None, help="the file of every lens that needs one and names none "
                   "(e.g. the averaged Jacobian lens: memtoc lens fit --out)")
    p.add_argument("--out", required=True, help="output directory (rank_table.md / .csv / .json, rank_summary.csv)")
    add_option(p, "batch_size", default=8)
    p.add_argument("--top-k", type=int, default=20, help="rank threshold of the top-k hit rates (rank <= k)")
    p.add_argument("--condition", default="tool_wrong", choices=(*ALL_CONDITIONS, "all"),
                   help="the episodes' condition (all: every condition)")
    p.add_argument("--cell", default="arb", choices=(*CELLS, "all"),
                   help="the questions' closed-book cell: arb = memory right, tool wrong (the paper's table); "
                   "all: every cell")
    p.add_argument("--answer", choices=("memory", "gold"), default="memory",
                   help="whose first token is ranked: the closed-book memory answer (primary) or the gold answer")
    p.add_argument("--no-controls", action="store_true", help="skip the other-questions control")
    p.add_argument("--allow-other-model", action="store_true", help="do not check that the run was made by --model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _dtype_arg(p)
    p.set_defaults(func=cmd_rank_table)
