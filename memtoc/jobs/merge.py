"""``memtoc merge`` and ``memtoc merge-activations``: join shards of one experiment made by separate processes.

A large experiment is split into shards (folds, ``--limit`` slices, condition subsets) run with the SAME settings,
each into its own run directory or HDF5 store. Inputs must share ``identity_sha256`` (else the differing identity
fields are named). Run records are deduplicated by key (``key`` / ``episode_id``): identical duplicates are fine,
conflicting ones are refused naming the key, and the metric table is recomputed. Store rows are appended through
:class:`activations.store.ActivationWriter`, and a duplicated episode must have identical rows and activations.
The merged store keeps the sources' compression and level, and their rows per HDF5 chunk when all sources have
the same (``extract --chunk-rows``); sources chunked differently give the writer's default chunking.

Both write into a temporary sibling of ``--out`` and rename it into place, so a killed merge never leaves a
half-merged output; inputs are only read (an interrupted input makes the merge ``partial``), and ``--overwrite``
swaps the new directory in atomically (:func:`memtoc.core.fileio.replace_dir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from memtoc.core.errors import MemtocError, RunStoreError
from memtoc.core.options import opt
from memtoc.jobs import stderr_line
from memtoc.core.fileio import describe_os_error, fsync_tree, recover_dir_swap, remove_path, replace_dir, temp_sibling

_LOG = Callable[[str], None]


@dataclass
class MergeConfig:
    """``memtoc merge``: run directories of the same settings (shards) and the merged run directory."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"runs": "input-run", "out": "output-run"}

    runs: tuple[str, ...] = field(default=(), metadata=opt(
        "run directories (memtoc evaluate --out) made with the same settings", positional=True, nargs="+",
        required=True))
    out: str = field(default="", metadata=opt("merged run directory (written to a temp dir, then renamed)",
                                              required=True, path=True))
    seed: int | None = field(default=None, metadata=opt(
        "bootstrap seed of the recomputed metric table (default: the first run's)"))
    overwrite: bool = field(default=False, metadata=opt("replace --out if it exists"))


@dataclass
class MergeActivationsConfig:
    """``memtoc merge-activations``: activation stores of the same settings and the merged store."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"stores": "input-store", "out": "output-store"}

    stores: tuple[str, ...] = field(default=(), metadata=opt(
        "activation stores (memtoc extract --out) made with the same settings", positional=True, nargs="+",
        required=True))
    out: str = field(default="", metadata=opt("merged store (written to a temp file, then renamed)", required=True,
                                              path=True))
    overwrite: bool = field(default=False, metadata=opt("replace --out if it exists"))


def run_merge(cfg: MergeConfig) -> "MergeResult":
    """Merge ``cfg.runs`` into ``cfg.out`` (:func:`merge_runs`)."""
    return merge_runs(list(cfg.runs), cfg.out, seed=cfg.seed, overwrite=cfg.overwrite)


def run_merge_activations(cfg: MergeActivationsConfig) -> "MergeActivationsResult":
    """Merge ``cfg.stores`` into ``cfg.out`` (:func:`merge_activation_stores`)."""
    return merge_activation_stores(list(cfg.stores), cfg.out, overwrite=cfg.overwrite)


def _identity_error(first: Mapping[str, Any], other: Mapping[str, Any], first_path: Path, path: Path) -> str:
    """Why shard ``path`` cannot join ``first_path``: the identity fields that differ, with both values."""
    a, b = first.get("identity") or {}, other.get("identity") or {}
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    detail = "; ".join(f"{k}: {a.get(k)!r} in {first_path} vs {b.get(k)!r} in {path}" for k in diff[:4])
    return (f"{path} was made with different settings than {first_path} "
            f"({', '.join(diff) or 'identity hash differs'}): {detail}")


def _canon(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, sort_keys=True, ensure_ascii=False)


def _prepare_out(out: Path, sources: Sequence[Path], overwrite: bool) -> None:
    for s in sources:
        if s.resolve() == out.resolve():
            raise MemtocError(f"--out {out} is one of the inputs; merge into a new path")
    from memtoc.core.fileio import check_output_path

    check_output_path(out, sources, flag="--out", output_is_dir=True)   # not inside an input, nor holding one
    if out.exists() and not overwrite:
        raise MemtocError(f"{out} already exists; choose another --out, or pass --overwrite to replace it")


# -- run directories ----------------------------------------------------------------------------------------

@dataclass
class MergeResult:
    out: Path
    n_sources: int
    n_closed_book: int
    n_episodes: int
    n_duplicates: int
    table_text: str = ""
    status: str = "complete"


def _merge_log(name: str, key: str, sources: Sequence[tuple[Path, list[dict[str, Any]]]]
               ) -> tuple[list[dict[str, Any]], int]:
    merged: dict[str, dict[str, Any]] = {}
    where: dict[str, Path] = {}
    dups = 0
    for src, records in sources:
        for rec in records:
            k = str(rec[key])
            if k in merged:
                if _canon(merged[k]) != _canon(rec):
                    diff = sorted(f for f in set(merged[k]) | set(rec) if merged[k].get(f) != rec.get(f))
                    what = "episode" if key == "episode_id" else "closed-book record"
                    raise RunStoreError(
                        f"conflicting duplicate {what} {k!r} in {where[k]} and {src} ({name}; fields differ: "
                        f"{', '.join(diff[:6])}); the shards do not agree, so they cannot be merged")
                dups += 1
                continue
            merged[k] = rec
            where[k] = src
    return list(merged.values()), dups


def _check_run_out(out: Path, overwrite: bool) -> None:
    """--overwrite replaces a previous merge output, never an unrelated directory or file."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise MemtocError(f"--out {out} exists and is not a directory; choose another --out")
    if overwrite and not (out / "run.json").is_file() and any(out.iterdir()):
        raise MemtocError(f"--out {out} exists and is not a run directory (no run.json); refusing to replace it")


