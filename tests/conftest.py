"""Shared fixtures: the MemToC release data folder and small models built from a config."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One converted-model cache per test session (memtoc.backends.gguf_cache), never the caller's ~/.cache: the first
# load of the default model converts it, every later load in this session, its xdist workers and its subprocesses
# reads the copy. The process that makes it (the xdist controller, or the only process) removes it at exit.
# ``MEMTOC_TEST_MODEL_CACHE`` names a cache the caller keeps for sessions to share (``make test``: both tiers); it
# is content-addressed (the GGUF's sha256) and written whole or not at all, so it cannot change a result.
_SESSION_CACHE = "MEMTOC_TEST_SESSION_MODEL_CACHE"
if os.environ.get("MEMTOC_TEST_MODEL_CACHE"):
    _MODEL_CACHE = os.environ["MEMTOC_TEST_MODEL_CACHE"]
elif os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_SESSION_CACHE):
    _MODEL_CACHE = os.environ[_SESSION_CACHE]
else:
    _MODEL_CACHE = os.environ[_SESSION_CACHE] = tempfile.mkdtemp(prefix="memtoc-test-models-")
    atexit.register(shutil.rmtree, _MODEL_CACHE, ignore_errors=True)
os.environ["MEMTOC_MODEL_CACHE"] = _MODEL_CACHE
os.environ.pop("MEMTOC_VLLM_CACHE", None)
# Several xdist workers on these cores: one torch (and BLAS) thread each, in this process and its subprocesses, so
# the workers do not oversubscribe the cores (torch's waiting threads spin).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"
    if "torch" in sys.modules:          # imported before this file: its pool was sized already
        sys.modules["torch"].set_num_threads(1)


def shared_memtoc_dir() -> Path | None:
    """``$MEMTOC_SHARED_DATA`` or ``../shared/memtoc`` beside the checkout; None when absent."""
    env = os.environ.get("MEMTOC_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "memtoc")
    return next((c for c in candidates if (c / "mapping_575.jsonl").exists()), None)


@pytest.fixture(scope="session")
def shared_memtoc() -> Path:
    path = shared_memtoc_dir()
    if path is None:
        pytest.skip("MemToC release data not found: set MEMTOC_SHARED_DATA or place it at ../shared/memtoc")
    return path


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_tiny_model(root: Path, *, seed: int = 0, n_layers: int = 3) -> Path:
    """A random-initialised Llama with a small byte-level BPE tokenizer and a chat template, saved to ``root``.

    Unit tests use it through the same loader as real models (a local directory), so they never touch a hub.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    corpus = [e.prompt for e in build_episodes(load_benchmark("demo").questions, formulations=("reference",))]
    corpus += ["FINAL: Paris\n", "The answer is FINAL: 1945\n"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      bos_token_id=fast.bos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    # Larger weights make greedy continuations varied instead of one repeated token.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root)
    fast.save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_dir):
    from memtoc.backends.hf import HFBackend

    return HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def default_model() -> str:
    """The embedded default model's path; a test that needs it installed is skipped when it is not."""
    from memtoc.backends.models import default_model_path
    from memtoc.core.errors import ModelNotAvailableError

    try:
        return str(default_model_path())
    except ModelNotAvailableError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def default_backend():
    """The embedded default model, loaded once per session (about 20 s); skipped when not installed."""
    from memtoc.backends.hf import HFBackend
    from memtoc.core.errors import ModelNotAvailableError

    try:
        return HFBackend.load("default", device="cpu", dtype="float32")
    except ModelNotAvailableError as exc:
        pytest.skip(str(exc))


@pytest.fixture()
def no_model(monkeypatch):
    """Every model load fails the test (an AssertionError, not a MemtocError, so ``main()`` re-raises it): what a
    test walks must be refused before any weights load."""
    import memtoc.backends.factory as factory
    from memtoc.backends.hf import HFBackend

    def refuse(*a, **k):
        raise AssertionError("the model loader was reached")

    monkeypatch.setattr(factory, "load_backend", refuse)
    monkeypatch.setattr(HFBackend, "load", classmethod(refuse))


def pytest_collection_finish(session) -> None:
    """Every test module is imported (torch, transformers, ...): freeze what exists so each full garbage collection
    skips those millions of objects (a reference library's ``gc.collect()`` took 0.45 s a call here)."""
    import gc

    gc.collect()
    gc.freeze()
