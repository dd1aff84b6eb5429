"""The package layering: no import cycle anywhere, and no module imports a layer above its own.

Imports inside functions count too: a cycle hidden behind a local import is still a cycle, and so do imports
under ``if TYPE_CHECKING:`` (a type-level cycle still ties the two modules together).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("memtoc", "activations", "probes", "steering")

#: The layers, lowest first, read from paths: folder (or file) -> layer. The longest matching prefix decides, and
#: every module must match one (test_every_module_has_a_layer). See docs/architecture.md. The five library folders
#: under the analysis layer are a layer each: run stores read core; the scorer reads run stores (the judged layer);
#: the benchmark reads the scorer (offline scoring, the transfer set); the backends (the one layer that loads torch)
#: read core only, and nothing of the four below them may import a model runtime.
LAYER_NAMES = ("core", "runs", "scoring", "bench", "backends", "analysis", "tasks", "jobs", "adapters")
LAYERS = {
    "memtoc/__init__.py": "core",
    "memtoc/core": "core", "memtoc/runs": "runs", "memtoc/scoring": "scoring", "memtoc/bench": "bench",
    "memtoc/backends": "backends",
    "activations": "analysis", "probes": "analysis", "steering": "analysis",
    "memtoc/tasks": "tasks",
    "memtoc/jobs": "jobs",
    "memtoc/cli": "adapters", "memtoc/api": "adapters", "memtoc/recipes": "adapters",
    "memtoc/inspect_eval": "adapters",
}
#: The one upward import allowed: the ``memtoc`` package's public face re-exports the Python API (an adapter)
#: lazily, from a module ``__getattr__``, so ``import memtoc`` loads nothing of it (test_the_facade_is_lazy).
LAZY_FACADE = ("memtoc", "memtoc.api")


def layer_of_path(path: Path) -> int | None:
    rel = path.relative_to(REPO).as_posix()
    best = max((k for k in LAYERS if rel == k or rel.startswith(k + "/")), key=len, default=None)
    return None if best is None else LAYER_NAMES.index(LAYERS[best])


def layer(module: str) -> int:
    found = layer_of_path(MODULES[module])
    assert found is not None, f"{module} is in no layer of LAYERS"
    return found


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = f
    return found


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the toolkit modules it imports (anywhere in its body)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a parent package runs first anyway
                    edges[name].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


MODULES: dict[str, Path] = {}


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    MODULES.update(modules())
    return import_edges(MODULES)


def test_every_module_has_a_layer() -> None:
    assert [name for name, path in sorted(modules().items()) if layer_of_path(path) is None] == []


def test_the_walker_sees_relative_and_local_imports(tmp_path) -> None:
    pkg = tmp_path / "memtoc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import memtoc.b\n")
    (pkg / "b.py").write_text("from memtoc.a import f\n")
    mods = {"memtoc": pkg / "__init__.py", "memtoc.a": pkg / "a.py", "memtoc.b": pkg / "b.py", "memtoc.c": pkg / "c.py"}
    e = import_edges(mods)
    assert e["memtoc.a"] == {"memtoc.b"} and e["memtoc.b"] == {"memtoc.a"}
    assert e["memtoc.c"] == {"memtoc.b"}          # a TYPE_CHECKING import is an edge too
    assert cycles(e) == [["memtoc.a", "memtoc.b"]]


def test_no_import_cycles(edges) -> None:
    assert cycles(edges) == []


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above the importer's (the lazy facade excepted)."""
    return [f"{a} ({LAYER_NAMES[layer(a)]}) -> {b} ({LAYER_NAMES[layer(b)]})"
            for a in sorted(edges) for b in sorted(edges[a]) if layer(b) > layer(a) and (a, b) != LAZY_FACADE]


def test_no_module_imports_a_layer_above_its_own(edges) -> None:
    assert upward(edges) == []


