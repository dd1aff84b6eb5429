"""The MemToC scorer and metrics for Inspect: the project's one scorer and metric code, not a re-implementation.

The scorer labels a sample with the functions ``memtoc evaluate`` writes its records with
(:func:`memtoc.tasks.memtoc.evaluation.closed_book_record` for the memory status,
:func:`~memtoc.tasks.memtoc.evaluation.scored_record` for the outcome and cell), and puts the whole record into
the sample's metadata (the keys of a run's ``episodes.jsonl``). The metrics are
:func:`memtoc.scoring.metrics.metric_table`'s pooled values (the unweighted mean over formulations, as
``memtoc metrics`` reports it) and :func:`memtoc.scoring.metrics.cell_counts`.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import TaskState

from memtoc.backends.base import Generation
from memtoc.inspect_eval.plan import plan_run
from memtoc.inspect_eval.solver import CLOSED_BOOK, TOOL_PASS
from memtoc.scoring.metrics import cell_counts, metric_table
from memtoc.tasks.memtoc.evaluation import closed_book_record, scored_record

__all__ = ["DECISIONS", "HEADLINE_METRICS", "memtoc_metrics", "memtoc_scorer"]

#: the release's headline readings (Ret., Tool, Wrong, Err.), reported as Inspect metrics
HEADLINE_METRICS: tuple[str, ...] = ("retention", "correct_tool_following", "incorrect_tool_following",
                                     "tool_error_abstention")
#: the record keys a score carries: the scorer's decisions and what the metrics select records by
DECISIONS: tuple[str, ...] = ("question_id", "formulation", "condition", "divergence_bucket", "trivial_hop",
                              "memory_span", "mem_absent", "memory_correct", "cell", "extracted", "followed_tool",
                              "kept_memory", "final_correct", "outcome", "neither_subtype", "ack_proxy", "abstain",
                              "abstain_raw")


@metric
def memtoc_metrics() -> Metric:
    """Ret., Tool, Wrong and Err. (pooled over formulations, NaN where no record qualifies) and the number of
    records in each cell (``cell_agree`` ... ``cell_mem_absent``), from the scores' decisions."""

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        records = [s.score.metadata for s in scores if s.score.metadata]
        table = metric_table(records, metrics=HEADLINE_METRICS, n_boot=1)   # values only: no interval is shown
        out = {name: float(table[name].pooled.value) for name in HEADLINE_METRICS}
        out.update({f"cell_{cell}": float(n) for cell, n in cell_counts(records).items()})
        return out

    return compute


@scorer(metrics=[memtoc_metrics()])
def memtoc_scorer(options: tuple = ()) -> Scorer:
    """Label a sample from the two generations its solver stored (``options``: the task's)."""

    async def score(state: TaskState, target: Target) -> Score:
        plan = plan_run(tuple(tuple(kv) for kv in options))
        ep = plan.episode(str(state.sample_id))
        closed, answer = state.store.get(CLOSED_BOOK), state.store.get(TOOL_PASS)
        if closed is None or answer is None:
            raise ValueError(f"sample {state.sample_id}: no MemToC generations in its store; the memtoc task's "
                             "solver (memtoc_passes) writes them")
        memory = closed_book_record(ep, Generation(**closed), plan.bench, plan.cfg.intervention.closed_book)
        rec: dict[str, Any] = scored_record(ep, Generation(**answer), memory, plan.bench)
        rec["closed_book_response"] = memory["response"]
        state.metadata.clear()
        state.metadata.update(rec)
        return Score(value=rec["outcome"], answer=rec["extracted"],
                     explanation=f"cell {rec['cell']}, outcome {rec['outcome']}",
                     metadata={k: rec[k] for k in DECISIONS})

    return score