def merge_runs(run_dirs: Sequence[str | Path], out: str | Path, *, seed: int | None = None,
               overwrite: bool = False, log: _LOG = stderr_line) -> MergeResult:
    """Merge run directories made with the same settings into ``out`` (see the module docstring). The output
    is built in ``.<out>.merge-tmp-<pid>`` and swapped in whole; leftovers of killed merges into the same ``out``
    are repaired or removed first."""
    from memtoc.runs.result import read_summary
    from memtoc.runs.runstore import RunStore
    from memtoc.scoring.metrics import metric_table

    if not run_dirs:
        raise MemtocError("merge needs at least one run directory")
    dirs = [Path(d) for d in run_dirs]
    out = Path(out)
    try:
        recover_dir_swap(out, tags=("merge-tmp",), log=log)
    except OSError as exc:
        raise MemtocError(f"{out}: cannot clean up after an earlier interrupted merge "
                          f"({describe_os_error(exc)})") from None
    _prepare_out(out, dirs, overwrite)
    _check_run_out(out, overwrite)
    stores = [RunStore.read(d, warn=lambda m: log(f"warning: {m}")) for d in dirs]
    infos = [s.run_info() for s in stores]
    first = infos[0]
    for d, info in zip(dirs[1:], infos[1:]):
        if info.get("identity_sha256") != first.get("identity_sha256"):
            raise RunStoreError(_identity_error(first, info, dirs[0], d))
    cb, cb_dups = _merge_log("closed_book.jsonl", "key", [(d, s.closed_book.records()) for d, s in zip(dirs, stores)])
    eps, ep_dups = _merge_log("episodes.jsonl", "episode_id", [(d, s.episodes.records()) for d, s in zip(dirs, stores)])
    if seed is None:
        seed = int(first.get("seed", (first.get("config") or {}).get("seed", 0)) or 0)
    table = metric_table(eps, seed=seed)
    missing = 0
    for s, st in zip([read_summary(d) for d in dirs], stores):
        n = s.get("n_episodes") or {}
        if n.get("planned") is not None and n.get("done") is not None and st.state and st.state.finished:
            missing += max(0, int(n["planned"]) - int(n["done"]))
    # complete only when every input finished complete and was read whole (no torn line, no dead writer)
    unfinished = [f"{d} ({s.state.describe() if s.state else 'unknown'}"
                  + (", torn last line" if s.state and s.state.torn else "") + ")"
                  for d, s in zip(dirs, stores) if not (s.state and s.state.finished and s.state.state == "complete")]
    merged_from = [{"path": str(d.resolve()), "identity_sha256": i.get("identity_sha256"),
                    "status": s.state.state if s.state else i.get("status"),
                    "torn": list(s.state.torn) if s.state else [],
                    "n_episodes": len(s.episodes), "n_closed_book": len(s.closed_book),
                    "git": i.get("git"), "config": i.get("config")}
                   for d, i, s in zip(dirs, infos, stores)]
    run_info = dict(first)
    run_info["config"] = dict(first.get("config") or {}, out=str(out))
    run_info["status"] = "complete" if not unfinished and missing == 0 else "partial"
    run_info["merged_from"] = merged_from
    summary = {"n_episodes": {"planned": len(eps) + missing, "done": len(eps)}, "n_closed_book": len(cb),
               "metrics": table.to_dict(),
               "merged": {"n_sources": len(dirs), "duplicate_episodes": ep_dups, "duplicate_closed_book": cb_dups}}

    def jsonl(recs: list[dict[str, Any]]) -> str:
        return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in recs)

    def js(obj: Any) -> str:
        return json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False) + "\n"

    tmp = temp_sibling(out, "merge-tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_path(tmp)
        tmp.mkdir(parents=True)
        for name, text in {"closed_book.jsonl": jsonl(cb), "episodes.jsonl": jsonl(eps), "run.json": js(run_info),
                           "summary.json": js(summary)}.items():
            with (tmp / name).open("w", encoding="utf-8") as fh:
                fh.write(text)
        fsync_tree(tmp)             # the files and the directory, before the swap
        replace_dir(tmp, out)
    except OSError as exc:
        remove_path(tmp)
        raise RunStoreError(f"cannot write the merged run directory {out} ({describe_os_error(exc)}"
                            f"{': ' + str(exc.filename) if exc.filename else ''}); "
                            f"{'the previous ' + str(out) + ' is unchanged' if out.exists() else 'nothing was written'}"
                            ) from None
    except BaseException:
        remove_path(tmp)
        raise
    why = f" (not complete: {'; '.join(unfinished)})" if unfinished else ""
    log(f"merged {len(dirs)} run directories -> {out}: {len(eps)} episodes ({ep_dups} duplicates dropped), "
        f"{len(cb)} closed-book records ({cb_dups} duplicates dropped); status {run_info['status']}{why}")
    return MergeResult(out=out, n_sources=len(dirs), n_closed_book=len(cb), n_episodes=len(eps),
                       n_duplicates=ep_dups + cb_dups, table_text=table.format_text(), status=run_info["status"])


# -- activation stores ------------------------------------------------------------------------------------

# Root attributes the writer sets itself (everything else is provenance and is carried over from shard 1).
_STRUCTURAL = {"schema", "identity", "identity_sha256", "sites", "d_model", "storage_dtype", "encoding",
               "compression", "n_rows", "n_episodes", "complete", "n_planned", "planned_sha256", "json_attrs"}
_BLOCK_ROWS = 4096


@dataclass
class MergeActivationsResult:
    out: Path
    n_sources: int
    n_rows: int
    n_episodes: int
    n_duplicates: int
    complete: bool


def _episode_rows(store: Any, start: int, stop: int) -> tuple[dict[str, Any], dict[int, Any]]:
    idx = {c: v[start:stop] for c, v in store.index.items() if c != "row"}
    raw = {s: store.read_raw(s, slice(start, stop)) for s in store.layers}
    return idx, raw


def _same_rows(a: tuple[dict[str, Any], dict[int, Any]], b: tuple[dict[str, Any], dict[int, Any]]) -> list[str]:
    import numpy as np

    def differ(x: Mapping[Any, Any], y: Mapping[Any, Any]) -> list[Any]:
        return [k for k in sorted(set(x) | set(y)) if k not in x or k not in y or not np.array_equal(x[k], y[k])]

    return [*differ(a[0], b[0]), *(f"site {s}" for s in differ(a[1], b[1]))]


def merge_activation_stores(paths: Sequence[str | Path], out: str | Path, *, overwrite: bool = False,
                            log: _LOG = stderr_line) -> MergeActivationsResult:
    """Merge HDF5 activation stores made with the same settings into ``out`` (see the module docstring)."""
    from activations import ActivationStoreError
    from activations.journal import remove_stale_temps
    from activations.store import INDEX_COLUMNS, ActivationWriter, RowBlock, open_store

    if not paths:
        raise MemtocError("merge-activations needs at least one store")
    srcs = [Path(p) for p in paths]
    out = Path(out)
    _prepare_out(out, srcs, overwrite)
    for stale in remove_stale_temps(out):
        log(f"removed {stale} (left by a merge that was killed)")
    stores = [open_store(p) for p in srcs]
    tmp = temp_sibling(out, "merge-tmp")       # the merge's journal; --out itself is replaced only by the final rename
    writer = None
    try:
        attrs0 = stores[0].attrs
        for p, st in zip(srcs[1:], stores[1:]):
            a = st.attrs
            if a.get("identity_sha256") != attrs0.get("identity_sha256"):
                raise ActivationStoreError(_identity_error(attrs0, a, srcs[0], p))
            for k in ("sites", "d_model", "storage_dtype", "encoding", "compression"):
                if a.get(k) != attrs0.get(k):
                    raise ActivationStoreError(f"{p}: {k} {a.get(k)!r} differs from {srcs[0]} ({attrs0.get(k)!r})")
            if st.compression_opts != stores[0].compression_opts:
                raise ActivationStoreError(f"{p}: compression_opts {st.compression_opts!r} differs from {srcs[0]} "
                                           f"({stores[0].compression_opts!r})")
        provenance = {k: v for k, v in attrs0.items() if k not in _STRUCTURAL}
        provenance["merged_from"] = [{"path": str(p.resolve()), "n_rows": len(st), "n_episodes": st.n_episodes,
                                      "complete": st.complete,
                                      "created_utc": st.attrs.get("created_utc")} for p, st in zip(srcs, stores)]
        compression = attrs0.get("compression")
        chunk_rows = {st.chunk_rows for st in stores}      # kept when the sources agree, else the writer's default
        writer = ActivationWriter.open(out, identity=attrs0["identity"], provenance=provenance,
                                       sites=[int(s) for s in attrs0["sites"]], d_model=int(attrs0["d_model"]),
                                       storage_dtype=str(attrs0["storage_dtype"]),
                                       compression=None if compression in (None, "none") else compression,
                                       compression_opts=stores[0].compression_opts, replace=True, journal_dir=tmp,
                                       chunk_rows=chunk_rows.pop() if len(chunk_rows) == 1 else None)
        where: dict[str, tuple[int, int, int]] = {}
        n_dups = 0
        try:
            for si, st in enumerate(stores):
                eps = st.episodes
                ids = [str(e) for e in eps["episode_id"]]
                starts, stops = eps["row_start"], eps["row_stop"]
                pend: list[int] = []

                def flush(pend: list[int], st: Any = st, eps: Any = eps, ids: list[str] = ids, starts: Any = starts,
                          stops: Any = stops) -> None:
                    if not pend:
                        return
                    r0, r1 = int(starts[pend[0]]), int(stops[pend[-1]])
                    idx = {c: v[r0:r1] for c, v in st.index.items() if c in INDEX_COLUMNS}
                    acts = {s: st.read(s, slice(r0, r1)) for s in st.layers}
                    meta = [{"episode_id": ids[i], "n_rows": int(stops[i]) - int(starts[i]),
                             "n_prompt_tokens": int(eps["n_prompt_tokens"][i]),
                             "n_generated_tokens": int(eps["n_generated_tokens"][i])} for i in pend]
                    block = RowBlock(episodes=meta, index=idx, acts=acts)
                    writer.append(block)

                rows_in_block = 0
                for i, eid in enumerate(ids):
                    if eid in where:
                        sj, a0, a1 = where[eid]
                        mine = _episode_rows(st, int(starts[i]), int(stops[i]))
                        theirs = _episode_rows(stores[sj], a0, a1)
                        bad = _same_rows(mine, theirs)
                        if bad:
                            raise ActivationStoreError(
                                f"conflicting duplicate episode {eid!r} in {srcs[sj]} and {srcs[si]} (differs in "
                                f"{', '.join(bad[:6])}); the shards do not agree, so they cannot be merged")
                        n_dups += 1
                        flush(pend)
                        pend, rows_in_block = [], 0
                        continue
                    contiguous = not pend or int(starts[i]) == int(stops[pend[-1]])
                    if not contiguous or rows_in_block >= _BLOCK_ROWS:
                        flush(pend)
                        pend, rows_in_block = [], 0
                    where[eid] = (si, int(starts[i]), int(stops[i]))
                    pend.append(i)
                    rows_in_block += int(stops[i]) - int(starts[i])
                flush(pend)
            all_complete = all(st.complete for st in stores)
            # writes the merged store next to --out, fsyncs it and renames it over --out (atomic overwrite)
            complete = writer.finish(planned=list(where), extra_attrs=None if all_complete else {"complete": False})
            complete = complete and all_complete
            n_rows, n_eps = writer.n_rows, writer.n_episodes
        finally:
            writer.close()
        for st in stores:
            st.close()
        stores = []
    except BaseException:
        for st in stores:
            try:
                st.close()
            except Exception:  # noqa: BLE001
                pass
        if writer is not None:
            writer.discard()
        raise
    log(f"merged {len(srcs)} activation stores -> {out}: {n_eps} episodes, {n_rows} rows ({n_dups} duplicate "
        f"episodes dropped){'' if complete else '; INCOMPLETE (a shard was incomplete)'}")
    return MergeActivationsResult(out=out, n_sources=len(srcs), n_rows=n_rows, n_episodes=n_eps,
                                  n_duplicates=n_dups, complete=complete)