def test_the_library_folders_are_layers_of_their_own(edges) -> None:
    """core, runs, scoring, bench and backends are separate layers: the loops this split removed would fail again
    (a job config's model description living in the backends, the Task protocol naming the run store's result
    type), and so would a scorer or a benchmark module that loads a model runtime."""
    loops = {"memtoc.core.config": {"memtoc.backends.base"}, "memtoc.core.tasks": {"memtoc.runs.result"},
             "memtoc.scoring.extract": {"memtoc.backends.base"}, "memtoc.bench.prompts": {"memtoc.backends.chat"},
             "memtoc.runs.result": {"memtoc.scoring.extract"}}
    assert upward(loops) == ["memtoc.bench.prompts (bench) -> memtoc.backends.chat (backends)",
                             "memtoc.core.config (core) -> memtoc.backends.base (backends)",
                             "memtoc.core.tasks (core) -> memtoc.runs.result (runs)",
                             "memtoc.runs.result (runs) -> memtoc.scoring.extract (scoring)",
                             "memtoc.scoring.extract (scoring) -> memtoc.backends.base (backends)"]
    lower = ("core", "runs", "scoring", "bench", "backends")
    assert [layer_of_path(REPO / "memtoc" / n) for n in lower] == [LAYER_NAMES.index(n) for n in lower]


