"""One object per benchmark condition, and the registry every part of the toolkit asks about conditions.

A :class:`Condition` says everything the code branches on: which value the tool returns for a question (or that
there is no tool call), whether that return is the right answer (the scorer's ``tool_correct``, which decides the
2x2 cell), the record's ``condition`` and ``divergence_bucket``, the default condition sets it belongs to, the
metrics it adds and what a run's identity records when it is selected. The episode builder, the offline scorer,
the metric table and the jobs' default selections read it from here, so a new condition is one module in this
package (docs/extending.md, "Adding a condition").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring.metrics import MetricDef, default_metrics, register_metric, unregister_metric

if TYPE_CHECKING:  # pragma: no cover
    from memtoc.bench.prompts import PromptSet
    from memtoc.bench.questions import Question

#: ``payload(question, prompts)``: the tool return of one question's episode, or None when this question has no
#: such return (the episode is skipped, as the far arm of a question without a far distractor).
Payload = Callable[["Question", "PromptSet"], "Mapping[str, Any] | None"]


@dataclass(frozen=True)
class Condition:
    """One selectable condition (``--conditions NAME``).

    ``payload`` None means the episode has no tool call: the tool-conditioned pass answers the closed-book prompt
    and the scorer does not count an empty answer as an abstention. ``tool_correct`` is fixed per condition: True
    (the return is the gold answer), False (a wrong value, an error or a return without a factual value: a
    memory-right question sits in ``arb``) or None (no tool: no cell).
    """

    name: str
    tool_correct: bool | None
    payload: Payload | None
    #: the ``condition`` of its records when it differs from ``name`` (the far arm records as ``tool_wrong``)
    records_as: str | None = None
    #: the ``divergence_bucket`` of its records (``near`` / ``far`` for the wrong-tool arms)
    bucket: str | None = None
    #: default condition sets it belongs to, with its place in each (``all``, ``controls``, ``sweep``, ...)
    sets: Mapping[str, int] = field(default_factory=dict)
    #: metrics that read this condition and are not in the release's table: added to every default metric table
    metrics: tuple[MetricDef, ...] = ()
    #: what a run's identity records when the condition is selected (the hash of its data), or None
    identity: Callable[[], Mapping[str, Any]] | None = None
    description: str = ""

    @property
    def condition(self) -> str:
        """The ``condition`` field of its records."""
        return self.records_as or self.name

    @property
    def has_tool_return(self) -> bool:
        return self.payload is not None

    def tool_output(self, question: "Question", prompts: "PromptSet") -> Mapping[str, Any] | None:
        """A fresh copy of the tool return for ``question`` (None: no tool call, or none for this question)."""
        if self.payload is None:
            return None
        out = self.payload(question, prompts)
        return None if out is None else dict(out)


_REGISTRY: dict[str, Condition] = {}


def register_condition(cond: Condition) -> Condition:
    """Add a condition (and its metrics); a second, different condition of the same name is refused."""
    old = _REGISTRY.get(cond.name)
    if old is not None and old != cond:
        raise ValueError(f"condition {cond.name!r} is already registered ({old.description or old})")
    if cond.records_as is not None and cond.records_as not in _REGISTRY:
        raise ValueError(f"condition {cond.name!r} records as {cond.records_as!r}, which is not registered")
    for m in cond.metrics:
        register_metric(m)
    _REGISTRY[cond.name] = cond
    return cond


def unregister_condition(name: str) -> None:
    """Remove a condition and its metrics again (tests, toy conditions)."""
    cond = _REGISTRY.pop(name, None)
    for m in cond.metrics if cond else ():
        unregister_metric(m.name)


def condition_names() -> tuple[str, ...]:
    """Every selectable condition, in registration order (the release's, the far arm, the controls, then others)."""
    return tuple(_REGISTRY)


def recorded_conditions() -> tuple[str, ...]:
    """Every value a record's ``condition`` can take (the far arm records as ``tool_wrong``)."""
    return tuple(dict.fromkeys(c.condition for c in _REGISTRY.values()))


def get_condition(name: str, *, field: str = "condition", **where: Any) -> Condition:
    """The condition named ``name`` (a selectable name or a record's condition); unknown names are refused."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise BenchmarkDataError(f"unknown condition {name!r}; expected one of {', '.join(_REGISTRY)}",
                                 field=field, **where) from None


def tool_correct(name: str) -> bool | None:
    """Whether the tool's return is right under this condition: the one source of ``tool_correct``."""
    return get_condition(name).tool_correct


def metrics_of(name: str) -> tuple[str, ...]:
    """The default-table metrics this condition's records enter (a selector names its recorded condition, and its
    divergence bucket when the selector asks for one)."""
    cond = get_condition(name)
    return tuple(m.name for m in default_metrics()
                 if any(s.condition == cond.condition and s.bucket in (None, cond.bucket) for s in m.selectors))


def condition_set(name: str) -> tuple[str, ...]:
    """The members of a default set, by their place in it (ties: registration order)."""
    members = [(c.sets[name], i, c.name) for i, c in enumerate(_REGISTRY.values()) if name in c.sets]
    return tuple(n for _, _, n in sorted(members))


def set_default(name: str) -> str:
    """A default set as a ``--conditions`` value (a comma list)."""
    return ",".join(condition_set(name))


def selection_identity(names: "tuple[str, ...] | list[str]") -> dict[str, Any]:
    """What a run's identity records for its selected conditions (nothing for the release's)."""
    out: dict[str, Any] = {}
    for n in names:
        ident = get_condition(n).identity
        if ident is not None:
            out.update(ident())
    return out
