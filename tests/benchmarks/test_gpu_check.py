"""``benchmarks/gpu_check.sh`` on CPU with a tiny budget: every check runs and passes, the JSON states what ran and
each bound, vLLM's absence is said, and the whole run imports nothing but the standard library, the GPU machine's
packages (``benchmarks/gpu_machine_packages.txt``) and this repository (recorded by ``import_audit/
sitecustomize.py`` in every process the script starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AUDIT = Path(__file__).resolve().parent / "import_audit"
CHECKS = {"capture", "direction", "sae_clamp", "staged_capture", "sweep"}


def _allowed() -> set[str]:
    lines = (REPO / "benchmarks" / "gpu_machine_packages.txt").read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def _own(file: str | None) -> bool:
    return bool(file) and Path(file).resolve().is_relative_to(REPO.resolve()) and "site-packages" not in file


def foreign_imports(modules: dict[str, dict], allowed: set[str]) -> dict[str, str]:
    """Modules outside the standard library and ``allowed`` that this repository's code imported (directly, or
    through another such module), each with the repository module that did; what an allowed package imported
    on its own is left out."""
    def ours(m: str) -> bool:
        return m == "__main__" or _own(modules.get(m, {}).get("file"))

    out = {}
    for top, rec in modules.items():
        if top in sys.stdlib_module_names or top in allowed or ours(top):
            continue
        seen, importer = {top}, rec.get("importer")
        while importer is not None:
            imp = importer.partition(".")[0]
            if ours(imp) or imp == "__main__":
                out[top] = importer
                break
            if imp in sys.stdlib_module_names or imp in allowed or imp in seen or imp not in modules:
                break
            seen.add(imp)
            importer = modules[imp].get("importer")
    return out


def test_the_audit_names_what_this_repository_imports_outside_the_set():
    mods = {"memtoc": {"importer": "__main__", "file": str(REPO / "memtoc" / "__init__.py")},
            "jsonschema": {"importer": "memtoc.core.config", "file": "/x/site-packages/jsonschema/__init__.py"},
            "attrs": {"importer": "jsonschema.validators", "file": "/x/site-packages/attrs/__init__.py"},
            "PIL": {"importer": "transformers.utils.import_utils", "file": "/x/site-packages/PIL/__init__.py"},
            "sae_lens": {"importer": "__main__", "file": "/x/site-packages/sae_lens/__init__.py"},
            "json": {"importer": "memtoc", "file": "/usr/lib/python3/json/__init__.py"}}
    assert foreign_imports(mods, {"transformers", "torch"}) == {
        "jsonschema": "memtoc.core.config", "attrs": "memtoc.core.config", "sae_lens": "__main__"}


def test_gpu_check_runs_on_cpu_with_the_gpu_machines_packages_only(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "0",     # no limit here: a loaded CI box
           "PYTHONPATH": str(AUDIT), "GPU_CHECK_IMPORT_LOG": str(tmp_path / "imports")}
    r = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--out", str(out), "--device", "cpu",
                        "--n", "2", "--max-new-tokens", "2", "--vllm-python", str(tmp_path / "no-vllm" / "python")],
                       cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the hf-vs-vLLM comparison did not run" in r.stderr
    res = json.loads(out.read_text())
    assert res["failed"] == [] and res["vllm"].startswith("not run: the hf-vs-vLLM comparison needs vLLM on CUDA")
    assert set(res["checks"]) == CHECKS and all(c["ok"] for c in res["checks"].values())
    assert set(res["ran"]) == CHECKS and set(res["bounds"]) == CHECKS
    assert all(res["bounds"][n] and c["bound"] == res["bounds"][n] for n, c in res["checks"].items())   # stated
    assert res["device"] == "cpu" and res["device_name"] and res["dtype"] == "float32" and res["versions"]["torch"]
    assert res["model"]["architecture"] == "LlamaForCausalLM" and res["model"]["n_layers"] == 30
    assert res["model"]["d_model"] == 576 and res["n_prompts"] == 2
    assert set(res["checks"]["capture"]["kinds"]) == {"last_input", "tool_span", "from_tool_return", "all"}
    assert set(res["checks"]["staged_capture"]["runs"]) == {"tp2", "pp2"}
    assert res["checks"]["sweep"]["bound"].startswith("float32: exact")
    assert res["wall_s"] > 0 and res["load_1min"]["cpus"] == os.cpu_count()   # a timing says how busy the box was
    logs = sorted(tmp_path.glob("imports.*.json"))
    assert logs, "the import audit wrote nothing (sitecustomize not loaded?)"
    recorded = [json.loads(log.read_text())["modules"] for log in logs]
    assert any({"memtoc", "activations", "steering", "torch", "transformers"} <= set(m) for m in recorded)
    for log, modules in zip(logs, recorded):
        assert foreign_imports(modules, _allowed()) == {}, log.name


def test_a_failed_check_exits_1_naming_it(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    def fake(args):
        return {"checks": {"capture": {"ok": True, "bound": "exact"},
                           "sweep": {"ok": False, "bound": "exact"},
                           "sae_clamp": {"ok": False, "error": "RuntimeError: boom"}}}

    monkeypatch.setattr(gpu_check, "run_checks", fake)
    out = tmp_path / "c.json"
    rc = gpu_check.main(["--out", str(out), "--device", "cpu", "--vllm-python", str(tmp_path / "none")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "gpu_check FAILED: sweep: assertion failed (see its record); sae_clamp: RuntimeError: boom" in err
    assert json.loads(out.read_text())["failed"] == ["sweep: assertion failed (see its record)",
                                                     "sae_clamp: RuntimeError: boom"]