def test_the_facade_is_lazy() -> None:
    """``import memtoc`` imports neither the API nor torch; the first API name used loads the API."""
    import subprocess
    import sys

    code = ("import sys, memtoc; assert 'memtoc.api' not in sys.modules and 'torch' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('memtoc', 'torch'))); "
            "f = memtoc.function_edit; assert 'memtoc.api' in sys.modules and f.__module__ == 'memtoc.api.edits'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_every_package_imports_cleanly() -> None:
    import importlib
    import importlib.util

    from memtoc.inspect_eval import NEEDS_INSPECT

    for name in sorted(modules()):
        if name.endswith(("_sandbox_prelude", "__main__")):
            continue  # runs inside the sandbox subprocess only / runs the command line
        if name in NEEDS_INSPECT and importlib.util.find_spec("inspect_ai") is None:
            continue  # the [inspect] extra is not installed here
        importlib.import_module(name)


def test_the_job_bodies_are_jobs() -> None:
    """The evaluate, extract and sweep jobs of every family are defined in the job layer; the analysis and task
    layers keep only the library they call."""
    from memtoc.jobs import codeexec, evaluate, extract, sweep, sweep_pass

    bodies = [evaluate.evaluate, evaluate.run_evaluate, extract.extract, extract.run_extract, extract.ExtractConfig,
              sweep.sweep, sweep.run_sweep, sweep.sweep_waves, sweep.sweep_strength, sweep.sweep_closed_book,
              sweep.sweep_strength_group, sweep_pass.evaluate_in_one_pass, codeexec.evaluate_codeexec,
              codeexec.extract_codeexec, codeexec.capture_codeexec, codeexec.run_codeexec_sweep]
    assert [f"{b.__module__}.{b.__name__}" for b in bodies if not b.__module__.startswith("memtoc.jobs.")] == []
    assert not (REPO / "activations" / "extract.py").exists()
    assert not (REPO / "memtoc" / "tasks" / "memtoc" / "evaluate.py").exists()


def test_the_job_bodies_probe_no_capability() -> None:
    """A job body picks its family by the config's class and its strategy by declared capabilities, never by
    probing an object for a method (``hasattr``, ``getattr(obj, "method", default)``); and the extract and sweep
    protocols of hooks are gone (their bodies call the family's data functions)."""
    import re

    from memtoc.core import tasks

    files = ["memtoc/jobs/extract.py", "memtoc/jobs/sweep.py", "memtoc/jobs/evaluate.py", "memtoc/jobs/codeexec.py",
             "memtoc/jobs/rank_table.py", "memtoc/tasks/evaluation.py"]
    probes = {f: re.findall(r"hasattr\(|getattr\(job\b", (REPO / f).read_text(encoding="utf-8")) for f in files}
    assert {f: p for f, p in probes.items() if p} == {}
    assert not hasattr(tasks, "TaskExtraction") and not hasattr(tasks, "TaskSweep")


def family_of(module: str) -> str | None:
    """The task family folder (``memtoc.tasks.<family>``) of a module, None outside one."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["memtoc", "tasks"] and (REPO / "memtoc" / "tasks" /
                                                                                 parts[2]).is_dir() else None


def test_families_import_no_other_family(edges) -> None:
    """What several task families use lives where all of them import it from (``memtoc/tasks/*.py`` or a lower
    layer), not in one family's folder: no family folder imports another, and the shared task modules import none."""
    offenders = [f"{a} -> {b}" for a in sorted(edges) for b in sorted(edges[a])
                 if a.startswith("memtoc.tasks.") and family_of(b) is not None and family_of(a) != family_of(b)]
    assert offenders == []
    assert {family_of(m) for m in MODULES} >= {"memtoc", "codeexec", "agent"}   # the walker sees the families


#: Folders that must stay free of the command line: the jobs and the two other adapters over them.
NO_PARSER = ("memtoc/jobs", "memtoc/api", "memtoc/recipes")


def test_jobs_api_and_recipes_import_no_parser_and_no_cli(edges) -> None:
    """The job layer is a library: the API and the recipe runner reach it without argparse or a CLI module."""
    offenders = []
    for name, path in sorted(MODULES.items()):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(NO_PARSER):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if "argparse" in imported:
            offenders.append(f"{name} imports argparse")
        offenders += [f"{name} imports {t}" for t in sorted(edges[name]) if t == "memtoc.cli" or t.startswith("memtoc.cli.")]
    assert offenders == []


def test_the_walker_finds_a_parser_import(tmp_path) -> None:
    tree = ast.parse("def f():\n    import argparse\n")
    assert {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} == {"argparse"}


def folder_edges(edges: dict[str, set[str]], folders: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """(from folder, to folder) -> the module imports between two of ``folders`` (``memtoc/core``, ...)."""
    def folder(m: str) -> str | None:
        rel = MODULES[m].relative_to(REPO).as_posix()
        return next((f for f in folders if rel.startswith(f + "/")), None)

    out: dict[tuple[str, str], list[str]] = {}
    for a in sorted(edges):
        for b in sorted(edges[a]):
            fa, fb = folder(a), folder(b)
            if fa and fb and fa != fb:
                out.setdefault((fa, fb), []).append(f"{a} -> {b}")
    return out


#: Interventions say what (``memtoc.backends.plans``); only the backends know how: outside ``memtoc/backends`` no
#: code asks for the token-row backend type or reaches into a backend's module through its parts.
BACKEND_SEAM = re.compile(r"TokenRowBackend|parts.model")
SEAM_FOLDERS = ("steering", "activations", "probes", "memtoc/jobs")


def seam_breaches(root: Path) -> list[str]:
    """``path:line: text`` of every line under ``SEAM_FOLDERS`` of ``root`` that :data:`BACKEND_SEAM` finds (the
    issue's ``grep -rn "TokenRowBackend\\|parts.model" --include=*.py`` over those folders)."""
    return [f"{f.relative_to(root).as_posix()}:{n}: {line.strip()}"
            for folder in SEAM_FOLDERS for f in sorted((root / folder).rglob("*.py"))
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if BACKEND_SEAM.search(line)]


def test_interventions_do_not_know_the_backend():
    assert seam_breaches(REPO) == []


def test_the_seam_check_finds_an_injected_breach(tmp_path):
    for folder, line in (("steering", "if isinstance(backend, TokenRowBackend):"),
                         ("memtoc/jobs", "model = parts.model"), ("probes/lenses", "x = backend.parts.model_type")):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "bad.py").write_text(f"def f(backend, parts):\n    {line}\n", encoding="utf-8")
    assert [b.split(":")[0] for b in seam_breaches(tmp_path)] == ["steering/bad.py", "probes/lenses/bad.py",
                                                                  "memtoc/jobs/bad.py"]


if __name__ == "__main__":   # the note's numbers: python tests/test_layering.py [folder,folder,... lowest first]
    import sys

    MODULES.update(modules())
    order = tuple(f"memtoc/{n}" for n in (sys.argv[1] if len(sys.argv) > 1 else "core,runs,scoring,bench,backends")
                  .split(","))
    pairs = folder_edges(import_edges(MODULES), order)
    up = {k: v for k, v in pairs.items() if order.index(k[1]) > order.index(k[0])}
    for (fa, fb), found in pairs.items():
        print(f"{fa} -> {fb}: {len(found)}{'  UPWARD' if (fa, fb) in up else ''}")
    print(f"upward: {len(up)} folder pairs, {sum(map(len, up.values()))} module imports")


def private_imports(root: Path) -> list[str]:
    """``file:line name`` of every private name (``_x``) one of our modules imports from another."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                    found += [f"{path.relative_to(root).as_posix()}:{node.lineno} {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names(tmp_path) -> None:
    """A helper two modules share is public (issue 45: ``_build``, ``_path``, ... were imported across the API)."""
    assert private_imports(REPO) == []
    (tmp_path / "memtoc").mkdir()
    (tmp_path / "memtoc" / "m.py").write_text("from memtoc.api.jobs import _build\n", encoding="utf-8")
    assert private_imports(tmp_path) == ["memtoc/m.py:1 _build"]
