"""The backend registry: one place names the backends, and jobs ask a backend kind, never a backend's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from memtoc.core.values import ConfigError

from memtoc.core.backend_kinds import (BACKEND_KINDS, BACKEND_NAMES, EDITS, TEXT_CAPABILITIES, TOOL_PARSERS,
                                       BackendKind, UnknownBackendError, backend_kind, register_backend_kind)
from memtoc.core.options import OPTIONS
from memtoc.core.runtime import ModelSpec

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("memtoc", "activations", "probes", "steering")

TOY_MODULE = '''
LOADED = []


class ToyBackend:
    name = "toy"
    chat = False
    tokenizer = None
    capabilities = frozenset({"generate", "guided"})


def load(spec, *, hooks=True):
    LOADED.append((spec, hooks))
    return ToyBackend()
'''


@pytest.fixture
def toy_kind(tmp_path, monkeypatch):
    """A backend kind that is not built in: its module (a loader) and one registration, removed again after."""
    (tmp_path / "toy_backend_mod.py").write_text(TOY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    kind = register_backend_kind(BackendKind(name="toy", loader="toy_backend_mod:load",
                                             capabilities=TEXT_CAPABILITIES, default_batch_size=3,
                                             spec_fields=("max_model_len",)))
    yield kind
    BACKEND_KINDS.remove("toy")


def test_the_built_in_kinds():
    assert tuple(BACKEND_NAMES) == ("hf", "vllm", "openai") and len(BACKEND_NAMES) == 3 and BACKEND_NAMES[0] == "hf"
    hf, vllm, openai = backend_kind("hf"), backend_kind("vllm"), backend_kind("openai")
    assert openai.capabilities == {"generate"} and openai.remote and not hf.remote and not vllm.remote
    assert hf.offers(EDITS) and vllm.offers(EDITS) and vllm.offers(TOOL_PARSERS) and not hf.offers(TOOL_PARSERS)
    assert (hf.default_batch_size, vllm.default_batch_size) == (8, 256)
    spec = ModelSpec(backend="vllm", tensor_parallel_size=2, max_model_len=64)
    assert vllm.settings(spec) == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                                   "gpu_memory_utilization": 0.9, "max_model_len": 64}
    assert hf.settings(spec) == {}
    # every spec field a kind claims is a ModelSpec field, and no two kinds claim the same one
    claimed = [f for n in BACKEND_NAMES for f in backend_kind(n).spec_fields]
    assert len(claimed) == len(set(claimed)) and set(claimed) <= set(ModelSpec.__dataclass_fields__)


def test_an_unknown_backend_is_refused_when_the_spec_is_built():
    with pytest.raises(UnknownBackendError, match=r"^--backend must be one of hf, vllm, openai, not 'nope'$"):
        ModelSpec(backend="nope")
    assert "nope" not in BACKEND_NAMES and 7 not in BACKEND_NAMES


def test_a_second_kind_under_a_registered_name_is_refused():
    with pytest.raises(ValueError, match="backend 'hf' is already registered"):
        register_backend_kind(BackendKind(name="hf", loader="x:y", capabilities=TEXT_CAPABILITIES))
    assert register_backend_kind(backend_kind("hf")) == backend_kind("hf")     # the same kind again: a no-op


def test_a_new_backend_is_one_registration(toy_kind):
    """Registering a kind is all a job needs: the --backend choice, the spec, the loader, the batch default and
    the capability checks follow, with no other file edited."""
    from memtoc.backends.factory import load_backend
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    assert "toy" in BACKEND_NAMES and OPTIONS["backend"].choices is BACKEND_NAMES
    from memtoc.cli.parse import parse_config

    assert parse_config(["evaluate", "--backend", "toy", "--out", "o"])[1].model_spec.backend == "toy"
    backend = load_backend(ModelSpec(backend="toy", max_model_len=5))
    import toy_backend_mod

    spec, hooks = toy_backend_mod.LOADED[-1]
    assert backend.name == "toy" and spec.max_model_len == 5 and hooks is True     # the engine every job can use
    assert toy_kind.settings(spec) == {"max_model_len": 5}
    load_backend(ModelSpec(backend="toy"), hooks=False)          # a generation-only job says so to the loader
    assert toy_backend_mod.LOADED[-1][1] is False
    assert EvaluationConfig(backend="toy").effective_batch_size() == 3
    assert EvaluationConfig(backend="toy", batch_size=5).effective_batch_size() == 5
    with pytest.raises(Exception, match="adapter views"):
        load_backend(ModelSpec(backend="toy", adapter="somewhere"))


def test_a_setting_of_another_kind_is_refused_before_any_loader(toy_kind):
    """``--tensor-parallel-size 2`` (a vllm setting) on a kind that does not read it would be dropped silently:
    refused in one line naming the option and the kind that has it, before the loader runs."""
    from memtoc.backends.factory import load_backend
    from memtoc.core.errors import MemtocError

    import toy_backend_mod

    before = len(toy_backend_mod.LOADED)
    for field, value in (("tensor_parallel_size", 2), ("pipeline_parallel_size", 2)):
        for name in ("toy", "hf"):
            with pytest.raises(MemtocError, match=rf"--{field.replace('_', '-')} 2 is a setting of the vllm "
                                                  rf"backend; the {name} backend has no such setting") as err:
                load_backend(ModelSpec(backend=name, **{field: value}))
            assert "\n" not in str(err.value)
    assert len(toy_backend_mod.LOADED) == before                 # no loader was reached
    load_backend(ModelSpec(backend="toy", max_model_len=7))      # its own setting passes
    assert toy_backend_mod.LOADED[-1][0].max_model_len == 7


def test_a_kept_model_is_one_engine_whatever_the_jobs_hooks(toy_kind):
    """A worker that keeps its models (``keep_models``) holds one engine per model: a hooked job after a
    generation-only one gets an eager engine in place of the compiled one, and a generation-only job after a hooked
    one reuses the eager engine (it generates too) instead of building a second."""
    from memtoc.backends.factory import keep_models, load_backend

    import toy_backend_mod

    keep_models(True)
    try:
        n = len(toy_backend_mod.LOADED)
        plain = load_backend(ModelSpec(backend="toy"), hooks=False)
        assert load_backend(ModelSpec(backend="toy"), hooks=False) is plain and len(toy_backend_mod.LOADED) == n + 1
        hooked = load_backend(ModelSpec(backend="toy"), hooks=True)
        assert hooked is not plain and toy_backend_mod.LOADED[-1][1] is True
        assert load_backend(ModelSpec(backend="toy"), hooks=False) is hooked
        assert load_backend(ModelSpec(backend="toy"), hooks=True) is hooked and len(toy_backend_mod.LOADED) == n + 2
    finally:
        keep_models(False)


def test_the_kind_is_gone_once_removed(toy_kind):
    from memtoc.cli.parse import parse_config

    BACKEND_KINDS.remove("toy")
    with pytest.raises(ConfigError, match="--backend must be one of"):
        parse_config(["evaluate", "--backend", "toy", "--out", "o"])
    with pytest.raises(UnknownBackendError):
        ModelSpec(backend="toy")
    register_backend_kind(toy_kind)         # the fixture removes it again


def test_capability_checks_ask_the_kind(toy_kind):
    """The agent's engine tool-call parser and a code-executor edit are refused by capability, naming the backend."""
    from memtoc.core.values import ConfigError
    from memtoc.tasks.agent.task import AgentRunConfig
    from memtoc.tasks.codeexec.run import CodeexecRunConfig
    from memtoc.tasks.codeexec.task import CodeexecEvaluation

    AgentRunConfig(backend="vllm", tool_call_parser="hermes")         # vllm offers its engine's parsers
    for name in ("hf", "toy"):
        with pytest.raises(ConfigError, match=rf"needs a backend with one \(--backend vllm; the {name} backend"):
            AgentRunConfig(backend=name, tool_call_parser="hermes")
    with pytest.raises(ConfigError, match="the toy backend does not"):
        CodeexecEvaluation(CodeexecRunConfig(backend="toy"), edit=object())
    for name in ("hf", "vllm"):                                 # both apply edits in generation
        assert CodeexecEvaluation(CodeexecRunConfig(backend=name), edit=object()).edit is not None


