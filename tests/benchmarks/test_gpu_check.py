"""``benchmarks/gpu_check.sh``: its hf half runs here, on CPU, with a tiny budget, through the shell script, and
says that vLLM did not run (the main environment has no vllm, as the GPU machines have none).

The hf half's own assertions (strength 0 equals untreated, the edit changes tokens) are checked here against the
tokens it wrote, and its capture file against an independent capture of the same prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_its_hf_half_without_vllm(tmp_path, default_backend):
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT": "0"}   # no limit here: a loaded CI box
    r = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "default", str(out), "--device", "cpu",
                        "--dtype", "float32", "--n", "2", "--max-new-tokens", "4",
                        "--vllm-python", str(tmp_path / "no-vllm" / "python")],
                       cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ran the hf half only" in r.stderr
    res = json.loads(out.read_text())
    assert res["vllm"].startswith("not run: vLLM is not installed here") and res["failed"] == []
    assert res["wall_s"] > 0 and res["load_1min"]["cpus"] == os.cpu_count()   # a timing says how busy the box was
    hf = res["hf"]
    assert hf["checks"] == {"strength 0 equals untreated": True, "the edit changes tokens": True}
    half = json.loads(out.with_suffix(".hf.json").read_text())
    n = res["n_prompts"]
    assert half["tokens"]["sweep"][:n] == half["tokens"]["plain"] and len(half["tokens"]["sweep"]) == 4 * n
    # the capture file: every site at last_input, equal to a capture made here
    from activations.capture import ResidualCapture

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    prompts, _ = gpu_check._prompts(n)
    b = default_backend                 # the session's float32 hf load of the default model
    cap = ResidualCapture([0, b.site_info.n_sites - 1], "last_input", prompts=prompts)
    b.forward(prompts, capture=cap)
    saved = np.load(hf["capture_file"])
    assert len(saved.files) == b.site_info.n_sites
    for s in (0, b.site_info.n_sites - 1):
        assert np.allclose(saved[str(s)], cap.values[s].float().numpy(), rtol=1e-4, atol=1e-4)
