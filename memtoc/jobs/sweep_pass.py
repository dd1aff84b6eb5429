"""A sweep's strengths evaluated together: one engine pass per round of generations, a strength per row.

Used by the sweep job (:func:`memtoc.jobs.sweep.sweep`) on a backend declaring ``row_edits`` (vllm). Each strength
is still an ordinary evaluation (:func:`memtoc.tasks.evaluation.evaluate_task`: its own run directory, identity with
the edit's hash, resume, the one scorer); the evaluations run in threads against members of one
:class:`memtoc.backends.shared_pass.SharedPass`, which answers each round of their ``generate`` calls with a
single engine pass.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

from memtoc.backends.shared_pass import PassStats, SharedPass
from memtoc.tasks.evaluation import evaluate_task


def evaluate_in_one_pass(backend: Any, configs: Mapping[float, Any], edits: Mapping[float, Any], *, task: str,
                         log: Callable[[str], None], **options: Any
                         ) -> tuple[dict[float, list[dict[str, Any]]], PassStats]:
    """Evaluate every strength (``configs[s]`` with ``edits[s]``) side by side; returns each strength's records
    and what the shared pass did. The first error of any strength is raised once all have stopped."""
    shared = SharedPass(backend, len(configs))
    records: dict[float, list[dict[str, Any]]] = {}
    errors: dict[float, BaseException] = {}

    def run(s: float) -> None:
        try:
            job, _ = evaluate_task(configs[s], task=task, backend=shared.member(), edit=edits[s], log=log, **options)
            records[s] = job.records()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors[s] = exc
        finally:
            shared.leave()

    threads = [threading.Thread(target=run, args=(s,), name=f"sweep-strength-{s:g}") for s in configs]
    for th in threads:
        th.start()
    shared.serve()          # the engine passes run here, in the thread that built the engine
    for th in threads:
        th.join()
    if errors:
        raise errors[min(errors)]
    st = shared.stats
    log(f"sweep: {len(configs)} strengths in {st.passes} engine pass(es) ({st.rows_sent} rows sent for "
        f"{st.rows_asked} asked)")
    return {s: records[s] for s in configs}, st