def test_the_judge_takes_its_batch_default_from_the_kind():
    from memtoc.jobs.judge import JudgeConfig, check_judge_config, judge_batch_size

    assert judge_batch_size(JudgeConfig(run_dir="r", backend="vllm")) == 256
    assert judge_batch_size(JudgeConfig(run_dir="r", backend="hf")) == 8
    assert judge_batch_size(JudgeConfig(run_dir="r", backend="vllm", batch_size=4)) == 4
    with pytest.raises(UnknownBackendError, match="--backend must be one of hf, vllm, openai, not 'nope'"):
        check_judge_config(JudgeConfig(run_dir="r", backend="nope"))


def _name_checks(src: str, where: str) -> list[str]:
    """``x.backend == "vllm"``-style comparisons, and literal lists of the backend names, in ``src``."""
    names = set(BACKEND_NAMES)
    found = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr == "backend" for s in sides)
            consts = {e.value for s in sides for e in ([s] if isinstance(s, ast.Constant) else getattr(s, "elts", []))
                      if isinstance(e, ast.Constant)}
            if named and consts & names:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1 and {
                e.value for e in node.elts if isinstance(e, ast.Constant)} == names:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_walker_finds_a_name_check():
    src = 'if cfg.backend != "vllm":\n    pass\nok = spec.backend in ("hf",)\nx = ("hf", "vllm", "openai")\ny = cfg.n == "hf"\n'
    assert _name_checks(src, "m.py") == ["m.py:1: cfg.backend != 'vllm'", "m.py:3: spec.backend in ('hf',)",
                                         "m.py:4: ('hf', 'vllm', 'openai')"]


def test_no_code_tests_a_backend_name_or_lists_the_names():
    found = [f for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             for f in _name_checks(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert found == []
