"""Report plots (memtoc.core.plots): what a reader must be able to tell apart on the headline chart."""

from __future__ import annotations

import pytest

from memtoc.core import plots


def _cell(v):
    return {"value": v, "ci_low": v, "ci_high": v}


def test_a_measured_zero_is_drawn_and_told_apart_from_no_data(monkeypatch) -> None:
    """A 0 % rate is a result (e.g. no tool-error abstention at all): it gets a visible mark and "0%", while a
    metric with no episodes says "n=0"; a zero-height bar alone would look like either."""
    figs = []
    monkeypatch.setattr(plots, "_png", lambda fig: figs.append(fig) or b"png")
    metrics = {"formulations": ["reference"], "metrics": {
        "retention": {"pooled": _cell(0.5), "per_formulation": {"reference": _cell(0.5)}},
        "tool_error_abstention": {"pooled": _cell(0.0), "per_formulation": {"reference": _cell(0.0)}},
        "correct_tool_following": {"pooled": _cell(float("nan")), "per_formulation": {"reference": _cell(None)}},
    }}
    assert plots.headline_bars(metrics) == b"png"
    ax = figs[0].axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0%") == 2 and texts.count("n=0") == 2          # reference and pooled each
    zero_marks = [line for line in ax.lines if list(line.get_ydata()) == pytest.approx([0.6, 0.6])]
    assert len(zero_marks) == 2 and all(line.get_linewidth() >= 2 for line in zero_marks)
