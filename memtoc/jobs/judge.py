"""``memtoc judge RUN_DIR --judge-model M``: the run's judge requests through a toolkit backend, resumable.

Greedy, ``max_new_tokens`` from the prompt file (32, paper App. B). The judge is built in one place,
:func:`load_judge_backend`, so it is a backend like any other (hf on CPU/GPU, vllm for a 7-9B judge).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, TYPE_CHECKING

from memtoc.core.backend_kinds import BACKEND_NAMES, backend_kind
from memtoc.core.errors import RunStoreError
from memtoc.core.options import opt, option
from memtoc.scoring.judge.binding import check_judge_file, run_identity_sha256, span_sha256
from memtoc.scoring.judge.prompts import JudgePrompts, load_judge_prompts
from memtoc.scoring.judge.requests import build_requests
from memtoc.scoring.judge.rules import parse_record
from memtoc.scoring.judge.store import JUDGE_FILE, IDENTITY_FIELDS, identity_diff, judge_identity_of, read_judge_records
from memtoc.runs.runstore import LOCK_NAME, JsonlLog, RunStore

if TYPE_CHECKING:   # the config is read to build the command line: no torch at import
    from memtoc.backends.base import Backend


@dataclass
class JudgeConfig:
    """``memtoc judge``: the release's judge requests (extract / ack) of a finished run."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"run_dir": "input-run", "prompts": "input"}

    run_dir: str = field(metadata=opt("a finished run directory (memtoc evaluate --out)", positional=True,
                                      path=True))
    judge_model: str = field(default="default", metadata=opt(
        "as --model of evaluate ('default' = embedded SmolLM2); 'paper' = Qwen/Qwen2.5-7B-Instruct (App. B); "
        "'auto' = the paper's judge on a GPU, 'default' on CPU (said loudly); 'run' = the run's own model (smoke "
        "tests)"))
    backend: str = field(default="hf", metadata=opt("runtime of the judge model", choices=BACKEND_NAMES))
    device: str = field(default="auto", metadata=opt("auto | cpu | cuda | cuda:N"))
    dtype: str = field(default="auto", metadata=opt(
        "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16"))
    #: None: 8 on hf, 256 on vllm
    batch_size: int | None = field(default=None, metadata=opt("judge prompts per call (default: the backend's)"))
    #: a judge prompt file; None = the packaged release prompts
    prompts: str | None = field(default=None, metadata=opt(
        "judge prompt file (default: memtoc/data/judge_prompts.json)", path=True))
    #: file name inside the run directory
    out: str = field(default=JUDGE_FILE, metadata=opt(
        "file name in the run directory (a second judge: its own file)", path=True))
    progress: bool = field(default=True, metadata=option("progress"))
    tensor_parallel_size: int = field(default=1, metadata=opt("vllm: GPUs to shard the judge over"))
    gpu_memory_utilization: float = field(default=0.9, metadata=opt("vllm: fraction of GPU memory to use"))
    max_model_len: int | None = field(default=None, metadata=opt("vllm: context length (default: the model's)"))


#: the paper's judge (App. B: Qwen2.5-7B-Instruct served like the models, greedy, 32 new tokens)
PAPER_JUDGE_MODEL = "Qwen/Qwen2.5-7B-Instruct"


