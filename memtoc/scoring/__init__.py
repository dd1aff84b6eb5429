"""The one deterministic MemToC scorer: extract the answer span, match it, detect abstention, label.

A re-implementation of the MemToC release scorer (`shared/docs/scoring.md`, sections 1-5 and 9),
gotchas included, so that numbers computed here are comparable with the published ones.
"""

from memtoc.scoring.abstain import ABSTAIN_RULES, AbstainRule, is_abstain, matching_rules
from memtoc.scoring.extract import QUOTE_CHARS, extract_span
from memtoc.scoring.normalize import (
    canonical,
    is_trivial_hop,
    match,
    match_any,
    match_v0,
    normalize,
    parse_dates,
)
from memtoc.scoring.score import (
    CELL_BY_CORRECTNESS,
    MemoryStatus,
    Score,
    assign_cell,
    memory_status,
    score_response,
)

__all__ = [
    "ABSTAIN_RULES",
    "AbstainRule",
    "CELL_BY_CORRECTNESS",
    "MemoryStatus",
    "QUOTE_CHARS",
    "Score",
    "assign_cell",
    "canonical",
    "extract_span",
    "is_abstain",
    "is_trivial_hop",
    "match",
    "match_any",
    "match_v0",
    "matching_rules",
    "memory_status",
    "normalize",
    "parse_dates",
    "score_response",
]
