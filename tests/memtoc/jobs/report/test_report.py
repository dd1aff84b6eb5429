"""``memtoc report``: a self-contained page (sections, embedded PNGs, no external resources, escaping)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.jobs.report.build import write_report
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec

PNG_SIG = b"\x89PNG\r\n\x1a\n"
XSS = "Who wrote <script>alert('x')</script> & why?"
RUN_SECTIONS = ("Provenance", "Metrics", "Headline metrics", "Outcomes by condition and cell", "Files",
                "Arbitration-cell episodes")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.imgs: list[str] = []
        self.hrefs: list[str] = []
        self.tags: list[str] = []
        self.attr_values: list[str] = []
        self.text: list[str] = []
        self._h = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        d = dict(attrs)
        self.attr_values += [v or "" for _, v in attrs]
        if tag in ("h1", "h2", "h3", "h4"):
            self._h = []
        if tag == "img":
            self.imgs.append(d.get("src", ""))
        if tag == "a":
            self.hrefs.append(d.get("href", ""))

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3", "h4") and self._h is not None:
            self.headings.append("".join(self._h).strip())
            self._h = None

    def handle_data(self, data):
        self.text.append(data)
        if self._h is not None:
            self._h.append(data)


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def _check_self_contained(page: _Page, raw: str) -> None:
    assert page.imgs, "no plots"
    for src in page.imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_SIG)
    assert not any(v.lower().startswith(("http://", "https://", "//")) for v in page.attr_values)
    assert "http://" not in raw and "https://" not in raw
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_backend, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    evaluate(EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        job=JobSettings(out=str(out), progress=False),
        selection=EpisodeSelection(conditions="tool_wrong,tool_right,tool_error", limit=2),
        generation=GenerationConfig(batch_size=4, max_new_tokens=6)), backend=tiny_backend, log=lambda s: None)
    # the random tiny model never remembers an answer: mark one tool_wrong episode as an arbitration episode whose
    # question carries markup, to test the episode table and its escaping
    path = out / "episodes.jsonl"
    recs = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]
    for r in recs:
        if r["condition"] == "tool_wrong":
            r["cell"], r["question"] = "arb", XSS
            break
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return out


def test_run_report_sections_images_escaping(run_dir, tmp_path):
    out = tmp_path / "rep"
    res = write_report(run_dir, out)
    raw = res.html.read_text(encoding="utf-8")
    page = _parse(res.html)
    for h in RUN_SECTIONS:
        assert h in page.headings, h
    _check_self_contained(page, raw)
    # the question is escaped, shown as text
    assert "<script>" not in raw and "&lt;script&gt;" in raw
    assert XSS in "".join(page.text)
    # links to the run's own files, relative to the report
    for f in ("episodes.jsonl", "closed_book.jsonl"):
        href = next(h for h in page.hrefs if h.endswith(f))
        assert not Path(href).is_absolute() and (out / href).resolve() == (run_dir / f).resolve()
    # provenance: model hash, benchmark hashes and every number's source file
    info = json.loads((run_dir / "run.json").read_text())
    assert info["identity"]["weights_sha256"] in raw
    for h in info["identity"]["benchmark_files"].values():
        assert h in raw
    assert "summary.json" in raw and "source:" in raw
    md = res.markdown.read_text(encoding="utf-8")
    for h in RUN_SECTIONS:
        assert f"## {h}" in md
    assert "<script>" not in md
    img = next(l for l in md.splitlines() if l.startswith("!["))
    assert (out / img.split("(")[-1].rstrip(")")).read_bytes().startswith(PNG_SIG)


def _fake_artifacts(root: Path) -> None:
    (root / "sweep").mkdir(parents=True)
    cell = lambda v: {"value": v, "ci_low": max(0, v - .1), "ci_high": min(1, v + .1), "n": 10}  # noqa: E731
    rows = [{"strength": s, "spec_strength": s, "n_episodes": 30,
             "metrics": {m: cell(v) for m, v in (("retention", .2 + .1 * i), ("correct_tool_following", .9 - .1 * i),
                                                  ("tool_error_abstention", 0.0))},
             "flips": {"n": 10, "flip_to_memory": {"value": .1 * i, "k": i, "ci_low": 0, "ci_high": .3},
                       "flip_to_tool": {"value": 0.0, "k": 0, "ci_low": 0, "ci_high": 0}},
             "format": {"final_line_rate": cell(1.0), "degenerate_rate": cell(0.0)},
             "paired_vs_0": {"retention": {"delta": .1 * i, "ci_low": 0, "ci_high": .2}},
             "verdict": {"success": i > 1}} for i, s in enumerate((0.0, 2.0, 4.0))]
    (root / "sweep" / "sweep.json").write_text(json.dumps({
        "schema_version": "memtoc-sweep-v1", "edit": {"name": "dir<b>", "kind": "direction", "positions": "last_input",
                                                      "layers": [2]},
        "direction": "memory", "strengths": [0, 2, 4], "rows": rows}))
    (root / "rank").mkdir()
    (root / "rank" / "rank_table.json").write_text(json.dumps({
        "meta": {"run": "r", "model": "m", "n_episodes": 3, "condition": "tool_wrong", "cell": "arb",
                 "lenses": ["logit"], "top_k": 20},
        "summary": [{"lens": "logit", "split": "all", "behaviour": "all", "n": 3, "median_rank": 40, "top20": 1,
                     "control_median": 900}],
        "episodes": [{"behaviour": b, "lenses": {"logit": {"rank": r}}}
                     for b, r in (("followed_tool", 5), ("kept_memory", 300), ("other", 12000))]}))
    (root / "probe").mkdir()
    (root / "probe" / "probe.json").write_text(json.dumps({
        "meta": {"label": "outcome", "positive": "kept_memory", "negative": "followed_tool", "n_splits": 5, "C": .05},
        "sites": [{"site": s, "auroc_pooled": .5 + .1 * s, "ci_low": .4, "ci_high": .9, "auroc_mean": .6,
                   "auroc_sd": .05} for s in range(4)]}))


def test_experiment_report_sections(run_dir, tmp_path):
    exp = tmp_path / "exp"
    shutil.copytree(run_dir, exp / "runs" / "arm_a")
    _fake_artifacts(exp)
    assert main(["report", str(exp)]) == 0
    page = _parse(exp / "report.html")
    raw = (exp / "report.html").read_text(encoding="utf-8")
    for h in ("Sweep sweep/sweep.json", "Rank table rank/rank_table.json", "Probe probe/probe.json", "Runs",
              "Run runs/arm_a"):
        assert h in page.headings, (h, page.headings)
    assert len(page.imgs) == 3          # sweep curves, rank histogram, probe AUROC
    _check_self_contained(page, raw)
    assert "dir&lt;b&gt;" in raw
    assert any(h == "runs/arm_a/episodes.jsonl" for h in page.hrefs)


def test_report_refuses_unknown_directory(tmp_path):
    assert main(["report", str(tmp_path)]) == 2


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium) - headless render skipped")
def test_headless_chromium_renders(run_dir, tmp_path):
    res = write_report(run_dir, tmp_path / "rep")
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--window-size=1200,1600", f"--screenshot={shot}", res.html.resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.read_bytes().startswith(PNG_SIG) and shot.stat().st_size > 10_000


def test_sweep_plots_draw_strengths_in_order(monkeypatch):
    """Sweep rows list the baseline (strength 0) first; the curves must still run left to right."""
    import matplotlib.axes

    from memtoc.core import plots

    drawn = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, x, *a, **k: (drawn.append(list(x)),
                                                                               real(self, x, *a, **k))[1])
    cell = {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6}
    rows = [{"strength": s, "conditions": {"P1+": {"accuracy": cell, "adoption": cell}},
             "metrics": {"retention": cell}, "flips": {}, "format": {}} for s in (0.0, -4.0, 4.0)]
    plots.codeexec_sweep_curves(rows, ["P1+"])
    plots.sweep_curves(rows)
    assert drawn and all(x == sorted(x) == [-4.0, 0.0, 4.0] for x in drawn)