def resolve_judge_model(name: str, run_dir: str | Path, *, cuda: bool | None = None,
                        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> str:
    """``auto``: the paper's judge where a GPU is present, else ``default`` (the embedded SmolLM2, said loudly);
    ``paper``: the paper's judge; ``run``: the run's own model (a smoke test, not a judge to read results from)."""
    if name == "paper":
        return PAPER_JUDGE_MODEL
    if name == "auto":
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        if cuda:
            return PAPER_JUDGE_MODEL
        log(f"judge: no GPU here, so --judge-model auto uses 'default' (the embedded SmolLM2), NOT the paper's "
            f"{PAPER_JUDGE_MODEL}; its judged layer is a smoke test, not the paper's")
        return "default"
    if name == "run":
        from memtoc.jobs.study.runs import run_model_identity

        model = run_model_identity(RunStore.read(run_dir).run_info(), Path(run_dir), " for --judge-model run")
        log(f"judge: --judge-model run uses the run's own model {model} (a smoke test, not the paper's judge)")
        return model
    return name


@dataclass
class JudgeResult:
    path: Path
    n_requests: int
    n_new: int
    counts: dict[str, int]


def judge_batch_size(cfg: JudgeConfig) -> int:
    """Requests per backend call: ``--batch-size``, else the backend kind's default (it knows its scheduling)."""
    return cfg.batch_size or backend_kind(cfg.backend).default_batch_size


def load_judge_backend(cfg: JudgeConfig) -> Backend:
    """The judge model, built by the one backend factory like every other model of the toolkit."""
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    return load_backend(ModelSpec(model=cfg.judge_model, backend=cfg.backend, device=cfg.device, dtype=cfg.dtype,
                                  tensor_parallel_size=cfg.tensor_parallel_size,
                                  gpu_memory_utilization=cfg.gpu_memory_utilization,
                                  max_model_len=cfg.max_model_len), hooks=False)     # generation only


#: files of a run directory the judge never writes (its own is ``judge*.jsonl``, the --out name)
RUN_FILES = ("episodes.jsonl", "closed_book.jsonl", "run.json", "summary.json", LOCK_NAME)


def judge_output_path(root: Path, output: str) -> Path:
    """``--out`` is a file name in the run directory: the one output rule, with the run's own files as inputs
    (``../../x.jsonl``, an absolute path or ``episodes.jsonl`` are refused, naming both paths)."""
    from memtoc.core.fileio import check_output_path

    path = root / output
    check_output_path(path, [root / n for n in RUN_FILES], within=root)
    if path.is_dir():
        raise RunStoreError(f"--out {output}: {path} is a directory; give a file name such as judge_<name>.jsonl")
    return path


def check_judge_config(cfg: JudgeConfig) -> None:
    """Every option checked before the run is read or a model loads (one line, exit 2 on the CLI)."""
    from memtoc.core.checks import check_device, check_positive

    check_device(cfg.device, flag="--device")
    backend_kind(cfg.backend)                  # an unknown backend: one line naming --backend and the choices
    if cfg.batch_size is not None:
        check_positive(cfg.batch_size, "--batch-size")
    check_positive(cfg.tensor_parallel_size, "--tensor-parallel-size")
    if cfg.max_model_len is not None:
        check_positive(cfg.max_model_len, "--max-model-len")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        from memtoc.core.errors import MemtocError

        raise MemtocError(f"--gpu-memory-utilization {cfg.gpu_memory_utilization}: give a share in (0, 1]")


def judge_identity(provenance: dict[str, Any], prompts: JudgePrompts) -> dict[str, Any]:
    ident = {"model": provenance.get("model"), "weights_sha256": (provenance.get("weights") or {}).get("sha256"),
             "backend": provenance.get("backend"), "dtype": provenance.get("dtype"),
             "chat_template_sha256": provenance.get("chat_template_sha256"),
             "prompt_version": prompts.prompt_version, "prompts_sha256": prompts.sha256,
             "max_new_tokens": prompts.max_new_tokens}
    assert tuple(ident) == IDENTITY_FIELDS
    return ident


def _refuse(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    diff = identity_diff(old, new)
    raise RunStoreError(
        f"{path} holds a judge pass of another judge (field {', '.join(diff)}: {old.get(diff[0])!r} vs "
        f"{new.get(diff[0])!r}); write this judge to its own file with --out judge_<name>.jsonl, or delete "
        f"{path.name} to start over")


def run_judge(cfg: JudgeConfig, *, backend: Backend | None = None,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> JudgeResult:
    """Build the run's requests, skip those already in the judge file, judge the rest in fsynced batches."""
    check_judge_config(cfg)
    store = RunStore.read(cfg.run_dir)
    if backend is None:
        cfg = dataclasses.replace(cfg, judge_model=resolve_judge_model(cfg.judge_model, cfg.run_dir, log=log))
    prompts = load_judge_prompts(cfg.prompts)
    records = store.episodes.records()
    requests = build_requests(records, prompts)
    path = judge_output_path(store.root, cfg.out)
    existing = read_judge_records(path) if path.exists() else {}
    old_ident = judge_identity_of(existing, path)
    check_judge_file(existing, records, run_dir=store.root, path=path)   # resume only this run's pass
    run_id = run_identity_sha256(store.root)
    todo = [r for r in requests if r.request_id not in existing]
    cheap = {"prompt_version": prompts.prompt_version, "prompts_sha256": prompts.sha256}
    if old_ident is not None and backend is None:
        # refuse before loading a model when the spec or the prompts already differ
        mismatch = {k: v for k, v in cheap.items() if old_ident.get(k) != v}
        if old_ident.get("model") != cfg.judge_model:
            mismatch["model"] = cfg.judge_model
        if mismatch:
            _refuse(path, old_ident, {**old_ident, **mismatch})
    counts = {k: sum(r.kind == k for r in requests) for k in ("extract_final", "extract_closed_book", "ack")}
    if not todo:
        if not path.exists():     # no request at all (e.g. only tool errors): an empty judge layer, said so
            path.touch()
            log(f"{path}: the run has no judge requests; an empty judge file written (judged = deterministic)")
        else:
            log(f"{path}: nothing left to judge ({len(requests)} requests already judged)")
        return JudgeResult(path, len(requests), 0, counts)
    backend = backend or load_judge_backend(cfg)
    ident = judge_identity(backend.provenance(), prompts)
    if old_ident is not None and identity_diff(old_ident, ident):
        _refuse(path, old_ident, ident)
    judge_log = JsonlLog(path, "request_id")  # repairs a torn last line before appending
    from tqdm import tqdm

    from memtoc.core.runtime import GenerationConfig

    gen_cfg = GenerationConfig(max_new_tokens=prompts.max_new_tokens, stop_at_final_line=False)
    size = judge_batch_size(cfg)
    parse_kw = {"max_words": prompts.max_words, "abstain_token": prompts.abstain_token,
                "strip_chars": prompts.strip_chars}
    n_new = 0
    bar = tqdm(total=len(todo), desc="judge", unit="request", disable=not cfg.progress, file=sys.stderr)
    try:
        todo.sort(key=lambda r: len(r.prompt))
        for start in range(0, len(todo), size):
            batch = todo[start:start + size]
            recs = []
            # a failing backend call raises (the pass resumes from the last batch); ``error`` is for judges whose
            # calls can fail per request (a served judge)
            gens = backend.generate([r.prompt for r in batch], gen_cfg)
            for req, gen in zip(batch, gens):
                rec = {**req.to_dict(), "span_sha256": span_sha256(req.answer), "run_identity_sha256": run_id,
                       "reply": gen.text, "error": None, "judge": ident,
                       "parse": {} if req.kind == "ack" else parse_kw}
                rec["verdict"] = parse_record(rec, **({} if req.kind == "ack" else parse_kw))
                recs.append(rec)
            n_new += judge_log.append(recs)
            bar.update(len(batch))
    finally:
        bar.close()
    return JudgeResult(path, len(requests), n_new, counts)
